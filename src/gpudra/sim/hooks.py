"""Test hooks for what gpudra's NVML calls never change: processes, MIG mode, load, a lost GPU, XIDs and
ECC errors. I/O: the state file.

Real hardware gets processes from workloads, MIG mode from an administrator, utilization from work
and a lost GPU, an XID or an ECC error from a fault; the simulator gets them from these calls, so tests
can exercise "destroy while in use", the Ampere rule that MIG profiles are hidden while MIG is
disabled, a GPU that fell off the bus, or the events NVML delivers for a fault.

`python -m gpudra.sim` (`gpudra.sim.__main__`) raises the faults from a shell.
"""

from __future__ import annotations

from pathlib import Path

from gpudra.sim import events, hardware, machines, state

_MIB = 1024 * 1024


def attach_process(*, state_file: Path, device_uuid: str, pid: int, used_bytes: int = 0) -> None:
    """Records process `pid` as running on a GPU or MIG device, by UUID, holding `used_bytes` of its
    memory; more than the device has free is refused, as CUDA refuses the allocation."""
    with state.StateFile(state_file).update() as machine_state:
        model = machines.MACHINES[machine_state.machine]
        totals = {}  # device UUID -> (its memory in bytes, the UUIDs whose processes use that memory)
        for index, gpu in enumerate(machine_state.gpus):
            gpu_model = model.gpus[index].model
            migs = {ci.uuid for gi in gpu.gpu_instances for ci in gi.compute_instances}
            totals[gpu.uuid] = (gpu_model.memory_mib * _MIB, {gpu.uuid} | migs)
            for gi in gpu.gpu_instances:
                memory = hardware.mig_profile(gpu_model, gi.profile_id).memory_mib * _MIB
                totals.update({ci.uuid: (memory, {ci.uuid}) for ci in gi.compute_instances})
        if device_uuid not in totals:
            raise hardware.Refused(hardware.NOT_FOUND, f"no device with UUID {device_uuid}")
        total, sharing = totals[device_uuid]
        free = total - machine_state.memory_used(sharing)
        if not 0 <= used_bytes <= free:
            raise hardware.Refused(
                hardware.INVALID_ARGUMENT, f"{used_bytes} bytes: {device_uuid} has {free} bytes free"
            )
        machine_state.processes.append(state.Process(pid=pid, device_uuid=device_uuid, used_bytes=used_bytes))


def detach_process(*, state_file: Path, pid: int) -> None:
    with state.StateFile(state_file).update() as machine_state:
        machine_state.processes = [p for p in machine_state.processes if p.pid != pid]


def set_mig_mode(*, state_file: Path, gpu_uuid: str, enabled: bool) -> None:
    """Like `nvidia-smi -i <gpu> -mig 0|1` on an idle GPU plus the reset that applies it, whatever the
    architecture: refused while instances exist; clears a pending mode."""
    store = state.StateFile(state_file)
    with store.update() as machine_state:
        index, gpu = _gpu(machine_state, gpu_uuid)
        hardware.require_mig_capable(machines.MACHINES[machine_state.machine].gpus[index].model)
        if gpu.gpu_instances:
            raise hardware.Refused(hardware.IN_USE, f"{gpu_uuid} still has GPU instances")
        gpu.mig_mode, gpu.mig_mode_pending = int(enabled), None


def set_utilization(*, state_file: Path, gpu_uuid: str, percent: int) -> None:
    if not 0 <= percent <= 100:
        raise hardware.Refused(hardware.INVALID_ARGUMENT, f"utilization {percent}% is not within 0..100")
    with state.StateFile(state_file).update() as machine_state:
        _gpu(machine_state, gpu_uuid)[1].utilization = percent


def set_gpu_lost(*, state_file: Path, gpu_uuid: str, lost: bool) -> None:
    """Like a GPU falling off the bus (XID 79) and coming back after a reset: while lost, every NVML call
    on it, its GPU and compute instances and its MIG devices answers GPU_IS_LOST."""
    with state.StateFile(state_file).update() as machine_state:
        gpu = _gpu(machine_state, gpu_uuid)[1]
        gpu.lost = lost
        if not lost:  # the reset that brought it back applied the pending repairs and retrained its links
            gpu.row_remap_pending = gpu.retired_pages_pending = False
            gpu.nvlinks_down = []


MEMORY_CONDITIONS = ("row-remap-pending", "row-remap-failed", "retired-pages-pending")


def set_memory_condition(*, state_file: Path, gpu_uuid: str, condition: str, on: bool) -> None:
    """The driver queues a row remapping or a page retirement for the next reset (`*-pending`), or a
    row remapping fails (`row-remap-failed`); what the GPU's architecture does not report is still
    recorded, and NVML answers NOT_SUPPORTED for it."""
    if condition not in MEMORY_CONDITIONS:
        raise hardware.Refused(
            hardware.INVALID_ARGUMENT, f"condition {condition!r}: one of {', '.join(MEMORY_CONDITIONS)}"
        )
    with state.StateFile(state_file).update() as machine_state:
        setattr(_gpu(machine_state, gpu_uuid)[1], condition.replace("-", "_"), on)


def set_nvlink_down(*, state_file: Path, gpu_uuid: str, link: int, down: bool) -> None:
    """An NVLink of the GPU goes down (or trains again): nvmlDeviceGetNvLinkState answers 0 for it."""
    with state.StateFile(state_file).update() as machine_state:
        index, gpu = _gpu(machine_state, gpu_uuid)
        links = machines.MACHINES[machine_state.machine].gpus[index].model.nvlinks
        if not 0 <= link < links:
            raise hardware.Refused(
                hardware.INVALID_ARGUMENT, f"link {link}: the GPU has links 0..{links - 1}"
            )
        gpu.nvlinks_down = sorted(
            (set(gpu.nvlinks_down) | {link}) if down else set(gpu.nvlinks_down) - {link}
        )


def raise_xid(
    *,
    state_file: Path,
    gpu_uuid: str,
    xid: int,
    gpu_instance_id: int | None = None,
    compute_instance_id: int | None = None,
) -> None:
    """The driver reports XID `xid` on a GPU, or on one of its GPU (and compute) instances, which must
    exist: an XID critical-error event for the event sets registered for it."""
    if not 0 <= xid < 2**32:
        raise hardware.Refused(hardware.INVALID_ARGUMENT, f"XID {xid} is not within 0..2^32-1")
    with state.StateFile(state_file).update() as machine_state:
        index, gpu = _gpu(machine_state, gpu_uuid)
        _check_instance(gpu, gpu_instance_id, compute_instance_id)
        events.raise_event(
            machine_state,
            gpu=index,
            type_=machines.EVENT_XID,
            data=xid,
            gpu_instance_id=gpu_instance_id,
            compute_instance_id=compute_instance_id,
        )


def raise_double_bit_ecc(*, state_file: Path, gpu_uuid: str, gpu_instance_id: int | None = None) -> None:
    """An uncorrectable (double-bit) ECC error, as the driver reports one: the GPU's uncorrected count
    goes up, and it raises a double-bit ECC event and XID 48."""
    with state.StateFile(state_file).update() as machine_state:
        index, gpu = _gpu(machine_state, gpu_uuid)
        _check_instance(gpu, gpu_instance_id, None)
        gpu.ecc_uncorrected += 1
        for type_, data in ((machines.EVENT_DOUBLE_BIT_ECC, 0), (machines.EVENT_XID, 48)):
            events.raise_event(
                machine_state, gpu=index, type_=type_, data=data, gpu_instance_id=gpu_instance_id
            )


def raise_single_bit_ecc(*, state_file: Path, gpu_uuid: str) -> None:
    """A corrected (single-bit) ECC error: the driver raises a single-bit ECC event."""
    with state.StateFile(state_file).update() as machine_state:
        index, _ = _gpu(machine_state, gpu_uuid)
        events.raise_event(machine_state, gpu=index, type_=machines.EVENT_SINGLE_BIT_ECC)


CLOCK_SLOWDOWNS = {  # nvmlClocksEventReason bits, by the names gpudra's metric uses
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}


def set_clock_slowdown(*, state_file: Path, gpu_uuid: str, reasons: list[str]) -> None:
    """What holds the GPU's clocks down from now on (none: an empty list)."""
    unknown = sorted(set(reasons) - set(CLOCK_SLOWDOWNS))
    if unknown:
        raise hardware.Refused(
            hardware.INVALID_ARGUMENT, f"{', '.join(unknown)}: one of {', '.join(CLOCK_SLOWDOWNS)}"
        )
    with state.StateFile(state_file).update() as machine_state:
        _gpu(machine_state, gpu_uuid)[1].clock_event_reasons = sum({CLOCK_SLOWDOWNS[r] for r in reasons})


def _check_instance(
    gpu: state.GpuState, gpu_instance_id: int | None, compute_instance_id: int | None
) -> None:
    if gpu_instance_id is None:
        if compute_instance_id is not None:
            raise hardware.Refused(hardware.INVALID_ARGUMENT, "a compute instance needs its GPU instance")
        return
    gi = hardware.gpu_instance(gpu, gpu_instance_id)
    if compute_instance_id is not None:
        hardware.compute_instance(gi, compute_instance_id)


def _gpu(machine_state: state.MachineState, gpu_uuid: str) -> tuple[int, state.GpuState]:
    for index, gpu in enumerate(machine_state.gpus):
        if gpu.uuid == gpu_uuid:
            return index, gpu
    raise hardware.Refused(hardware.NOT_FOUND, f"no GPU with UUID {gpu_uuid}")
