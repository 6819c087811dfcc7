"""Wrapper scripts that put the stand-in driver tools on PATH. I/O: writes two executables.

gpudra runs `nvidia-smi` and `nvidia-cuda-mps-control` by name; a test or a simulated node puts the
returned directory first on PATH and the same code drives the simulated machine in `state_file`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import sys
from pathlib import Path

from gpudra.atomic_file import write_atomically

_TOOLS = {"nvidia-smi": "gpudra.sim.nvidia_smi", "nvidia-cuda-mps-control": "gpudra.sim.mps_control"}
# Run by path, not with -m: gpudra sends every MPS command through a client start, and `-m` would
# import the gpudra.sim package (its pynvml stand-in, the state file's models) first, ten times the
# CPU of the client itself. -P keeps the module's own directory off sys.path (its siblings' names are
# not the standard library's, but nothing here should depend on that).
_BY_PATH = {"nvidia-cuda-mps-control"}


def write_tools(directory: Path, *, state_file: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    state = shlex.quote(str(state_file.absolute()))
    for name, module in _TOOLS.items():
        script = directory / name
        run = f"-P {shlex.quote(_path_of(module))}" if name in _BY_PATH else f"-m {module}"
        content = f'#!/bin/sh\nGPUDRA_SIM_STATE={state} exec {shlex.quote(sys.executable)} {run} "$@"\n'
        # A second plugin instance (rolling update) starts while the first may be running these: an
        # unchanged script is left alone, a changed one replaced whole, never rewritten in place.
        with contextlib.suppress(OSError):
            if script.read_text() == content and os.access(script, os.X_OK):
                continue
        write_atomically(script, content.encode(), mode=0o755, durable=False)
    return directory


def _path_of(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return spec.origin
