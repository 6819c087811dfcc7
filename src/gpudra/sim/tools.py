"""Wrapper scripts that put the stand-in driver tools on PATH. I/O: writes two executables.

gpudra runs `nvidia-smi` and `nvidia-cuda-mps-control` by name; a test or a simulated node puts the
returned directory first on PATH and the same code drives the simulated machine in `state_file`.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

_TOOLS = {"nvidia-smi": "gpudra.sim.nvidia_smi", "nvidia-cuda-mps-control": "gpudra.sim.mps_control"}


def write_tools(directory: Path, *, state_file: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    state = shlex.quote(str(state_file.absolute()))
    for name, module in _TOOLS.items():
        script = directory / name
        script.write_text(
            f'#!/bin/sh\nGPUDRA_SIM_STATE={state} exec {shlex.quote(sys.executable)} -m {module} "$@"\n'
        )
        script.chmod(0o755)
    return directory
