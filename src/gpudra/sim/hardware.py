"""What the simulated GPUs allow: MIG instance rules and the NVML return codes of refusals. Pure.

Every function takes the machine (static facts) and its state (mutable, see `gpudra.sim.state`) and
either changes the state or raises `Refused` with the NVML return code real hardware gives, leaving the
state as it was. The C entry points in `gpudra.sim.library` only translate ctypes arguments to these.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from gpudra.sim import machines, state

# nvml.h return codes
SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
INSUFFICIENT_SIZE = 7
GPU_IS_LOST = 15
RESET_REQUIRED = 16
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
ARGUMENT_VERSION_MISMATCH = 25

ERROR_STRINGS = {
    SUCCESS: "Success",
    UNINITIALIZED: "Uninitialized",
    INVALID_ARGUMENT: "Invalid Argument",
    NOT_SUPPORTED: "Not Supported",
    NOT_FOUND: "Not Found",
    DRIVER_NOT_LOADED: "Driver Not Loaded",
    TIMEOUT: "Timeout",
    INSUFFICIENT_SIZE: "Insufficient Size",
    GPU_IS_LOST: "GPU is lost",
    RESET_REQUIRED: "GPU requires restart",
    IN_USE: "In use by another client",
    INSUFFICIENT_RESOURCES: "Insufficient resources",
    ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
}

# GI IDs come from a pool per instance size, lowest free first; like the driver's, an ID says nothing
# about where the instance sits (observed: a 3g at 0:4 got GI 2, another 3g at 4:4 got GI 2).
_GI_ID_POOLS = {8: (0,), 4: (1, 2), 2: (3, 4, 5, 6), 1: (7, 8, 9, 10, 11, 12, 13, 14)}

# Compute-instance profile index -> GPU slices; the CI profile ID equals the index (observed).
CI_PROFILE_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}
CI_PROFILE_COUNT = 9

# What NVML writes into a process's GPU/compute instance ID when it runs on a GPU without MIG.
VALUE_NOT_AVAILABLE = 0xFFFFFFFF
MIG_DISABLE, MIG_ENABLE = 0, 1


class Refused(Exception):
    """What the hardware answers instead of doing it: an NVML return code."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{ERROR_STRINGS.get(code, code)}: {reason}")
        self.code = code


@dataclass(frozen=True)
class ComputeProfile:
    """A compute-instance profile within one GPU-instance profile."""

    id: int
    slices: int
    instances: int
    multiprocessors: int
    gpu_instance: machines.MigProfileSpec

    @property
    def name(self) -> str:
        gi = self.gpu_instance.name
        return gi if self.slices == self.gpu_instance.slices else f"{self.slices}c.{gi}"


def mig_profile(model: machines.GpuModel, profile_id: int) -> machines.MigProfileSpec:
    for profile in model.mig_profiles:
        if profile.id == profile_id:
            return profile
    raise Refused(INVALID_ARGUMENT, f"{model.name} has no GPU-instance profile ID {profile_id}")


def require_present(gpu: state.GpuState) -> None:
    """What the driver answers for a GPU that fell off the bus, whatever was asked of it."""
    if gpu.lost:
        raise Refused(GPU_IS_LOST, f"{gpu.uuid} has fallen off the bus")


def require_mig_capable(model: machines.GpuModel) -> None:
    if not model.mig_capable:
        raise Refused(NOT_SUPPORTED, f"{model.name} does not support MIG")


def require_mig_enabled(model: machines.GpuModel, gpu: state.GpuState) -> None:
    require_mig_capable(model)
    if not gpu.mig_mode:
        raise Refused(NOT_SUPPORTED, f"MIG mode is disabled on {gpu.uuid}")


def processes_on(machine_state: state.MachineState, index: int) -> list[tuple[int, int, int]]:
    """(pid, GI ID, CI ID) of every process on GPU `index` or one of its MIG devices; the IDs are
    VALUE_NOT_AVAILABLE for a process on the GPU itself."""
    gpu = machine_state.gpus[index]
    where = {gpu.uuid: (VALUE_NOT_AVAILABLE, VALUE_NOT_AVAILABLE)} | {
        ci.uuid: (gi.id, ci.id) for gi in gpu.gpu_instances for ci in gi.compute_instances
    }
    return [(p.pid, *where[p.device_uuid]) for p in machine_state.processes if p.device_uuid in where]


def set_mig_mode(
    *, model: machines.GpuModel, virtualization: int, machine_state: state.MachineState, index: int, mode: int
) -> int:
    """nvmlDeviceSetMigMode on GPU `index`: switches to `mode` or leaves it pending; the activation status.

    SUCCESS: the mode is now `mode` (asking for the current mode cancels a pending change). IN_USE:
    GPU instances or processes hold the GPU, so the driver cannot unbind it. RESET_REQUIRED: the mode
    applies only after a GPU reset, which the driver does not do by itself on Ampere, nor can it
    inside a VM. The two failures leave the new mode pending, as the driver does; the simulator never
    resets, so only `hooks.set_mig_mode` (an administrator's reset) or setting the current mode again
    clears it.
    """
    require_mig_capable(model)
    if mode not in (MIG_DISABLE, MIG_ENABLE):
        raise Refused(INVALID_ARGUMENT, f"MIG mode {mode}")
    gpu = machine_state.gpus[index]
    if mode == gpu.mig_mode:
        gpu.mig_mode_pending = None
        return SUCCESS
    gpu.mig_mode_pending = mode
    if gpu.gpu_instances or processes_on(machine_state, index):
        return IN_USE
    if model.architecture < machines.ARCH_HOPPER or virtualization != machines.VIRTUALIZATION_NONE:
        return RESET_REQUIRED
    gpu.mig_mode, gpu.mig_mode_pending = mode, None
    return SUCCESS


def max_mig_devices(model: machines.GpuModel, gpu: state.GpuState) -> int:
    """nvmlDeviceGetMaxMigDeviceCount: one per compute slice with MIG enabled (7 on A100/H100), else 0."""
    if not (model.mig_capable and gpu.mig_mode):
        return 0
    return max(profile.slices for profile in model.mig_profiles)


def gpu_instance(gpu: state.GpuState, gi_id: int) -> state.GpuInstanceState:
    for gi in gpu.gpu_instances:
        if gi.id == gi_id:
            return gi
    raise Refused(NOT_FOUND, f"no GPU instance {gi_id} on {gpu.uuid}")


def compute_instance(gi: state.GpuInstanceState, ci_id: int) -> state.ComputeInstanceState:
    for ci in gi.compute_instances:
        if ci.id == ci_id:
            return ci
    raise Refused(NOT_FOUND, f"no compute instance {ci_id} in GPU instance {gi.id}")


def compute_profile(profile: machines.MigProfileSpec, index: int) -> ComputeProfile:
    """The CI profile `index` inside a GI of `profile`; the split rule is the one go-nvlib uses."""
    if not 0 <= index < CI_PROFILE_COUNT:
        raise Refused(INVALID_ARGUMENT, f"compute-instance profile index {index} out of range")
    slices = CI_PROFILE_SLICES.get(index)
    whole = profile.slices
    if slices is None or slices > whole or (slices < whole and 2 * slices > whole + 1):
        raise Refused(NOT_SUPPORTED, f"no {slices}-slice compute instance in a {profile.name} GPU instance")
    return ComputeProfile(
        id=index,
        slices=slices,
        instances=whole // slices,
        multiprocessors=profile.multiprocessors * slices // whole,
        gpu_instance=profile,
    )


def create_gpu_instance(
    *, model: machines.GpuModel, gpu: state.GpuState, profile_id: int, start: int, size: int
) -> state.GpuInstanceState:
    require_mig_enabled(model, gpu)
    profile = mig_profile(model, profile_id)
    if start not in profile.starts or size != profile.size:
        raise Refused(INVALID_ARGUMENT, f"{start}:{size} is not a placement of {profile.name}")
    same = [gi for gi in gpu.gpu_instances if gi.profile_id == profile_id]
    if len(same) >= profile.instances:
        raise Refused(INSUFFICIENT_RESOURCES, f"{profile.name} allows {profile.instances} instances")
    wanted = set(range(start, start + size))
    for gi in gpu.gpu_instances:
        if wanted & set(range(gi.start, gi.start + gi.size)):
            raise Refused(INSUFFICIENT_RESOURCES, f"placement {start}:{size} overlaps GPU instance {gi.id}")
    taken = {gi.id for gi in gpu.gpu_instances}
    gi_id = next(i for i in _GI_ID_POOLS[size] if i not in taken)
    created = state.GpuInstanceState(id=gi_id, profile_id=profile_id, start=start, size=size)
    gpu.gpu_instances.append(created)
    return created


def destroy_gpu_instance(*, gpu: state.GpuState, gi_id: int) -> None:
    gi = gpu_instance(gpu, gi_id)
    if gi.compute_instances:
        raise Refused(IN_USE, f"GPU instance {gi_id} still has compute instances")
    gpu.gpu_instances.remove(gi)


def create_compute_instance(
    *, model: machines.GpuModel, gi: state.GpuInstanceState, profile_id: int
) -> state.ComputeInstanceState:
    profile = compute_profile(mig_profile(model, gi.profile_id), profile_id)
    whole = profile.gpu_instance.slices
    occupied = {s for ci in gi.compute_instances for s in range(ci.start, ci.start + ci.size)}
    start = next(
        (
            s
            for s in range(0, whole - profile.slices + 1, profile.slices)
            if not occupied & set(range(s, s + profile.slices))
        ),
        None,
    )
    if start is None:
        raise Refused(INSUFFICIENT_RESOURCES, f"no room for a {profile.name} compute instance")
    taken = {ci.id for ci in gi.compute_instances}
    created = state.ComputeInstanceState(
        id=next(i for i in range(whole) if i not in taken),
        profile_id=profile_id,
        start=start,
        size=profile.slices,
        uuid=f"MIG-{uuid.uuid4()}",
    )
    gi.compute_instances.append(created)
    return created


def destroy_compute_instance(
    *, machine_state: state.MachineState, gi: state.GpuInstanceState, ci_id: int
) -> None:
    ci = compute_instance(gi, ci_id)
    holders = [p.pid for p in machine_state.processes if p.device_uuid == ci.uuid]
    if holders:
        raise Refused(IN_USE, f"processes {holders} use {ci.uuid}")
    gi.compute_instances.remove(ci)
