"""MpsKeeper: the MPS daemons of prepared claims are started again while the plugin runs.

On a simulated node whose stand-in `nvidia-cuda-mps-control` runs real daemon processes: a daemon is
killed with SIGKILL (the pid in its pid file), as when the plugin pod it lived in is deleted by a rolling
update, and the keeper's round must start it again with the claim's limits, and nothing else.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpudra.errors import HardwareError
from gpudra.gpu.tools import MPS_CONTROL, GpuTools
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import ClaimRef
from gpudra.node.metrics import PluginMetrics
from gpudra.node.mps_keeper import MpsKeeper, TamperingReports
from gpudra.node.prepare import DeviceState
from gpudra.node.sharing import SharingCoordinator, mps_daemons
from gpudra.node.sharing.mps_daemons import PID_FILE, TAMPERING_KINDS
from tests.unit.claims import from_claim, resource_claim, result, time_slicing, whole_gpus
from tests.unit.harness.crash import child
from tests.unit.harness.kube import Events
from tests.unit.harness.mps import (
    alive,
    assert_no_daemon,
    daemon_of,
    daemons,
    kill_leftover_daemons,  # noqa: F401 (an autouse fixture: every test kills what it left)
    mps_claim,
    mps_config,
    mps_root,
)
from tests.unit.harness.node import Node, uid
from tests.unit.harness.tools import counting_tools

INTERVAL = 5.0


def keeper_for(
    state: DeviceState, events: Events, interval: float = INTERVAL
) -> tuple[MpsKeeper, PluginMetrics]:
    metrics = PluginMetrics()
    return MpsKeeper(state, interval=interval, metrics=metrics, events=events), metrics


def restarts(metrics: PluginMetrics, outcome: str) -> float | None:
    return metrics.registry.get_sample_value("gpudra_mps_daemon_restarts_total", {"outcome": outcome})


def kill_daemon(node: Node, claim_uid: str) -> int:
    """SIGKILL the claim's daemon, by the pid in its pid file, and wait until it is gone."""
    pid = int((mps_root(node, claim_uid) / "pipe" / PID_FILE).read_text())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, f"daemon {pid} still alive after SIGKILL"
        time.sleep(0.02)
    return pid


@pytest.fixture
def h100(tmp_path: Path) -> Node:
    return Node(tmp_path, "dgx-h100")


def test_a_killed_daemon_runs_again_with_its_limits_after_one_round(h100: Node) -> None:
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-2", config=[from_claim(mps_config(40, "10Gi"))]))
    other = h100.claims.add(mps_claim(uid(2), "gpu-3", threads=20))
    state = h100.state()
    state.prepare(claim)
    state.prepare(other)
    kept = next(d.pid for d in daemons(h100) if d.pipe_directory == str(mps_root(h100, uid(2)) / "pipe"))
    killed = kill_daemon(h100, uid(1))
    events = Events()
    keeper, metrics = keeper_for(state, events)

    assert keeper.step() == INTERVAL
    gpu = h100.uuid(2)
    [restarted] = [d for d in daemons(h100) if d.pipe_directory == str(mps_root(h100, uid(1)) / "pipe")]
    assert restarted.pid != killed
    assert restarted.visible_devices == gpu
    assert restarted.default_active_thread_percentage == 40.0
    assert restarted.default_pinned_memory_limits == {gpu: "10240M"}
    assert kept in [d.pid for d in daemons(h100)]  # the claim whose daemon answered is left as it is
    assert restarts(metrics, "started") == 1 and restarts(metrics, "failed") == 0
    [(kind, reason, message)] = events.posted
    assert (kind, reason) == ("Warning", "MpsDaemonRestarted")
    assert f"ResourceClaim default/claim-{uid(1)} ({uid(1)})" in message
    assert h100.entries()[uid(1)].state == "PrepareCompleted"

    keeper.step()  # it answers now: nothing more
    assert restarts(metrics, "started") == 1 and len(events.posted) == 1
    # Its clients lost their server: the GPU the claim holds alone is Unhealthy for the kubelet.
    [(device, why)] = keeper.interrupted_devices().items()
    assert device == "gpu-2"
    assert why.startswith(
        f"the MPS control daemon of ResourceClaim default/claim-{uid(1)} ({uid(1)}) stopped"
    )
    assert why.endswith("lost their MPS server; a new pod gets a working device")

    state.unprepare(claim)  # stops exactly the restarted daemon
    assert_no_daemon(h100, uid(1), [killed, restarted.pid])
    h100.assert_nothing_left(uid(1))
    assert keeper.interrupted_devices() == {}  # the claim is gone, and its report with it
    state.unprepare(other)
    assert_no_daemon(h100, uid(2), [kept])


def test_only_the_mps_gpu_of_a_claim_that_also_time_slices_one_is_flagged(h100: Node) -> None:
    claim = h100.claims.add(
        resource_claim(
            uid(1),
            results=[result("sliced", "gpu-2"), result("mps", "gpu-3")],
            config=[from_claim(time_slicing("Long"), "sliced"), from_claim(mps_config(30), "mps")],
        )
    )
    state = h100.state()
    state.prepare(claim)
    kill_daemon(h100, uid(1))
    keeper, metrics = keeper_for(state, Events())
    keeper.step()
    assert restarts(metrics, "started") == 1
    assert list(keeper.interrupted_devices()) == ["gpu-3"]
    state.unprepare(claim)


def test_a_restarted_daemon_of_a_share_flags_no_device_health(h100: Node) -> None:
    """A shared device serves other tenants' claims too: their pods' health must not change."""
    share = {
        **result("gpu", "gpu-0-shared"),
        "shareID": "5f0c3a8e-1b2d-4c6e-8f90-a1b2c3d4e5f6",
        "consumedCapacity": {"memory": "10Gi", "compute": "10"},
    }
    claim = h100.claims.add(resource_claim(uid(1), results=[share]))
    state = h100.state()
    state.prepare(claim)
    kill_daemon(h100, uid(1))
    events = Events()
    keeper, metrics = keeper_for(state, events)
    woken: list[bool] = []
    keeper.on_interrupted = lambda: woken.append(True)
    keeper.step()
    assert restarts(metrics, "started") == 1
    assert keeper.interrupted_devices() == {} and woken == []
    state.unprepare(claim)


@pytest.mark.parametrize(
    ("action", "step", "state"),
    [
        ("prepare", "prepare-mps-started", "PrepareStarted"),
        ("unprepare", "unprepare-started", "UnprepareStarted"),
    ],
)
def test_a_claim_being_prepared_or_unprepared_is_left_alone(
    h100: Node, action: str, step: str, state: str
) -> None:
    """Another instance (a process here) stopped mid-call: its entry is not PrepareCompleted, so its
    daemon is not this keeper's to start; that call's retry or a recovery settles it."""
    claim = h100.claims.add(mps_claim(uid(1), "gpu-2"))
    plugin = h100.state()
    if action == "unprepare":
        plugin.prepare(claim)
    crashed = child(h100, action, claim, step)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert h100.entries()[uid(1)].state == state
    killed = kill_daemon(h100, uid(1))
    tools = counting_tools(h100)
    plugin.sharing = SharingCoordinator(tools, mps_root=h100.root / "mps")
    events = Events()
    keeper, metrics = keeper_for(plugin, events)

    keeper.step()
    assert tools.runs == []
    assert [d.pid for d in daemons(h100) if alive(d.pid)] == []
    assert events.posted == [] and restarts(metrics, "started") == 0
    assert h100.entries()[uid(1)].state == state
    h100.state()  # the restart settles it, with no daemon left
    assert_no_daemon(h100, uid(1), [killed])


class UnpreparedMeanwhile(SharingCoordinator):
    """SharingCoordinator that, once armed, lets another instance unprepare the claim right after the keeper's
    check found its daemon gone, before the keeper takes the node lock."""

    def __init__(self, tools: GpuTools, *, mps_root: Path, node: Node) -> None:
        super().__init__(tools, mps_root=mps_root)
        self.node = node
        self.armed: ClaimRef | None = None  # the claim to unprepare at the next check

    def answers(self, entry: ckpt.ClaimEntry) -> bool:
        answered = super().answers(entry)
        if self.armed is not None:
            claim, self.armed = self.armed, None
            self.node.state().unprepare(claim)
        return answered


def test_a_claim_the_other_instance_unprepared_meanwhile_is_not_started_again(h100: Node) -> None:
    sharing = UnpreparedMeanwhile(h100.tools, mps_root=h100.root / "mps", node=h100)
    claim = h100.claims.add(mps_claim(uid(1), "gpu-2"))
    state = h100.state(sharing=sharing)
    state.prepare(claim)
    killed = kill_daemon(h100, uid(1))
    sharing.armed = claim
    events = Events()
    keeper, metrics = keeper_for(state, events)

    keeper.step()
    assert sharing.armed is None  # the other instance did unprepare in between
    assert_no_daemon(h100, uid(1), [killed])
    h100.assert_nothing_left(uid(1))
    assert events.posted == [] and restarts(metrics, "started") == 0


def test_no_claim_with_mps_runs_no_tool(h100: Node) -> None:
    tools = counting_tools(h100)
    state = h100.state(sharing=SharingCoordinator(tools, mps_root=h100.root / "mps"))
    keeper, metrics = keeper_for(state, Events())
    keeper.step()  # nothing prepared
    state.prepare(h100.claims.add(whole_gpus(uid(1), "gpu-0")))
    state.prepare(h100.claims.add(whole_gpus(uid(2), "gpu-1", config=[from_claim(time_slicing("Long"))])))
    tools.runs.clear()

    for _ in range(3):
        assert keeper.step() == INTERVAL
    assert tools.runs == []
    assert restarts(metrics, "started") == 0


def test_a_failed_restart_is_counted_reported_once_and_retried(h100: Node) -> None:
    tools = counting_tools(h100)
    state = h100.state(sharing=SharingCoordinator(tools, mps_root=h100.root / "mps"))
    claim = h100.claims.add(mps_claim(uid(1), "gpu-2", threads=30))
    state.prepare(claim)
    killed = kill_daemon(h100, uid(1))
    tools.refuse_start = True
    events = Events()
    keeper, metrics = keeper_for(state, events)

    for attempt in (1, 2):
        with pytest.raises(HardwareError) as raised:
            keeper.step()
        assert str(raised.value) == (
            f"cannot start again the MPS daemon of ResourceClaim default/claim-{uid(1)} ({uid(1)}): "
            f"{MPS_CONTROL} -d failed (1): MPS control daemon: cannot start"
        )
        assert restarts(metrics, "failed") == attempt
    assert events.reasons() == ["MpsDaemonRestartFailed"]  # once per failing streak, not per attempt
    assert h100.entries()[uid(1)].state == "PrepareCompleted"  # the claim stays prepared

    tools.refuse_start = False
    keeper.step()
    [daemon] = daemons(h100)
    assert daemon.pid != killed and daemon.default_active_thread_percentage == 30.0
    assert restarts(metrics, "started") == 1
    assert events.reasons() == ["MpsDaemonRestartFailed", "MpsDaemonRestarted"]
    state.unprepare(claim)
    assert_no_daemon(h100, uid(1), [killed, daemon.pid])


def test_the_loop_logs_a_failed_restart_and_retries_until_the_daemon_runs(
    h100: Node, caplog: pytest.LogCaptureFixture
) -> None:
    tools = counting_tools(h100)
    state = h100.state(sharing=SharingCoordinator(tools, mps_root=h100.root / "mps"))
    claim = h100.claims.add(mps_claim(uid(1), "gpu-2"))
    state.prepare(claim)
    kill_daemon(h100, uid(1))
    tools.refuse_start = True
    keeper, metrics = keeper_for(state, Events(), interval=0.05)
    keeper.start()
    try:
        deadline = time.monotonic() + 30
        while keeper.loop.failures < 2:
            assert time.monotonic() < deadline, "the loop did not retry"
            time.sleep(0.02)
        tools.refuse_start = False
        while restarts(metrics, "started") != 1:
            assert time.monotonic() < deadline, "the daemon was not started again"
            time.sleep(0.02)
    finally:
        keeper.stop(10)
    assert keeper.loop.alive is False and keeper.loop.last_error is None
    assert [r.getMessage() for r in caplog.records if r.name == "gpudra.runtime.service"][:1] == [
        "background step failed; retrying"
    ]
    assert len(daemons(h100)) == 1
    state.unprepare(claim)


# --- what a tenant's containers do to the pipe directory they mount read-write (issue 29) -------------


def reporting(node: Node, tools: GpuTools | None = None) -> tuple[DeviceState, PluginMetrics, Events]:
    """A state whose tampering reports go where the plugin's go (TamperingReports), and those."""
    metrics, events = PluginMetrics(), Events()
    reports = TamperingReports(metrics=metrics, events=events)
    sharing = SharingCoordinator(tools or node.tools, mps_root=node.root / "mps", on_tampering=reports)
    state = node.state(sharing=sharing)
    reports.claims = lambda: state.store.current.claims
    return state, metrics, events


def tampering(metrics: PluginMetrics) -> dict[str, float]:
    counted = {
        kind: metrics.registry.get_sample_value("gpudra_mps_tampering_total", {"kind": kind})
        for kind in TAMPERING_KINDS
    }
    return {kind: value for kind, value in counted.items() if value}


def test_a_deleted_pid_file_is_no_stopped_daemon_and_is_reported_at_unprepare(h100: Node) -> None:
    """The keeper used to find the daemon gone and fail to start another ("already running") forever,
    and unprepare left the daemon running."""
    tools = counting_tools(h100)
    state, metrics, events = reporting(h100, tools)
    claim = h100.claims.add(mps_claim(uid(1), "gpu-2"))
    state.prepare(claim)
    [daemon] = daemons(h100)
    (mps_root(h100, uid(1)) / "pipe" / PID_FILE).unlink()
    keeper = MpsKeeper(state, interval=INTERVAL, metrics=metrics, events=events)
    tools.runs.clear()

    for _ in range(2):
        assert keeper.step() == INTERVAL  # it runs: nothing to start, nothing failed
    assert tools.runs == []  # found in /proc: no tool run, nothing read in the pipe directory
    assert [d.pid for d in daemons(h100)] == [daemon.pid]
    assert restarts(metrics, "started") == 0 and restarts(metrics, "failed") == 0

    state.unprepare(claim)
    assert_no_daemon(h100, uid(1), [daemon.pid])
    assert tampering(metrics) == {"pid-file-removed": 1.0}
    [(kind, reason, message)] = events.posted
    assert (kind, reason) == ("Warning", "MpsTampering")
    assert message.startswith(
        f"a container changed the MPS pipe directory of ResourceClaim default/claim-{uid(1)} ({uid(1)}) "
        "(pid-file-removed): "
    )
    assert f"stopped the daemon it started, pid {daemon.pid}" in message


def test_a_daemon_quit_by_its_tenant_is_started_again_in_a_cleared_directory(h100: Node) -> None:
    """The tenant quits its own daemon and links the control socket to another claim's daemon: the
    restart sends its limits to its new daemon only, whose directory it cleared first."""
    state, metrics, events = reporting(h100)
    attacker = h100.claims.add(mps_claim(uid(1), "gpu-2", threads=40))
    victim = h100.claims.add(mps_claim(uid(2), "gpu-3", threads=20))
    state.prepare(attacker)
    state.prepare(victim)
    quit_by_tenant = daemon_of(h100, uid(1)).pid
    pipe = mps_root(h100, uid(1)) / "pipe"
    h100.tools.mps_control(["quit"], pipe_dir=pipe)  # any MPS client may send it
    while alive(quit_by_tenant):
        time.sleep(0.02)
    (pipe / "control").symlink_to(mps_root(h100, uid(2)) / "pipe" / "control")
    (pipe / PID_FILE).write_text(f"{daemon_of(h100, uid(2)).pid}\n")
    keeper = MpsKeeper(state, interval=INTERVAL, metrics=metrics, events=events)

    keeper.step()
    restarted, other = daemon_of(h100, uid(1)), daemon_of(h100, uid(2))
    assert restarted.pid != quit_by_tenant and restarted.default_active_thread_percentage == 40.0
    assert other.default_active_thread_percentage == 20.0  # the victim's limits are its own
    assert (pipe / "control").is_socket() and not (pipe / "control").is_symlink()
    assert events.reasons() == ["MpsDaemonRestarted"] and tampering(metrics) == {}
    state.unprepare(attacker)
    assert_no_daemon(h100, uid(1), [quit_by_tenant, restarted.pid])
    assert daemon_of(h100, uid(2)).pid == other.pid
    state.unprepare(victim)


class RacingTenant(GpuTools):
    """The simulator's tools, and a tenant who links the control socket of a daemon just started to
    another claim's, before the plugin sends it its limits (once armed)."""

    def __init__(self, search_path: str, *, link_to: Path) -> None:
        super().__init__(search_path=search_path)
        self.link_to = link_to
        self.armed = False

    def start_mps_daemon(self, *, env: Mapping[str, str]) -> None:
        super().start_mps_daemon(env=env)
        if self.armed:
            control = Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / "control"
            control.unlink()
            control.symlink_to(self.link_to)


def test_a_daemon_that_cannot_be_given_its_limits_is_not_left_running_without_them(h100: Node) -> None:
    tools = RacingTenant(h100.tools.search_path, link_to=mps_root(h100, uid(2)) / "pipe" / "control")
    state, metrics, events = reporting(h100, tools)
    attacker = h100.claims.add(mps_claim(uid(1), "gpu-2", threads=40))
    victim = h100.claims.add(mps_claim(uid(2), "gpu-3", threads=20))
    state.prepare(attacker)
    state.prepare(victim)
    killed = kill_daemon(h100, uid(1))
    other = daemon_of(h100, uid(2)).pid
    keeper = MpsKeeper(state, interval=INTERVAL, metrics=metrics, events=events)

    tools.armed = True
    with pytest.raises(HardwareError, match="not the daemon's control socket; gpudra sent it nothing"):
        keeper.step()
    assert [d.pipe_directory for d in daemons(h100)] == [str(mps_root(h100, uid(2)) / "pipe")]
    assert daemon_of(h100, uid(2)).default_active_thread_percentage == 20.0
    assert tampering(metrics) == {"control-replaced": 1.0} and restarts(metrics, "failed") == 1
    assert events.reasons() == ["MpsTampering", "MpsDaemonRestartFailed"]

    tools.armed = False
    keeper.step()  # the next round starts it, with its limits
    restarted = daemon_of(h100, uid(1))
    assert restarted.pid != killed and restarted.default_active_thread_percentage == 40.0
    state.unprepare(attacker)
    assert_no_daemon(h100, uid(1), [killed, restarted.pid])
    assert daemon_of(h100, uid(2)).pid == other
    state.unprepare(victim)


def test_a_restart_clears_a_flooded_pipe_directory_within_a_bound(
    h100: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's files in its pipe directory (its containers' mount, so cleared in place, under the
    node lock): a restart removes the daemon's own leftovers first and a bounded number of the rest, so
    the daemon runs again at once; the rest stays until unprepare (the trash); nothing outside is
    touched."""
    monkeypatch.setattr(mps_daemons, "_RESTART_CLEAR_BUDGET", 100)
    claim = h100.claims.add(mps_claim(uid(1), "gpu-2", threads=30))
    state = h100.state()
    state.prepare(claim)
    pipe = mps_root(h100, uid(1)) / "pipe"
    outside = pipe.parent.parent / "not-the-tenants"
    outside.write_text("kept")
    for index in range(250):
        (pipe / f"junk-{index}").write_text("")
    (pipe / "deep").mkdir()
    (pipe / "deep" / "escape").symlink_to(outside)
    kill_daemon(h100, uid(1))  # its pid file and control socket stay behind
    keeper, metrics = keeper_for(state, Events())

    keeper.step()
    [restarted] = [d for d in daemons(h100) if d.pipe_directory == str(pipe)]
    assert restarted.default_active_thread_percentage == 30.0
    junk = [p for p in pipe.iterdir() if p.name.startswith(("junk-", "deep"))]
    assert len(junk) == 251 - 100  # the budget, after the daemon's own pid file and socket
    assert outside.read_text() == "kept"
    assert restarts(metrics, "started") == 1
    state.unprepare(claim)
