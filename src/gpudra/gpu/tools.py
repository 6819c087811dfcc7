"""Runs the NVIDIA command-line tools gpudra needs where NVML has no API. I/O: subprocesses.

- Time-slice intervals have no NVML call outside vGPU hosts, so they go through
  `nvidia-smi compute-policy -i <uuid> --set-timeslice <0..3>` (gpu-mechanics.md section 4).
- Compute modes go through `nvidia-smi -i <uuid> -c <MODE>` and `--query-gpu=compute_mode`, the command
  lines NVIDIA's device plugin and DRA driver use before starting MPS.
- MPS control daemons are started with `nvidia-cuda-mps-control -d` and driven by the commands it reads
  on stdin (section 3); CUDA_MPS_PIPE_DIRECTORY tells both which daemon is meant.

With a simulated machine the same command lines reach the simulator's stand-in executables.

With a driver root other than `/` (`--driver-root`, see `gpudra.gpu.driver_root`) the tools are the
root's, found in its bin directories and run as `chroot <root> <tool> ...`, since they are linked against
the libc next to them. Paths given to them then mean those paths inside the root: the MPS pipe and log
directories (in the plugin's state directory) must be the same writable directories there, which holds
when the state directory is mounted at its host path in the container and inside the root, as the Helm
chart does for any driver root. Where they are not, an MPS command fails with a HardwareError that says
so and names --driver-root, instead of starting a daemon whose pipe the plugin and its containers cannot
reach.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from gpudra.errors import HardwareError, NotSupported, NvmlUnavailable
from gpudra.gpu import driver_root as roots

MPS_CONTROL: Final = "nvidia-cuda-mps-control"
# What it says when no daemon answers in its pipe directory (the simulator's stand-in says the same).
MPS_NO_DAEMON: Final = "Cannot find MPS control daemon process"
# nvidia-smi(1), RETURN VALUE: "the requested operation is not available on target device".
_NVIDIA_SMI_NOT_SUPPORTED: Final = 3
# What `nvidia-smi --query-gpu=compute_mode` prints, and what `nvidia-smi -c` takes, per NVML value.
COMPUTE_MODES: Final[dict[str, int]] = {"Default": 0, "Prohibited": 2, "Exclusive_Process": 3}
# Environment variables whose directories the tool opens: with a driver root, they must be there too.
_DIRECTORY_VARIABLES: Final = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


class GpuTools:
    def __init__(
        self, *, search_path: str | None = None, timeout: float = 30.0, driver_root: Path = Path("/")
    ) -> None:
        """`search_path` finds the tools, or with a `driver_root` other than `/` the chroot command."""
        self.search_path = search_path if search_path is not None else os.environ.get("PATH", "")
        self.timeout = timeout
        self.driver_root = driver_root

    @classmethod
    def with_directory_first(cls, directory: Path) -> GpuTools:
        """Tools found in `directory` before PATH (the simulator's stand-ins)."""
        return cls(search_path=os.pathsep.join([str(directory), os.environ.get("PATH", "")]))

    def run(
        self,
        tool: str,
        args: Sequence[str],
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Run `tool` with `args`: its stdout; HardwareError (or NvmlUnavailable) for a failed run. Every
        tool process gpudra starts goes through here (tests count and refuse runs by overriding it)."""
        argv = self.command(tool)
        for variable in _DIRECTORY_VARIABLES:
            if env is not None and variable in env:
                self._check_shared(Path(env[variable]), variable)
        command = " ".join([tool, *args])
        try:
            result = subprocess.run(
                [*argv, *args],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
                env=None if env is None else _first(env, os.environ),
            )
        except subprocess.TimeoutExpired as err:
            raise HardwareError(f"{command} did not finish in {self.timeout:g}s") from err
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip()
            if tool == "nvidia-smi" and result.returncode == _NVIDIA_SMI_NOT_SUPPORTED:
                raise NotSupported(f"{command} failed ({result.returncode}): {detail}")
            raise HardwareError(f"{command} failed ({result.returncode}): {detail}")
        return result.stdout

    def command(self, tool: str) -> list[str]:
        """The command line that runs `tool`, before its arguments: its path on the search path, or
        `chroot <root> <its path inside the root>` with a driver root. NvmlUnavailable if not found."""
        if roots.is_host(self.driver_root):
            executable = shutil.which(tool, path=self.search_path)
            if executable is None:
                raise NvmlUnavailable(f"{tool} not found on PATH ({self.search_path})")
            return [executable]
        found = roots.find(self.driver_root, tool, roots.TOOL_DIRS)
        if found is None or not os.access(roots.here(self.driver_root, found), os.X_OK):
            raise NvmlUnavailable(
                f"{tool} not found under the driver root {self.driver_root} (--driver-root); searched "
                f"{roots.searched(self.driver_root, roots.TOOL_DIRS)}"
            )
        chroot = shutil.which("chroot", path=self.search_path)
        if chroot is None:
            raise NvmlUnavailable(
                f"chroot not found on PATH ({self.search_path}); it runs {tool} in the driver root "
                f"{self.driver_root} (--driver-root)"
            )
        return [chroot, str(self.driver_root), str(found)]

    def _check_shared(self, directory: Path, variable: str) -> None:
        if roots.is_host(self.driver_root) or roots.shared(self.driver_root, directory):
            return
        raise HardwareError(
            f"{variable} {directory} is not the same writable directory inside the driver root "
            f"{self.driver_root} (--driver-root), where the NVIDIA tools run: MPS needs the plugin's "
            "state directory (--state-dir) at the same path inside the driver root, as when the driver "
            "root is the host's / and the state directory is mounted at its host path"
        )

    def set_timeslice(self, *, gpu_uuid: str, level: int) -> None:
        """Set the GPU's time-slice: 0 Default, 1 Short, 2 Medium, 3 Long."""
        self.run("nvidia-smi", ["compute-policy", "-i", gpu_uuid, "--set-timeslice", str(level)])

    def compute_mode(self, *, gpu_uuid: str) -> int:
        """The GPU's compute mode as NVML numbers it (0 Default, 2 Prohibited, 3 Exclusive_Process)."""
        out = self.run(
            "nvidia-smi", ["--query-gpu=compute_mode", "--format=csv,noheader", "-i", gpu_uuid]
        ).strip()
        if out not in COMPUTE_MODES:
            raise HardwareError(
                f"nvidia-smi reported compute mode {out!r} for {gpu_uuid}; expected one of "
                f"{', '.join(COMPUTE_MODES)}"
            )
        return COMPUTE_MODES[out]

    def set_compute_mode(self, *, gpu_uuid: str, mode: int) -> None:
        names = {value: name.upper() for name, value in COMPUTE_MODES.items()}
        self.run("nvidia-smi", ["-i", gpu_uuid, "-c", names[mode]])

    def start_mps_daemon(self, *, env: Mapping[str, str]) -> None:
        """`nvidia-cuda-mps-control -d` with `env` (pipe and log directories, visible devices): the
        daemon detaches into its own session, so it outlives the plugin process that started it."""
        self.run(MPS_CONTROL, ["-d"], env=env)

    def mps_control(self, commands: Sequence[str], *, pipe_dir: Path) -> str:
        """Send `commands` to the daemon listening in `pipe_dir`; its replies, one line each.
        HardwareError when no daemon listens there or a command is refused."""
        out = self.run(
            MPS_CONTROL,
            [],
            stdin="".join(f"{command}\n" for command in commands),
            env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)},
        )
        return out


def _first(env: Mapping[str, str], inherited: Mapping[str, str]) -> dict[str, str]:
    """`env` over `inherited`, with `env`'s variables first: /proc/<pid>/environ lists them in this
    order, and whoever finds a process by them (gpudra.node.sharing.mps_processes) reads only its head."""
    return {**env, **{name: value for name, value in inherited.items() if name not in env}}
