"""NVML through pynvml: GPU discovery into inventory records, MIG mode and instances, device usage,
health events. I/O: NVML, sysfs, proc.

The only module that imports pynvml. `connect()` uses the machine's libnvidia-ml, or the one under a
driver root (`gpudra.gpu.driver_root`); `connect(beneath=...)` first installs another library
underneath pynvml (gpudra's simulated driver: gpudra.node.gpu_driver chooses it), so everything below runs
the same pynvml calls on a real card and in tests.

Every NVML failure leaves this module as a gpudra error, translated in one place (`_nvml_errors`):
library or driver missing or not each other's version -> NvmlUnavailable, NOT_SUPPORTED ->
NotSupported, INSUFFICIENT_RESOURCES -> InsufficientResources, IN_USE -> InUse, anything else (other
codes, pynvml's NVMLLibraryMismatchError, text NVML returns that is not UTF-8) -> HardwareError; each
carries the NVMLError class name and says which call failed on which GPU. The one exception is the
health probe, `Nvml.gpu_health`: there the errors of a GPU that is gone (`_GPU_GONE`) are its answer,
not a failure. `Nvml.set_mig_mode` also turns the activation status NVML returns (not raises) into the
same classes: IN_USE -> InUse, anything else -> HardwareError.

Health events (`Nvml.watch_events`): one NVML event set per watch, registered per GPU for XID critical
errors and double-bit ECC errors, as far as the GPU offers them (`nvmlDeviceGetSupportedEventTypes`;
NVML registers a MIG device's events through its parent and reports the GPU instance in each event).
A GPU that offers neither, or refuses the registration with NOT_SUPPORTED, is left to polling
(`Nvml.gpu_health`, `Nvml.uncorrected_ecc_errors`); `EventWatch.wait` blocks for up to its timeout.

Besides NVML it reads sysfs (NUMA node, PCIe root of each GPU) and the driver's proc files
(/proc/devices and /proc/driver/nvidia-caps/mig-minors, for the MIG capability device nodes).
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

import pynvml

from gpudra import errors
from gpudra.gpu import driver_root as roots
from gpudra.model import inventory as records
from gpudra.model.gpu_health import GpuConditions

_T = TypeVar("_T")
_MIB = 1024**2
_GIB = 1024**3

_ERROR_CLASSES: dict[int, type[errors.HardwareError]] = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: errors.NvmlUnavailable,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: errors.NvmlUnavailable,
    # libnvidia-ml is not the loaded kernel driver's version (a driver upgrade without a reboot)
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: errors.NvmlUnavailable,
    pynvml.NVML_ERROR_NOT_SUPPORTED: errors.NotSupported,
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: errors.InsufficientResources,
    pynvml.NVML_ERROR_IN_USE: errors.InUse,
}
# What NVML answers for a GPU that fell off the bus, hung, needs a reset or is no longer enumerated.
_GPU_GONE = frozenset(
    pynvml.nvmlExceptionClass(code).__name__
    for code in (
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_GPU_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_FOUND,
    )
)
# What a probe loop over profile indices or NVLink numbers meets for entries a GPU does not have.
_ABSENT = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument)
# What a loop over MIG device slots meets for empty ones (and for a MIG device destroyed meanwhile).
_NO_MIG_DEVICE = (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument)
# NVML return code -> its nvml.h name without the prefix, e.g. 16 -> "RESET_REQUIRED".
_CODE_NAMES = {
    value: name.removeprefix("NVML_ERROR_")
    for name, value in vars(pynvml).items()
    if name.startswith("NVML_ERROR_") and isinstance(value, int)
}

# go-nvlib's names; the NVIDIA DRA driver publishes these.
_ARCHITECTURES = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "Kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "Maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "Pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "Volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "Turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "Ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "Ada Lovelace",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "Hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "Blackwell",
}
_BRANDS = {
    pynvml.NVML_BRAND_UNKNOWN: "Unknown",
    pynvml.NVML_BRAND_QUADRO: "Quadro",
    pynvml.NVML_BRAND_TESLA: "Tesla",
    pynvml.NVML_BRAND_NVS: "NVS",
    pynvml.NVML_BRAND_GRID: "Grid",
    pynvml.NVML_BRAND_GEFORCE: "GeForce",
    pynvml.NVML_BRAND_TITAN: "Titan",
    pynvml.NVML_BRAND_NVIDIA_VAPPS: "NvidiaVApps",
    pynvml.NVML_BRAND_NVIDIA_VPC: "NvidiaVPC",
    pynvml.NVML_BRAND_NVIDIA_VCS: "NvidiaVCS",
    pynvml.NVML_BRAND_NVIDIA_VWS: "NvidiaVWS",
    pynvml.NVML_BRAND_NVIDIA_CLOUD_GAMING: "NvidiaCloudGaming",
    pynvml.NVML_BRAND_QUADRO_RTX: "QuadroRTX",
    pynvml.NVML_BRAND_NVIDIA_RTX: "NvidiaRTX",
    pynvml.NVML_BRAND_NVIDIA: "Nvidia",
    pynvml.NVML_BRAND_GEFORCE_RTX: "GeForceRTX",
    pynvml.NVML_BRAND_TITAN_RTX: "TitanRTX",
}
# Profile-name suffixes by NVML profile index, as go-nvlib derives them.
_PROFILE_SUFFIXES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: "+me",
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1: "+me",
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: "+me.all",
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: "+me.all",
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX: "+gfx",
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX: "+gfx",
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX: "+gfx",
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX: "+gfx",
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME: "-me",
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME: "-me",
}
# NVML has no SM count for a whole GPU; MIG-capable GPUs give it through their full-GPU profile,
# the others (and Ampere with MIG disabled, which hides its profiles) through this table.
_FULL_GPU_MULTIPROCESSORS = {
    "NVIDIA A100-SXM4-40GB": 108,
    "NVIDIA H100 80GB HBM3": 132,
    "NVIDIA L4": 58,
    "Tesla T4": 40,
}
_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def _nvml_text(error: pynvml.NVMLError) -> str:
    """The error's text; pynvml asks NVML itself for codes it does not know, and that can fail too."""
    try:
        return str(error)
    except Exception:
        return f"NVML error {error.value}"


@contextmanager
def _nvml_errors(call: str, gpu: str | None) -> Iterator[None]:
    """Turns what pynvml raises inside into the gpudra error for it (module docstring).

    pynvml raises NVMLError subclasses (a missing libnvidia-ml, whose OSError it catches, included),
    NVMLLibraryMismatchError for the unversioned functions it guards, and UnicodeDecodeError when it
    decodes text NVML returned. ctypes.ArgumentError and TypeError mean gpudra passed a wrong argument:
    a bug, left to surface as one.
    """
    where = f"{call} on GPU {gpu}" if gpu else call
    try:
        yield
    except pynvml.NVMLError as error:
        error_class = _ERROR_CLASSES.get(error.value, errors.HardwareError)
        raise error_class(f"{where} failed: {_nvml_text(error)}", nvml_error=type(error).__name__) from error
    except pynvml.NVMLLibraryMismatchError as error:
        raise errors.HardwareError(f"{where} failed: {error}", nvml_error=type(error).__name__) from error
    except UnicodeDecodeError as error:
        raise errors.HardwareError(f"{where} failed: NVML returned text that is not UTF-8") from error


def _call(function: Callable[..., _T], *args: Any, gpu: str | None) -> _T:
    with _nvml_errors(function.__name__, gpu):
        return function(*args)


def _call_if_present(
    function: Callable[..., _T],
    *args: Any,
    gpu: str | None,
    absent: tuple[type[pynvml.NVMLError], ...] = _ABSENT,
) -> _T | None:
    """Like `_call`, but None where NVML answers one of `absent`: the entry does not exist here."""
    with _nvml_errors(function.__name__, gpu):
        try:
            return function(*args)
        except absent:
            return None


class Beneath(Protocol):
    """A library that stands in for libnvidia-ml underneath pynvml, with the sysfs and proc trees of
    its machine. Installs nest: each `install` is undone by one `uninstall`."""

    @property
    def sysfs_root(self) -> Path: ...

    @property
    def proc_root(self) -> Path: ...

    def install(self, pynvml_module: Any) -> None: ...

    def uninstall(self, pynvml_module: Any) -> None: ...


# The libraries installed underneath pynvml by this process's open sessions: pynvml holds one library
# per process, so the driver's own is refused while one is.
_beneath: list[Beneath] = []


def connect(*, driver_root: Path = Path("/"), beneath: Beneath | None = None) -> Nvml:
    """Opens NVML: the machine's driver, or the library `beneath` installed underneath pynvml for this
    session (uninstalled when it closes).

    With a `driver_root` other than `/`, the driver's libnvidia-ml.so.1 is loaded from under it first,
    for this process's life (pynvml keeps the library it loaded); a library `beneath` ignores it.
    """
    if beneath is None:
        if _beneath:
            raise errors.ConfigError(
                "the simulator is in use in this process; close it first", field="--nvml"
            )
        if not roots.is_host(driver_root):
            roots.load_library(driver_root)
        return Nvml()
    beneath.install(pynvml)
    _beneath.append(beneath)
    try:
        return Nvml(sysfs_root=beneath.sysfs_root, proc_root=beneath.proc_root, beneath=beneath)
    except BaseException:
        _uninstall(beneath)
        raise


def _uninstall(beneath: Beneath) -> None:
    _beneath.remove(beneath)
    beneath.uninstall(pynvml)


# Event kinds by NVML type. Not watched: clock and PState changes (NVML documents them for Kepler only)
# and power source changes (AC/battery); what holds the clocks down is read at each poll instead
# (`gpu_conditions`).
XID, DOUBLE_BIT_ECC, SINGLE_BIT_ECC, MIG_CONFIG_CHANGE = (
    "xid",
    "double_bit_ecc",
    "single_bit_ecc",
    "mig_config_change",
)
_EVENT_KINDS = {
    pynvml.nvmlEventTypeXidCriticalError: XID,
    pynvml.nvmlEventTypeDoubleBitEccError: DOUBLE_BIT_ECC,
    pynvml.nvmlEventTypeSingleBitEccError: SINGLE_BIT_ECC,
    pynvml.nvmlEventMigConfigChange: MIG_CONFIG_CHANGE,
}
_WATCHED_EVENTS = sum(_EVENT_KINDS)
_NO_INSTANCE = 0xFFFFFFFF  # NVML's "not available" in an event's GPU or compute instance ID
_CLOCK_SLOWDOWNS = {  # nvmlClocksEventReason bit -> the name gpudra reports it by (GpuConditions)
    pynvml.nvmlClocksEventReasonSwPowerCap: "sw_power_cap",
    pynvml.nvmlClocksEventReasonHwSlowdown: "hw_slowdown",
    pynvml.nvmlClocksEventReasonSwThermalSlowdown: "sw_thermal_slowdown",
    pynvml.nvmlClocksEventReasonHwThermalSlowdown: "hw_thermal_slowdown",
    pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown: "hw_power_brake_slowdown",
}


@dataclasses.dataclass(frozen=True)
class GpuEvent:
    """One event on a GPU or one of its instances (IDs None when NVML could not attribute it): an XID
    (`xid` set), a double-bit ECC error — the faults — or a single-bit ECC error or a MIG configuration
    change, which are only counted (`kind`)."""

    gpu_uuid: str
    xid: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    kind: str = XID


class EventWatch:
    """An NVML event set registered for the health events of some GPUs (`Nvml.watch_events`).

    `xid_events` and `ecc_events` are the GPUs registered for each kind; `failed` maps the GPUs whose
    registration failed for another reason than NOT_SUPPORTED (a lost GPU) to the error."""

    def __init__(
        self,
        event_set: Any,
        *,
        handles: dict[int, str],
        xid_events: frozenset[str],
        ecc_events: frozenset[str],
        failed: dict[str, str],
    ) -> None:
        self._set = event_set
        self._handles = handles  # handle pointer value -> GPU UUID
        self.xid_events = xid_events
        self.ecc_events = ecc_events
        self.failed = failed
        self._open = True

    def wait(self, timeout: float) -> GpuEvent | None:
        """The next health event, or None after `timeout` seconds without one (or for an event of
        another type)."""
        try:
            data = _call(pynvml.nvmlEventSetWait_v2, self._set, max(1, int(timeout * 1000)), gpu=None)
        except errors.HardwareError as error:
            if error.nvml_error == pynvml.NVMLError_Timeout.__name__:
                return None
            raise
        uuid = self._handles.get(ctypes.cast(data.device, ctypes.c_void_p).value or 0)
        if uuid is None:
            uuid = _call(pynvml.nvmlDeviceGetUUID, data.device, gpu="of an event")
        kind = _EVENT_KINDS.get(int(data.eventType))
        if kind is None:
            return None
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        return GpuEvent(
            gpu_uuid=uuid,
            xid=int(data.eventData) if kind == XID else None,
            gpu_instance_id=None if gi == _NO_INSTANCE else gi,
            compute_instance_id=None if _NO_INSTANCE in (ci, gi) else ci,
            kind=kind,
        )

    def close(self) -> None:
        if self._open:
            self._open = False
            _call(pynvml.nvmlEventSetFree, self._set, gpu=None)


@dataclasses.dataclass(frozen=True)
class DeviceUsage:
    """One reading of a GPU or MIG device (`Nvml.device_usage`)."""

    # Percent of the driver's last sample period (1/6 s to 1 s) in which a kernel ran; None where NVML
    # reports none: on MIG devices, and on a GPU in MIG mode.
    utilization: int | None
    memory_used: int  # bytes, as NVML's memory info counts them
    processes: tuple[int, ...]  # sorted PIDs of its compute processes (an MPS server is one)


class Nvml:
    """An initialised NVML session; close it (or use it as a context manager) to shut NVML down."""

    def __init__(
        self,
        *,
        sysfs_root: Path = Path("/sys"),
        proc_root: Path = Path("/proc"),
        beneath: Beneath | None = None,
    ) -> None:
        _call(pynvml.nvmlInit, gpu=None)
        self._sysfs = sysfs_root
        self._proc = proc_root
        self._beneath = beneath
        self._open = True

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        try:
            _call(pynvml.nvmlShutdown, gpu=None)
        finally:
            if self._beneath is not None:
                _uninstall(self._beneath)

    def __enter__(self) -> Nvml:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # --- health --------------------------------------------------------------------------------

    def gpu_health(self, *, gpu_uuid: str) -> tuple[bool, str]:
        """(healthy, reason) from a cheap read-only probe: find the GPU by UUID, read its memory info.

        An error of a GPU that is gone makes it unhealthy, with the NVMLError class name as the reason;
        NOT_SUPPORTED is an answer from a working GPU. Other failures (no driver, no permission) say
        nothing about this GPU and are raised like any NVML failure.
        """
        try:
            handle = self._handle(gpu_uuid)
            _call(pynvml.nvmlDeviceGetMemoryInfo, handle, gpu=gpu_uuid)
        except errors.NotSupported:
            pass
        except errors.HardwareError as error:
            reason = error.nvml_error or ""
            if reason in _GPU_GONE:
                return False, reason
            raise
        return True, ""

    def watch_events(self, gpu_uuids: Iterable[str]) -> EventWatch:
        """An event set for the XID and double-bit ECC events of these GPUs, as far as each offers them
        (see `EventWatch`); close it when done."""
        event_set = _call(pynvml.nvmlEventSetCreate, gpu=None)
        handles: dict[int, str] = {}
        xid_events: set[str] = set()
        ecc_events: set[str] = set()
        failed: dict[str, str] = {}
        try:
            for uuid in gpu_uuids:
                try:
                    handle = self._handle(uuid)
                    offered = _call_if_present(
                        pynvml.nvmlDeviceGetSupportedEventTypes,
                        handle,
                        gpu=uuid,
                        absent=(pynvml.NVMLError_NotSupported,),
                    )
                    types = (offered or 0) & _WATCHED_EVENTS
                    if types:
                        _call(pynvml.nvmlDeviceRegisterEvents, handle, types, event_set, gpu=uuid)
                except errors.NotSupported:
                    continue
                except errors.HardwareError as error:
                    failed[uuid] = str(error)
                    continue
                handles[ctypes.cast(handle, ctypes.c_void_p).value or 0] = uuid
                if types & pynvml.nvmlEventTypeXidCriticalError:
                    xid_events.add(uuid)
                if types & pynvml.nvmlEventTypeDoubleBitEccError:
                    ecc_events.add(uuid)
        except BaseException:
            _call(pynvml.nvmlEventSetFree, event_set, gpu=None)
            raise
        return EventWatch(
            event_set,
            handles=handles,
            xid_events=frozenset(xid_events),
            ecc_events=frozenset(ecc_events),
            failed=failed,
        )

    def gpu_conditions(self, *, gpu_uuid: str) -> GpuConditions:
        """The memory repairs waiting for a reset, a failed row remapping, which NVLinks are up, and what
        holds the clocks down: what no event reports (gpudra.model.gpu_health). Each is None where the
        GPU does not report it: remapped rows before Ampere and on a GPU with MIG instances, pending
        page retirement from Ampere on, links on a GPU without NVLink. Read-only."""
        handle = self._handle(gpu_uuid)
        absent = (pynvml.NVMLError_NotSupported,)
        rows = _call_if_present(pynvml.nvmlDeviceGetRemappedRows, handle, gpu=gpu_uuid, absent=absent)
        pages = _call_if_present(
            pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle, gpu=gpu_uuid, absent=absent
        )
        reasons = _call_if_present(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle, gpu=gpu_uuid)
        up: set[int] = set()
        links = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            state = _call_if_present(pynvml.nvmlDeviceGetNvLinkState, handle, link, gpu=gpu_uuid)
            if state is None:
                break  # links are numbered from 0: the first that does not exist ends them
            links += 1
            if state == pynvml.NVML_FEATURE_ENABLED:
                up.add(link)
        return GpuConditions(
            row_remap_pending=None if rows is None else bool(rows[2]),
            row_remap_failed=None if rows is None else bool(rows[3]),
            retired_pages_pending=None if pages is None else pages == pynvml.NVML_FEATURE_ENABLED,
            nvlinks_up=frozenset(up) if links else None,
            clock_slowdowns=None
            if reasons is None
            else frozenset(name for bit, name in _CLOCK_SLOWDOWNS.items() if reasons & bit),
        )

    def uncorrected_ecc_errors(self, *, gpu_uuid: str) -> int | None:
        """Double-bit ECC errors since the driver loaded (NVML's volatile count); None where the GPU
        reports none (ECC off or unsupported)."""
        handle = self._handle(gpu_uuid)
        return _call_if_present(
            pynvml.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
            gpu=gpu_uuid,
            absent=(pynvml.NVMLError_NotSupported,),
        )

    # --- discovery -----------------------------------------------------------------------------

    def inventory(self) -> records.Inventory:
        cuda = _call(pynvml.nvmlSystemGetCudaDriverVersion, gpu=None)
        count = _call(pynvml.nvmlDeviceGetCount, gpu=None)
        gpus = []
        links: dict[str, set[str]] = {}
        gpu_nodes: set[str] = set()
        for index in range(count):
            handle = _call(pynvml.nvmlDeviceGetHandleByIndex, index, gpu=f"index {index}")
            gpu = self._gpu(index, handle)
            gpus.append(gpu)
            gpu_nodes.add(gpu.pci_bus_id)
            links[gpu.pci_bus_id] = self._nvlink_remotes(handle, uuid=gpu.uuid, gpu_nodes=gpu_nodes)
        islands = _nvlink_islands(links, gpu_nodes)
        return records.Inventory(
            driver_version=_call(pynvml.nvmlSystemGetDriverVersion, gpu=None),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
            gpus=tuple(
                dataclasses.replace(
                    gpu,
                    nvlink_peers=tuple(p for p in islands.get(gpu.pci_bus_id, ()) if p != gpu.pci_bus_id),
                    nvlink_domain=min(islands[gpu.pci_bus_id]) if gpu.pci_bus_id in islands else None,
                )
                for gpu in gpus
            ),
        )

    def device_usage(self, *, uuid: str) -> DeviceUsage:
        """What a GPU or MIG device (by its GPU-… or MIG-… UUID) is doing now; see `DeviceUsage`."""
        handle = self._handle(uuid)
        rates = _call_if_present(
            pynvml.nvmlDeviceGetUtilizationRates, handle, gpu=uuid, absent=(pynvml.NVMLError_NotSupported,)
        )
        memory = _call(pynvml.nvmlDeviceGetMemoryInfo, handle, gpu=uuid)
        processes = _call(pynvml.nvmlDeviceGetComputeRunningProcesses, handle, gpu=uuid)
        return DeviceUsage(
            utilization=None if rates is None else int(rates.gpu),
            memory_used=int(memory.used),
            processes=tuple(sorted({p.pid for p in processes})),
        )

    def _gpu(self, index: int, handle: Any) -> records.Gpu:
        uuid = _call(pynvml.nvmlDeviceGetUUID, handle, gpu=f"index {index}")
        name = _call(pynvml.nvmlDeviceGetName, handle, gpu=uuid)
        major, minor = _call(pynvml.nvmlDeviceGetCudaComputeCapability, handle, gpu=uuid)
        total_bytes = _call(pynvml.nvmlDeviceGetMemoryInfo, handle, gpu=uuid).total
        bus_id = _bus_id(_call(pynvml.nvmlDeviceGetPciInfo, handle, gpu=uuid).busId)
        mig_capable, mig_enabled = self._mig_mode(handle, uuid)
        profiles = self._mig_profiles(handle, uuid=uuid, total_bytes=total_bytes) if mig_capable else ()
        full = max(profiles, key=lambda p: p.slice_count, default=None)
        arch = _call(pynvml.nvmlDeviceGetArchitecture, handle, gpu=uuid)
        switchable = mig_capable and _resets_itself(arch) and self._bare_metal(handle, uuid)
        return records.Gpu(
            index=index,
            minor=_call(pynvml.nvmlDeviceGetMinorNumber, handle, gpu=uuid),
            uuid=uuid,
            name=name,
            brand=_BRANDS.get(_call(pynvml.nvmlDeviceGetBrand, handle, gpu=uuid), "Unknown"),
            architecture=_ARCHITECTURES.get(arch, "Unknown"),
            cuda_compute_capability=f"{major}.{minor}",
            memory_bytes=total_bytes,
            pci_bus_id=bus_id,
            pcie_root=self._pcie_root(bus_id),
            numa_node=self._numa_node(bus_id),
            nvlink_peers=(),
            nvlink_domain=None,
            multiprocessors=full.multiprocessors if full else _FULL_GPU_MULTIPROCESSORS.get(name),
            mig_capable=mig_capable,
            mig_enabled=mig_enabled,
            mig_memory_slices=max((p.start + p.size for f in profiles for p in f.placements), default=0),
            mig_mode_switchable=switchable,
            mig_profiles=profiles,
            mig_devices=self._mig_devices(handle, uuid=uuid, profiles=profiles) if mig_enabled else (),
        )

    def _numa_node(self, bus_id: str) -> int | None:
        try:
            node = int((self._sysfs / "bus" / "pci" / "devices" / bus_id / "numa_node").read_text())
        except FileNotFoundError:
            return None
        return node if node >= 0 else None

    def _pcie_root(self, bus_id: str) -> str | None:
        """The root complex above the device, from where its sysfs symlink leads (as Kubernetes does)."""
        link = self._sysfs / "bus" / "pci" / "devices" / bus_id
        if not link.exists():
            return None
        return next((part for part in link.resolve().parts if _PCIE_ROOT.fullmatch(part)), None)

    def _nvlink_remotes(self, handle: Any, *, uuid: str, gpu_nodes: set[str]) -> set[str]:
        """The far ends of the GPU's active NVLinks: GPU bus ids, or "switch/<bus id>" for NVSwitches."""
        remotes = set()
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            active = _call_if_present(pynvml.nvmlDeviceGetNvLinkState, handle, link, gpu=uuid)
            if active != pynvml.NVML_FEATURE_ENABLED:
                continue
            kind = _call(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link, gpu=uuid)
            remote = _bus_id(_call(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link, gpu=uuid).busId)
            if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU:
                gpu_nodes.add(remote)
                remotes.add(remote)
            else:
                remotes.add(f"switch/{remote}")
        return remotes

    # --- MIG -----------------------------------------------------------------------------------

    def _mig_mode(self, handle: Any, uuid: str) -> tuple[bool, bool]:
        """(capable, enabled)."""
        mode = _call_if_present(pynvml.nvmlDeviceGetMigMode, handle, gpu=uuid)
        if mode is None:
            return False, False
        return True, mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE

    def _bare_metal(self, handle: Any, uuid: str) -> bool:
        """Whether NVML says the GPU is not virtualized. Inside a VM (passthrough or vGPU) the driver
        cannot reset the GPU, so a MIG mode change waits for a reboot; a GPU that does not say counts
        as virtualized, so that gpudra never starts a change it cannot finish."""
        mode = _call_if_present(
            pynvml.nvmlDeviceGetVirtualizationMode, handle, gpu=uuid, absent=(pynvml.NVMLError_NotSupported,)
        )
        return bool(mode == pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE)

    def _mig_profiles(self, handle: Any, *, uuid: str, total_bytes: int) -> tuple[records.MigProfile, ...]:
        profiles = []
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = _call_if_present(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, index, gpu=uuid)
            if info is None:
                continue
            profiles.append(
                records.MigProfile(
                    id=info.id,
                    name=mig_profile_name(
                        index=index,
                        slices=info.sliceCount,
                        memory_mib=info.memorySizeMB,
                        total_bytes=total_bytes,
                    ),
                    slice_count=info.sliceCount,
                    instance_count=info.instanceCount,
                    multiprocessors=info.multiprocessorCount,
                    copy_engines=info.copyEngineCount,
                    decoders=info.decoderCount,
                    encoders=info.encoderCount,
                    jpegs=info.jpegCount,
                    ofas=info.ofaCount,
                    memory_mib=info.memorySizeMB,
                    placements=self._placements(handle, uuid=uuid, profile_id=info.id),
                )
            )
        return tuple(profiles)

    def _placements(self, handle: Any, *, uuid: str, profile_id: int) -> tuple[records.MigPlacement, ...]:
        count = ctypes.c_uint()
        call = pynvml.nvmlDeviceGetGpuInstancePossiblePlacements
        _call(call, handle, profile_id, None, ctypes.byref(count), gpu=uuid)
        found = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        _call(call, handle, profile_id, found, ctypes.byref(count), gpu=uuid)
        return tuple(records.MigPlacement(start=p.start, size=p.size) for p in found[: count.value])

    def _mig_devices(
        self, handle: Any, *, uuid: str, profiles: tuple[records.MigProfile, ...]
    ) -> tuple[records.MigDevice, ...]:
        devices = [
            device
            for profile in profiles
            for gi in self._gpu_instances(handle, uuid=uuid, profile=profile)
            for device in self._devices_in(gi, uuid=uuid, profile=profile)
        ]
        return tuple(sorted(devices, key=lambda d: (d.placement, d.compute_instance_id)))

    def _gpu_instances(self, handle: Any, *, uuid: str, profile: records.MigProfile) -> list[Any]:
        found = (pynvml.c_nvmlGpuInstance_t * profile.instance_count)()
        count = ctypes.c_uint()
        _call(pynvml.nvmlDeviceGetGpuInstances, handle, profile.id, found, ctypes.byref(count), gpu=uuid)
        return list(found[: count.value])

    def _compute_instances(self, gi: Any, uuid: str) -> Iterator[tuple[Any, Any]]:
        """(CI profile info, CI handle) for every compute instance in GPU instance `gi`."""
        seen = set()
        for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            info = _call_if_present(
                pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                index,
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                gpu=uuid,
            )
            if info is None or info.id in seen:
                continue
            seen.add(info.id)
            found = (pynvml.c_nvmlComputeInstance_t * info.instanceCount)()
            count = ctypes.c_uint()
            _call(
                pynvml.nvmlGpuInstanceGetComputeInstances, gi, info.id, found, ctypes.byref(count), gpu=uuid
            )
            for ci in found[: count.value]:
                yield info, ci

    def _devices_in(self, gi: Any, *, uuid: str, profile: records.MigProfile) -> list[records.MigDevice]:
        gi_info = _call(pynvml.nvmlGpuInstanceGetInfo, gi, gpu=uuid)
        return [
            self._mig_device(ci, uuid=uuid, gi_info=gi_info, profile=profile, ci_slices=ci_profile.sliceCount)
            for ci_profile, ci in self._compute_instances(gi, uuid)
        ]

    def _mig_device(
        self, ci: Any, *, uuid: str, gi_info: Any, profile: records.MigProfile, ci_slices: int
    ) -> records.MigDevice:
        ci_info = _call(pynvml.nvmlComputeInstanceGetInfo, ci, gpu=uuid)
        attributes = _call(pynvml.nvmlDeviceGetAttributes, ci_info.device, gpu=uuid)
        return records.MigDevice(
            uuid=_call(pynvml.nvmlDeviceGetUUID, ci_info.device, gpu=uuid),
            profile_id=profile.id,
            profile_name=profile.name if ci_slices == profile.slice_count else f"{ci_slices}c.{profile.name}",
            placement=records.MigPlacement(start=gi_info.placement.start, size=gi_info.placement.size),
            gpu_instance_id=gi_info.id,
            compute_instance_id=ci_info.id,
            memory_mib=attributes.memorySizeMB,
            multiprocessors=attributes.multiprocessorCount,
        )

    def _handle(self, gpu_uuid: str) -> Any:
        return _call(pynvml.nvmlDeviceGetHandleByUUID, gpu_uuid, gpu=gpu_uuid)

    def _mig_profile(self, handle: Any, *, gpu_uuid: str, profile_id: int) -> records.MigProfile:
        """The profile `profile_id` of a GPU with MIG enabled; NotSupported otherwise."""
        current, _ = _call(pynvml.nvmlDeviceGetMigMode, handle, gpu=gpu_uuid)
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            raise errors.NotSupported(f"MIG mode is disabled on GPU {gpu_uuid}")
        total_bytes = _call(pynvml.nvmlDeviceGetMemoryInfo, handle, gpu=gpu_uuid).total
        profiles = self._mig_profiles(handle, uuid=gpu_uuid, total_bytes=total_bytes)
        for profile in profiles:
            if profile.id == profile_id:
                return profile
        offered = ", ".join(f"{p.id} ({p.name})" for p in profiles)
        raise errors.NotSupported(f"GPU {gpu_uuid} has no MIG profile ID {profile_id}; it has {offered}")

    def create_mig_device(self, *, gpu_uuid: str, profile_id: int, placement_start: int) -> records.MigDevice:
        """Creates a GPU instance at the placement and its default full compute instance.

        All or nothing: if the compute instance cannot be made, the GPU instance is destroyed again.
        An instance already at the placement, with a compute instance or without, is refused
        (InsufficientResources): nothing here can tell who made it, so nothing here adopts it.
        """
        handle = self._handle(gpu_uuid)
        profile = self._mig_profile(handle, gpu_uuid=gpu_uuid, profile_id=profile_id)
        placement = pynvml.c_nvmlGpuInstancePlacement_t(placement_start, profile.memory_slices)
        gi = _call(
            pynvml.nvmlDeviceCreateGpuInstanceWithPlacement,
            handle,
            profile_id,
            ctypes.byref(placement),
            gpu=gpu_uuid,
        )
        try:
            return self._add_compute_instance(gi, gpu_uuid=gpu_uuid, profile=profile)
        except BaseException as failure:
            with _noted(failure):
                _call(pynvml.nvmlGpuInstanceDestroy, gi, gpu=gpu_uuid)
            raise

    def _add_compute_instance(
        self, gi: Any, *, gpu_uuid: str, profile: records.MigProfile
    ) -> records.MigDevice:
        full = None
        for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            info = _call_if_present(
                pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                index,
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                gpu=gpu_uuid,
            )
            if info is not None and info.sliceCount == profile.slice_count:
                full = info
                break
        if full is None:
            raise errors.NotSupported(
                f"GPU {gpu_uuid}: no full compute-instance profile in a {profile.name} instance"
            )
        ci = _call(pynvml.nvmlGpuInstanceCreateComputeInstance, gi, full.id, gpu=gpu_uuid)
        try:
            gi_info = _call(pynvml.nvmlGpuInstanceGetInfo, gi, gpu=gpu_uuid)
            return self._mig_device(
                ci, uuid=gpu_uuid, gi_info=gi_info, profile=profile, ci_slices=full.sliceCount
            )
        except BaseException as failure:
            with _noted(failure):
                _call(pynvml.nvmlComputeInstanceDestroy, ci, gpu=gpu_uuid)
            raise

    def destroy_mig_device(self, *, gpu_uuid: str, gpu_instance_id: int) -> None:
        """Destroys the GPU instance's compute instances, then the GPU instance; InUse while processes run."""
        handle = self._handle(gpu_uuid)
        gi = _call(pynvml.nvmlDeviceGetGpuInstanceById, handle, gpu_instance_id, gpu=gpu_uuid)
        for _, ci in list(self._compute_instances(gi, gpu_uuid)):
            _call(pynvml.nvmlComputeInstanceDestroy, ci, gpu=gpu_uuid)
        _call(pynvml.nvmlGpuInstanceDestroy, gi, gpu=gpu_uuid)

    def mig_device_by_placement(
        self, *, gpu_uuid: str, profile_id: int, placement_start: int
    ) -> records.MigDevice | None:
        """The MIG device of this profile at this placement, if one exists (what a crashed prepare left)."""
        handle = self._handle(gpu_uuid)
        profile = self._mig_profile(handle, gpu_uuid=gpu_uuid, profile_id=profile_id)
        for gi in self._gpu_instances(handle, uuid=gpu_uuid, profile=profile):
            for device in self._devices_in(gi, uuid=gpu_uuid, profile=profile):
                if device.placement.start == placement_start:
                    return device
        return None

    def mig_devices(self, *, gpu_uuid: str) -> tuple[records.MigDevice, ...]:
        """The MIG devices that exist on the GPU now, by placement; () with MIG disabled or unsupported."""
        handle = self._handle(gpu_uuid)
        if not self._mig_mode(handle, gpu_uuid)[1]:
            return ()
        total_bytes = _call(pynvml.nvmlDeviceGetMemoryInfo, handle, gpu=gpu_uuid).total
        profiles = self._mig_profiles(handle, uuid=gpu_uuid, total_bytes=total_bytes)
        return self._mig_devices(handle, uuid=gpu_uuid, profiles=profiles)

    def gpu_instances(self, *, gpu_uuid: str) -> tuple[records.GpuInstance, ...]:
        """The GPU instances that exist on the GPU now, by placement, each with the MIG devices in it:
        also one without a compute instance, which `mig_devices` leaves out. () with MIG disabled."""
        handle = self._handle(gpu_uuid)
        if not self._mig_mode(handle, gpu_uuid)[1]:
            return ()
        total_bytes = _call(pynvml.nvmlDeviceGetMemoryInfo, handle, gpu=gpu_uuid).total
        found = []
        for profile in self._mig_profiles(handle, uuid=gpu_uuid, total_bytes=total_bytes):
            for gi in self._gpu_instances(handle, uuid=gpu_uuid, profile=profile):
                info = _call(pynvml.nvmlGpuInstanceGetInfo, gi, gpu=gpu_uuid)
                found.append(
                    records.GpuInstance(
                        id=info.id,
                        profile_id=profile.id,
                        profile_name=profile.name,
                        placement=records.MigPlacement(start=info.placement.start, size=info.placement.size),
                        mig_devices=tuple(
                            d.uuid for d in self._devices_in(gi, uuid=gpu_uuid, profile=profile)
                        ),
                    )
                )
        return tuple(sorted(found, key=lambda instance: (instance.placement, instance.id)))

    def destroy_at_placement(self, *, gpu_uuid: str, profile_id: int, placement_start: int) -> bool:
        """Destroys the GPU instance of this profile at this placement, its compute instances first.

        Also one a crash left without a compute instance. False when there is none (MIG disabled
        included: then no instance can exist); InUse while processes run on it, NotSupported on a GPU
        without MIG or for a profile the GPU does not have.
        """
        handle = self._handle(gpu_uuid)
        current, _ = _call(pynvml.nvmlDeviceGetMigMode, handle, gpu=gpu_uuid)
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return False
        profile = self._mig_profile(handle, gpu_uuid=gpu_uuid, profile_id=profile_id)
        for gi in self._gpu_instances(handle, uuid=gpu_uuid, profile=profile):
            info = _call(pynvml.nvmlGpuInstanceGetInfo, gi, gpu=gpu_uuid)
            if info.placement.start != placement_start:
                continue
            for _, ci in list(self._compute_instances(gi, gpu_uuid)):
                _call(pynvml.nvmlComputeInstanceDestroy, ci, gpu=gpu_uuid)
            _call(pynvml.nvmlGpuInstanceDestroy, gi, gpu=gpu_uuid)
            return True
        return False

    # --- MIG mode ------------------------------------------------------------------------------

    def mig_enabled(self, *, gpu_uuid: str) -> bool:
        """The GPU's current MIG mode; False on a GPU without MIG."""
        return self._mig_mode(self._handle(gpu_uuid), gpu_uuid)[1]

    def set_mig_mode(self, *, gpu_uuid: str, enabled: bool) -> None:
        """Switches MIG mode on or off, and raises unless the GPU is in that mode afterwards.

        NVML answers the call with an activation status instead of raising: IN_USE (something holds
        the GPU) becomes InUse, anything else (RESET_REQUIRED on Ampere or in a VM) a HardwareError;
        both put the previous mode back as the pending one, best effort, so that a later reset does
        not flip the mode behind gpudra's back. NotSupported on a GPU without MIG. A change may
        re-enumerate the GPU (NVML: "attributes such as minor number might change"): read the
        inventory again after it.
        """
        handle = self._handle(gpu_uuid)
        wanted = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        current, pending = _call(pynvml.nvmlDeviceGetMigMode, handle, gpu=gpu_uuid)
        if current == pending == wanted:
            return
        status = _call(pynvml.nvmlDeviceSetMigMode, handle, wanted, gpu=gpu_uuid)
        if status == pynvml.NVML_SUCCESS:
            return
        failure = _mig_mode_refused(gpu_uuid, enabled=enabled, status=status)
        with _noted(failure):
            undone = _call(pynvml.nvmlDeviceSetMigMode, handle, current, gpu=gpu_uuid)
            if undone != pynvml.NVML_SUCCESS:
                failure.add_note(
                    f"putting the pending MIG mode back failed as well: {_CODE_NAMES.get(undone, undone)}"
                )
        raise failure

    def compute_processes(self, *, gpu_uuid: str) -> tuple[int, ...]:
        """Sorted PIDs of the compute processes on the GPU or any of its MIG devices.

        The GPU's own list is NVML's aggregate over its MIG devices only for a privileged caller, so
        each MIG device is asked as well.
        """
        handle = self._handle(gpu_uuid)
        listed = pynvml.nvmlDeviceGetComputeRunningProcesses
        pids = {p.pid for p in _call(listed, handle, gpu=gpu_uuid)}
        if self._mig_mode(handle, gpu_uuid)[1]:
            for index in range(_call(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle, gpu=gpu_uuid)):
                mig = _call_if_present(
                    pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
                    handle,
                    index,
                    gpu=gpu_uuid,
                    absent=_NO_MIG_DEVICE,
                )
                if mig is None:
                    continue
                # A MIG device destroyed since it was listed has no processes left.
                found = _call_if_present(listed, mig, gpu=gpu_uuid, absent=_NO_MIG_DEVICE) or []
                pids.update(p.pid for p in found)
        return tuple(sorted(pids))

    # --- MIG device nodes ----------------------------------------------------------------------

    def mig_capabilities(
        self, *, gpu_minor: int, gpu_instance_id: int, compute_instance_id: int
    ) -> records.MigCapabilities:
        """The nvidia-caps major and the capability minors of one GPU and compute instance.

        From <proc>/devices ("Character devices:" section, line "<major> nvidia-caps") and
        <proc>/driver/nvidia-caps/mig-minors (lines "gpu<minor>/gi<id>/access <N>" and
        "gpu<minor>/gi<id>/ci<id>/access <N>"). HardwareError naming the file and the entry when
        either is missing: a driver without MIG support, or /proc not mounted into the plugin.
        """
        devices = self._proc / "devices"
        major = _character_devices(_read_proc(devices)).get("nvidia-caps")
        if major is None:
            raise errors.HardwareError(
                f"{devices} lists no character device 'nvidia-caps': the NVIDIA driver is not loaded, "
                "or too old for MIG"
            )
        path = self._proc / "driver" / "nvidia-caps" / "mig-minors"
        minors = _mig_minors(_read_proc(path))
        gi_entry = f"gpu{gpu_minor}/gi{gpu_instance_id}/access"
        ci_entry = f"gpu{gpu_minor}/gi{gpu_instance_id}/ci{compute_instance_id}/access"
        for entry in (gi_entry, ci_entry):
            if entry not in minors:
                raise errors.HardwareError(
                    f"{path} has no entry {entry!r}: GPU minor {gpu_minor}, GPU instance {gpu_instance_id} "
                    f"or compute instance {compute_instance_id} is out of the driver's range"
                )
        return records.MigCapabilities(major=major, gi_minor=minors[gi_entry], ci_minor=minors[ci_entry])


@contextmanager
def _noted(failure: BaseException) -> Iterator[None]:
    """Runs a clean-up step; if it fails too, that becomes a note on the original failure."""
    try:
        yield
    except errors.GpudraError as cleanup:
        failure.add_note(f"clean-up failed as well: {cleanup}")


def _resets_itself(architecture: int) -> bool:
    """Hopper and newer apply a MIG mode change at once; Ampere needs a GPU reset for it."""
    known = architecture != pynvml.NVML_DEVICE_ARCH_UNKNOWN
    return bool(known and architecture >= pynvml.NVML_DEVICE_ARCH_HOPPER)


def _mig_mode_refused(gpu_uuid: str, *, enabled: bool, status: int) -> errors.HardwareError:
    """The error for a non-zero activation status of nvmlDeviceSetMigMode, saying what to do."""
    mode = "enable" if enabled else "disable"
    name = _CODE_NAMES.get(status, str(status))
    try:
        nvml_error: str | None = pynvml.nvmlExceptionClass(status).__name__
    except ValueError:
        nvml_error = None
    if status == pynvml.NVML_ERROR_IN_USE:
        return errors.InUse(
            f"cannot {mode} MIG mode on GPU {gpu_uuid}: NVML activation status {name}, the GPU is in use; "
            "stop the processes using it (nvidia-smi shows them) and remove its MIG instances, then retry",
            nvml_error=nvml_error,
        )
    return errors.HardwareError(
        f"cannot {mode} MIG mode on GPU {gpu_uuid}: NVML activation status {name}, the change needs a GPU "
        f"reset this machine cannot do by itself (Ampere, or a VM); set it out of band with "
        f"`nvidia-smi -i {gpu_uuid} -mig {int(enabled)}`, then reset the GPU or reboot the node",
        nvml_error=nvml_error,
    )


def _read_proc(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as error:
        raise errors.HardwareError(
            f"cannot read {path}: {error.strerror}; is the NVIDIA driver loaded and /proc visible to gpudra?"
        ) from error


def _character_devices(text: str) -> dict[str, int]:
    """Name -> major from /proc/devices' "Character devices:" section (block devices excluded)."""
    majors: dict[str, int] = {}
    section = ""
    for line in text.splitlines():
        if line.endswith(":"):
            section = line
            continue
        fields = line.split(None, 1)
        if section == "Character devices:" and len(fields) == 2 and fields[0].isdigit():
            majors.setdefault(fields[1].strip(), int(fields[0]))
    return majors


def _mig_minors(text: str) -> dict[str, int]:
    """Entry -> minor from mig-minors ("config 1", "gpu0/gi1/access 12", ...); other lines ignored."""
    minors = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit():
            minors[fields[0]] = int(fields[1])
    return minors


def _bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:17:00.0" as sysfs and Kubernetes write it: "0000:17:00.0"."""
    domain, rest = nvml_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def _nvlink_islands(links: dict[str, set[str]], gpu_nodes: set[str]) -> dict[str, tuple[str, ...]]:
    """GPU bus id -> sorted bus ids of all GPUs joined with it over NVLink (itself included).

    Connected components of the graph of active links; an NVSwitch is a node, so every GPU linked to
    a switch is joined with every other GPU linked to it. GPUs without active links are absent.
    """
    neighbours: dict[str, set[str]] = {}
    for gpu, remotes in links.items():
        for remote in remotes:
            neighbours.setdefault(gpu, set()).add(remote)
            neighbours.setdefault(remote, set()).add(gpu)
    islands: dict[str, tuple[str, ...]] = {}
    for start in neighbours:
        if start in islands or start not in gpu_nodes:
            continue
        component, frontier = {start}, [start]
        while frontier:
            for nxt in neighbours[frontier.pop()] - component:
                component.add(nxt)
                frontier.append(nxt)
        members = tuple(sorted(component & gpu_nodes))
        islands.update(dict.fromkeys(members, members))
    return islands


def mig_profile_name(*, index: int, slices: int, memory_mib: int, total_bytes: int) -> str:
    """go-nvlib's profile name: "<slices>g.<GB>gb" plus the suffix of the profile index.

    GB is the instance's memory rounded up to eighths of the GPU, times the GPU's memory in whole
    GiB (rounded up), rounded half up: 4864 MiB of a 40960 MiB A100 is 1/8 of 40 = "1g.5gb".
    """
    eighths = math.ceil(Fraction(memory_mib * _MIB * 8, total_bytes))
    gigabytes = math.floor(Fraction(eighths, 8) * math.ceil(Fraction(total_bytes, _GIB)) + Fraction(1, 2))
    return f"{slices}g.{gigabytes}gb{_PROFILE_SUFFIXES.get(index, '')}"
