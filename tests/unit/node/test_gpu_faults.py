"""GPU faults end to end on a simulated machine: NVML events through gpudra.gpu.nvml, the marks
gpudra.node.health.gpu_faults keeps, and what the health monitor makes of them (the slices' taints, the
kubelet's device health, Node events, metrics); the polling fallback where a GPU offers no events;
the recovery rules; the health file across restarts; two plugin instances on one node (a rolling
update, a SIGKILL); the CLI options."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudra import atomic_file, cli, sim
from gpudra.gpu import nvml
from gpudra.model import devices
from gpudra.model.gpu_health import DEFAULT_CLASSIFICATION, XidClass
from gpudra.node import faults, gpu_driver
from gpudra.node.health import gpu_faults
from gpudra.node.health.gpu_faults import GpuFaults
from gpudra.node.health.monitor import Health, HealthMonitor
from gpudra.node.metrics import PluginMetrics
from tests.unit.harness.crash import REPO
from tests.unit.harness.gpu_faults import Instance
from tests.unit.harness.kube import Events

POOL = "node-a"
INTERVAL = 0.05


class Node:
    """A simulated machine with the health monitor and its faults running, as the plugin wires them."""

    def __init__(
        self, tmp_path: Path, profile: str, *, clean_seconds: float = 600, effect: str = "NoSchedule"
    ):
        self.profile = profile
        self.state_file = tmp_path / "sim" / "machine.json"
        self.health_file = tmp_path / "state" / "health.json"
        self.health_file.parent.mkdir(exist_ok=True)
        with self.session() as session:
            inventory = session.inventory()
        self.model = devices.build_devices(
            inventory, mig_mode="partitionable" if profile == "dgx-h100" else "static"
        )
        self.gpus = {f"gpu-{gpu.minor}": gpu.uuid for gpu in inventory.gpus}
        self.events = Events()
        self.metrics = PluginMetrics()
        self.annotation = ""
        self.boot_id = "boot-1"
        self.clean_seconds = clean_seconds
        self.effect = effect
        self.holders: dict[str, list[str]] = {}
        self.taints_kept = True  # whether the API server keeps device taints (the served model says)
        self.clock: Callable[[], float] = time.time  # what the marks are dated by
        self.monitor = self.start()

    def session(self) -> nvml.Nvml:
        return gpu_driver.connect(f"sim:{self.profile}", state_file=self.state_file)

    def start(self) -> HealthMonitor:
        self.faults = GpuFaults(
            devices=self.model.devices,
            open_nvml=self.session,
            classification=DEFAULT_CLASSIFICATION,
            clean_seconds=self.clean_seconds,
            reset_effect=self.effect,
            state_file=self.health_file,
            boot_id=self.boot_id,
            events=self.events,
            metrics=self.metrics,
            holders=lambda gpu, device: self.holders.get(device or gpu, []),
            read_annotation=lambda: self.annotation,
            taints_kept=lambda: self.taints_kept,
            annotation_interval=0.05,
            clock=lambda: self.clock(),  # noqa: PLW0108 (the test swaps self.clock later)
        )
        monitor = HealthMonitor(
            pool=POOL,
            devices=self.model.devices,
            open_nvml=self.session,
            interval=INTERVAL,
            faults=self.faults,
        )
        monitor.start()
        return monitor

    def restart(self) -> None:
        self.monitor.stop()
        self.monitor = self.start()

    def until(self, what: str, done: Callable[[], object], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"never: {what}; taints {self.monitor.taints()}"
            time.sleep(0.02)

    def tainted(self) -> dict[str, str]:
        """Device -> "value:effect" of its taint."""
        return {name: f"{t.get('value')}:{t['effect']}" for name, t in self.monitor.taints().items()}

    def on_gpu(self, gpu: str) -> set[str]:
        return {d["name"] for d in self.model.devices if devices.gpu_uuid_of(d) == self.gpus[gpu]}

    def health(self) -> dict[str, tuple[Health, str]]:
        snapshot = self.monitor.wait(after=0, timeout=10)
        assert snapshot is not None
        return {d.device: (d.health, d.message) for d in snapshot.devices}

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


@pytest.fixture
def h100(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path, "dgx-h100")
    node.until("the event set is open", lambda: node.sample("gpudra_gpu_events_monitored", gpu="gpu-7") == 1)
    yield node
    node.monitor.stop()


# --- faults on a running monitor ---------------------------------------------------------------------


def test_a_fatal_xid_taints_the_gpu_and_its_partitions_and_says_who_holds_it(h100: Node) -> None:
    gpu = h100.gpus["gpu-3"]
    h100.holders[gpu] = ["team-a/train"]
    sim.raise_xid(state_file=h100.state_file, gpu_uuid=gpu, xid=79)
    h100.until("gpu-3 tainted", lambda: set(h100.tainted()) == h100.on_gpu("gpu-3"))
    assert set(h100.tainted().values()) == {"Xid79:NoSchedule"}
    assert any("-mig-" in name for name in h100.tainted())  # the partitions follow their GPU
    health = h100.health()
    assert health["gpu-3-mig-1g10gb-0"] == (
        Health.UNHEALTHY,
        f"GPU {gpu}: XID 79 (GPU has fallen off the bus); needs a node reboot",
    )
    assert health["gpu-2"] == (Health.HEALTHY, "")
    (posted,) = h100.events.posted
    assert posted == (
        "Warning",
        "GpuFault",
        f"GPU {gpu} (gpu-3): XID 79 (GPU has fallen off the bus), class reboot; tainted "
        f"gpudra.io/unhealthy=Xid79:NoSchedule until the node reboots (a GPU reset does not lift it) or the "
        f"Node is annotated gpudra.io/clear-health={gpu}; held by claim team-a/train",
    )
    assert h100.sample("gpudra_gpu_xid_errors_total", gpu="gpu-3", xid="79") == 1


def test_where_the_server_drops_taints_the_event_says_left_out_and_the_report_has_the_words(
    h100: Node,
) -> None:
    gpu = h100.gpus["gpu-3"]
    h100.taints_kept = False
    sim.raise_xid(state_file=h100.state_file, gpu_uuid=gpu, xid=79)
    h100.until("gpu-3 unhealthy", lambda: set(h100.monitor.messages()) == h100.on_gpu("gpu-3"))
    (posted,) = h100.events.posted
    assert (
        "class reboot; left out of the slices (no device taints on this release) until the node" in posted[2]
    )
    assert h100.monitor.messages()["gpu-3"] == (
        f"GPU {gpu}: XID 79 (GPU has fallen off the bus), class reboot; lifted when the node reboots (a GPU "
        f"reset does not lift it) or the Node is annotated gpudra.io/clear-health={gpu}"
    )


def test_an_xid_storm_is_one_mark_one_event_series_and_no_health_file_write_per_xid(
    h100: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU that keeps raising XID 79: every XID counted, one mark, one GpuFault series (one Event
    whose count grows: gpudra.kube.events), and health.json written when the mark is made and when the
    annotation is first read after it (its baseline), not per XID; a repeat a while later moves the
    saved last_seen."""
    h100.health()  # after the first poll, which saves what it reads first (ECC counts, NVLinks up)
    writes: list[Path] = []
    real_write = atomic_file.write_atomically

    def counted(path: Path, data: bytes, **kwargs: Any) -> None:
        real_write(path, data, **kwargs)
        writes.append(path)

    monkeypatch.setattr(gpu_faults, "write_atomically", counted)
    now = [1000.0]
    h100.clock = lambda: now[0]
    gpu = h100.gpus["gpu-5"]
    for _ in range(300):
        sim.raise_xid(state_file=h100.state_file, gpu_uuid=gpu, xid=79)
    # The Event is posted last of what a fault does (after its count and its mark).
    h100.until("300 Events posted", lambda: len(h100.events.series) == 300)
    assert h100.sample("gpudra_gpu_xid_errors_total", gpu="gpu-5", xid="79") == 300
    assert len(h100.faults.marks()) == 1 and writes in ([h100.health_file], [h100.health_file] * 2)
    assert {(t, r) for t, r, _ in h100.events.posted} == {("Warning", "GpuFault")}
    assert set(h100.events.series) == {f"GPU {gpu}/reboot"} and len(h100.events.series) == 300
    saved = json.loads(h100.health_file.read_text())["marks"][0]
    assert saved["last_seen"] == 1000.0
    # A repeat once LAST_SEEN_SAVE_SECONDS have passed reaches the file (by the repeat's own write, or,
    # once that much more passed, by the next change the repeat brought: its annotation baseline).
    now[0] += gpu_faults.LAST_SEEN_SAVE_SECONDS
    sim.raise_xid(state_file=h100.state_file, gpu_uuid=gpu, xid=79)
    # The mark, not the XID counter (counted before the mark is dated): a clock moved on before the
    # repeat is dated would date it 1020.
    h100.until("the repeat marked", lambda: [m.last_seen for m in h100.faults.marks()] == [1010.0])
    assert h100.sample("gpudra_gpu_xid_errors_total", gpu="gpu-5", xid="79") == 301
    now[0] += gpu_faults.LAST_SEEN_SAVE_SECONDS

    def saved_last_seen() -> float:
        return float(json.loads(h100.health_file.read_text())["marks"][0]["last_seen"])

    h100.until("the repeat saved", lambda: saved_last_seen() == 1010.0)
    assert len(writes) <= 4


def test_an_application_error_is_counted_and_taints_nothing(h100: Node) -> None:
    gpu = h100.gpus["gpu-1"]
    for xid in (13, 31, 43, 45, 63, 68, 92, 94):
        sim.raise_xid(state_file=h100.state_file, gpu_uuid=gpu, xid=xid)
    h100.until(
        "eight XIDs counted", lambda: h100.sample("gpudra_gpu_xid_errors_total", gpu="gpu-1", xid="94")
    )
    assert h100.tainted() == {} and h100.events.posted == [] and h100.faults.marks() == ()
    assert h100.sample("gpudra_gpu_xid_errors_total", gpu="gpu-1", xid="13") == 1
    assert all(health == Health.HEALTHY for health, _ in h100.health().values())


def test_a_partitions_own_fault_taints_that_partition_only(h100: Node) -> None:
    gpu = h100.gpus["gpu-0"]
    with h100.session() as session:
        mig = session.create_mig_device(gpu_uuid=gpu, profile_id=9, placement_start=4)  # 3g.40gb at 4
    sim.raise_xid(state_file=h100.state_file, gpu_uuid=gpu, xid=95, gpu_instance_id=mig.gpu_instance_id)
    h100.until("the partition tainted", lambda: h100.tainted() == {"gpu-0-mig-3g40gb-4": "Xid95:NoSchedule"})
    assert h100.health()["gpu-0-mig-3g40gb-4"][0] == Health.UNHEALTHY
    assert h100.health()["gpu-0"] == (Health.HEALTHY, "")
    (posted,) = h100.events.posted
    assert posted[2].startswith(f"GPU {gpu} partition gpu-0-mig-3g40gb-4 (gpu-0): XID 95 (uncontained ECC")
    # a fault on the GPU itself then taints all of it
    sim.raise_xid(state_file=h100.state_file, gpu_uuid=gpu, xid=74)
    h100.until("all of gpu-0 tainted", lambda: set(h100.tainted()) == h100.on_gpu("gpu-0"))
    assert h100.tainted()["gpu-0-mig-3g40gb-4"] == "Xid74:NoSchedule"


def test_a_mig_configuration_change_tells_its_watchers(h100: Node) -> None:
    changed = threading.Event()
    h100.faults.subscribe_mig_change(changed.set)
    with h100.session() as session:
        session.create_mig_device(gpu_uuid=h100.gpus["gpu-4"], profile_id=19, placement_start=0)
    assert changed.wait(5)
    assert h100.sample("gpudra_gpu_events_total", gpu="gpu-4", type="mig_config_change")
    assert h100.tainted() == {}


def test_a_double_bit_error_needs_a_reset(h100: Node) -> None:
    sim.raise_double_bit_ecc(state_file=h100.state_file, gpu_uuid=h100.gpus["gpu-5"])
    h100.until("gpu-5 tainted", lambda: set(h100.tainted()) == h100.on_gpu("gpu-5"))
    h100.until("counted", lambda: h100.sample("gpudra_gpu_xid_errors_total", gpu="gpu-5", xid="48"))
    assert h100.sample("gpudra_gpu_double_bit_ecc_errors_total", gpu="gpu-5") == 1
    assert {m.xid_class for m in h100.faults.marks()} == {XidClass.RESET}


def test_the_reset_effect_option_evicts(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100", effect="NoExecute")
    try:
        node.until("watching", lambda: node.sample("gpudra_gpu_events_monitored", gpu="gpu-0") == 1)
        sim.raise_xid(state_file=node.state_file, gpu_uuid=node.gpus["gpu-0"], xid=119)
        sim.raise_xid(state_file=node.state_file, gpu_uuid=node.gpus["gpu-1"], xid=8)
        sim.raise_xid(state_file=node.state_file, gpu_uuid=node.gpus["gpu-2"], xid=79)
        node.until("all three tainted", lambda: len(node.tainted()) == len(node.on_gpu("gpu-0")) * 3)
        assert node.tainted()["gpu-0"] == "Xid119:NoExecute"
        assert node.tainted()["gpu-1"] == "Xid8:NoSchedule"  # recoverable: never evicts
        assert node.tainted()["gpu-2"] == "Xid79:NoExecute"  # a reboot: evicts as a reset does
    finally:
        node.monitor.stop()


# --- recovery ----------------------------------------------------------------------------------------


def test_a_reset_fault_stays_until_the_gpu_was_seen_gone_and_back(h100: Node) -> None:
    gpu = h100.gpus["gpu-2"]
    sim.raise_xid(state_file=h100.state_file, gpu_uuid=gpu, xid=119)
    h100.until("tainted", h100.tainted)
    time.sleep(20 * INTERVAL)  # many polls without another event: still tainted
    assert set(h100.tainted()) == h100.on_gpu("gpu-2")
    sim.set_gpu_lost(state_file=h100.state_file, gpu_uuid=gpu, lost=True)
    h100.until("unreachable seen", lambda: all(m.unreachable_seen for m in h100.faults.marks()))
    sim.set_gpu_lost(state_file=h100.state_file, gpu_uuid=gpu, lost=False)
    h100.until("lifted", lambda: h100.tainted() == {})
    assert h100.events.reasons() == ["GpuFault", "GpuFaultCleared"]
    assert h100.events.posted[-1][2] == (
        f"GPU {gpu}: taint gpudra.io/unhealthy=Xid119 lifted: a GPU reset was observed: it was unreachable "
        "and answers again"
    )


def test_a_gpu_off_the_bus_stays_tainted_after_a_reset_until_the_node_reboots(h100: Node) -> None:
    """XID 79's catalog action is RESTART_BM: the GPU seen lost and answering again keeps the taint (the
    probe's own lost-GPU taint goes); a restart under a new boot ID lifts it."""
    gpu = h100.gpus["gpu-2"]
    sim.set_gpu_lost(state_file=h100.state_file, gpu_uuid=gpu, lost=True)
    sim.raise_xid(state_file=h100.state_file, gpu_uuid=gpu, xid=79)
    h100.until("unreachable seen", lambda: [m.unreachable_seen for m in h100.faults.marks()] == [True])
    sim.set_gpu_lost(state_file=h100.state_file, gpu_uuid=gpu, lost=False)
    h100.until("answering", lambda: h100.health()["gpu-2"][1].endswith("needs a node reboot"))
    time.sleep(20 * INTERVAL)
    assert set(h100.tainted().values()) == {"Xid79:NoSchedule"}
    assert h100.events.reasons() == ["GpuFault"]
    h100.restart()  # the plugin restarted on the same boot: still there
    h100.until("the restarted monitor polled", lambda: h100.monitor.wait(after=0, timeout=5))
    assert set(h100.tainted()) == h100.on_gpu("gpu-2")
    h100.boot_id = "boot-2"
    h100.restart()
    h100.until("lifted by the reboot", lambda: h100.tainted() == {} and h100.monitor.wait(after=0, timeout=5))
    assert h100.events.posted[-1][2] == (
        f"GPU {gpu}: taint gpudra.io/unhealthy=Xid79 lifted: the node rebooted since"
    )


def test_the_operators_annotation_clears_a_reset_fault(h100: Node) -> None:
    gpu = h100.gpus["gpu-6"]
    h100.annotation = gpu  # left from an earlier clearance: it must not clear the new fault
    sim.raise_xid(state_file=h100.state_file, gpu_uuid=gpu, xid=64)
    h100.until("baseline read", lambda: [m.annotation_baseline for m in h100.faults.marks()] == [gpu])
    time.sleep(0.3)
    assert set(h100.tainted()) == h100.on_gpu("gpu-6")
    h100.annotation = ""
    h100.until("removal seen", lambda: h100.faults.marks()[0].annotation_baseline == gpu)  # unchanged
    h100.annotation = f"GPU-other,{gpu}"
    h100.until("lifted", lambda: h100.tainted() == {}, timeout=30)
    assert h100.events.posted[-1][1:] == (
        "GpuFaultCleared",
        f"GPU {gpu}: taint gpudra.io/unhealthy=Xid64 lifted: the Node's annotation "
        "gpudra.io/clear-health names it",
    )


def test_a_recoverable_fault_is_lifted_after_the_clean_time(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100", clean_seconds=0.5)
    try:
        node.until("watching", lambda: node.sample("gpudra_gpu_events_monitored", gpu="gpu-4") == 1)
        gpu = node.gpus["gpu-4"]
        sim.raise_xid(state_file=node.state_file, gpu_uuid=gpu, xid=8)  # unlisted: recoverable
        node.until("tainted", node.tainted)
        started = time.monotonic()
        sim.raise_xid(state_file=node.state_file, gpu_uuid=gpu, xid=999)  # another: the clock starts again
        node.until("lifted", lambda: node.tainted() == {})
        assert time.monotonic() - started >= 0.45
        assert node.events.reasons() == ["GpuFault", "GpuFault", "GpuFaultCleared"]
        assert node.events.posted[-1][2].endswith("lifted: no fault for 0.5 s")
    finally:
        node.monitor.stop()


def test_a_restart_keeps_the_taint_and_a_reboot_lifts_it(h100: Node) -> None:
    gpu = h100.gpus["gpu-7"]
    sim.raise_xid(state_file=h100.state_file, gpu_uuid=gpu, xid=48)
    h100.until("tainted", h100.tainted)
    saved = json.loads(h100.health_file.read_text())
    assert [(m["gpu_uuid"], m["reason"], m["xid_class"]) for m in saved["marks"]] == [(gpu, "Xid48", "reset")]
    h100.restart()
    h100.until("the restarted monitor polled", lambda: h100.monitor.wait(after=0, timeout=5))
    assert set(h100.tainted()) == h100.on_gpu("gpu-7")
    h100.boot_id = "boot-2"
    h100.restart()
    h100.until("lifted by the reboot", lambda: h100.tainted() == {} and h100.monitor.wait(after=0, timeout=5))
    assert h100.events.posted[-1][2].endswith("lifted: the node rebooted since")


def test_a_failed_remap_saved_as_reset_before_the_reboot_class_loads_as_reboot(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    mark = {
        "gpu_uuid": "GPU-x",
        "device": None,
        "reason": "RowRemapFailure",
        "xid_class": "reset",
        "what": "a row remapping failed",
        "first_seen": 1.0,
        "last_seen": 1.0,
        "boot_id": "boot-1",
    }
    saved = {
        "version": 1,
        "boot_id": "boot-1",
        "marks": [mark, {**mark, "gpu_uuid": "GPU-y", "reason": "Xid48"}],
    }
    (tmp_path / "state" / "health.json").write_text(json.dumps(saved))
    node = Node(tmp_path, "mixed")
    try:
        assert {m.gpu_uuid: m.xid_class for m in node.faults.marks()} == {
            "GPU-x": XidClass.REBOOT,
            "GPU-y": XidClass.RESET,
        }
    finally:
        node.monitor.stop()


def test_a_damaged_health_file_is_logged_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "health.json").write_text("{not json")
    node = Node(tmp_path, "mixed")
    try:
        assert node.faults.marks() == ()
        assert "GPU health file unreadable; starting without faults" in caplog.text
    finally:
        node.monitor.stop()


# --- the polling fallback ----------------------------------------------------------------------------


def test_a_gpu_without_events_is_polled_and_said_so_once(tmp_path: Path) -> None:
    node = Node(tmp_path, "no-sharing")
    try:
        node.until("said", lambda: node.events.reasons() == ["GpuEventsUnsupported"])
        gpu = node.gpus["gpu-0"]
        assert node.events.posted[0][2] == (
            f"GPUs gpu-0 ({gpu}) offer no NVML XID events (NOT_SUPPORTED): their XIDs are not seen; gpudra "
            "polls them for a lost GPU and for double-bit ECC errors at each health check instead"
        )
        assert node.sample("gpudra_gpu_events_monitored", gpu="gpu-0") == 0
        assert node.faults.ecc_polled() == (gpu,)
        sim.raise_xid(state_file=node.state_file, gpu_uuid=gpu, xid=79)  # not seen: no event offered
        time.sleep(10 * INTERVAL)
        assert node.tainted() == {}
        sim.raise_double_bit_ecc(state_file=node.state_file, gpu_uuid=gpu)  # seen by the poll
        node.until("tainted by the poll", lambda: set(node.tainted().values()) == {"DoubleBitEcc:NoSchedule"})
        assert node.sample("gpudra_gpu_double_bit_ecc_errors_total", gpu="gpu-0") == 1
        sim.set_gpu_lost(state_file=node.state_file, gpu_uuid=gpu, lost=True)  # the probe sees a lost GPU
        node.until("lost", lambda: node.health()["gpu-0"][1] == f"GPU {gpu}: NVMLError_GpuIsLost")
        sim.set_gpu_lost(state_file=node.state_file, gpu_uuid=gpu, lost=False)
        node.until("back, and the reset lifts the mark", lambda: node.tainted() == {})
        node.restart()  # a restart reads the count where it was: no new error
        # Once per start: waited for, as the restarted watcher says it when its loop first runs.
        node.until("said again", lambda: node.events.reasons().count("GpuEventsUnsupported") == 2)
        time.sleep(10 * INTERVAL)
        assert node.tainted() == {}
        assert node.events.reasons().count("GpuEventsUnsupported") == 2  # once per start
    finally:
        node.monitor.stop()


# --- the options -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "--health-xids=79=fatal",
            "--health-xids: '79=fatal' is not comma-separated <xid>=<class> or default=<class>, class one "
            "of ignore, recoverable, reset",
        ),
        ("--health-recovery-seconds=soon", "--health-recovery-seconds: 'soon' is not a number of seconds"),
    ],
)
def test_a_bad_health_option_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], option: str, message: str
) -> None:
    code = cli.main(["kubelet-plugin", "--node-name=node-a", "--nvml=sim:mixed", option])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1
    assert message in err


def test_the_reset_effect_option_names_its_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["kubelet-plugin", "--node-name=node-a", "--health-reset-effect=Evict"]) == 2
    assert "--health-reset-effect: 'Evict' is not one of NoSchedule, NoExecute" in capsys.readouterr().err


# --- conditions the poll reads -----------------------------------------------------------------------


def test_a_pending_row_remap_taints_the_gpu_until_a_reset_applies_it(h100: Node) -> None:
    gpu = h100.gpus["gpu-2"]
    h100.holders[gpu] = ["team-a/train"]
    sim.set_memory_condition(state_file=h100.state_file, gpu_uuid=gpu, condition="row-remap-pending", on=True)
    h100.until("tainted", h100.tainted)
    assert h100.tainted() == {name: "RowRemapPending:NoSchedule" for name in h100.on_gpu("gpu-2")}
    assert h100.sample("gpudra_gpu_condition", gpu="gpu-2", condition="RowRemapPending") == 1
    assert h100.sample("gpudra_gpu_condition", gpu="gpu-3", condition="RowRemapPending") == 0
    time.sleep(20 * INTERVAL)  # read again and again: one fault, one event
    assert h100.events.posted == [
        (
            "Warning",
            "GpuFault",
            f"GPU {gpu} (gpu-2): a row remapping is pending: the GPU needs a reset to apply it, class reset; "
            "tainted gpudra.io/unhealthy=RowRemapPending:NoSchedule until a GPU reset is observed, the node "
            f"reboots, or the Node is annotated gpudra.io/clear-health={gpu}; held by claim team-a/train",
        )
    ]
    assert h100.sample("gpudra_gpu_double_bit_ecc_errors_total", gpu="gpu-2") is None  # not an ECC error
    sim.set_memory_condition(
        state_file=h100.state_file, gpu_uuid=gpu, condition="row-remap-pending", on=False
    )
    h100.until("lifted", lambda: h100.tainted() == {})
    assert h100.events.posted[-1][1:] == (
        "GpuFaultCleared",
        f"GPU {gpu}: taint gpudra.io/unhealthy=RowRemapPending lifted: the pending row remapping was "
        "applied: the GPU was reset",
    )
    assert h100.sample("gpudra_gpu_condition", gpu="gpu-2", condition="RowRemapPending") == 0


def test_a_condition_gone_does_not_lift_a_fault_that_came_after_it(h100: Node) -> None:
    gpu = h100.gpus["gpu-1"]
    sim.set_memory_condition(state_file=h100.state_file, gpu_uuid=gpu, condition="row-remap-pending", on=True)
    h100.until("tainted", h100.tainted)
    sim.raise_xid(state_file=h100.state_file, gpu_uuid=gpu, xid=48)
    h100.until("the XID recorded", lambda: h100.events.reasons() == ["GpuFault", "GpuFault"])
    sim.set_memory_condition(
        state_file=h100.state_file, gpu_uuid=gpu, condition="row-remap-pending", on=False
    )
    h100.until(
        "read gone",
        lambda: h100.sample("gpudra_gpu_condition", gpu="gpu-1", condition="RowRemapPending") == 0,
    )
    time.sleep(10 * INTERVAL)
    assert set(h100.tainted()) == h100.on_gpu("gpu-1")


def test_a_failed_row_remap_survives_a_reset_and_yields_to_the_annotation(h100: Node) -> None:
    gpu = h100.gpus["gpu-5"]
    sim.set_memory_condition(state_file=h100.state_file, gpu_uuid=gpu, condition="row-remap-failed", on=True)
    h100.until("tainted", h100.tainted)
    assert set(h100.tainted().values()) == {"RowRemapFailure:NoSchedule"}
    assert (
        "class reboot; tainted gpudra.io/unhealthy=RowRemapFailure:NoSchedule until the node reboots (a "
        "GPU reset does not lift it)" in h100.events.posted[0][2]
    )
    sim.set_gpu_lost(state_file=h100.state_file, gpu_uuid=gpu, lost=True)
    h100.until("unreachable seen", lambda: all(m.unreachable_seen for m in h100.faults.marks()))
    sim.set_gpu_lost(state_file=h100.state_file, gpu_uuid=gpu, lost=False)
    h100.until("answering again", lambda: gpu not in h100.monitor.unhealthy_gpus())
    time.sleep(10 * INTERVAL)
    assert set(h100.tainted()) == h100.on_gpu("gpu-5")  # the memory still cannot be repaired
    h100.until("baseline read", lambda: [m.annotation_baseline for m in h100.faults.marks()] == [""])
    h100.annotation = gpu
    h100.until("lifted", lambda: h100.tainted() == {}, timeout=30)
    time.sleep(10 * INTERVAL)
    assert h100.tainted() == {}  # still read, but no new fault: the operator's word holds until a reboot
    assert h100.events.reasons() == ["GpuFault", "GpuFaultCleared"]


def test_an_nvlink_that_was_up_and_is_down_taints_until_it_trains_again(h100: Node) -> None:
    gpu = h100.gpus["gpu-4"]
    h100.until(
        "links read", lambda: h100.sample("gpudra_gpu_condition", gpu="gpu-4", condition="NvLinkDown") == 0
    )
    sim.set_nvlink_down(state_file=h100.state_file, gpu_uuid=gpu, link=3, down=True)
    h100.until("tainted", h100.tainted)
    assert set(h100.tainted().values()) == {"NvLinkDown:NoSchedule"}
    assert "NVLink 3 down (was up)" in h100.events.posted[0][2]
    h100.restart()  # the expected links and the condition are kept: no second event
    h100.until("the restarted monitor polled", lambda: h100.monitor.wait(after=0, timeout=5))
    time.sleep(10 * INTERVAL)
    assert h100.events.reasons() == ["GpuFault"]
    sim.set_nvlink_down(state_file=h100.state_file, gpu_uuid=gpu, link=3, down=False)
    h100.until("lifted", lambda: h100.tainted() == {})
    assert h100.events.posted[-1][2].endswith("lifted: every NVLink that was up is up again")


def test_retired_pages_pending_on_a_gpu_before_ampere(tmp_path: Path) -> None:
    node = Node(tmp_path, "mixed")
    try:
        t4 = next(name for name, uuid in node.gpus.items() if name in ("gpu-4", "gpu-5"))
        gpu = node.gpus[t4]
        node.until(
            "read", lambda: node.sample("gpudra_gpu_condition", gpu=t4, condition="RetiredPagesPending") == 0
        )
        assert (
            node.sample("gpudra_gpu_condition", gpu=t4, condition="RowRemapPending") is None
        )  # not reported
        sim.set_memory_condition(
            state_file=node.state_file, gpu_uuid=gpu, condition="retired-pages-pending", on=True
        )
        node.until("tainted", node.tainted)
        assert node.tainted() == {name: "RetiredPagesPending:NoSchedule" for name in node.on_gpu(t4)}
        sim.set_gpu_lost(state_file=node.state_file, gpu_uuid=gpu, lost=True)  # the reset applies it
        node.until("unreachable seen", lambda: all(m.unreachable_seen for m in node.faults.marks()))
        sim.set_gpu_lost(state_file=node.state_file, gpu_uuid=gpu, lost=False)
        node.until("lifted", lambda: node.tainted() == {})
        time.sleep(10 * INTERVAL)
        assert node.events.reasons() == ["GpuFault", "GpuFaultCleared"]
    finally:
        node.monitor.stop()


def test_corrected_ecc_and_mig_changes_are_counted_and_slowdowns_shown_never_tainting(h100: Node) -> None:
    gpu = h100.gpus["gpu-0"]
    sim.raise_single_bit_ecc(state_file=h100.state_file, gpu_uuid=gpu)
    sim.raise_single_bit_ecc(state_file=h100.state_file, gpu_uuid=gpu)
    h100.until(
        "counted", lambda: h100.sample("gpudra_gpu_events_total", gpu="gpu-0", type="single_bit_ecc") == 2
    )
    with h100.session() as session:
        session.set_mig_mode(gpu_uuid=h100.gpus["gpu-6"], enabled=True)
        made = session.create_mig_device(gpu_uuid=h100.gpus["gpu-6"], profile_id=0, placement_start=0)
        session.destroy_mig_device(gpu_uuid=h100.gpus["gpu-6"], gpu_instance_id=made.gpu_instance_id)
    h100.until(
        "MIG changes counted",
        lambda: h100.sample("gpudra_gpu_events_total", gpu="gpu-6", type="mig_config_change") == 2,
    )
    sim.set_clock_slowdown(state_file=h100.state_file, gpu_uuid=gpu, reasons=["hw_thermal_slowdown"])
    h100.until(
        "slowdown shown",
        lambda: h100.sample("gpudra_gpu_clock_slowdown", gpu="gpu-0", reason="hw_thermal_slowdown") == 1,
    )
    assert h100.sample("gpudra_gpu_clock_slowdown", gpu="gpu-0", reason="sw_power_cap") == 0
    sim.set_clock_slowdown(state_file=h100.state_file, gpu_uuid=gpu, reasons=[])
    h100.until(
        "slowdown gone",
        lambda: h100.sample("gpudra_gpu_clock_slowdown", gpu="gpu-0", reason="hw_thermal_slowdown") == 0,
    )
    assert h100.tainted() == {} and h100.events.posted == []


# --- two instances on a node (a rolling update) -----------------------------------------------------


def wait_for(what: str, done: Callable[[], object], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def health_file_marks(state_dir: Path) -> list[str]:
    """The reasons of the marks in health.json (which must parse)."""
    return sorted(m["reason"] for m in json.loads((state_dir / "health.json").read_text())["marks"])


@pytest.fixture
def machine(tmp_path: Path) -> tuple[Path, Path]:
    """A simulated DGX H100's state file and a plugin state directory, both instances' to share."""
    (tmp_path / "sim").mkdir()
    (tmp_path / "state").mkdir()
    return tmp_path / "sim" / "machine.json", tmp_path / "state"


def test_two_instances_post_one_event_per_fault_and_keep_one_health_file(machine: tuple[Path, Path]) -> None:
    """Both see every NVML event; only the one in its publisher turn posts, counts and writes, the other
    follows the file (its kubelet health shows the same marks), and takes over from the file as the
    old one left it."""
    sim_state, state_dir = machine
    old = Instance("dgx-h100", sim_state, state_dir)
    old.start()
    new = None
    try:
        wait_for("the old instance records", old.watching)
        new = Instance("dgx-h100", sim_state, state_dir)
        new.start()
        time.sleep(0.3)
        assert new.turn.standing_by and not new.watching()
        gpu3 = old.gpus["gpu-3"]
        sim.raise_xid(state_file=sim_state, gpu_uuid=gpu3, xid=79)
        wait_for("both taint gpu-3", lambda: old.tainted() and new.tainted() == old.tainted())
        time.sleep(0.5)  # room for a second event
        assert len(old.faults_posted()) == 1 and new.events.posted == []
        assert old.metrics.registry.get_sample_value(
            "gpudra_gpu_xid_errors_total", {"gpu": "gpu-3", "xid": "79"}
        )
        assert (
            new.metrics.registry.get_sample_value(
                "gpudra_gpu_xid_errors_total", {"gpu": "gpu-3", "xid": "79"}
            )
            is None
        )
        assert health_file_marks(state_dir) == ["Xid79"]

        # The update ends as the plugin stops: the turn first; the old monitor runs a moment longer.
        old.turn.stop(5)
        wait_for("the new instance records", new.watching)
        sim.raise_xid(state_file=sim_state, gpu_uuid=old.gpus["gpu-5"], xid=48)
        wait_for("gpu-5 tainted", lambda: any(v == "Xid48:NoSchedule" for v in new.tainted().values()))
        new.annotation = gpu3  # the operator clears gpu-3: the old instance must not write its mark back
        wait_for("gpu-3 cleared", lambda: health_file_marks(state_dir) == ["Xid48"])
        time.sleep(0.5)
        assert health_file_marks(state_dir) == ["Xid48"]
        assert not any(v.startswith("Xid79") for v in old.tainted().values())  # the old one follows
        assert len(old.faults_posted()) == 1 and len(new.faults_posted()) == 1
        assert new.events.reasons() == ["GpuFault", "GpuFaultCleared"]
    finally:
        old.stop()
        if new is not None:
            new.stop()


def test_a_writer_killed_between_saving_a_fault_and_posting_it_leaves_the_mark_to_its_successor(
    machine: tuple[Path, Path],
) -> None:
    """SIGKILL at the worst moment: the fault is in the file, its event not posted. The instance
    standing by takes the turn with the mark (the taint stays), posts nothing for it (at most once),
    and records the next fault once."""
    sim_state, state_dir = machine
    Instance("dgx-h100", sim_state, state_dir)  # the machine's state file, before two processes use it
    command = [
        sys.executable,
        "-m",
        "tests.unit.harness.gpu_faults",
        "dgx-h100",
        str(sim_state),
        str(state_dir),
    ]
    (step,) = faults.HEALTH_STEPS
    env = {**os.environ, "GPUDRA_CRASH_AT": step}
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        survivor = Instance("dgx-h100", sim_state, state_dir)
        survivor.start()
        try:
            time.sleep(0.3)
            assert survivor.turn.standing_by
            sim.raise_xid(state_file=sim_state, gpu_uuid=survivor.gpus["gpu-3"], xid=79)
            assert child.wait(10) == -signal.SIGKILL
            wait_for("the survivor records", survivor.watching)
            assert health_file_marks(state_dir) == ["Xid79"]
            wait_for("gpu-3 still tainted", lambda: "gpu-3" in survivor.tainted())
            assert survivor.events.posted == []
            sim.raise_xid(state_file=sim_state, gpu_uuid=survivor.gpus["gpu-4"], xid=48)
            wait_for("gpu-4 tainted", lambda: "gpu-4" in survivor.tainted())
            time.sleep(0.3)
            (posted,) = survivor.faults_posted()
            assert "XID 48" in posted and "(gpu-4)" in posted
            assert health_file_marks(state_dir) == ["Xid48", "Xid79"]
        finally:
            survivor.stop()
