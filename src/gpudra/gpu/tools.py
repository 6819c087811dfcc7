"""Runs the NVIDIA command-line tools gpudra needs where NVML has no API. I/O: subprocesses.

Time-slice intervals have no NVML call outside vGPU hosts, so they go through
`nvidia-smi compute-policy -i <uuid> --set-timeslice <0..3>` (gpu-mechanics.md section 4). With a
simulated machine the same command lines reach the simulator's stand-in executables.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from gpudra.errors import HardwareError, NvmlUnavailable


class GpuTools:
    def __init__(self, *, search_path: str | None = None, timeout: float = 30.0) -> None:
        self.search_path = search_path if search_path is not None else os.environ.get("PATH", "")
        self.timeout = timeout

    @classmethod
    def with_directory_first(cls, directory: Path) -> GpuTools:
        """Tools found in `directory` before PATH (the simulator's stand-ins)."""
        return cls(search_path=os.pathsep.join([str(directory), os.environ.get("PATH", "")]))

    def _run(self, tool: str, args: Sequence[str]) -> str:
        executable = shutil.which(tool, path=self.search_path)
        if executable is None:
            raise NvmlUnavailable(f"{tool} not found on PATH ({self.search_path})")
        try:
            result = subprocess.run(
                [executable, *args], capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired as err:
            raise HardwareError(f"{tool} {' '.join(args)} did not finish in {self.timeout:g}s") from err
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip()
            raise HardwareError(f"{tool} {' '.join(args)} failed ({result.returncode}): {detail}")
        return result.stdout

    def set_timeslice(self, *, gpu_uuid: str, level: int) -> None:
        """Set the GPU's time-slice: 0 Default, 1 Short, 2 Medium, 3 Long."""
        self._run("nvidia-smi", ["compute-policy", "-i", gpu_uuid, "--set-timeslice", str(level)])
