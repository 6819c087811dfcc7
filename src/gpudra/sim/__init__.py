"""A simulated NVIDIA driver under pynvml, plus stand-ins for its tools and device nodes. I/O: state
file, sysfs, proc, device nodes.

`install` puts a `SimulatedLibrary` where pynvml keeps the loaded libnvidia-ml (`nvmlLib`) and fills
pynvml's function-pointer cache with its entry points, so every pynvml wrapper runs unchanged on top
of simulated C functions, and writes the files of the driver that gpudra reads besides NVML: a sysfs
tree (`sysfs`) and a proc tree (`procfs`). `write_device_nodes` makes the driver's /dev entries
(`devnodes`), for container runtimes to inject. This package never imports pynvml: `gpudra.gpu.nvml`
passes the module in.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpudra import errors
from gpudra.sim import devnodes, library, machines, procfs, state, sysfs
from gpudra.sim.hooks import (
    attach_process,
    detach_process,
    raise_double_bit_ecc,
    raise_single_bit_ecc,
    raise_xid,
    set_clock_slowdown,
    set_gpu_lost,
    set_memory_condition,
    set_mig_mode,
    set_nvlink_down,
    set_utilization,
)
from gpudra.sim.tools import write_tools

__all__ = [
    "PROFILES",
    "Simulation",
    "attach_process",
    "detach_process",
    "install",
    "installed",
    "raise_double_bit_ecc",
    "raise_single_bit_ecc",
    "raise_xid",
    "set_clock_slowdown",
    "set_gpu_lost",
    "set_memory_condition",
    "set_mig_mode",
    "set_nvlink_down",
    "set_utilization",
    "state_file",
    "uninstall",
    "write_device_nodes",
    "write_tools",
]

PROFILES = tuple(machines.MACHINES)


def _machine(profile: str) -> machines.Machine:
    machine = machines.MACHINES.get(profile)
    if machine is None:
        raise errors.ConfigError(
            f"unknown simulated machine {profile!r}; allowed: {', '.join(PROFILES)}", field="--nvml"
        )
    return machine


def write_device_nodes(profile: str, directory: Path) -> tuple[Path, ...]:
    """Creates the device nodes of the simulated machine `profile` in `directory` (a /dev stand-in:
    `nvidia<minor>`, `nvidiactl`, `nvidia-uvm`, ..., see `devnodes`); returns their paths.

    Needs CAP_MKNOD; without it, or where `directory` cannot hold device nodes, a ConfigError says so."""
    return devnodes.write(_machine(profile), directory)


class PynvmlModule(Protocol):
    """The module state of pynvml (nvidia-ml-py) that installing the simulator replaces."""

    nvmlLib: object  # the loaded CDLL, or None before the first nvmlInit
    libLoadLock: threading.Lock  # guards nvmlLib and the cache
    _nvmlGetFunctionPointer_cache: dict[str, Any]  # C symbol name -> callable, consulted first
    _nvmlLib_refcount: int  # nvmlInit calls not yet shut down


def install(
    pynvml_module: PynvmlModule, *, profile: str, state_file: Path, sysfs_root: Path, proc_root: Path
) -> None:
    """Boots (or joins) the simulated machine `profile` in `state_file` and loads it under pynvml.

    The machine's sysfs and proc files are (re)written under `sysfs_root` and `proc_root`.

    Installs nest: installing the same machine and state file again only counts, and each `uninstall`
    undoes one. Another machine while one is installed, or the simulator while this process uses real
    NVML, is refused, because pynvml holds one library per process.
    """
    machine = _machine(profile)
    store = state.StateFile(state_file.absolute())
    store.create(machine)
    sysfs.write(machine, sysfs_root)
    procfs.write(proc_root)
    with pynvml_module.libLoadLock:
        current = pynvml_module.nvmlLib
        if isinstance(current, library.SimulatedLibrary):
            if (current.machine, current.state_file.path) != (machine, store.path):
                raise errors.ConfigError(
                    f"this process already simulates {current.machine.name!r} with state "
                    f"{current.state_file.path}; close it first",
                    field="--nvml",
                )
            current.installs += 1
            return
        if pynvml_module._nvmlLib_refcount > 0:
            raise errors.ConfigError("this process uses the real NVML; close it first", field="--nvml")
        simulated = library.SimulatedLibrary(machine=machine, state_file=store)
        simulated.previous = current
        simulated.installs = 1
        pynvml_module.nvmlLib = simulated
        pynvml_module._nvmlGetFunctionPointer_cache.clear()
        pynvml_module._nvmlGetFunctionPointer_cache.update(simulated.entry_points())


def uninstall(pynvml_module: PynvmlModule) -> None:
    """Undoes one `install`; the last one gives pynvml back what it had loaded before."""
    with pynvml_module.libLoadLock:
        current = pynvml_module.nvmlLib
        if not isinstance(current, library.SimulatedLibrary):
            return
        current.installs -= 1
        if current.installs == 0:
            pynvml_module.nvmlLib = current.previous
            pynvml_module._nvmlGetFunctionPointer_cache.clear()


def installed(pynvml_module: PynvmlModule) -> bool:
    return isinstance(pynvml_module.nvmlLib, library.SimulatedLibrary)


def state_file(profile: str) -> Path:
    """Where a simulated machine keeps its state: $GPUDRA_SIM_STATE, else a per-profile temp file."""
    default = Path(os.environ.get("TMPDIR", "/tmp")) / "gpudra-sim" / f"{profile}.json"
    return Path(os.environ.get("GPUDRA_SIM_STATE") or default)


@dataclass(frozen=True)
class Simulation:
    """The simulated machine `profile` whose state lives in `state`, as gpudra.gpu.nvml installs it
    underneath pynvml (its `Beneath`): the sysfs and proc trees are the directories `sysfs` and `proc`
    next to the state file; processes that use the same file share one machine."""

    profile: str
    state: Path

    def __post_init__(self) -> None:
        _machine(self.profile)  # an unknown profile is refused here, before anything is written

    @property
    def sysfs_root(self) -> Path:
        return self.state.parent / "sysfs"

    @property
    def proc_root(self) -> Path:
        return self.state.parent / "proc"

    def install(self, pynvml_module: PynvmlModule) -> None:
        install(
            pynvml_module,
            profile=self.profile,
            state_file=self.state,
            sysfs_root=self.sysfs_root,
            proc_root=self.proc_root,
        )

    def uninstall(self, pynvml_module: PynvmlModule) -> None:
        uninstall(pynvml_module)
