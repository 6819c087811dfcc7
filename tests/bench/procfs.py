"""What /proc says about a plugin process and the machine. I/O: /proc files."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident memory (VmRSS) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass(frozen=True)
class CpuTimes:
    """Seconds of CPU: the process's own (utime + stime), and its reaped children's (cutime + cstime),
    which for gpudra are the GPU tools it runs (nvidia-smi, nvidia-cuda-mps-control)."""

    own: float
    children: float

    def __sub__(self, earlier: CpuTimes) -> CpuTimes:
        return CpuTimes(self.own - earlier.own, self.children - earlier.children)


def cpu_times(pid: int) -> CpuTimes:
    # Fields after the command name, which is in parentheses and may itself contain spaces.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return CpuTimes(own=(utime + stime) / _TICKS, children=(cutime + cstime) / _TICKS)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg has them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine() -> str:
    """CPU model and count, memory, kernel: what the figures depend on."""
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.machine(),
    )
    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    return (
        f"{os.cpu_count()} CPUs ({model}), {mem_kib / 1024**2:.0f} GiB memory, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )
