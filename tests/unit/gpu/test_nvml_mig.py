"""MIG instance lifecycle through gpudra.gpu.nvml on the simulated machines: what works, what is refused."""

from __future__ import annotations

import contextlib
import ctypes
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpudra import errors, sim
from gpudra.gpu import nvml
from gpudra.model import inventory
from gpudra.node import gpu_driver


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "machine.json"


@pytest.fixture
def h100(state_file: Path) -> Iterator[nvml.Nvml]:
    with gpu_driver.connect("sim:dgx-h100", state_file=state_file) as session:
        yield session


@pytest.fixture
def a100(state_file: Path) -> Iterator[nvml.Nvml]:
    with gpu_driver.connect("sim:dgx-a100", state_file=state_file) as session:
        yield session


def _first_gpu(session: nvml.Nvml) -> inventory.Gpu:
    return session.inventory().gpus[0]


def _devices(session: nvml.Nvml, index: int = 0) -> tuple[inventory.MigDevice, ...]:
    return session.inventory().gpus[index].mig_devices


@contextlib.contextmanager
def _failing(c_function: str, code: int) -> Iterator[None]:
    """Makes one simulated C function return `code`, as a driver fault would."""
    cache = pynvml._nvmlGetFunctionPointer_cache
    original = cache[c_function]
    cache[c_function] = lambda *args: code
    try:
        yield
    finally:
        cache[c_function] = original


ROUND_TRIPS = [
    ("dgx-h100", 19, 6, "1g.10gb", 1, 9984, 16),
    ("dgx-h100", 20, 3, "1g.10gb+me", 1, 9984, 16),
    ("dgx-h100", 15, 6, "1g.20gb", 2, 20096, 26),
    ("dgx-h100", 14, 4, "2g.20gb", 2, 20096, 32),
    ("dgx-h100", 9, 4, "3g.40gb", 4, 40448, 60),
    ("dgx-h100", 5, 0, "4g.40gb", 4, 40448, 64),
    ("dgx-h100", 0, 0, "7g.80gb", 8, 81152, 132),
    ("dgx-a100", 19, 5, "1g.5gb", 1, 4864, 14),
    ("dgx-a100", 15, 2, "1g.10gb", 2, 9856, 14),
    ("dgx-a100", 9, 0, "3g.20gb", 4, 19968, 42),
    ("dgx-a100", 0, 0, "7g.40gb", 8, 40192, 98),
]


@pytest.mark.parametrize("case", ROUND_TRIPS, ids=[f"{m}-{n}@{s}" for m, _, s, n, *_ in ROUND_TRIPS])
def test_create_find_destroy_round_trip(
    state_file: Path, case: tuple[str, int, int, str, int, int, int]
) -> None:
    machine, profile_id, start, name, size, memory_mib, sms = case
    with gpu_driver.connect(f"sim:{machine}", state_file=state_file) as session:
        gpu = session.inventory().gpus[3]
        created = session.create_mig_device(gpu_uuid=gpu.uuid, profile_id=profile_id, placement_start=start)
        assert created.uuid.startswith("MIG-")
        assert (created.profile_id, created.profile_name) == (profile_id, name)
        assert created.placement == inventory.MigPlacement(start=start, size=size)
        assert (created.memory_mib, created.multiprocessors, created.compute_instance_id) == (
            memory_mib,
            sms,
            0,
        )
        assert _devices(session, 3) == (created,)
        assert _devices(session, 2) == ()
        found = session.mig_device_by_placement(
            gpu_uuid=gpu.uuid, profile_id=profile_id, placement_start=start
        )
        assert found == created
        session.destroy_mig_device(gpu_uuid=gpu.uuid, gpu_instance_id=created.gpu_instance_id)
        assert _devices(session, 3) == ()
        gone = session.mig_device_by_placement(
            gpu_uuid=gpu.uuid, profile_id=profile_id, placement_start=start
        )
        assert gone is None


def test_a_full_h100_partitioning(h100: nvml.Nvml) -> None:
    uuid = _first_gpu(h100).uuid
    for profile_id, start in [(19, 6), (9, 0), (14, 4)]:
        h100.create_mig_device(gpu_uuid=uuid, profile_id=profile_id, placement_start=start)
    layout = [(d.profile_name, d.placement.start, d.placement.size) for d in _devices(h100)]
    assert layout == [("3g.40gb", 0, 4), ("2g.20gb", 4, 2), ("1g.10gb", 6, 1)]


CONFLICTS = [
    ("overlapping", [(9, 0)], (19, 3)),
    ("same placement", [(19, 2)], (19, 2)),
    ("whole GPU after a slice", [(19, 6)], (0, 0)),
    ("slice after the whole GPU", [(0, 0)], (19, 6)),
    ("media extensions once per GPU", [(20, 0)], (20, 1)),
    ("straddling two", [(15, 0), (15, 4)], (9, 0)),
]


@pytest.mark.parametrize(("first", "then"), [c[1:] for c in CONFLICTS], ids=[c[0] for c in CONFLICTS])
def test_occupied_placements_are_refused(
    h100: nvml.Nvml, state_file: Path, first: list[tuple[int, int]], then: tuple[int, int]
) -> None:
    uuid = _first_gpu(h100).uuid
    for profile_id, start in first:
        h100.create_mig_device(gpu_uuid=uuid, profile_id=profile_id, placement_start=start)
    before = state_file.read_bytes()
    with pytest.raises(errors.InsufficientResources) as refused:
        h100.create_mig_device(gpu_uuid=uuid, profile_id=then[0], placement_start=then[1])
    assert refused.value.nvml_error == "NVMLError_InsufficientResources"
    assert f"nvmlDeviceCreateGpuInstanceWithPlacement on GPU {uuid}" in str(refused.value)
    assert state_file.read_bytes() == before


def test_a_placement_the_profile_does_not_have_is_an_invalid_argument(h100: nvml.Nvml) -> None:
    with pytest.raises(errors.HardwareError) as refused:
        h100.create_mig_device(gpu_uuid=_first_gpu(h100).uuid, profile_id=9, placement_start=2)
    assert type(refused.value) is errors.HardwareError
    assert refused.value.nvml_error == "NVMLError_InvalidArgument"


def test_an_unknown_profile_is_not_supported(h100: nvml.Nvml) -> None:
    with pytest.raises(errors.NotSupported) as refused:
        h100.create_mig_device(gpu_uuid=_first_gpu(h100).uuid, profile_id=21, placement_start=0)
    assert "no MIG profile ID 21" in str(refused.value)
    assert "19 (1g.10gb)" in str(refused.value)


def test_mig_on_a_gpu_without_mig_is_refused(state_file: Path) -> None:
    with gpu_driver.connect("sim:mixed", state_file=state_file) as session:
        uuid = _first_gpu(session).uuid
        with pytest.raises(errors.NotSupported) as refused:
            session.create_mig_device(gpu_uuid=uuid, profile_id=19, placement_start=0)
        assert refused.value.nvml_error == "NVMLError_NotSupported"
        with pytest.raises(errors.NotSupported):
            session.mig_device_by_placement(gpu_uuid=uuid, profile_id=19, placement_start=0)


def test_mig_with_mig_mode_disabled_is_refused(a100: nvml.Nvml, state_file: Path) -> None:
    uuid = _first_gpu(a100).uuid
    sim.set_mig_mode(state_file=state_file, gpu_uuid=uuid, enabled=False)
    with pytest.raises(errors.NotSupported) as refused:
        a100.create_mig_device(gpu_uuid=uuid, profile_id=19, placement_start=0)
    assert "MIG mode is disabled" in str(refused.value)


def test_destroy_while_in_use_is_refused(h100: nvml.Nvml, state_file: Path) -> None:
    uuid = _first_gpu(h100).uuid
    device = h100.create_mig_device(gpu_uuid=uuid, profile_id=14, placement_start=2)
    sim.attach_process(state_file=state_file, device_uuid=device.uuid, pid=4242)
    before = state_file.read_bytes()
    with pytest.raises(errors.InUse) as refused:
        h100.destroy_mig_device(gpu_uuid=uuid, gpu_instance_id=device.gpu_instance_id)
    assert refused.value.nvml_error == "NVMLError_InUse"
    assert "nvmlComputeInstanceDestroy" in str(refused.value)
    assert state_file.read_bytes() == before
    assert _devices(h100) == (device,)
    sim.detach_process(state_file=state_file, pid=4242)
    h100.destroy_mig_device(gpu_uuid=uuid, gpu_instance_id=device.gpu_instance_id)
    assert _devices(h100) == ()


def test_destroying_a_missing_instance_is_not_found(h100: nvml.Nvml) -> None:
    with pytest.raises(errors.HardwareError) as refused:
        h100.destroy_mig_device(gpu_uuid=_first_gpu(h100).uuid, gpu_instance_id=3)
    assert refused.value.nvml_error == "NVMLError_NotFound"


def test_an_unknown_gpu_is_not_found(h100: nvml.Nvml) -> None:
    with pytest.raises(errors.HardwareError) as refused:
        h100.create_mig_device(
            gpu_uuid="GPU-00000000-0000-0000-0000-000000000000", profile_id=19, placement_start=0
        )
    assert refused.value.nvml_error == "NVMLError_NotFound"
    assert "nvmlDeviceGetHandleByUUID on GPU GPU-00000000" in str(refused.value)


def test_a_failed_compute_instance_leaves_no_gpu_instance(h100: nvml.Nvml, state_file: Path) -> None:
    uuid = _first_gpu(h100).uuid
    before = state_file.read_bytes()
    with (
        _failing("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES),
        pytest.raises(errors.InsufficientResources) as refused,
    ):
        h100.create_mig_device(gpu_uuid=uuid, profile_id=9, placement_start=4)
    assert "nvmlGpuInstanceCreateComputeInstance" in str(refused.value)
    after, earlier = json.loads(state_file.read_bytes()), json.loads(before)
    # The GPU instance was made and destroyed again: two MIG configuration change events, nothing else.
    assert [event["type"] for event in after.pop("events")] == [pynvml.nvmlEventMigConfigChange] * 2
    assert after.pop("events_raised") == earlier.pop("events_raised") + 2
    earlier.pop("events")
    assert after == earlier
    assert _devices(h100) == ()


def test_a_gpu_instance_left_without_compute_instance_is_listed_and_never_adopted(
    h100: nvml.Nvml, state_file: Path
) -> None:
    uuid = _first_gpu(h100).uuid
    # A crash between the two steps: the compute instance fails and so does the clean-up.
    with (
        _failing("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_UNKNOWN),
        _failing("nvmlGpuInstanceDestroy", pynvml.NVML_ERROR_UNKNOWN),
        pytest.raises(errors.HardwareError) as crashed,
    ):
        h100.create_mig_device(gpu_uuid=uuid, profile_id=9, placement_start=4)
    assert any("clean-up failed as well" in note for note in crashed.value.__notes__)
    [left] = json.loads(state_file.read_bytes())["gpus"][0]["gpu_instances"]
    assert (left["start"], left["compute_instances"]) == (4, [])
    assert h100.mig_device_by_placement(gpu_uuid=uuid, profile_id=9, placement_start=4) is None
    assert _devices(h100) == ()
    [instance] = h100.gpu_instances(gpu_uuid=uuid)
    assert (instance.id, instance.profile_id, instance.placement.start) == (left["id"], 9, 4)
    assert instance.profile_name == "3g.40gb" and instance.mig_devices == ()
    # Whoever made it (a crash, or a hand), create does not take it over: the checkpoint decides.
    with pytest.raises(errors.InsufficientResources):
        h100.create_mig_device(gpu_uuid=uuid, profile_id=9, placement_start=4)
    assert h100.destroy_at_placement(gpu_uuid=uuid, profile_id=9, placement_start=4)
    created = h100.create_mig_device(gpu_uuid=uuid, profile_id=9, placement_start=4)
    [instance] = h100.gpu_instances(gpu_uuid=uuid)
    assert instance.id == created.gpu_instance_id and instance.mig_devices == (created.uuid,)


def test_gpu_instances_with_mig_off_are_none(h100: nvml.Nvml, state_file: Path) -> None:
    gpu = h100.inventory().gpus[1]
    sim.set_mig_mode(state_file=state_file, gpu_uuid=gpu.uuid, enabled=False)
    assert h100.gpu_instances(gpu_uuid=gpu.uuid) == ()


def test_a_complete_device_at_the_placement_is_still_refused(h100: nvml.Nvml) -> None:
    uuid = _first_gpu(h100).uuid
    h100.create_mig_device(gpu_uuid=uuid, profile_id=9, placement_start=4)
    with pytest.raises(errors.InsufficientResources):
        h100.create_mig_device(gpu_uuid=uuid, profile_id=9, placement_start=4)


def test_instance_ids_follow_creation_not_placement(h100: nvml.Nvml) -> None:
    uuid = _first_gpu(h100).uuid

    def ids_by_start(order: list[int]) -> dict[int, int]:
        made = [h100.create_mig_device(gpu_uuid=uuid, profile_id=19, placement_start=s) for s in order]
        for device in made:
            h100.destroy_mig_device(gpu_uuid=uuid, gpu_instance_id=device.gpu_instance_id)
        return {d.placement.start: d.gpu_instance_id for d in made}

    assert ids_by_start([6, 0]) != ids_by_start([0, 6])


def test_mig_uuids_are_new_on_every_create(h100: nvml.Nvml) -> None:
    uuid = _first_gpu(h100).uuid
    seen = set()
    for _ in range(3):
        device = h100.create_mig_device(gpu_uuid=uuid, profile_id=15, placement_start=2)
        seen.add(device.uuid)
        h100.destroy_mig_device(gpu_uuid=uuid, gpu_instance_id=device.gpu_instance_id)
    assert len(seen) == 3


def test_gpus_are_independent(h100: nvml.Nvml) -> None:
    gpus = h100.inventory().gpus
    for gpu in gpus[:2]:
        h100.create_mig_device(gpu_uuid=gpu.uuid, profile_id=0, placement_start=0)
    assert [len(g.mig_devices) for g in h100.inventory().gpus] == [1, 1, 0, 0, 0, 0, 0, 0]


_OTHER_PROCESS = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from gpudra.node import gpu_driver
    with gpu_driver.connect("sim:dgx-h100", state_file=Path(sys.argv[1])) as session:
        gpu = session.inventory().gpus[0]
        print(",".join(d.uuid for d in gpu.mig_devices))
        made = session.create_mig_device(gpu_uuid=gpu.uuid, profile_id=19, placement_start=0)
        print(made.uuid)
    """
)


def test_state_is_shared_with_another_process(h100: nvml.Nvml, state_file: Path) -> None:
    uuid = _first_gpu(h100).uuid
    mine = h100.create_mig_device(gpu_uuid=uuid, profile_id=9, placement_start=4)
    result = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS, str(state_file)], capture_output=True, text=True, check=True
    )
    seen_there, made_there = result.stdout.split()
    assert seen_there == mine.uuid
    assert {d.uuid for d in _devices(h100)} == {mine.uuid, made_there}
    with pytest.raises(errors.InsufficientResources):
        h100.create_mig_device(gpu_uuid=uuid, profile_id=19, placement_start=0)


# --- MIG mode -------------------------------------------------------------------------------------


def _pending(state_file: Path, index: int = 0) -> tuple[int, int | None]:
    gpu = json.loads(state_file.read_bytes())["gpus"][index]
    return gpu["mig_mode"], gpu["mig_mode_pending"]


def test_mig_enabled(h100: nvml.Nvml, state_file: Path) -> None:
    gpus = h100.inventory().gpus
    sim.set_mig_mode(state_file=state_file, gpu_uuid=gpus[1].uuid, enabled=False)
    assert [h100.mig_enabled(gpu_uuid=g.uuid) for g in gpus[:3]] == [True, False, True]


def test_a_gpu_without_mig_has_mig_disabled(state_file: Path) -> None:
    with gpu_driver.connect("sim:mixed", state_file=state_file) as session:
        assert not session.mig_enabled(gpu_uuid=_first_gpu(session).uuid)


def test_hopper_switches_mig_mode(h100: nvml.Nvml, state_file: Path) -> None:
    uuid = _first_gpu(h100).uuid
    h100.set_mig_mode(gpu_uuid=uuid, enabled=False)
    assert not h100.mig_enabled(gpu_uuid=uuid)
    assert _pending(state_file) == (0, None)
    before = state_file.read_bytes()
    h100.set_mig_mode(gpu_uuid=uuid, enabled=False)  # already so: nothing to do
    assert state_file.read_bytes() == before
    h100.set_mig_mode(gpu_uuid=uuid, enabled=True)
    assert h100.mig_enabled(gpu_uuid=uuid)
    assert h100.create_mig_device(gpu_uuid=uuid, profile_id=19, placement_start=0).uuid.startswith("MIG-")


def test_switching_mig_mode_with_a_process_running_is_in_use(h100: nvml.Nvml, state_file: Path) -> None:
    uuid = _first_gpu(h100).uuid
    h100.set_mig_mode(gpu_uuid=uuid, enabled=False)
    sim.attach_process(state_file=state_file, device_uuid=uuid, pid=808)
    with pytest.raises(errors.InUse) as refused:
        h100.set_mig_mode(gpu_uuid=uuid, enabled=True)
    message = str(refused.value)
    assert uuid in message
    assert "IN_USE" in message
    assert "stop the processes" in message
    assert refused.value.nvml_error == "NVMLError_InUse"
    # Nothing changed, and nothing is left pending for a later reset to apply.
    assert _pending(state_file) == (0, None)
    sim.detach_process(state_file=state_file, pid=808)
    h100.set_mig_mode(gpu_uuid=uuid, enabled=True)
    assert h100.mig_enabled(gpu_uuid=uuid)


def test_switching_mig_mode_with_instances_is_in_use(h100: nvml.Nvml, state_file: Path) -> None:
    uuid = _first_gpu(h100).uuid
    device = h100.create_mig_device(gpu_uuid=uuid, profile_id=9, placement_start=0)
    with pytest.raises(errors.InUse):
        h100.set_mig_mode(gpu_uuid=uuid, enabled=False)
    assert _pending(state_file) == (1, None)
    assert _devices(h100) == (device,)


def test_ampere_never_switches_mig_mode(a100: nvml.Nvml, state_file: Path) -> None:
    uuid = _first_gpu(a100).uuid
    with pytest.raises(errors.HardwareError) as refused:
        a100.set_mig_mode(gpu_uuid=uuid, enabled=False)
    assert type(refused.value) is errors.HardwareError
    assert refused.value.nvml_error == "NVMLError_ResetRequired"
    message = str(refused.value)
    assert uuid in message
    assert "RESET_REQUIRED" in message
    assert f"nvidia-smi -i {uuid} -mig 0" in message
    assert a100.mig_enabled(gpu_uuid=uuid)
    assert _pending(state_file) == (1, None)


def test_a_vm_never_switches_mig_mode(state_file: Path) -> None:
    with gpu_driver.connect("sim:vm-h100", state_file=state_file) as session:
        uuid = _first_gpu(session).uuid
        with pytest.raises(errors.HardwareError) as refused:
            session.set_mig_mode(gpu_uuid=uuid, enabled=True)
        assert refused.value.nvml_error == "NVMLError_ResetRequired"
        assert not session.mig_enabled(gpu_uuid=uuid)
    assert _pending(state_file) == (0, None)


def test_mig_mode_on_a_gpu_without_mig_is_not_supported(state_file: Path) -> None:
    with (
        gpu_driver.connect("sim:mixed", state_file=state_file) as session,
        pytest.raises(errors.NotSupported) as refused,
    ):
        session.set_mig_mode(gpu_uuid=_first_gpu(session).uuid, enabled=True)
    assert refused.value.nvml_error == "NVMLError_NotSupported"


def test_a_failed_undo_of_the_pending_mode_is_noted(a100: nvml.Nvml) -> None:
    uuid = _first_gpu(a100).uuid
    cache = pynvml._nvmlGetFunctionPointer_cache
    original = cache["nvmlDeviceSetMigMode"]
    answers = iter([pynvml.NVML_ERROR_RESET_REQUIRED, pynvml.NVML_ERROR_IN_USE])

    def set_mig_mode(handle: object, mode: int, status: Any) -> int:
        status._obj.value = next(answers)  # pynvml passes byref(c_uint)
        return pynvml.NVML_SUCCESS

    cache["nvmlDeviceSetMigMode"] = set_mig_mode
    try:
        with pytest.raises(errors.HardwareError) as refused:
            a100.set_mig_mode(gpu_uuid=uuid, enabled=False)
    finally:
        cache["nvmlDeviceSetMigMode"] = original
    assert "RESET_REQUIRED" in str(refused.value)
    assert refused.value.__notes__ == ["putting the pending MIG mode back failed as well: IN_USE"]


# --- processes, MIG devices, destroy by placement --------------------------------------------------


def test_compute_processes_on_a_gpu_and_its_mig_devices(h100: nvml.Nvml, state_file: Path) -> None:
    gpus = h100.inventory().gpus
    uuid = gpus[0].uuid
    assert h100.compute_processes(gpu_uuid=uuid) == ()
    first = h100.create_mig_device(gpu_uuid=uuid, profile_id=19, placement_start=6)
    second = h100.create_mig_device(gpu_uuid=uuid, profile_id=9, placement_start=0)
    sim.attach_process(state_file=state_file, device_uuid=second.uuid, pid=700)
    sim.attach_process(state_file=state_file, device_uuid=first.uuid, pid=90)
    sim.attach_process(state_file=state_file, device_uuid=first.uuid, pid=700)  # one process, two devices
    assert h100.compute_processes(gpu_uuid=uuid) == (90, 700)
    assert h100.compute_processes(gpu_uuid=gpus[1].uuid) == ()


def test_compute_processes_asks_each_mig_device(h100: nvml.Nvml, state_file: Path) -> None:
    """Without privileges the GPU's own list leaves out its MIG devices' processes."""
    uuid = _first_gpu(h100).uuid
    device = h100.create_mig_device(gpu_uuid=uuid, profile_id=14, placement_start=4)
    sim.attach_process(state_file=state_file, device_uuid=device.uuid, pid=5150)
    cache = pynvml._nvmlGetFunctionPointer_cache
    original = cache["nvmlDeviceGetComputeRunningProcesses_v3"]
    parent = ctypes.cast(pynvml.nvmlDeviceGetHandleByUUID(uuid), ctypes.c_void_p).value

    def unprivileged(handle: object, count: object, infos: object) -> int:
        if ctypes.cast(handle, ctypes.c_void_p).value == parent:
            return int(pynvml.NVML_SUCCESS)  # an empty list
        return int(original(handle, count, infos))

    cache["nvmlDeviceGetComputeRunningProcesses_v3"] = unprivileged
    try:
        assert h100.compute_processes(gpu_uuid=uuid) == (5150,)
    finally:
        cache["nvmlDeviceGetComputeRunningProcesses_v3"] = original


def test_compute_processes_on_a_gpu_without_mig(state_file: Path) -> None:
    with gpu_driver.connect("sim:mixed", state_file=state_file) as session:
        gpus = session.inventory().gpus
        sim.attach_process(state_file=state_file, device_uuid=gpus[2].uuid, pid=12)
        assert [session.compute_processes(gpu_uuid=g.uuid) for g in gpus[1:4]] == [(), (12,), ()]


def test_mig_devices_of_one_gpu(h100: nvml.Nvml, state_file: Path) -> None:
    gpus = h100.inventory().gpus
    assert h100.mig_devices(gpu_uuid=gpus[0].uuid) == ()
    made = [
        h100.create_mig_device(gpu_uuid=gpus[0].uuid, profile_id=p, placement_start=s)
        for p, s in ((19, 6), (9, 0))
    ]
    assert h100.mig_devices(gpu_uuid=gpus[0].uuid) == (made[1], made[0]) == _devices(h100)
    sim.set_mig_mode(state_file=state_file, gpu_uuid=gpus[1].uuid, enabled=False)
    assert h100.mig_devices(gpu_uuid=gpus[1].uuid) == ()


def test_a_gpu_without_mig_has_no_mig_devices(state_file: Path) -> None:
    with gpu_driver.connect("sim:mixed", state_file=state_file) as session:
        assert session.mig_devices(gpu_uuid=_first_gpu(session).uuid) == ()


def test_destroy_at_placement(h100: nvml.Nvml) -> None:
    uuid = _first_gpu(h100).uuid
    kept = h100.create_mig_device(gpu_uuid=uuid, profile_id=19, placement_start=4)
    h100.create_mig_device(gpu_uuid=uuid, profile_id=19, placement_start=5)
    assert h100.destroy_at_placement(gpu_uuid=uuid, profile_id=19, placement_start=5)
    assert _devices(h100) == (kept,)
    assert not h100.destroy_at_placement(gpu_uuid=uuid, profile_id=19, placement_start=5)
    # The profile must match too: a 1g.10gb+me at 4 is not the 1g.10gb there.
    assert not h100.destroy_at_placement(gpu_uuid=uuid, profile_id=20, placement_start=4)
    assert _devices(h100) == (kept,)


def test_destroy_at_placement_removes_an_unfinished_instance(h100: nvml.Nvml, state_file: Path) -> None:
    uuid = _first_gpu(h100).uuid
    with (
        _failing("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_UNKNOWN),
        _failing("nvmlGpuInstanceDestroy", pynvml.NVML_ERROR_UNKNOWN),
        pytest.raises(errors.HardwareError),
    ):
        h100.create_mig_device(gpu_uuid=uuid, profile_id=9, placement_start=4)
    [left] = json.loads(state_file.read_bytes())["gpus"][0]["gpu_instances"]
    assert (left["profile_id"], left["start"], left["compute_instances"]) == (9, 4, [])
    assert h100.destroy_at_placement(gpu_uuid=uuid, profile_id=9, placement_start=4)
    assert json.loads(state_file.read_bytes())["gpus"][0]["gpu_instances"] == []


def test_destroy_at_placement_with_several_compute_instances(h100: nvml.Nvml) -> None:
    uuid = _first_gpu(h100).uuid
    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    placement = pynvml.c_nvmlGpuInstancePlacement_t(0, 4)
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 9, ctypes.byref(placement))
    for _ in range(3):
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    assert len(_devices(h100)) == 3
    assert h100.destroy_at_placement(gpu_uuid=uuid, profile_id=9, placement_start=0)
    assert _devices(h100) == ()


def test_destroy_at_placement_in_use_is_refused(h100: nvml.Nvml, state_file: Path) -> None:
    uuid = _first_gpu(h100).uuid
    device = h100.create_mig_device(gpu_uuid=uuid, profile_id=15, placement_start=2)
    sim.attach_process(state_file=state_file, device_uuid=device.uuid, pid=31337)
    with pytest.raises(errors.InUse):
        h100.destroy_at_placement(gpu_uuid=uuid, profile_id=15, placement_start=2)
    assert _devices(h100) == (device,)


def test_destroy_at_placement_without_mig(h100: nvml.Nvml, state_file: Path) -> None:
    uuid = _first_gpu(h100).uuid
    h100.set_mig_mode(gpu_uuid=uuid, enabled=False)
    assert not h100.destroy_at_placement(gpu_uuid=uuid, profile_id=19, placement_start=0)
    with pytest.raises(errors.NotSupported):  # MIG enabled, but no such profile
        h100.destroy_at_placement(gpu_uuid=h100.inventory().gpus[1].uuid, profile_id=21, placement_start=0)


def test_destroy_at_placement_on_a_gpu_without_mig_is_not_supported(state_file: Path) -> None:
    with (
        gpu_driver.connect("sim:mixed", state_file=state_file) as session,
        pytest.raises(errors.NotSupported),
    ):
        session.destroy_at_placement(gpu_uuid=_first_gpu(session).uuid, profile_id=19, placement_start=0)


# --- MIG capability device nodes --------------------------------------------------------------------


def test_mig_capabilities_of_a_created_device(h100: nvml.Nvml) -> None:
    gpu = h100.inventory().gpus[3]
    assert gpu.minor == 3
    for profile_id, start in ((19, 6), (9, 0)):
        device = h100.create_mig_device(gpu_uuid=gpu.uuid, profile_id=profile_id, placement_start=start)
        caps = h100.mig_capabilities(
            gpu_minor=gpu.minor,
            gpu_instance_id=device.gpu_instance_id,
            compute_instance_id=device.compute_instance_id,
        )
        # mig-minors: "config 1", "monitor 2", then 9 minors per (GPU, GI): the GI's, then CIs 0..7.
        gi_minor = 3 + (gpu.minor * 15 + device.gpu_instance_id) * 9
        assert caps == inventory.MigCapabilities(
            major=508, gi_minor=gi_minor, ci_minor=gi_minor + 1 + device.compute_instance_id
        )


def test_mig_capabilities_read_the_major_from_character_devices(h100: nvml.Nvml, state_file: Path) -> None:
    devices = state_file.parent / "proc" / "devices"
    devices.write_text("Character devices:\n195 nvidia\n238 nvidia-caps\n\nBlock devices:\n508 nvidia-caps\n")
    caps = h100.mig_capabilities(gpu_minor=0, gpu_instance_id=1, compute_instance_id=0)
    assert caps == inventory.MigCapabilities(major=238, gi_minor=12, ci_minor=13)
    devices.write_text("Character devices:\n195 nvidia\n\nBlock devices:\n238 nvidia-caps\n")
    with pytest.raises(errors.HardwareError) as missing:
        h100.mig_capabilities(gpu_minor=0, gpu_instance_id=1, compute_instance_id=0)
    assert f"{devices} lists no character device 'nvidia-caps'" in str(missing.value)


def test_mig_capabilities_missing_entries_and_files(h100: nvml.Nvml, state_file: Path) -> None:
    with pytest.raises(errors.HardwareError) as missing:
        h100.mig_capabilities(gpu_minor=32, gpu_instance_id=1, compute_instance_id=0)
    assert "no entry 'gpu32/gi1/access'" in str(missing.value)
    with pytest.raises(errors.HardwareError) as missing:
        h100.mig_capabilities(gpu_minor=0, gpu_instance_id=1, compute_instance_id=8)
    assert "no entry 'gpu0/gi1/ci8/access'" in str(missing.value)
    minors = state_file.parent / "proc" / "driver" / "nvidia-caps" / "mig-minors"
    minors.unlink()
    with pytest.raises(errors.HardwareError) as missing:
        h100.mig_capabilities(gpu_minor=0, gpu_instance_id=1, compute_instance_id=0)
    assert f"cannot read {minors}" in str(missing.value)
