"""The simulated card's mutable state and the file that holds it. I/O: the state file and its lock file.

One JSON file per simulated machine plays the part of the hardware: every process that installs the
simulator (the plugin, a test, the stand-in `nvidia-smi`, an MPS daemon) reads and changes the same
file, so MIG instances, compute modes and daemons survive restarts and are seen by all, like a card.
Changes run under an exclusive `flock` on a sibling lock file (the state file itself is replaced by
rename, so it cannot carry the lock) and are written atomically: temp file, fsync, rename.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from gpudra import errors
from gpudra.atomic_file import locked, write_atomically
from gpudra.sim import machines

ENVIRONMENT = "GPUDRA_SIM_STATE"


class _StateModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ComputeInstanceState(_StateModel):
    id: int
    profile_id: int  # CI profile ID (equals the NVML CI profile index, as observed)
    start: int  # in GPU slices of the parent GI
    size: int
    uuid: str  # the MIG device's UUID, new on every create
    compute_mode: int = 0


class GpuInstanceState(_StateModel):
    id: int
    profile_id: int
    start: int  # in memory slices
    size: int
    compute_instances: list[ComputeInstanceState] = []


class GpuState(_StateModel):
    uuid: str
    mig_mode: int  # 0 disabled, 1 enabled; always 0 on GPUs without MIG
    # A mode change nvmlDeviceSetMigMode could not apply (it needs a reset or the GPU was busy); None
    # when none is pending. NVML reports it as the pending mode.
    mig_mode_pending: int | None = None
    compute_mode: int = 0
    timeslice: int = 0  # nvidia-smi compute-policy: 0 default, 1 short, 2 medium, 3 long
    utilization: int = 0  # percent, what nvmlDeviceGetUtilizationRates reports as .gpu
    lost: bool = False  # fallen off the bus: NVML calls on it answer GPU_IS_LOST (hooks.set_gpu_lost)
    # Uncorrected (double-bit) ECC errors since boot: nvmlDeviceGetTotalEccErrors (hooks.raise_double_bit_ecc)
    ecc_uncorrected: int = 0
    # Memory repairs the driver has queued for the next reset, and a row remapping that failed (kept
    # across resets, as NVML keeps it): nvmlDeviceGetRemappedRows on Ampere and later,
    # nvmlDeviceGetRetiredPagesPendingStatus before (hooks.set_memory_condition). A reset (hooks.
    # set_gpu_lost off) applies what is pending.
    row_remap_pending: bool = False
    row_remap_failed: bool = False
    retired_pages_pending: bool = False
    nvlinks_down: list[int] = []  # links that were trained and are down (hooks.set_nvlink_down)
    clock_event_reasons: int = (
        0  # nvmlClocksEventReason* bits holding the clocks down (hooks.set_clock_slowdown)
    )
    gpu_instances: list[GpuInstanceState] = []


class Process(_StateModel):
    """A (fake) process holding a GPU or MIG device, by UUID; destroy refuses while one is attached."""

    pid: int
    device_uuid: str
    used_bytes: int = 0  # device memory it holds: NVML's usedGpuMemory, and part of the device's used


class MpsDaemon(_StateModel):
    pid: int
    pipe_directory: str
    log_directory: str
    visible_devices: str | None
    default_active_thread_percentage: float = 100.0
    default_pinned_memory_limits: dict[str, str] = {}


class Event(_StateModel):
    """One NVML event the driver raised (`hooks.raise_xid`, ...), as event sets deliver it (`sim.events`)."""

    seq: int  # 1, 2, ... in the order raised: an event set delivers those after its registration
    gpu: int  # the GPU's index
    type: int  # one nvmlEventType bit
    data: int = 0  # the XID of an XID event
    # The GPU and compute instance the driver attributes it to; NVML's "not available" when none.
    gpu_instance_id: int = 0xFFFFFFFF
    compute_instance_id: int = 0xFFFFFFFF


class MachineState(_StateModel):
    machine: str
    gpus: list[GpuState]
    processes: list[Process] = []
    mps_daemons: list[MpsDaemon] = []
    events: list[Event] = []  # the newest raised, oldest first (bounded: `sim.events.KEPT`)
    events_raised: int = 0  # seq of the newest event ever raised

    def memory_used(self, device_uuids: set[str]) -> int:
        """Bytes the processes on any of these GPU or MIG devices hold."""
        return sum(p.used_bytes for p in self.processes if p.device_uuid in device_uuids)


def initial_state(machine: machines.Machine) -> MachineState:
    """A freshly booted machine: no instances, default modes, MIG mode as the profile says."""
    return MachineState(
        machine=machine.name,
        gpus=[
            GpuState(uuid=machine.gpu_uuid(i), mig_mode=int(machine.mig_enabled and slot.model.mig_capable))
            for i, slot in enumerate(machine.gpus)
        ],
    )


class StateFile:
    """Reads and changes one machine's state file; see the module docstring for the locking rules."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # The last file `read` parsed: its identity (below), its bytes and what they parse into.
        self._parsed: tuple[tuple[int, ...], bytes, MachineState] | None = None

    def exists(self) -> bool:
        return self.path.exists()

    def create(self, machine: machines.Machine) -> None:
        """Boots `machine` into a new state file, or checks that an existing one is the same machine."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with locked(self.path, exclusive=True):
            if not self.path.exists():
                self._write(initial_state(machine))
                return
            found = self._read().machine
        if found != machine.name:
            raise errors.ConfigError(
                f"state file {self.path} holds the simulated machine {found!r}, not {machine.name!r}; "
                "use another state file or remove this one",
                field="GPUDRA_SIM_STATE",
            )

    def read(self) -> MachineState:
        """The state now, for reading only (changes go through `update`). While the file's bytes stay
        the same the same object comes back: every simulated NVML call reads the state, and parsing it
        each time would make the simulator cost what a driver call does not."""
        parsed = self._parsed
        # A waiting event set calls this 20 times a second in every plugin: a stat that finds the file
        # as it was answers without the lock, the read and the comparison. Every change replaces the
        # file (a new inode, new times), so an unchanged identity is unchanged bytes.
        with contextlib.suppress(FileNotFoundError):
            if parsed is not None and _identity(os.stat(self.path)) == parsed[0]:
                return parsed[2]
        with locked(self.path, exclusive=False), self.path.open("rb") as file:
            identity, content = _identity(os.fstat(file.fileno())), file.read()
        if parsed is None or parsed[1] != content:
            self._parsed = (identity, content, MachineState.model_validate_json(content))
        else:
            self._parsed = (identity, content, parsed[2])
        return self._parsed[2]

    @contextlib.contextmanager
    def update(self) -> Iterator[MachineState]:
        """Yields the state for changing; writes it back only if the block finishes without raising."""
        with locked(self.path, exclusive=True):
            state = self._read()
            yield state
            self._write(state)

    def _read(self) -> MachineState:
        return MachineState.model_validate_json(self.path.read_bytes())

    def _write(self, state: MachineState) -> None:
        write_atomically(self.path, state.model_dump_json(indent=1).encode(), mode=0o644)


def _identity(stat: os.stat_result) -> tuple[int, ...]:
    """What tells one version of the state file from another without reading it."""
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def from_environment() -> StateFile | None:
    """The state file the stand-in tools act on (their wrapper scripts set the variable); None if absent."""
    value = os.environ.get(ENVIRONMENT)
    if not value or not Path(value).exists():
        return None
    return StateFile(Path(value))
