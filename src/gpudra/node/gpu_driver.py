"""The one seam where the machine's own NVIDIA driver or gpudra's simulator is chosen, by the --nvml
option ("real" or "sim:<machine>"): NVML sessions, the driver's tools, the device nodes. Every command
that opens NVML (the plugin's wiring, mps-host, `gpudra inventory`) gets them here; the rest of node/
and gpu/ takes what this gives and never names the simulator. I/O: through gpudra.gpu and gpudra.sim.
"""

from __future__ import annotations

from pathlib import Path

from gpudra import errors, sim
from gpudra.gpu import nvml
from gpudra.gpu.tools import GpuTools

REAL = "real"
SPECS = (REAL, *(f"sim:{profile}" for profile in sim.PROFILES))


def simulation(spec: str, *, state_file: Path | None = None) -> sim.Simulation | None:
    """The simulated machine --nvml `spec` names (None: the real driver); its state in `state_file`,
    by default $GPUDRA_SIM_STATE, else ${TMPDIR:-/tmp}/gpudra-sim/<machine>.json."""
    if spec == REAL:
        return None
    profile = spec.removeprefix("sim:")
    if spec not in SPECS or profile == spec:
        raise errors.ConfigError(f"unknown NVML {spec!r}; allowed: {', '.join(SPECS)}", field="--nvml")
    return sim.Simulation(profile, state_file or sim.state_file(profile))


def connect(spec: str = REAL, *, state_file: Path | None = None, driver_root: Path = Path("/")) -> nvml.Nvml:
    """An NVML session on the machine `spec` names. With a `driver_root` other than `/`, the real
    driver's library is loaded from under it; a simulated machine ignores it."""
    return nvml.connect(driver_root=driver_root, beneath=simulation(spec, state_file=state_file))


def tools(spec: str, *, driver_root: Path, directory: Path) -> GpuTools:
    """The driver's tools (nvidia-smi, nvidia-cuda-mps-control), or the simulator's stand-ins for
    them, written into `directory`."""
    simulated = simulation(spec)
    if simulated is None:
        return GpuTools(driver_root=driver_root)
    return GpuTools.with_directory_first(sim.write_tools(directory, state_file=simulated.state))


def device_node_dir(spec: str, dev_root: Path) -> Path | None:
    """Where the plugin makes the simulated machine's device nodes: `<dev root>/dev` with a dev root
    other than / (never the node's own /dev); None for the real driver, whose nodes exist already."""
    if simulation(spec) is None or dev_root == Path("/"):
        return None
    return dev_root / "dev"


def write_device_nodes(spec: str, directory: Path) -> tuple[Path, ...]:
    """The simulated machine's device nodes, made in `directory` (a /dev stand-in); none for the real
    driver."""
    simulated = simulation(spec)
    return () if simulated is None else sim.write_device_nodes(simulated.profile, directory)
