"""Device usage through gpudra.gpu.nvml on the simulated machines: utilization, memory used by the
processes on a GPU or MIG device, and what NVML refuses (utilization of a MIG device)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpudra import errors, sim
from gpudra.gpu import nvml
from gpudra.node import gpu_driver
from gpudra.sim import hardware

_GIB = 1 << 30


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "machine.json"


@pytest.fixture
def mixed(state_file: Path) -> Iterator[nvml.Nvml]:
    with gpu_driver.connect("sim:mixed", state_file=state_file) as session:
        yield session


@pytest.fixture
def h100(state_file: Path) -> Iterator[nvml.Nvml]:
    with gpu_driver.connect("sim:dgx-h100", state_file=state_file) as session:
        yield session


def test_a_whole_gpu_reports_utilization_memory_and_processes(mixed: nvml.Nvml, state_file: Path) -> None:
    uuid = mixed.inventory().gpus[0].uuid
    assert mixed.device_usage(uuid=uuid) == nvml.DeviceUsage(utilization=0, memory_used=0, processes=())
    sim.set_utilization(state_file=state_file, gpu_uuid=uuid, percent=37)
    sim.attach_process(state_file=state_file, device_uuid=uuid, pid=300, used_bytes=3 * _GIB)
    sim.attach_process(state_file=state_file, device_uuid=uuid, pid=12, used_bytes=_GIB)
    assert mixed.device_usage(uuid=uuid) == nvml.DeviceUsage(
        utilization=37, memory_used=4 * _GIB, processes=(12, 300)
    )
    memory = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByUUID(uuid))
    assert memory.free == memory.total - 4 * _GIB
    found = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByUUID(uuid))
    assert {p.pid: p.usedGpuMemory for p in found} == {300: 3 * _GIB, 12: _GIB}
    sim.detach_process(state_file=state_file, pid=300)
    assert mixed.device_usage(uuid=uuid).memory_used == _GIB


def test_a_mig_device_reports_memory_and_processes_but_no_utilization(
    h100: nvml.Nvml, state_file: Path
) -> None:
    gpu = h100.inventory().gpus[0].uuid
    device = h100.create_mig_device(gpu_uuid=gpu, profile_id=19, placement_start=0)
    other = h100.create_mig_device(gpu_uuid=gpu, profile_id=19, placement_start=1)
    sim.attach_process(state_file=state_file, device_uuid=device.uuid, pid=4242, used_bytes=2 * _GIB)
    sim.attach_process(state_file=state_file, device_uuid=other.uuid, pid=7, used_bytes=_GIB)
    assert h100.device_usage(uuid=device.uuid) == nvml.DeviceUsage(
        utilization=None, memory_used=2 * _GIB, processes=(4242,)
    )
    # NVML reports no utilization for a MIG device, nor for its GPU in MIG mode; the GPU's memory and
    # processes are the aggregate of its MIG devices' (a privileged caller's view).
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByUUID(device.uuid))
    assert h100.device_usage(uuid=gpu) == nvml.DeviceUsage(
        utilization=None, memory_used=3 * _GIB, processes=(7, 4242)
    )


def test_a_lost_gpu_cannot_be_measured(h100: nvml.Nvml, state_file: Path) -> None:
    gpu = h100.inventory().gpus[0].uuid
    device = h100.create_mig_device(gpu_uuid=gpu, profile_id=19, placement_start=0)
    handle = pynvml.nvmlDeviceGetHandleByUUID(device.uuid)
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=gpu, lost=True)
    try:
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetUtilizationRates(handle)
        with pytest.raises(errors.HardwareError, match="GPU is lost"):
            h100.device_usage(uuid=device.uuid)
    finally:
        sim.set_gpu_lost(state_file=state_file, gpu_uuid=gpu, lost=False)


def test_a_process_cannot_hold_more_than_the_free_memory(h100: nvml.Nvml, state_file: Path) -> None:
    gpu = h100.inventory().gpus[0].uuid
    device = h100.create_mig_device(gpu_uuid=gpu, profile_id=19, placement_start=0)
    total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByUUID(device.uuid)).total
    sim.attach_process(state_file=state_file, device_uuid=device.uuid, pid=1, used_bytes=total - 10)
    for used in (11, -1):
        with pytest.raises(hardware.Refused) as refused:
            sim.attach_process(state_file=state_file, device_uuid=device.uuid, pid=2, used_bytes=used)
        assert refused.value.code == hardware.INVALID_ARGUMENT
    sim.attach_process(state_file=state_file, device_uuid=device.uuid, pid=2, used_bytes=10)
    assert h100.device_usage(uuid=device.uuid).memory_used == total
