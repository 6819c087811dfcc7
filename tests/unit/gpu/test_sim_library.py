"""The simulated driver seen through pynvml itself: installation, handles, and NVML's return codes."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpudra import errors, sim
from gpudra.gpu import nvml
from gpudra.node import gpu_driver
from gpudra.node import options as node_options


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "machine.json"


@pytest.fixture
def h100(state_file: Path) -> Iterator[Any]:
    """pynvml initialised on a simulated DGX H100; yields GPU 0's handle."""
    with gpu_driver.connect("sim:dgx-h100", state_file=state_file):
        yield pynvml.nvmlDeviceGetHandleByIndex(0)


@pytest.fixture
def mixed(state_file: Path) -> Iterator[Any]:
    with gpu_driver.connect("sim:mixed", state_file=state_file):
        yield pynvml.nvmlDeviceGetHandleByIndex(0)


def _install(profile: str, state_file: Path) -> None:
    sim.install(
        pynvml,
        profile=profile,
        state_file=state_file,
        sysfs_root=state_file.parent / "sysfs",
        proc_root=state_file.parent / "proc",
    )


def _gpu_instance(handle: Any, *, profile_id: int, start: int, size: int) -> Any:
    placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
    return pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id, ctypes.byref(placement))


def _mig_device(handle: Any, *, profile_id: int, start: int, size: int) -> tuple[Any, Any]:
    gi = _gpu_instance(handle, profile_id=profile_id, start=start, size=size)
    full = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    return gi, pynvml.nvmlGpuInstanceCreateComputeInstance(gi, full.id)


def test_install_replaces_the_loaded_library_and_restores_it(
    state_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = object()
    monkeypatch.setattr(pynvml, "nvmlLib", loaded)
    monkeypatch.setitem(pynvml._nvmlGetFunctionPointer_cache, "nvmlInit_v2", "real function")
    _install("mixed", state_file)
    assert sim.installed(pynvml)
    assert "nvmlInit_v2" not in pynvml._nvmlGetFunctionPointer_cache
    assert "nvmlDeviceGetCount_v2" in pynvml._nvmlGetFunctionPointer_cache
    sim.uninstall(pynvml)
    assert pynvml.nvmlLib is loaded
    assert not sim.installed(pynvml)
    assert pynvml._nvmlGetFunctionPointer_cache == {}


def test_calls_before_init_are_uninitialized(state_file: Path) -> None:
    _install("mixed", state_file)
    try:
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlShutdown()
    finally:
        sim.uninstall(pynvml)


def test_unknown_profile_is_refused(state_file: Path) -> None:
    with pytest.raises(errors.ConfigError) as bad:
        _install("dgx-b200", state_file)
    assert "dgx-a100, dgx-h100, mixed, vm-h100, vm-h200, no-sharing" in str(bad.value)


def test_the_cli_names_every_simulated_machine() -> None:
    assert node_options.SIM_MACHINES == sim.PROFILES


def test_symbols_the_simulator_lacks_are_function_not_found(mixed: Any) -> None:
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetSerial(mixed)


def test_device_identity(h100: Any) -> None:
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlDeviceGetName(h100) == "NVIDIA H100 80GB HBM3"
    assert pynvml.nvmlDeviceGetArchitecture(h100) == pynvml.NVML_DEVICE_ARCH_HOPPER
    assert pynvml.nvmlDeviceGetBrand(h100) == pynvml.NVML_BRAND_NVIDIA
    assert pynvml.nvmlDeviceGetCudaComputeCapability(h100) == (9, 0)
    assert pynvml.nvmlDeviceGetMemoryInfo(h100).total == 81559 * 1024**2
    pci = pynvml.nvmlDeviceGetPciInfo(h100)
    assert (pci.busId, pci.busIdLegacy, pci.bus, pci.pciDeviceId) == (
        "00000000:18:00.0",
        "0000:18:00.0",
        0x18,
        0x233010DE,
    )
    uuid = pynvml.nvmlDeviceGetUUID(h100)
    again = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    assert ctypes.cast(again, ctypes.c_void_p).value == ctypes.cast(h100, ctypes.c_void_p).value
    assert pynvml.nvmlSystemGetDriverVersion() == "580.65.06"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 13000


def test_nvlinks_go_to_nvswitches(h100: Any) -> None:
    switches = set()
    for link in range(18):
        assert pynvml.nvmlDeviceGetNvLinkState(h100, link) == pynvml.NVML_FEATURE_ENABLED
        assert pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h100, link) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        switches.add(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h100, link).busId)
    assert len(switches) == 4
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(h100, 18)


def test_pcie_gpus_have_no_nvlink(mixed: Any) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(mixed, 0)


def test_profile_indices_are_not_profile_ids(h100: Any) -> None:
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h100, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2)
    assert (info.id, info.name, info.memorySizeMB, info.sliceCount) == (15, "MIG 1g.20gb", 20096, 1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h100, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h100, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)


def test_possible_placements_count_then_fill(h100: Any) -> None:
    count = ctypes.c_uint()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h100, 15, None, ctypes.byref(count))
    assert count.value == 4
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * 4)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h100, 15, placements, ctypes.byref(count))
    assert [(p.start, p.size) for p in placements] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            h100, 15, (pynvml.c_nvmlGpuInstancePlacement_t * 3)(), ctypes.byref(count)
        )


def test_versioned_structs_are_checked(h100: Any) -> None:
    info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 1
    function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
    assert function(h100, 0, ctypes.byref(info)) == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def test_string_buffers_that_are_too_small(h100: Any) -> None:
    buffer = ctypes.create_string_buffer(8)
    function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetName")
    assert function(h100, buffer, ctypes.c_uint(8)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE


def test_compute_instance_info_gives_the_mig_device(h100: Any) -> None:
    gi, ci = _mig_device(h100, profile_id=19, start=3, size=1)
    info = pynvml.nvmlComputeInstanceGetInfo(ci)
    mig_uuid = pynvml.nvmlDeviceGetUUID(info.device)
    assert mig_uuid.startswith("MIG-")
    by_uuid = pynvml.nvmlDeviceGetHandleByUUID(mig_uuid)
    assert pynvml.nvmlDeviceGetAttributes(by_uuid).memorySizeMB == 9984
    assert pynvml.nvmlDeviceGetMemoryInfo(by_uuid).total == 9984 * 1024**2
    gi_info = pynvml.nvmlGpuInstanceGetInfo(gi)
    assert (gi_info.profileId, gi_info.placement.start, gi_info.placement.size) == (19, 3, 1)
    assert ctypes.cast(gi_info.device, ctypes.c_void_p).value == ctypes.cast(h100, ctypes.c_void_p).value
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetAttributes(h100)


REFUSALS = [
    ("occupied", [(9, 0, 4)], (19, 2, 1), pynvml.NVMLError_InsufficientResources),
    ("instance limit", [(20, 0, 1)], (20, 5, 1), pynvml.NVMLError_InsufficientResources),
    ("not a placement", [], (9, 2, 4), pynvml.NVMLError_InvalidArgument),
    ("wrong size", [], (9, 0, 3), pynvml.NVMLError_InvalidArgument),
    ("unknown profile ID", [], (4, 0, 1), pynvml.NVMLError_InvalidArgument),
]


@pytest.mark.parametrize(("made", "then", "error"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_gpu_instance_refusals(
    h100: Any, made: list[tuple[int, int, int]], then: tuple[int, int, int], error: type[Exception]
) -> None:
    for profile_id, start, size in made:
        _gpu_instance(h100, profile_id=profile_id, start=start, size=size)
    with pytest.raises(error):
        _gpu_instance(h100, profile_id=then[0], start=then[1], size=then[2])


def test_mig_calls_on_a_gpu_without_mig_are_not_supported(mixed: Any) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(mixed)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(mixed, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        _gpu_instance(mixed, profile_id=19, start=0, size=1)


def test_a_gpu_instance_with_a_compute_instance_is_in_use(h100: Any) -> None:
    gi, ci = _mig_device(h100, profile_id=19, start=0, size=1)
    with pytest.raises(pynvml.NVMLError_InUse) as refused:
        pynvml.nvmlGpuInstanceDestroy(gi)
    assert str(refused.value) == "In use by another client"
    pynvml.nvmlComputeInstanceDestroy(ci)
    pynvml.nvmlGpuInstanceDestroy(gi)


def test_a_compute_instance_with_a_process_is_in_use(h100: Any, state_file: Path) -> None:
    _, ci = _mig_device(h100, profile_id=19, start=0, size=1)
    mig_uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlComputeInstanceGetInfo(ci).device)
    sim.attach_process(state_file=state_file, device_uuid=mig_uuid, pid=77)
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlComputeInstanceDestroy(ci)
    sim.detach_process(state_file=state_file, pid=77)
    pynvml.nvmlComputeInstanceDestroy(ci)


def test_stale_and_bogus_handles_are_invalid(h100: Any) -> None:
    gi = _gpu_instance(h100, profile_id=19, start=0, size=1)
    pynvml.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceGetInfo(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(ctypes.cast(0x1000, pynvml.c_nvmlDevice_t))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(gi)  # a GPU-instance handle is not a device handle


def test_lookups_of_missing_things_are_not_found(h100: Any) -> None:
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetGpuInstanceById(h100, 7)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("MIG-00000000-0000-0000-0000-000000000000")


def test_compute_instance_profiles_within_a_gpu_instance(h100: Any) -> None:
    gi = _gpu_instance(h100, profile_id=9, start=0, size=4)  # 3g.40gb
    shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    slices = [
        pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, shared).sliceCount
        for index in (
            pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
            pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        )
    ]
    assert slices == [1, 3]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE, shared
        )
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT, shared
        )
    three = [pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0) for _ in range(3)]
    assert [pynvml.nvmlComputeInstanceGetInfo(ci).placement.start for ci in three] == [0, 1, 2]
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)


def test_mig_mode_hook_refuses_while_instances_exist(h100: Any, state_file: Path) -> None:
    _gpu_instance(h100, profile_id=19, start=0, size=1)
    with pytest.raises(sim.hardware.Refused) as refused:
        sim.set_mig_mode(state_file=state_file, gpu_uuid=pynvml.nvmlDeviceGetUUID(h100), enabled=False)
    assert refused.value.code == pynvml.NVML_ERROR_IN_USE


def test_a_machine_whose_state_is_gone_has_no_driver(state_file: Path) -> None:
    _install("mixed", state_file)
    try:
        state_file.unlink()
        with pytest.raises(errors.NvmlUnavailable) as missing:
            nvml.Nvml(sysfs_root=state_file.parent / "sysfs")
        assert missing.value.nvml_error == "NVMLError_DriverNotLoaded"
    finally:
        sim.uninstall(pynvml)


@dataclass(frozen=True)
class _LostGpu:
    """GPU 0 of a DGX H100 with one MIG device, marked lost after its handles were taken."""

    uuid: str
    gpu: Any
    gi: Any
    ci: Any
    mig: Any
    mig_uuid: str


@pytest.fixture
def lost(h100: Any, state_file: Path) -> Iterator[_LostGpu]:
    gi, ci = _mig_device(h100, profile_id=19, start=0, size=1)
    mig = pynvml.nvmlComputeInstanceGetInfo(ci).device
    gpu = _LostGpu(pynvml.nvmlDeviceGetUUID(h100), h100, gi, ci, mig, pynvml.nvmlDeviceGetUUID(mig))
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=gpu.uuid, lost=True)
    yield gpu
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=gpu.uuid, lost=False)


_ON_A_LOST_GPU: dict[str, Callable[[_LostGpu], object]] = {
    "handle by index": lambda g: pynvml.nvmlDeviceGetHandleByIndex(0),
    "handle by UUID": lambda g: pynvml.nvmlDeviceGetHandleByUUID(g.uuid),
    "MIG device by UUID": lambda g: pynvml.nvmlDeviceGetHandleByUUID(g.mig_uuid),
    "name": lambda g: pynvml.nvmlDeviceGetName(g.gpu),
    "memory": lambda g: pynvml.nvmlDeviceGetMemoryInfo(g.gpu),
    "MIG mode": lambda g: pynvml.nvmlDeviceGetMigMode(g.gpu),
    "GPU instance": lambda g: pynvml.nvmlGpuInstanceGetInfo(g.gi),
    "compute instance": lambda g: pynvml.nvmlComputeInstanceGetInfo(g.ci),
    "MIG device memory": lambda g: pynvml.nvmlDeviceGetMemoryInfo(g.mig),
    "destroy": lambda g: pynvml.nvmlComputeInstanceDestroy(g.ci),
    "set MIG mode": lambda g: pynvml.nvmlDeviceSetMigMode(g.gpu, pynvml.NVML_DEVICE_MIG_DISABLE),
    "virtualization": lambda g: pynvml.nvmlDeviceGetVirtualizationMode(g.gpu),
    "MIG device slots": lambda g: pynvml.nvmlDeviceGetMaxMigDeviceCount(g.gpu),
    "MIG device slot": lambda g: pynvml.nvmlDeviceGetMigDeviceHandleByIndex(g.gpu, 0),
    "processes": lambda g: pynvml.nvmlDeviceGetComputeRunningProcesses(g.gpu),
    "MIG device processes": lambda g: pynvml.nvmlDeviceGetComputeRunningProcesses(g.mig),
}


@pytest.mark.parametrize("call", _ON_A_LOST_GPU.values(), ids=_ON_A_LOST_GPU.keys())
def test_every_call_on_a_lost_gpu_is_gpu_is_lost(lost: _LostGpu, call: Callable[[_LostGpu], object]) -> None:
    with pytest.raises(pynvml.NVMLError_GpuIsLost, match="GPU is lost"):
        call(lost)


def test_a_lost_gpu_leaves_the_others_alone_and_comes_back(lost: _LostGpu, state_file: Path) -> None:
    assert pynvml.nvmlDeviceGetCount() == 8  # still enumerated, as on real hardware
    assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(1)) == "NVIDIA H100 80GB HBM3"
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=lost.uuid, lost=False)
    again = pynvml.nvmlDeviceGetHandleByUUID(lost.uuid)
    assert ctypes.cast(again, ctypes.c_void_p).value == ctypes.cast(lost.gpu, ctypes.c_void_p).value
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByUUID(lost.mig_uuid)) == lost.mig_uuid
    pynvml.nvmlComputeInstanceDestroy(lost.ci)
    pynvml.nvmlGpuInstanceDestroy(lost.gi)


# --- MIG mode, virtualization, MIG device slots, processes, the proc tree ----------------------------


@pytest.fixture
def a100(state_file: Path) -> Iterator[Any]:
    with gpu_driver.connect("sim:dgx-a100", state_file=state_file):
        yield pynvml.nvmlDeviceGetHandleByIndex(0)


@pytest.fixture
def vm_h100(state_file: Path) -> Iterator[Any]:
    with gpu_driver.connect("sim:vm-h100", state_file=state_file):
        yield pynvml.nvmlDeviceGetHandleByIndex(0)


def _mig_uuid(ci: Any) -> str:
    uuid: str = pynvml.nvmlDeviceGetUUID(pynvml.nvmlComputeInstanceGetInfo(ci).device)
    return uuid


def test_hopper_switches_mig_mode_at_once(h100: Any) -> None:
    assert pynvml.nvmlDeviceSetMigMode(h100, pynvml.NVML_DEVICE_MIG_DISABLE) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(h100) == [0, 0]
    assert pynvml.nvmlDeviceSetMigMode(h100, pynvml.NVML_DEVICE_MIG_DISABLE) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceSetMigMode(h100, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(h100) == [1, 1]
    # the other GPUs are left alone
    assert pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(1)) == [1, 1]


def test_hopper_refuses_a_mode_change_while_instances_exist(h100: Any) -> None:
    gi = _gpu_instance(h100, profile_id=19, start=0, size=1)
    # The call succeeds; the activation status says the change did not happen and is pending.
    assert pynvml.nvmlDeviceSetMigMode(h100, pynvml.NVML_DEVICE_MIG_DISABLE) == pynvml.NVML_ERROR_IN_USE
    assert pynvml.nvmlDeviceGetMigMode(h100) == [1, 0]
    assert pynvml.nvmlGpuInstanceGetInfo(gi).placement.start == 0  # the instance is untouched
    # Asking for the current mode cancels the pending change.
    assert pynvml.nvmlDeviceSetMigMode(h100, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(h100) == [1, 1]


def test_hopper_refuses_a_mode_change_while_a_process_runs(h100: Any, state_file: Path) -> None:
    pynvml.nvmlDeviceSetMigMode(h100, pynvml.NVML_DEVICE_MIG_DISABLE)
    sim.attach_process(state_file=state_file, device_uuid=pynvml.nvmlDeviceGetUUID(h100), pid=99)
    assert pynvml.nvmlDeviceSetMigMode(h100, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_ERROR_IN_USE
    assert pynvml.nvmlDeviceGetMigMode(h100) == [0, 1]
    sim.detach_process(state_file=state_file, pid=99)
    assert pynvml.nvmlDeviceSetMigMode(h100, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(h100) == [1, 1]


def test_ampere_never_switches_mig_mode_without_a_reset(a100: Any, state_file: Path) -> None:
    for _ in range(2):
        status = pynvml.nvmlDeviceSetMigMode(a100, pynvml.NVML_DEVICE_MIG_DISABLE)
        assert status == pynvml.NVML_ERROR_RESET_REQUIRED
        assert pynvml.nvmlDeviceGetMigMode(a100) == [1, 0]
    # The administrator's reset (the hook) applies a mode and clears what was pending.
    uuid = pynvml.nvmlDeviceGetUUID(a100)
    sim.set_mig_mode(state_file=state_file, gpu_uuid=uuid, enabled=False)
    assert pynvml.nvmlDeviceGetMigMode(a100) == [0, 0]
    assert (
        pynvml.nvmlDeviceSetMigMode(a100, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_ERROR_RESET_REQUIRED
    )
    assert pynvml.nvmlDeviceGetMigMode(a100) == [0, 1]


def test_a_vm_needs_a_reboot_to_switch_mig_mode(vm_h100: Any) -> None:
    assert pynvml.nvmlDeviceGetVirtualizationMode(vm_h100) == pynvml.NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
    assert pynvml.nvmlDeviceGetMigMode(vm_h100) == [0, 0]
    status = pynvml.nvmlDeviceSetMigMode(vm_h100, pynvml.NVML_DEVICE_MIG_ENABLE)
    assert status == pynvml.NVML_ERROR_RESET_REQUIRED
    assert pynvml.nvmlDeviceGetMigMode(vm_h100) == [0, 1]


def test_mig_mode_on_a_gpu_without_mig_is_not_supported(mixed: Any) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceSetMigMode(mixed, pynvml.NVML_DEVICE_MIG_ENABLE)
    assert pynvml.nvmlDeviceGetVirtualizationMode(mixed) == pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE


def test_an_unknown_mig_mode_is_an_invalid_argument(h100: Any) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceSetMigMode(h100, 2)
    assert pynvml.nvmlDeviceGetMigMode(h100) == [1, 1]
    assert pynvml.nvmlDeviceGetVirtualizationMode(h100) == pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE


def test_mig_device_slots(h100: Any, state_file: Path) -> None:
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h100) == 7
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h100, 0)
    _, first = _mig_device(h100, profile_id=19, start=6, size=1)
    _, second = _mig_device(h100, profile_id=9, start=0, size=4)
    found = {pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h100, i)) for i in (0, 1)}
    assert found == {_mig_uuid(first), _mig_uuid(second)}
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h100, 2)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h100, 7)
    # Observed on an H200 with MIG disabled: no slots, and every index is NOT_FOUND.
    other = pynvml.nvmlDeviceGetHandleByIndex(1)
    sim.set_mig_mode(state_file=state_file, gpu_uuid=pynvml.nvmlDeviceGetUUID(other), enabled=False)
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(other) == 0
    for slot in (0, 7):
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(other, slot)


def test_gpus_without_mig_have_no_mig_device_slots(mixed: Any) -> None:
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(mixed) == 0
    for slot in (0, 7):
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(mixed, slot)


def test_processes_on_a_gpu(mixed: Any, state_file: Path) -> None:
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(mixed) == []
    uuid = pynvml.nvmlDeviceGetUUID(mixed)
    for pid in (31, 17):
        sim.attach_process(state_file=state_file, device_uuid=uuid, pid=pid)
    found = pynvml.nvmlDeviceGetComputeRunningProcesses(mixed)
    assert sorted(p.pid for p in found) == [17, 31]
    assert {(p.gpuInstanceId, p.computeInstanceId) for p in found} == {(0xFFFFFFFF, 0xFFFFFFFF)}
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(1)) == []


def test_processes_on_a_mig_device(h100: Any, state_file: Path) -> None:
    gi, ci = _mig_device(h100, profile_id=14, start=2, size=2)
    mig = pynvml.nvmlComputeInstanceGetInfo(ci).device
    sim.attach_process(state_file=state_file, device_uuid=_mig_uuid(ci), pid=4321)
    gi_id = pynvml.nvmlGpuInstanceGetInfo(gi).id
    [on_mig] = pynvml.nvmlDeviceGetComputeRunningProcesses(mig)
    assert (on_mig.pid, on_mig.gpuInstanceId, on_mig.computeInstanceId) == (4321, gi_id, 0)
    # The GPU's handle gives the aggregate over its MIG devices (nvml.h, privileged caller).
    [on_gpu] = pynvml.nvmlDeviceGetComputeRunningProcesses(h100)
    assert (on_gpu.pid, on_gpu.gpuInstanceId) == (4321, gi_id)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(1)) == []


def test_process_counts_follow_nvmls_size_protocol(mixed: Any, state_file: Path) -> None:
    uuid = pynvml.nvmlDeviceGetUUID(mixed)
    for pid in (1, 2, 3):
        sim.attach_process(state_file=state_file, device_uuid=uuid, pid=pid)
    function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    count = ctypes.c_uint(0)
    assert function(mixed, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 3
    count.value = 2
    infos = (pynvml.c_nvmlProcessInfo_v3_t * 2)()
    assert function(mixed, ctypes.byref(count), infos) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 3
    count.value = 5
    infos = (pynvml.c_nvmlProcessInfo_v3_t * 5)()
    assert function(mixed, ctypes.byref(count), infos) == pynvml.NVML_SUCCESS
    assert (count.value, [infos[i].pid for i in range(3)]) == (3, [1, 2, 3])


def test_a_gpu_alone_in_a_vm_has_no_nvlink(vm_h100: Any) -> None:
    """As an H200 passed through to a one-GPU VM answered."""
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(vm_h100, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkRemotePciInfo(vm_h100, 0)


def test_the_proc_tree_is_laid_out_like_the_drivers(h100: Any, state_file: Path) -> None:
    proc = state_file.parent / "proc"
    devices = (proc / "devices").read_text()
    characters, blocks = devices.split("\n\n")
    assert characters.splitlines()[0] == "Character devices:"
    assert {"195 nvidia", "195 nvidiactl", "508 nvidia-caps"} <= set(characters.splitlines())
    assert blocks.startswith("Block devices:\n")
    lines = (proc / "driver" / "nvidia-caps" / "mig-minors").read_text().splitlines()
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert lines[11:14] == ["gpu0/gi1/access 12", "gpu0/gi1/ci0/access 13", "gpu0/gi1/ci1/access 14"]
    assert lines[-1] == f"gpu31/gi14/ci7/access {3 + 32 * 15 * 9 - 1}"
    assert len(lines) == 2 + 32 * 15 * 9
    minors = [int(line.split()[1]) for line in lines]
    assert minors == list(range(1, len(lines) + 1))
