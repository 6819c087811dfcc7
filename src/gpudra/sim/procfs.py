"""The NVIDIA driver's entries in a fake /proc tree, and processes in it. I/O: writes under the given root.

Two files, laid out as the driver writes them, so the code that reads the real /proc reads this tree
unchanged:
- `devices`: the character-device majors; `nvidia-caps` gets its major when the driver loads (238, 241
  and 508 occur on real machines), which is why gpudra reads it rather than assuming one. The names
  as the driver registers them, `nvidia-caps-imex-channels` beside `nvidia-caps` included.
- `driver/nvidia-caps/mig-minors`: the minors of /dev/nvidia-caps/nvidia-cap<N>. `config 1` and
  `monitor 2`, then for every possible GPU minor (0..31) and GPU-instance ID (0..14) one minor for the
  GPU instance followed by one for each of its compute-instance IDs (0..7): nine per GPU instance,
  from 3 on, whether or not such an instance or GPU exists.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpudra.sim.scratch import scratch as scratch_path

NVIDIA_MAJOR = 195
NVIDIA_CAPS_MAJOR = 508
NVIDIA_UVM_MAJOR = 507
GPU_MINORS = 32
GPU_INSTANCES = 15  # GI IDs 0..14
COMPUTE_INSTANCES = 8  # CI IDs 0..7
_FIRST_INSTANCE_MINOR = 3


def gi_minor(*, gpu_minor: int, gpu_instance_id: int) -> int:
    """The capability minor of GPU instance `gpu_instance_id` on GPU `gpu_minor`."""
    return _FIRST_INSTANCE_MINOR + (gpu_minor * GPU_INSTANCES + gpu_instance_id) * (1 + COMPUTE_INSTANCES)


def ci_minor(*, gpu_minor: int, gpu_instance_id: int, compute_instance_id: int) -> int:
    return gi_minor(gpu_minor=gpu_minor, gpu_instance_id=gpu_instance_id) + 1 + compute_instance_id


def devices() -> str:
    lines = [
        "Character devices:",
        "  1 mem",
        "  4 /dev/vc/0",
        "  4 tty",
        "  5 /dev/tty",
        "  5 /dev/console",
        "  5 /dev/ptmx",
        " 10 misc",
        " 13 input",
        f"{NVIDIA_MAJOR} nvidia",
        f"{NVIDIA_MAJOR} nvidiactl",
        f"{NVIDIA_UVM_MAJOR} nvidia-uvm",
        f"{NVIDIA_CAPS_MAJOR} nvidia-caps",
        f"{NVIDIA_CAPS_MAJOR + 1} nvidia-caps-imex-channels",
        "",
        "Block devices:",
        "  7 loop",
        "  8 sd",
        "259 blkext",
    ]
    return "\n".join(lines) + "\n"


def mig_minors() -> str:
    lines = ["config 1", "monitor 2"]
    for gpu in range(GPU_MINORS):
        for gi in range(GPU_INSTANCES):
            lines.append(f"gpu{gpu}/gi{gi}/access {gi_minor(gpu_minor=gpu, gpu_instance_id=gi)}")
            lines.extend(
                f"gpu{gpu}/gi{gi}/ci{ci}/access "
                f"{ci_minor(gpu_minor=gpu, gpu_instance_id=gi, compute_instance_id=ci)}"
                for ci in range(COMPUTE_INSTANCES)
            )
    return "\n".join(lines) + "\n"


def write(root: Path) -> None:
    """Writes the files under `root` (the same for every machine, as the driver's are)."""
    _replace(root / "devices", devices())
    _replace(root / "driver" / "nvidia-caps" / "mig-minors", mig_minors())


def _replace(path: Path, text: str) -> None:
    # Replaced by rename: see gpudra.sim.scratch.
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.read_text() == text:
            return
    except FileNotFoundError:
        pass
    scratch = scratch_path(path)
    scratch.write_text(text)
    os.replace(scratch, path)


def write_process(
    root: Path,
    pid: int,
    *,
    environ: bytes,
    comm: bytes = b"sleep",
    state: str = "S",
    parent: int = 1,
    start_time: int = 1000,
) -> None:
    """A process's `environ` and `stat` under `root`, as the kernel lays them out: `environ` is
    NUL-separated bytes; the command name `comm`, in parentheses, may hold any bytes (a process names
    itself), `start_time` is field 22 in clock ticks after boot."""
    directory = root / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "environ").write_bytes(environ)
    fields = [state, str(parent), str(pid), str(pid), "0", "-1", "4194560", *["0"] * 12, str(start_time)]
    fields += ["0"] * (52 - 2 - len(fields))
    (directory / "stat").write_bytes(b"%d (%s) %s\n" % (pid, comm, " ".join(fields).encode()))
