"""The simulated libnvidia-ml: the C entry points pynvml calls for gpudra. I/O: the state file.

pynvml looks every C symbol up with `getattr(nvmlLib, name)` and calls it with ctypes arguments:
handles are pointer objects, out-parameters arrive as `byref(...)` objects (the target is `._obj`),
string buffers and caller-allocated arrays arrive as themselves, sizes as `c_uint`, indices often as
plain ints. Each entry point here takes exactly that, writes results into the caller's objects and
returns an NVML return code, so pynvml's own wrappers (structs, versions, `_nvmlCheckReturn` raising
`NVMLError_*`) run unchanged. Symbols not defined here are missing, as in an old driver:
pynvml raises NVMLError_FunctionNotFound. Where the driver reports an outcome in an out-parameter
rather than the return code (nvmlDeviceSetMigMode's activation status), so does the simulator.

Handles are opaque pointer values that encode what they point at (GPU, GPU instance, compute
instance, MIG device) and are checked against the current state on every call, so a handle to an
instance another process destroyed is refused like a stale one on real hardware. A GPU marked lost
in the state (`hooks.set_gpu_lost`) answers GPU_IS_LOST to every call that reaches it: handle lookups,
queries and MIG calls on it, its instances and its MIG devices.

Event sets (nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2, nvmlEventSetFree) live
in this process, as they do in a real one, and read the events `hooks` raise into the state file
(`gpudra.sim.events`): a wait polls the file until an event for the set arrives or its timeout passes
(TIMEOUT). A GPU offers the event types its machine profile lists; registering for any other, or
through a MIG device handle (NVML registers MIG events through the parent), is NOT_SUPPORTED.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

from gpudra.sim import events, hardware, machines, state
from gpudra.sim.hardware import Refused

_MAGIC = 0x6770
_GPU, _GPU_INSTANCE, _COMPUTE_INSTANCE, _MIG_DEVICE, _EVENT_SET = 1, 2, 3, 4, 5
# How often a waiting nvmlEventSetWait looks at the state file for new events.
_EVENT_POLL_SECONDS = 0.05
_ECC_UNCORRECTED = 1  # nvmlMemoryErrorType_t
_NVLINK_DEVICE_TYPE_SWITCH = 2
_MIB = 1024 * 1024

EntryPoint = Callable[..., Any]
_ENTRY_POINTS: dict[str, str] = {}


def _entry(c_name: str) -> Callable[[EntryPoint], EntryPoint]:
    def register(method: EntryPoint) -> EntryPoint:
        _ENTRY_POINTS[c_name] = method.__name__
        return method

    return register


class CFunction:
    """What `getattr(nvmlLib, name)` returns: callable, and open to the attributes pynvml sets (restype)."""

    def __init__(self, call: EntryPoint) -> None:
        self._call = call
        self.restype: Any = ctypes.c_int

    def __call__(self, *args: Any) -> Any:
        return self._call(*args)


def _handle(kind: int, *, gpu: int, gi: int = 0, ci: int = 0) -> int:
    return (_MAGIC << 32) | (kind << 24) | (gpu << 16) | (gi << 8) | ci


def _pointer_value(handle: Any) -> int:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return 0


def _store_handle(target: Any, value: int) -> None:
    ctypes.c_void_p.from_buffer(target).value = value


def _out(ref: Any) -> Any:
    target = getattr(ref, "_obj", None)
    if target is None:
        raise Refused(hardware.INVALID_ARGUMENT, "out-parameter is not a reference")
    return target


def _int(value: Any) -> int:
    return int(getattr(value, "value", value))


def _put_string(buffer: Any, *, length: Any, text: str) -> None:
    data = text.encode()
    if len(data) + 1 > _int(length):
        raise Refused(hardware.INSUFFICIENT_SIZE, f"{len(data) + 1} bytes needed")
    buffer.value = data


def _version(struct: Any, version: int) -> None:
    """NVML's versioned structs carry sizeof(struct) | version << 24 in their first field."""
    if struct.version != ctypes.sizeof(struct) | version << 24:
        raise Refused(hardware.ARGUMENT_VERSION_MISMATCH, f"{type(struct).__name__}.version")


def _fill_pci(info: Any, *, bus: int, pci_device: int, pci_subsystem: int) -> None:
    info.busIdLegacy = f"{0:04X}:{bus:02X}:00.0".encode()
    info.busId = f"{0:08X}:{bus:02X}:00.0".encode()
    info.domain = 0
    info.bus = bus
    info.device = 0
    info.pciDeviceId = pci_device << 16 | machines.NVIDIA_VENDOR_ID
    info.pciSubSystemId = pci_subsystem


class SimulatedLibrary:
    """Stands where pynvml keeps the loaded CDLL; `install` in `gpudra.sim` puts it there."""

    def __init__(self, *, machine: machines.Machine, state_file: state.StateFile) -> None:
        self.machine = machine
        self.state_file = state_file
        self.installs = 0
        self.previous: object = None  # what pynvml had loaded before, restored on the last uninstall
        self._initialized = 0
        self._event_sets: dict[int, events.EventSet] = {}
        self._event_sets_made = 0  # numbers are never reused, so a freed set's handle stays invalid
        self._event_sets_lock = threading.Lock()
        self._functions = {
            c_name: CFunction(self._guard(c_name, getattr(self, method)))
            for c_name, method in _ENTRY_POINTS.items()
        }

    def __getattr__(self, name: str) -> CFunction:
        functions: dict[str, CFunction] = self.__dict__.get("_functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(name)

    def entry_points(self) -> dict[str, CFunction]:
        return dict(self._functions)

    def _guard(self, c_name: str, method: EntryPoint) -> EntryPoint:
        needs_init = c_name not in ("nvmlInitWithFlags", "nvmlErrorString")

        def call(*args: Any) -> Any:
            if needs_init and not self._initialized:
                return hardware.UNINITIALIZED
            try:
                return method(*args)
            except Refused as refused:
                return refused.code

        return call

    # --- handles -------------------------------------------------------------------------------

    def _decode(self, handle: Any, kind: int) -> tuple[int, int, int]:
        value = _pointer_value(handle)
        if self._kind(handle) != kind or (value >> 16) & 0xFF >= len(self.machine.gpus):
            raise Refused(hardware.INVALID_ARGUMENT, "not a valid handle")
        return (value >> 16) & 0xFF, (value >> 8) & 0xFF, value & 0xFF

    def _kind(self, handle: Any) -> int:
        value = _pointer_value(handle)
        return (value >> 24) & 0xFF if value >> 32 == _MAGIC else 0

    def _gpu(self, handle: Any) -> int:
        index = self._decode(handle, _GPU)[0]
        hardware.require_present(self.state_file.read().gpus[index])
        return index

    def _gpu_instance(
        self, handle: Any, machine_state: state.MachineState
    ) -> tuple[int, state.GpuState, state.GpuInstanceState]:
        index, gi_id, _ = self._decode(handle, _GPU_INSTANCE)
        gpu = machine_state.gpus[index]
        hardware.require_present(gpu)
        try:
            return index, gpu, hardware.gpu_instance(gpu, gi_id)
        except Refused as refused:
            raise Refused(hardware.INVALID_ARGUMENT, "stale GPU instance handle") from refused

    def _compute_instance(
        self, handle: Any, *, kind: int, machine_state: state.MachineState
    ) -> tuple[int, state.GpuInstanceState, state.ComputeInstanceState]:
        index, gi_id, ci_id = self._decode(handle, kind)
        hardware.require_present(machine_state.gpus[index])
        try:
            gi = hardware.gpu_instance(machine_state.gpus[index], gi_id)
            return index, gi, hardware.compute_instance(gi, ci_id)
        except Refused as refused:
            raise Refused(hardware.INVALID_ARGUMENT, "stale compute instance handle") from refused

    def _model(self, index: int) -> machines.GpuModel:
        return self.machine.gpus[index].model

    # --- library -------------------------------------------------------------------------------

    @_entry("nvmlInitWithFlags")
    def init_with_flags(self, flags: Any) -> int:
        if not self.state_file.exists():
            raise Refused(hardware.DRIVER_NOT_LOADED, f"no simulated machine at {self.state_file.path}")
        self._initialized += 1
        return hardware.SUCCESS

    @_entry("nvmlShutdown")
    def shutdown(self) -> int:
        self._initialized -= 1
        return hardware.SUCCESS

    @_entry("nvmlErrorString")
    def error_string(self, code: Any) -> bytes:
        return hardware.ERROR_STRINGS.get(_int(code), "Unknown Error").encode()

    @_entry("nvmlSystemGetDriverVersion")
    def system_driver_version(self, buffer: Any, length: Any) -> int:
        _put_string(buffer, length=length, text=self.machine.driver_version)
        return hardware.SUCCESS

    @_entry("nvmlSystemGetCudaDriverVersion")
    def system_cuda_driver_version(self, ref: Any) -> int:
        _out(ref).value = self.machine.cuda_driver_version
        return hardware.SUCCESS

    # --- devices -------------------------------------------------------------------------------

    @_entry("nvmlDeviceGetCount_v2")
    def device_count(self, ref: Any) -> int:
        _out(ref).value = len(self.machine.gpus)
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetHandleByIndex_v2")
    def handle_by_index(self, index: Any, ref: Any) -> int:
        i = _int(index)
        if not 0 <= i < len(self.machine.gpus):
            raise Refused(hardware.INVALID_ARGUMENT, f"no GPU with index {i}")
        hardware.require_present(self.state_file.read().gpus[i])
        _store_handle(_out(ref), _handle(_GPU, gpu=i))
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetHandleByUUID")
    def handle_by_uuid(self, uuid: Any, ref: Any) -> int:
        raw = getattr(uuid, "value", None)
        if not isinstance(raw, bytes):
            raise Refused(hardware.INVALID_ARGUMENT, "UUID is not a C string")
        wanted = raw.decode()
        target = _out(ref)
        gpus = self.state_file.read().gpus
        for i, gpu in enumerate(gpus):
            if gpu.uuid == wanted:
                hardware.require_present(gpu)
                _store_handle(target, _handle(_GPU, gpu=i))
                return hardware.SUCCESS
        for i, gpu in enumerate(gpus):
            for gi in gpu.gpu_instances:
                for ci in gi.compute_instances:
                    if ci.uuid == wanted:
                        hardware.require_present(gpu)
                        _store_handle(target, _handle(_MIG_DEVICE, gpu=i, gi=gi.id, ci=ci.id))
                        return hardware.SUCCESS
        raise Refused(hardware.NOT_FOUND, f"no device with UUID {wanted}")

    @_entry("nvmlDeviceGetName")
    def name(self, handle: Any, buffer: Any, length: Any) -> int:
        _put_string(buffer, length=length, text=self._model(self._gpu(handle)).name)
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetUUID")
    def uuid(self, handle: Any, buffer: Any, length: Any) -> int:
        if self._kind(handle) == _MIG_DEVICE:
            _, _, ci = self._compute_instance(handle, kind=_MIG_DEVICE, machine_state=self.state_file.read())
            _put_string(buffer, length=length, text=ci.uuid)
        else:
            _put_string(buffer, length=length, text=self.machine.gpu_uuid(self._gpu(handle)))
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetBrand")
    def brand(self, handle: Any, ref: Any) -> int:
        _out(ref).value = self._model(self._gpu(handle)).brand
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetArchitecture")
    def architecture(self, handle: Any, ref: Any) -> int:
        _out(ref).value = self._model(self._gpu(handle)).architecture
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetCudaComputeCapability")
    def compute_capability(self, handle: Any, major: Any, minor: Any) -> int:
        model = self._model(self._gpu(handle))
        _out(major).value, _out(minor).value = model.compute_capability
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetMemoryInfo")
    def memory_info(self, handle: Any, ref: Any) -> int:
        """Used is what the processes on the device hold; a GPU's includes its MIG devices' (NVML's
        aggregate for a privileged caller). The driver's own reservation is not simulated."""
        info = _out(ref)
        machine_state = self.state_file.read()
        if self._kind(handle) == _MIG_DEVICE:
            index, gi, ci = self._compute_instance(handle, kind=_MIG_DEVICE, machine_state=machine_state)
            total = hardware.mig_profile(self._model(index), gi.profile_id).memory_mib * _MIB
            used = machine_state.memory_used({ci.uuid})
        else:
            index = self._gpu(handle)
            gpu = machine_state.gpus[index]
            total = self._model(index).memory_mib * _MIB
            migs = {ci.uuid for gi in gpu.gpu_instances for ci in gi.compute_instances}
            used = machine_state.memory_used({gpu.uuid} | migs)
        info.total, info.free, info.used = total, total - used, used
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetPciInfo_v3")
    def pci_info(self, handle: Any, ref: Any) -> int:
        slot = self.machine.gpus[self._gpu(handle)]
        _fill_pci(
            _out(ref), bus=slot.bus, pci_device=slot.model.pci_device, pci_subsystem=slot.model.pci_subsystem
        )
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetMinorNumber")
    def minor_number(self, handle: Any, ref: Any) -> int:
        _out(ref).value = self.machine.gpus[self._gpu(handle)].minor
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetUtilizationRates")
    def utilization(self, handle: Any, ref: Any) -> int:
        if self._kind(handle) == _MIG_DEVICE:
            self._compute_instance(handle, kind=_MIG_DEVICE, machine_state=self.state_file.read())
            raise Refused(hardware.NOT_SUPPORTED, "utilization is not reported for MIG devices")
        index = self._gpu(handle)
        gpu = self.state_file.read().gpus[index]
        if gpu.mig_mode:
            raise Refused(hardware.NOT_SUPPORTED, "utilization is not reported in MIG mode")
        info = _out(ref)
        info.gpu, info.memory = gpu.utilization, 0
        return hardware.SUCCESS

    # --- NVLink --------------------------------------------------------------------------------

    def _link(self, handle: Any, link: Any) -> machines.NvSwitch:
        slot = self.machine.gpus[self._gpu(handle)]
        if not slot.model.nvlinks:
            raise Refused(hardware.NOT_SUPPORTED, f"{slot.model.name} has no NVLink")
        if not slot.nvswitches:
            # An NVLink board alone in a VM: observed on an H200 passed through to a one-GPU VM.
            raise Refused(hardware.NOT_SUPPORTED, f"the NVLinks of {slot.bdf} lead nowhere")
        number = _int(link)
        if not 0 <= number < slot.model.nvlinks:
            raise Refused(hardware.INVALID_ARGUMENT, f"{slot.model.name} has no NVLink {number}")
        return slot.nvswitches[number % len(slot.nvswitches)]

    @_entry("nvmlDeviceGetNvLinkState")
    def nvlink_state(self, handle: Any, link: Any, ref: Any) -> int:
        self._link(handle, link)
        down = self.state_file.read().gpus[self._gpu(handle)].nvlinks_down
        _out(ref).value = 0 if _int(link) in down else 1
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetNvLinkRemoteDeviceType")
    def nvlink_remote_type(self, handle: Any, link: Any, ref: Any) -> int:
        self._link(handle, link)
        _out(ref).value = _NVLINK_DEVICE_TYPE_SWITCH
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetNvLinkRemotePciInfo_v2")
    def nvlink_remote_pci(self, handle: Any, link: Any, ref: Any) -> int:
        switch = self._link(handle, link)
        _fill_pci(_out(ref), bus=switch.bus, pci_device=switch.pci_device, pci_subsystem=0)
        return hardware.SUCCESS

    # --- ECC and events ------------------------------------------------------------------------

    @_entry("nvmlDeviceGetTotalEccErrors")
    def total_ecc_errors(self, handle: Any, error_type: Any, counter_type: Any, ref: Any) -> int:
        """Uncorrected errors as raised by `hooks.raise_double_bit_ecc`, volatile and aggregate alike
        (the simulator never reloads its driver); corrected ones are not simulated (0)."""
        index = self._gpu(handle)
        gpu = self.state_file.read().gpus[index]
        _out(ref).value = gpu.ecc_uncorrected if _int(error_type) == _ECC_UNCORRECTED else 0
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetRemappedRows")
    def remapped_rows(self, handle: Any, corrected: Any, uncorrected: Any, pending: Any, failed: Any) -> int:
        """Ampere and later; NOT_SUPPORTED before, and on a MIG-enabled GPU with instances (as NVML's
        documentation says). Counts of remapped rows are not simulated (0)."""
        index = self._gpu(handle)
        gpu = self.state_file.read().gpus[index]
        if self.machine.gpus[index].model.architecture < machines.ARCH_AMPERE:
            raise Refused(hardware.NOT_SUPPORTED, "row remapping starts with Ampere")
        if gpu.mig_mode and gpu.gpu_instances:
            raise Refused(hardware.NOT_SUPPORTED, "remapped rows are not reported while MIG instances exist")
        _out(corrected).value = _out(uncorrected).value = 0
        _out(pending).value = int(gpu.row_remap_pending)
        _out(failed).value = int(gpu.row_remap_failed)
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetRetiredPagesPendingStatus")
    def retired_pages_pending(self, handle: Any, ref: Any) -> int:
        """Page retirement: the GPUs before Ampere (later ones remap rows instead)."""
        index = self._gpu(handle)
        if self.machine.gpus[index].model.architecture >= machines.ARCH_AMPERE:
            raise Refused(hardware.NOT_SUPPORTED, "Ampere and later remap rows instead of retiring pages")
        _out(ref).value = int(self.state_file.read().gpus[index].retired_pages_pending)
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetCurrentClocksEventReasons")
    def clocks_event_reasons(self, handle: Any, ref: Any) -> int:
        """What holds the clocks down now (hooks.set_clock_slowdown); 0: nothing."""
        _out(ref).value = self.state_file.read().gpus[self._gpu(handle)].clock_event_reasons
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetSupportedEventTypes")
    def supported_event_types(self, handle: Any, ref: Any) -> int:
        self._gpu(handle)
        _out(ref).value = self.machine.event_types
        return hardware.SUCCESS

    @_entry("nvmlEventSetCreate")
    def event_set_create(self, ref: Any) -> int:
        target = _out(ref)
        newest = self.state_file.read().events_raised
        with self._event_sets_lock:
            self._event_sets_made += 1
            number = self._event_sets_made
            self._event_sets[number] = events.EventSet(cursor=newest)
        _store_handle(target, (_MAGIC << 32) | (_EVENT_SET << 24) | number)
        return hardware.SUCCESS

    def _event_set(self, handle: Any) -> events.EventSet:
        value = _pointer_value(handle)
        found = self._event_sets.get(value & 0xFFFFFF) if self._kind(handle) == _EVENT_SET else None
        if found is None:
            raise Refused(hardware.INVALID_ARGUMENT, "not an event set")
        return found

    @_entry("nvmlDeviceRegisterEvents")
    def register_events(self, handle: Any, types: Any, event_set: Any) -> int:
        if self._kind(handle) == _MIG_DEVICE:
            raise Refused(hardware.NOT_SUPPORTED, "events are registered through the parent GPU")
        index = self._gpu(handle)
        wanted = _int(types)
        if not wanted or wanted & ~self.machine.event_types:
            raise Refused(hardware.NOT_SUPPORTED, f"event types {wanted:#x} are not offered on this GPU")
        target = self._event_set(event_set)
        target.register(gpu=index, types=wanted, newest=self.state_file.read().events_raised)
        return hardware.SUCCESS

    @_entry("nvmlEventSetWait_v2")
    def event_set_wait(self, event_set: Any, ref: Any, timeout_ms: Any) -> int:
        source = self._event_set(event_set)
        data = _out(ref)
        deadline = time.monotonic() + _int(timeout_ms) / 1000
        while (event := source.take(self.state_file.read())) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Refused(hardware.TIMEOUT, "no event")
            time.sleep(min(left, _EVENT_POLL_SECONDS))
        ctypes.c_void_p.from_buffer(data, type(data).device.offset).value = _handle(_GPU, gpu=event.gpu)
        data.eventType = event.type
        data.eventData = event.data
        data.gpuInstanceId = event.gpu_instance_id
        data.computeInstanceId = event.compute_instance_id
        return hardware.SUCCESS

    @_entry("nvmlEventSetFree")
    def event_set_free(self, event_set: Any) -> int:
        self._event_set(event_set)
        with self._event_sets_lock:
            del self._event_sets[_pointer_value(event_set) & 0xFFFFFF]
        return hardware.SUCCESS

    # --- MIG: modes, profiles, placements ------------------------------------------------------

    @_entry("nvmlDeviceGetMigMode")
    def mig_mode(self, handle: Any, current: Any, pending: Any) -> int:
        index = self._gpu(handle)
        hardware.require_mig_capable(self._model(index))
        gpu = self.state_file.read().gpus[index]
        _out(current).value = gpu.mig_mode
        _out(pending).value = gpu.mig_mode if gpu.mig_mode_pending is None else gpu.mig_mode_pending
        return hardware.SUCCESS

    @_entry("nvmlDeviceSetMigMode")
    def set_mig_mode(self, handle: Any, mode: Any, ref: Any) -> int:
        """The call itself succeeds; whether the mode changed is the activation status it writes."""
        index = self._gpu(handle)
        status = _out(ref)
        with self.state_file.update() as machine_state:
            status.value = hardware.set_mig_mode(
                model=self._model(index),
                virtualization=self.machine.virtualization,
                machine_state=machine_state,
                index=index,
                mode=_int(mode),
            )
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetVirtualizationMode")
    def virtualization_mode(self, handle: Any, ref: Any) -> int:
        self._gpu(handle)
        _out(ref).value = self.machine.virtualization
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetGpuInstanceProfileInfoV")
    def gpu_instance_profile_info(self, handle: Any, profile_index: Any, ref: Any) -> int:
        index = self._gpu(handle)
        model = self._model(index)
        hardware.require_mig_capable(model)
        number = _int(profile_index)
        if not 0 <= number < 0x12:  # NVML_GPU_INSTANCE_PROFILE_COUNT
            raise Refused(hardware.INVALID_ARGUMENT, f"profile index {number} out of range")
        if model.profiles_need_mig_mode:
            hardware.require_mig_enabled(model, self.state_file.read().gpus[index])
        profile = next((p for p in model.mig_profiles if p.index == number), None)
        if profile is None:
            raise Refused(hardware.NOT_SUPPORTED, f"{model.name} has no profile with index {number}")
        info = _out(ref)
        _version(info, 2)
        info.id = profile.id
        info.isP2pSupported = 0
        info.sliceCount = profile.slices
        info.instanceCount = profile.instances
        info.multiprocessorCount = profile.multiprocessors
        info.copyEngineCount = profile.copy_engines
        info.decoderCount = profile.decoders
        info.encoderCount = 0
        info.jpegCount = profile.jpegs
        info.ofaCount = profile.ofas
        info.memorySizeMB = profile.memory_mib
        info.name = f"MIG {profile.name}".encode()
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetGpuInstancePossiblePlacements_v2")
    def possible_placements(self, handle: Any, profile_id: Any, placements: Any, count: Any) -> int:
        model = self._model(self._gpu(handle))
        hardware.require_mig_capable(model)
        profile = hardware.mig_profile(model, _int(profile_id))
        if placements is not None:
            if len(placements) < len(profile.starts):
                raise Refused(hardware.INSUFFICIENT_SIZE, f"{len(profile.starts)} placements")
            for slot, start in zip(placements, profile.starts, strict=False):
                slot.start, slot.size = start, profile.size
        _out(count).value = len(profile.starts)
        return hardware.SUCCESS

    # --- MIG: GPU instances --------------------------------------------------------------------

    @_entry("nvmlDeviceCreateGpuInstanceWithPlacement")
    def create_gpu_instance(self, handle: Any, profile_id: Any, placement: Any, ref: Any) -> int:
        index = self._gpu(handle)
        requested = _out(placement)
        target = _out(ref)
        with self.state_file.update() as machine_state:
            created = hardware.create_gpu_instance(
                model=self._model(index),
                gpu=machine_state.gpus[index],
                profile_id=_int(profile_id),
                start=requested.start,
                size=requested.size,
            )
            events.raise_event(machine_state, gpu=index, type_=machines.EVENT_MIG_CONFIG_CHANGE)
        _store_handle(target, _handle(_GPU_INSTANCE, gpu=index, gi=created.id))
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetGpuInstances")
    def gpu_instances(self, handle: Any, profile_id: Any, instances: Any, count: Any) -> int:
        index = self._gpu(handle)
        model = self._model(index)
        gpu = self.state_file.read().gpus[index]
        hardware.require_mig_enabled(model, gpu)
        wanted = hardware.mig_profile(model, _int(profile_id)).id
        found = sorted(gi.id for gi in gpu.gpu_instances if gi.profile_id == wanted)
        if instances is None or len(instances) < len(found):
            raise Refused(hardware.INSUFFICIENT_SIZE, f"{len(found)} GPU instances")
        for slot, gi_id in enumerate(found):
            instances[slot] = ctypes.cast(_handle(_GPU_INSTANCE, gpu=index, gi=gi_id), type(instances[slot]))
        _out(count).value = len(found)
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetGpuInstanceById")
    def gpu_instance_by_id(self, handle: Any, gi_id: Any, ref: Any) -> int:
        index = self._gpu(handle)
        gpu = self.state_file.read().gpus[index]
        hardware.require_mig_enabled(self._model(index), gpu)
        gi = hardware.gpu_instance(gpu, _int(gi_id))
        _store_handle(_out(ref), _handle(_GPU_INSTANCE, gpu=index, gi=gi.id))
        return hardware.SUCCESS

    @_entry("nvmlGpuInstanceGetInfo")
    def gpu_instance_info(self, handle: Any, ref: Any) -> int:
        index, _, gi = self._gpu_instance(handle, self.state_file.read())
        info = _out(ref)
        _store_handle(info.device, _handle(_GPU, gpu=index))
        info.id = gi.id
        info.profileId = gi.profile_id
        info.placement.start, info.placement.size = gi.start, gi.size
        return hardware.SUCCESS

    @_entry("nvmlGpuInstanceDestroy")
    def destroy_gpu_instance(self, handle: Any) -> int:
        with self.state_file.update() as machine_state:
            index, gpu, gi = self._gpu_instance(handle, machine_state)
            hardware.destroy_gpu_instance(gpu=gpu, gi_id=gi.id)
            events.raise_event(machine_state, gpu=index, type_=machines.EVENT_MIG_CONFIG_CHANGE)
        return hardware.SUCCESS

    # --- MIG: compute instances and MIG devices ------------------------------------------------

    @_entry("nvmlGpuInstanceGetComputeInstanceProfileInfoV")
    def compute_instance_profile_info(self, handle: Any, profile_index: Any, engines: Any, ref: Any) -> int:
        index, _, gi = self._gpu_instance(handle, self.state_file.read())
        if _int(engines) != 0:  # NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED is the only one
            raise Refused(hardware.INVALID_ARGUMENT, f"engine profile {_int(engines)}")
        gi_profile = hardware.mig_profile(self._model(index), gi.profile_id)
        profile = hardware.compute_profile(gi_profile, _int(profile_index))
        info = _out(ref)
        _version(info, 2)
        info.id = profile.id
        info.sliceCount = profile.slices
        info.instanceCount = profile.instances
        info.multiprocessorCount = profile.multiprocessors
        info.sharedCopyEngineCount = gi_profile.copy_engines
        info.sharedDecoderCount = gi_profile.decoders
        info.sharedEncoderCount = 0
        info.sharedJpegCount = gi_profile.jpegs
        info.sharedOfaCount = gi_profile.ofas
        info.name = f"MIG {profile.name}".encode()
        return hardware.SUCCESS

    @_entry("nvmlGpuInstanceCreateComputeInstance")
    def create_compute_instance(self, handle: Any, profile_id: Any, ref: Any) -> int:
        target = _out(ref)
        with self.state_file.update() as machine_state:
            index, _, gi = self._gpu_instance(handle, machine_state)
            created = hardware.create_compute_instance(
                model=self._model(index), gi=gi, profile_id=_int(profile_id)
            )
        _store_handle(target, _handle(_COMPUTE_INSTANCE, gpu=index, gi=gi.id, ci=created.id))
        return hardware.SUCCESS

    @_entry("nvmlGpuInstanceGetComputeInstances")
    def compute_instances(self, handle: Any, profile_id: Any, instances: Any, count: Any) -> int:
        index, _, gi = self._gpu_instance(handle, self.state_file.read())
        wanted = _int(profile_id)
        hardware.compute_profile(hardware.mig_profile(self._model(index), gi.profile_id), wanted)
        found = sorted(ci.id for ci in gi.compute_instances if ci.profile_id == wanted)
        if instances is None or len(instances) < len(found):
            raise Refused(hardware.INSUFFICIENT_SIZE, f"{len(found)} compute instances")
        for slot, ci_id in enumerate(found):
            instances[slot] = ctypes.cast(
                _handle(_COMPUTE_INSTANCE, gpu=index, gi=gi.id, ci=ci_id), type(instances[slot])
            )
        _out(count).value = len(found)
        return hardware.SUCCESS

    @_entry("nvmlComputeInstanceGetInfo_v2")
    def compute_instance_info(self, handle: Any, ref: Any) -> int:
        index, gi, ci = self._compute_instance(
            handle, kind=_COMPUTE_INSTANCE, machine_state=self.state_file.read()
        )
        info = _out(ref)
        _store_handle(info.device, _handle(_MIG_DEVICE, gpu=index, gi=gi.id, ci=ci.id))
        _store_handle(info.gpuInstance, _handle(_GPU_INSTANCE, gpu=index, gi=gi.id))
        info.id = ci.id
        info.profileId = ci.profile_id
        info.placement.start, info.placement.size = ci.start, ci.size
        return hardware.SUCCESS

    @_entry("nvmlComputeInstanceDestroy")
    def destroy_compute_instance(self, handle: Any) -> int:
        with self.state_file.update() as machine_state:
            _, gi, ci = self._compute_instance(handle, kind=_COMPUTE_INSTANCE, machine_state=machine_state)
            hardware.destroy_compute_instance(machine_state=machine_state, gi=gi, ci_id=ci.id)
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetAttributes_v2")
    def attributes(self, handle: Any, ref: Any) -> int:
        if self._kind(handle) != _MIG_DEVICE:
            self._gpu(handle)
            raise Refused(hardware.NOT_SUPPORTED, "attributes are reported for MIG devices only")
        index, gi, ci = self._compute_instance(handle, kind=_MIG_DEVICE, machine_state=self.state_file.read())
        gi_profile = hardware.mig_profile(self._model(index), gi.profile_id)
        profile = hardware.compute_profile(gi_profile, ci.profile_id)
        info = _out(ref)
        info.multiprocessorCount = profile.multiprocessors
        info.sharedCopyEngineCount = gi_profile.copy_engines
        info.sharedDecoderCount = gi_profile.decoders
        info.sharedEncoderCount = 0
        info.sharedJpegCount = gi_profile.jpegs
        info.sharedOfaCount = gi_profile.ofas
        info.gpuInstanceSliceCount = gi_profile.slices
        info.computeInstanceSliceCount = profile.slices
        info.memorySizeMB = gi_profile.memory_mib
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetMaxMigDeviceCount")
    def max_mig_device_count(self, handle: Any, ref: Any) -> int:
        index = self._gpu(handle)
        _out(ref).value = hardware.max_mig_devices(self._model(index), self.state_file.read().gpus[index])
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetMigDeviceHandleByIndex")
    def mig_device_handle_by_index(self, handle: Any, slot: Any, ref: Any) -> int:
        """Slot i holds the i-th MIG device in (GI ID, CI ID) order; the slots behind them are empty.

        Without MIG every slot is empty (observed on an H200 with MIG disabled: NOT_FOUND at 0 and 7);
        a slot past the last is an invalid argument [unverified].
        """
        index = self._gpu(handle)
        gpu = self.state_file.read().gpus[index]
        number = _int(slot)
        slots = hardware.max_mig_devices(self._model(index), gpu)
        if not slots:
            raise Refused(hardware.NOT_FOUND, f"no MIG devices on {gpu.uuid}")
        if not 0 <= number < slots:
            raise Refused(hardware.INVALID_ARGUMENT, f"MIG device index {number} out of range")
        devices = sorted((gi.id, ci.id) for gi in gpu.gpu_instances for ci in gi.compute_instances)
        if number >= len(devices):
            raise Refused(hardware.NOT_FOUND, f"no MIG device at index {number}")
        gi_id, ci_id = devices[number]
        _store_handle(_out(ref), _handle(_MIG_DEVICE, gpu=index, gi=gi_id, ci=ci_id))
        return hardware.SUCCESS

    @_entry("nvmlDeviceGetComputeRunningProcesses_v3")
    def compute_running_processes(self, handle: Any, count: Any, infos: Any) -> int:
        """NVML's count protocol: too small a buffer (None included) answers INSUFFICIENT_SIZE with the
        count needed, unless there is nothing to report; a GPU handle reports the processes of the whole
        GPU, its MIG devices' included (NVML's aggregate view for a privileged caller), a MIG device
        handle those of that MIG device."""
        machine_state = self.state_file.read()
        if self._kind(handle) == _MIG_DEVICE:
            _, gi, ci = self._compute_instance(handle, kind=_MIG_DEVICE, machine_state=machine_state)
            where = {ci.uuid: (gi.id, ci.id)}
        else:
            gpu = machine_state.gpus[self._gpu(handle)]
            where = {gpu.uuid: (hardware.VALUE_NOT_AVAILABLE, hardware.VALUE_NOT_AVAILABLE)} | {
                ci.uuid: (gi.id, ci.id) for gi in gpu.gpu_instances for ci in gi.compute_instances
            }
        found = [p for p in machine_state.processes if p.device_uuid in where]
        size = _out(count)
        capacity = 0 if infos is None else min(size.value, len(infos))
        size.value = len(found)
        if len(found) > capacity:
            raise Refused(hardware.INSUFFICIENT_SIZE, f"{len(found)} processes")
        for slot, process in enumerate(found):
            info = infos[slot]
            info.pid = process.pid
            info.usedGpuMemory = process.used_bytes
            info.gpuInstanceId, info.computeInstanceId = where[process.device_uuid]
        return hardware.SUCCESS
