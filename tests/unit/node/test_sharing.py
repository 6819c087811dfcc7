"""SharingCoordinator and GpuTools: what a claim's sharing config does to a simulated GPU, tool failures."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from gpudra import sim
from gpudra.api import API_VERSION, GpuConfig, decode_config
from gpudra.errors import ConfigError, HardwareError, NvmlUnavailable
from gpudra.gpu.tools import GpuTools
from gpudra.model.inventory import Gpu
from gpudra.node import checkpoint as ckpt
from gpudra.node import gpu_driver
from gpudra.node.allocation import ResolvedDevice
from gpudra.node.sharing import SharingCoordinator, mps_processes
from gpudra.node.sharing.mps_daemons import Daemon
from gpudra.node.sharing.mps_processes import DaemonMark
from gpudra.sim import state as sim_state
from tests.unit.claims import mps, time_slicing

CONFIG_FIELD = "status.allocation.devices.config[2].opaque.parameters"
UID = "00000000-0000-4000-8000-000000000001"
SHARE = "5f0c3a8e-1b2d-4c6e-8f90-a1b2c3d4e5f6"
OTHER_SHARE = "6a1d4b9f-2c3e-4d7f-9a01-b2c3d4e5f6a7"


def mps_limits(*, threads: int | None = None, memory: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if threads is not None:
        config["defaultActiveThreadPercentage"] = threads
    if memory is not None:
        config["defaultPinnedDeviceMemoryLimit"] = memory
    return {
        "apiVersion": API_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": config},
    }


@pytest.fixture
def machine(tmp_path: Path) -> tuple[list[Gpu], GpuTools, sim_state.StateFile]:
    state_file = tmp_path / "machine.json"
    with gpu_driver.connect("sim:dgx-h100", state_file=state_file) as session:
        gpus = list(session.inventory().gpus)
    tools = GpuTools.with_directory_first(sim.write_tools(tmp_path / "bin", state_file=state_file))
    store = sim_state.StateFile(state_file)
    with store.update() as booted:  # whole GPUs: prepare switches MIG off before sharing applies
        for gpu in booted.gpus:
            gpu.mig_mode = 0
    return gpus, tools, store


def allocated(
    gpu: Gpu,
    parameters: dict[str, Any] | None,
    *,
    admin_access: bool = False,
    share_id: str | None = None,
    consumed: dict[str, Fraction] | None = None,
) -> ResolvedDevice:
    config = GpuConfig() if parameters is None else decode_config(parameters)
    assert isinstance(config, GpuConfig)
    return ResolvedDevice(
        request="gpu",
        device=f"gpu-{gpu.minor}" if share_id is None else f"gpu-{gpu.minor}-shared",
        kind="gpu",
        gpu=gpu,
        config=config,
        config_entry=None if parameters is None else 2,
        admin_access=admin_access,
        share_id=share_id,
        consumed=consumed or {},
        memory_bytes=gpu.memory_bytes,
        uuid=gpu.uuid,
    )


def record(interval: ckpt.TimeSliceInterval) -> ckpt.TimeSlicingRecord:
    return ckpt.TimeSlicingRecord(strategy="TimeSlicing", interval=interval)


def timeslices(store: sim_state.StateFile) -> list[int]:
    return [gpu.timeslice for gpu in store.read().gpus]


def entry(
    uid: str, *devices: tuple[Gpu, ckpt.SharingRecord | None], share_ids: Sequence[str | None] = ()
) -> ckpt.ClaimEntry:
    shares = list(share_ids) or [None] * len(devices)
    return ckpt.ClaimEntry(
        uid=uid,
        namespace="default",
        name=f"claim-{uid}",
        state="PrepareCompleted",
        devices=tuple(
            ckpt.PreparedDevice(
                request_names=("gpu",),
                pool="node",
                device=f"gpu-{gpu.minor}" if share is None else f"gpu-{gpu.minor}-shared",
                cdi_device_ids=(),
                gpu_uuids=(gpu.uuid,),
                sharing=sharing,
                share_id=share,
            )
            for (gpu, sharing), share in zip(devices, shares, strict=True)
        ),
    )


def sharing_of(tools: GpuTools, tmp_path: Path) -> SharingCoordinator:
    return SharingCoordinator(tools, mps_root=tmp_path / "mps")


PLAIN = {"apiVersion": API_VERSION, "kind": "GpuConfig"}
PLANS: dict[str, tuple[dict[str, Any] | None, bool, ckpt.SharingRecord | None]] = {
    "no config: nothing": (None, False, None),
    "no sharing: nothing": (PLAIN, False, None),
    "TimeSlicing without settings: Default": (
        {**PLAIN, "sharing": {"strategy": "TimeSlicing"}}, False, record("Default")
    ),
    "Short": (time_slicing("Short"), False, record("Short")),
    "Long": (time_slicing("Long"), False, record("Long")),
    "admin access: nothing": (time_slicing("Long"), True, None),
    "admin access with MPS: nothing": (mps(), True, None),
}  # fmt: skip


@pytest.mark.parametrize(("parameters", "admin", "expected"), PLANS.values(), ids=PLANS)
def test_plan(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile],
    tmp_path: Path,
    parameters: dict[str, Any] | None,
    admin: bool,
    expected: ckpt.SharingRecord | None,
) -> None:
    gpus, tools, _ = machine
    device = allocated(gpus[0], parameters, admin_access=admin)
    assert sharing_of(tools, tmp_path).plan(UID, [device], others=[]) == [expected]


def test_plan_touches_no_gpu(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile], tmp_path: Path
) -> None:
    gpus, _, store = machine
    unusable = GpuTools(search_path="")  # any tool run would fail
    plan = sharing_of(unusable, tmp_path).plan(UID, [allocated(gpus[0], time_slicing("Long"))], others=[])
    assert plan == [record("Long")]
    assert timeslices(store) == [0] * 8


@pytest.mark.parametrize(
    ("interval", "level"), [("Default", 0), ("Short", 1), ("Medium", 2), ("Long", 3)], ids=str
)
def test_apply_sets_the_interval_on_those_gpus_and_undo_resets_it(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile],
    tmp_path: Path,
    interval: ckpt.TimeSliceInterval,
    level: int,
) -> None:
    gpus, tools, store = machine
    sharing = sharing_of(tools, tmp_path)
    claim = entry(UID, (gpus[1], record(interval)), (gpus[6], record(interval)))
    sharing.apply(claim, visible={}, others=[])
    assert timeslices(store) == [0, level, 0, 0, 0, 0, level, 0]
    sharing.apply(claim, visible={}, others=[])  # again: same result
    assert timeslices(store) == [0, level, 0, 0, 0, 0, level, 0]
    sharing.undo(claim, others=[])
    assert timeslices(store) == [0] * 8
    sharing.undo(claim, others=[])
    assert timeslices(store) == [0] * 8


def test_no_tool_runs_for_a_time_slice_already_in_place(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile], tmp_path: Path
) -> None:
    gpus, tools, store = machine
    unusable = sharing_of(GpuTools(search_path=""), tmp_path)  # any tool run would fail
    default = entry("a", (gpus[0], record("Default")))
    unusable.apply(default, visible={}, others=[])  # no record set another interval: Default already
    unusable.undo(default, others=[])

    first = entry("a", (gpus[0], record("Long")), share_ids=[SHARE])
    sharing_of(tools, tmp_path).apply(first, visible={}, others=[])
    second = entry("b", (gpus[0], record("Long")), share_ids=[OTHER_SHARE])
    unusable.apply(second, visible={}, others=[first])  # the other share set Long already
    unusable.undo(second, others=[first])  # and keeps it
    assert timeslices(store)[0] == 3


def test_a_claim_being_unprepared_leaves_the_time_slice_unknown(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile], tmp_path: Path
) -> None:
    """Its undo may have stopped half way (the GPU back at Default, its record still Long): the tool runs."""
    gpus, tools, store = machine
    sharing = sharing_of(tools, tmp_path)
    leaving = entry("a", (gpus[0], record("Long")), share_ids=[SHARE]).with_state("UnprepareStarted")
    second = entry("b", (gpus[0], record("Long")), share_ids=[OTHER_SHARE])
    sharing.apply(second, visible={}, others=[leaving])
    assert timeslices(store)[0] == 3
    with pytest.raises(NvmlUnavailable):
        sharing_of(GpuTools(search_path=""), tmp_path).undo(second, others=[leaving])


def test_reset_time_slices_runs_the_tool_whatever_the_records_say(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile], tmp_path: Path
) -> None:
    gpus, tools, store = machine
    sharing = sharing_of(tools, tmp_path)
    sharing.apply(entry("a", (gpus[2], record("Medium"))), visible={}, others=[])
    sharing.reset([gpus[2].uuid])
    assert timeslices(store) == [0] * 8


# --- MPS on a whole GPU ------------------------------------------------------------------------------


def test_mps_on_a_whole_gpu_runs_one_daemon_with_the_limits_and_exclusive_compute(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile], tmp_path: Path
) -> None:
    gpus, tools, store = machine
    sharing = sharing_of(tools, tmp_path)
    parameters = mps_limits(threads=40, memory="10Gi")
    devices = [allocated(gpus[0], parameters), allocated(gpus[3], parameters)]
    records = sharing.plan(UID, devices, others=[])
    assert all(isinstance(r, ckpt.MpsRecord) for r in records)
    first = records[0]
    assert isinstance(first, ckpt.MpsRecord)
    assert (first.active_thread_percentage, first.pinned_memory_limit, first.restore_compute_mode) == (
        40,
        10 * 2**30,
        0,
    )
    assert store.read().mps_daemons == []  # planning starts nothing
    claim = entry(UID, *zip([gpus[0], gpus[3]], records, strict=True))
    visible = {"gpu-0": gpus[0].uuid, "gpu-3": gpus[3].uuid}
    sharing.apply(claim, visible=visible, others=[])

    [daemon] = store.read().mps_daemons
    assert daemon.visible_devices == ",".join(sorted([gpus[0].uuid, gpus[3].uuid]))
    assert daemon.default_active_thread_percentage == 40.0
    assert daemon.default_pinned_memory_limits == {gpus[0].uuid: "10240M", gpus[3].uuid: "10240M"}
    assert Path(daemon.pipe_directory) == first.root / "pipe"
    assert [g.compute_mode for g in store.read().gpus] == [3, 0, 0, 3, 0, 0, 0, 0]
    assert oct((first.root / "shm").stat().st_mode & 0o7777) == "0o1777"

    sharing.apply(
        claim, visible=visible, others=[]
    )  # again (a retried prepare, an adoption): the same daemon
    assert [d.pid for d in store.read().mps_daemons] == [daemon.pid]

    sharing.undo(claim, others=[])
    assert store.read().mps_daemons == []
    assert not first.root.exists()
    assert [g.compute_mode for g in store.read().gpus] == [0] * 8
    sharing.undo(claim, others=[])  # idempotent


def test_edits_give_containers_the_pipe_and_shm(tmp_path: Path) -> None:
    root = tmp_path / "mps" / "abc"
    device = ckpt.PreparedDevice(
        request_names=("gpu",),
        pool="node",
        device="gpu-0",
        cdi_device_ids=(),
        gpu_uuids=("GPU-1",),
        sharing=ckpt.MpsRecord(strategy="MPS", root=root),
    )
    env, mounts = SharingCoordinator.container_edits(device)
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps"}
    assert [(m.host_path, m.container_path) for m in mounts] == [
        (str(root / "pipe"), "/tmp/nvidia-mps"),
        (str(root / "shm"), "/dev/shm"),
    ]


BAD_MPS = {
    "limit above the device": (
        mps_limits(memory="100Gi"),
        None,
        "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
        "100Gi is above the 81559Mi of memory of gpu-0; allowed: 1Mi to 81559Mi",
    ),
    "limit above the share": (
        mps_limits(memory="30Gi"),
        {"memory": Fraction(20 * 2**30)},
        "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
        "30Gi is above the 20Gi of memory this share of gpu-0-shared was allocated; allowed: 1Mi to 20Gi",
    ),
    "threads above the share": (
        mps_limits(threads=50),
        {"memory": Fraction(20 * 2**30), "compute": Fraction(25)},
        "sharing.mpsConfig.defaultActiveThreadPercentage",
        "50 is above the compute share of 25% this share of gpu-0-shared was allocated; allowed: 1 to 25",
    ),
}


@pytest.mark.parametrize(("parameters", "consumed", "field", "message"), BAD_MPS.values(), ids=BAD_MPS)
def test_bad_mps_limits_name_the_field_and_the_allowed_values(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile],
    tmp_path: Path,
    parameters: dict[str, Any],
    consumed: dict[str, Fraction] | None,
    field: str,
    message: str,
) -> None:
    gpus, tools, _ = machine
    share = SHARE if consumed is not None else None
    device = allocated(gpus[0], parameters, share_id=share, consumed=consumed)
    with pytest.raises(ConfigError) as raised:
        sharing_of(tools, tmp_path).plan(UID, [device], others=[])
    assert raised.value.field == f"{CONFIG_FIELD}.{field}"
    assert raised.value.reason == message


# --- shares ------------------------------------------------------------------------------------------


def test_a_share_without_config_gets_its_consumed_capacity_as_mps_limits(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile], tmp_path: Path
) -> None:
    gpus, tools, store = machine
    sharing = sharing_of(tools, tmp_path)
    device = allocated(
        gpus[0], None, share_id=SHARE, consumed={"memory": Fraction(20 * 2**30), "compute": Fraction(25)}
    )
    [planned] = sharing.plan(UID, [device], others=[])
    assert isinstance(planned, ckpt.MpsRecord)
    assert (planned.active_thread_percentage, planned.pinned_memory_limit, planned.restore_compute_mode) == (
        25,
        20 * 2**30,
        None,  # several claims' daemons share the GPU: its compute mode stays DEFAULT
    )
    asks_no_compute = allocated(
        gpus[0], None, share_id=SHARE, consumed={"memory": Fraction(10 * 2**30), "compute": Fraction(0)}
    )
    [best_effort] = sharing.plan(UID, [asks_no_compute], others=[])
    assert isinstance(best_effort, ckpt.MpsRecord)
    assert (best_effort.active_thread_percentage, best_effort.pinned_memory_limit) == (None, 10 * 2**30)
    sharing.apply(
        entry(UID, (gpus[0], planned), share_ids=[SHARE]), visible={"gpu-0-shared": gpus[0].uuid}, others=[]
    )
    [daemon] = store.read().mps_daemons
    assert (daemon.default_active_thread_percentage, daemon.default_pinned_memory_limits) == (
        25.0,
        {gpus[0].uuid: "20480M"},
    )
    assert [g.compute_mode for g in store.read().gpus] == [0] * 8
    sharing.undo(entry(UID, (gpus[0], planned), share_ids=[SHARE]), others=[])
    assert store.read().mps_daemons == []


def test_time_slicing_shares_must_agree_and_the_last_one_resets_the_gpu(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile], tmp_path: Path
) -> None:
    gpus, tools, store = machine
    sharing = sharing_of(tools, tmp_path)
    first = entry("a", (gpus[0], record("Long")), share_ids=[SHARE])
    sharing.apply(first, visible={}, others=[])
    same = allocated(gpus[0], time_slicing("Long"), share_id=OTHER_SHARE)
    assert sharing.plan("b", [same], others=[first]) == [record("Long")]
    other = allocated(gpus[0], time_slicing("Short"), share_id=OTHER_SHARE)
    with pytest.raises(ConfigError) as raised:
        sharing.plan("b", [other], others=[first])
    assert raised.value.field == f"{CONFIG_FIELD}.sharing.timeSlicingConfig.interval"
    assert "runs with time-slice interval Long for ResourceClaim default/claim-a" in raised.value.reason
    assert raised.value.reason.endswith("allowed now: Long")

    second = entry("b", (gpus[0], record("Long")), share_ids=[OTHER_SHARE])
    sharing.apply(second, visible={}, others=[first])
    sharing.undo(first, others=[second])
    assert timeslices(store)[0] == 3  # the other claim still runs with Long
    sharing.undo(second, others=[])
    assert timeslices(store)[0] == 0


def test_a_dead_daemon_is_started_again_on_adoption_and_others_are_stopped(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile], tmp_path: Path
) -> None:
    gpus, tools, store = machine
    sharing = sharing_of(tools, tmp_path)
    [planned] = sharing.plan(UID, [allocated(gpus[1], mps_limits(threads=30))], others=[])
    assert isinstance(planned, ckpt.MpsRecord)
    claim = entry(UID, (gpus[1], planned))
    visible = {"gpu-1": gpus[1].uuid}
    sharing.apply(claim, visible=visible, others=[])
    assert sharing.adopt(claim, visible=visible, others=[]) is False  # alive: kept as it is
    [daemon] = store.read().mps_daemons
    os.kill(daemon.pid, signal.SIGKILL)
    wait_for(lambda: sharing.mps.daemons.running(Daemon(planned.root, planned.token)) is None)
    assert sharing.adopt(claim, visible=visible, others=[]) is True
    [again] = [d for d in store.read().mps_daemons if d.pid != daemon.pid and _alive(d.pid)]
    assert again.default_active_thread_percentage == 30.0

    assert sharing.stop_unrecorded([claim]) == []
    assert sharing.stop_unrecorded([]) == [planned.root]
    assert not planned.root.exists()
    assert not any(_alive(d.pid) for d in store.read().mps_daemons)


def test_a_gpu_that_refuses_mps_fails_the_claim_and_leaves_nothing(tmp_path: Path) -> None:
    state_file = tmp_path / "machine.json"
    with gpu_driver.connect("sim:no-sharing", state_file=state_file) as session:
        [gpu, *_] = session.inventory().gpus
    tools = GpuTools.with_directory_first(sim.write_tools(tmp_path / "bin", state_file=state_file))
    sharing = sharing_of(tools, tmp_path)
    [planned] = sharing.plan(UID, [allocated(gpu, mps_limits(threads=30))], others=[])
    claim = entry(UID, (gpu, planned))
    with pytest.raises(HardwareError, match="MPS"):
        sharing.apply(claim, visible={f"gpu-{gpu.minor}": gpu.uuid}, others=[])
    sharing.undo(claim, others=[])  # what prepare's rollback does
    assert sim_state.StateFile(state_file).read().mps_daemons == []
    assert not (tmp_path / "mps").exists() or not any((tmp_path / "mps").iterdir())
    with pytest.raises(HardwareError, match="Not Supported"):
        sharing.apply(entry(UID, (gpu, record("Long"))), visible={}, others=[])


def test_mps_processes_are_found_by_their_mark_and_pinned_by_their_start_time(tmp_path: Path) -> None:
    pipe, token = tmp_path / "pipe", mps_processes.new_token()
    marked = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "GPUDRA_MPS_DAEMON_TOKEN": token}
    daemon = subprocess.Popen(["sleep", "60"], env=marked)
    unmarked = subprocess.Popen(["sleep", "60"], env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    try:
        # Popen returns once the child exists; its /proc entry may show the new program a moment later
        # on a loaded machine (seen once in CI), so look until it does.
        deadline = time.monotonic() + 10
        while not (listed := mps_processes.find(DaemonMark(pipe, token))) and time.monotonic() < deadline:
            time.sleep(0.05)
        [found] = listed
        assert (found.pid, found.parent) == (daemon.pid, os.getpid())
        assert mps_processes.daemon([found]) == found and mps_processes.running(found)
        # The same pid with another start time is another process (the pid was handed out again).
        assert not mps_processes.running(dataclasses.replace(found, start_time=found.start_time + 1))
        # Without a token, the pipe directory marks every process of the plugin's mount namespace.
        assert {p.pid for p in mps_processes.find(DaemonMark(pipe, None))} == {daemon.pid, unmarked.pid}
        daemon.kill()
        daemon.wait()
        assert not mps_processes.running(found) and mps_processes.find(DaemonMark(pipe, token)) == []
    finally:
        for process in (daemon, unmarked):
            process.kill()
            process.wait()


def test_without_a_token_a_process_of_another_mount_namespace_is_not_the_daemon(tmp_path: Path) -> None:
    """A container's processes never share the plugin's mount namespace, whatever their environment."""
    if subprocess.run(["unshare", "-Urm", "true"], check=False, capture_output=True).returncode != 0:
        pytest.skip("no user namespaces here to make a mount namespace in")
    pipe = tmp_path / "pipe"
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    contained = subprocess.Popen(["unshare", "-Urm", "sleep", "60"], env=env)
    try:
        wait_for(lambda: Path(f"/proc/{contained.pid}/cmdline").read_bytes().startswith(b"sleep"))
        assert mps_processes.find(DaemonMark(pipe, None)) == []
    finally:
        contained.kill()
        contained.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1].startswith("Z")


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_set_timeslice_runs_the_documented_command_line(tmp_path: Path) -> None:
    seen = tmp_path / "args"
    script = tmp_path / "nvidia-smi"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}\n')
    script.chmod(0o755)
    GpuTools(search_path=str(tmp_path)).set_timeslice(gpu_uuid="GPU-1234", level=3)
    assert seen.read_text().split() == ["compute-policy", "-i", "GPU-1234", "--set-timeslice", "3"]


def test_a_missing_tool_is_nvml_unavailable(tmp_path: Path) -> None:
    with pytest.raises(NvmlUnavailable, match=f"nvidia-smi not found on PATH \\({tmp_path}\\)"):
        GpuTools(search_path=str(tmp_path)).set_timeslice(gpu_uuid="GPU-1234", level=0)


def test_a_failing_tool_is_a_hardware_error_with_its_output(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile],
) -> None:
    _, tools, _ = machine
    with pytest.raises(HardwareError) as raised:
        tools.set_timeslice(gpu_uuid="GPU-00000000-0000-0000-0000-000000000000", level=3)
    assert str(raised.value) == (
        "nvidia-smi compute-policy -i GPU-00000000-0000-0000-0000-000000000000 --set-timeslice 3 "
        "failed (6): No devices were found"
    )


def test_a_hanging_tool_times_out(tmp_path: Path) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    with pytest.raises(HardwareError, match="did not finish in 1s"):
        GpuTools(search_path=str(tmp_path), timeout=1).set_timeslice(gpu_uuid="GPU-1234", level=0)
