"""MIG prepare's reads on a real NVIDIA GPU: the mode-switch rule, capability minors, processes. Needs a GPU.

Read-only like the other GPU tests: nothing here switches MIG mode or creates an instance. Where the
card could be switched, the test stops before the switch; the refusal path (a GPU whose mode change
needs a reset, e.g. one passed through to a VM) is exercised for real because it touches nothing.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pynvml
import pytest

from gpudra.errors import ClaimError
from gpudra.node import checkpoint as ckpt
from gpudra.node import gpu_driver
from gpudra.node.mig import MigPartitions

pytestmark = pytest.mark.gpu


def test_mig_mode_switchable_follows_architecture_and_virtualization() -> None:
    pynvml.nvmlInit()
    try:
        expected = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                pynvml.nvmlDeviceGetMigMode(handle)
                capable = True
            except pynvml.NVMLError_NotSupported:
                capable = False
            arch = pynvml.nvmlDeviceGetArchitecture(handle)
            virtual = pynvml.nvmlDeviceGetVirtualizationMode(handle)
            expected[pynvml.nvmlDeviceGetUUID(handle)] = (
                capable and arch >= pynvml.NVML_DEVICE_ARCH_HOPPER and virtual == 0
            )
    finally:
        pynvml.nvmlShutdown()
    with gpu_driver.connect("real") as session:
        found = {gpu.uuid: gpu.mig_mode_switchable for gpu in session.inventory().gpus}
    assert found == expected


def test_mig_capability_minors_follow_the_layout_the_simulator_writes() -> None:
    lines = Path("/proc/driver/nvidia-caps/mig-minors").read_text().splitlines()
    minors = dict(line.rsplit(" ", 1) for line in lines)
    with gpu_driver.connect("real") as session:
        for gpu_minor, gi, ci in [(0, 0, 0), (0, 1, 0), (0, 14, 7), (3, 2, 1)]:
            caps = session.mig_capabilities(gpu_minor=gpu_minor, gpu_instance_id=gi, compute_instance_id=ci)
            assert (
                caps.gi_minor == int(minors[f"gpu{gpu_minor}/gi{gi}/access"]) == 3 + (gpu_minor * 15 + gi) * 9
            )
            assert (
                caps.ci_minor == int(minors[f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"]) == caps.gi_minor + 1 + ci
            )
            assert f"{caps.major} nvidia-caps" in Path("/proc/devices").read_text().splitlines()


def test_compute_processes_sees_a_cuda_context_of_this_process() -> None:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        pytest.skip("no libcuda.so.1 on this machine")
    context = ctypes.c_void_p()
    assert cuda.cuInit(0) == 0
    device = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
    assert cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device) == 0
    try:
        with gpu_driver.connect("real") as session:
            gpus = session.inventory().gpus
            seen = {gpu.uuid: session.compute_processes(gpu_uuid=gpu.uuid) for gpu in gpus}
        assert any(os.getpid() in pids for pids in seen.values()), seen
    finally:
        cuda.cuCtxDestroy_v2(context)


def test_a_partition_on_a_gpu_that_cannot_switch_is_refused_without_touching_it() -> None:
    with gpu_driver.connect("real") as session:
        gpus = [g for g in session.inventory().gpus if g.mig_capable and not g.mig_enabled]
        if not gpus or gpus[0].mig_mode_switchable:
            pytest.skip("needs a MIG-capable GPU with MIG off whose mode change needs a reset")
        gpu = gpus[0]
        profile = min(gpu.mig_profiles, key=lambda p: p.slice_count)
        partitions = MigPartitions(session, gpus={gpu.uuid: gpu})
        record = ckpt.MigRecord(
            spec=ckpt.MigSpec(
                gpu_uuid=gpu.uuid, profile_id=profile.id, placement_start=profile.placements[0].start
            )
        )
        with pytest.raises(ClaimError, match="never switches it on this GPU"):
            partitions.create(f"gpu-{gpu.minor}-mig", record)
        assert session.mig_enabled(gpu_uuid=gpu.uuid) is False
