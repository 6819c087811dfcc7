"""Wrapper scripts that put the stand-in driver tools on PATH. I/O: writes two executables.

gpudra runs `nvidia-smi` and `nvidia-cuda-mps-control` by name; a test or a simulated node puts the
returned directory first on PATH and the same code drives the simulated machine in `state_file`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path

from gpudra.atomic_file import write_atomically

_TOOLS = {"nvidia-smi": "gpudra.sim.nvidia_smi", "nvidia-cuda-mps-control": "gpudra.sim.mps_control"}


def write_tools(directory: Path, *, state_file: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    state = shlex.quote(str(state_file.absolute()))
    for name, module in _TOOLS.items():
        script = directory / name
        content = f'#!/bin/sh\nGPUDRA_SIM_STATE={state} exec {shlex.quote(sys.executable)} -m {module} "$@"\n'
        # A second plugin instance (rolling update) starts while the first may be running these: an
        # unchanged script is left alone, a changed one replaced whole, never rewritten in place.
        with contextlib.suppress(OSError):
            if script.read_text() == content and os.access(script, os.X_OK):
                continue
        write_atomically(script, content.encode(), mode=0o755, durable=False)
    return directory
