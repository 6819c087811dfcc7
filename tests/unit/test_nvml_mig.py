"""MIG instance lifecycle through gpudra.gpu.nvml on the simulated machines: what works, what is refused."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpudra import errors, sim
from gpudra.gpu import nvml
from gpudra.model import inventory


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "machine.json"


@pytest.fixture
def h100(state_file: Path) -> Iterator[nvml.Nvml]:
    with nvml.connect("sim:dgx-h100", state_file=state_file) as session:
        yield session


@pytest.fixture
def a100(state_file: Path) -> Iterator[nvml.Nvml]:
    with nvml.connect("sim:dgx-a100", state_file=state_file) as session:
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
    with nvml.connect(f"sim:{machine}", state_file=state_file) as session:
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
    with nvml.connect("sim:mixed", state_file=state_file) as session:
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
    assert json.loads(state_file.read_bytes()) == json.loads(before)
    assert _devices(h100) == ()


def test_a_gpu_instance_left_without_compute_instance_is_completed(h100: nvml.Nvml, state_file: Path) -> None:
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
    completed = h100.create_mig_device(gpu_uuid=uuid, profile_id=9, placement_start=4)
    assert completed.gpu_instance_id == left["id"]
    assert _devices(h100) == (completed,)


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
    from gpudra.gpu import nvml
    with nvml.connect("sim:dgx-h100", state_file=Path(sys.argv[1])) as session:
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
