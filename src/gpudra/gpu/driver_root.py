"""The NVIDIA driver's user-space files under a driver root. I/O: the file system, the dynamic loader.

The kubelet plugin runs in a container whose libraries are not the driver's. libnvidia-ml.so.1,
nvidia-smi and nvidia-cuda-mps-control stay where the driver was installed: under `/` for a driver
installed on the host, under `/run/nvidia/driver` with the GPU Operator. The Helm chart mounts that
tree read-only in the container and names it with `--driver-root` (`/driver-root`); with the default
`/` nothing here is used: pynvml loads the library by its soname and the tools are found on PATH.

- NVML: `load_library` finds libnvidia-ml.so.1 in the root's library directories and loads it by its
  path before pynvml's first nvmlInit. pynvml then loads "libnvidia-ml.so.1" by name, and the dynamic
  loader answers a name with the object already loaded whose SONAME it is, so pynvml gets the root's
  library. The library's own dependencies (libc, libm, ...) come from the container, as with NVIDIA's
  driver. Pointing LD_LIBRARY_PATH at the root's library directory instead would pull the host's libc
  into the plugin's process.
- Tools: nvidia-smi and nvidia-cuda-mps-control are linked against the libc next to them, so they run as
  `chroot <root> <tool>` (the plugin's container is privileged); `find` looks for them in TOOL_DIRS.
  A path handed to a tool then means that path inside the root: `shared` says whether it is the same
  directory there. For MPS, whose pipe and log directories are in the plugin's state directory, that holds
  when the state directory is mounted at its host path both in the container and inside the root, as
  the Helm chart mounts it for any driver root (the GPU Operator's too); the plugin says at start
  whether it holds.
- Symlinks in the root are followed as they would be inside it (`resolve`): an absolute target such as
  /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15 is under the root, not in the container.
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Final

from gpudra.errors import NvmlUnavailable

NVML_LIBRARY: Final = "libnvidia-ml.so.1"
# Where distributions and the GPU Operator's driver containers put the driver's libraries, in the order
# NVIDIA's DRA driver searches them, then the plain lib directories some distributions use.
LIBRARY_DIRS: Final = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
    "lib",
)
TOOL_DIRS: Final = ("usr/bin", "usr/sbin", "bin", "sbin", "opt/bin")
_MAX_SYMLINKS: Final = 40  # the kernel's limit on links followed in one lookup (ELOOP)


def is_host(root: Path) -> bool:
    """Whether `root` is this container's own `/`: the driver is used as installed, nothing re-rooted."""
    return os.path.realpath(root) == "/"


def here(root: Path, inside: PurePosixPath) -> Path:
    """Where the absolute path `inside` of the root is in this container."""
    return root.joinpath(*inside.parts[1:])


def resolve(root: Path, inside: PurePosixPath) -> PurePosixPath | None:
    """The absolute path `inside` the root with its symlinks followed as they would be there: absolute
    targets start again at the root, and `..` stops at it. None when a component does not exist."""
    left = list(reversed(inside.parts[1:]))  # components still to walk, the next one last
    done = PurePosixPath("/")  # symlink-free
    links = 0
    while left:
        part = left.pop()
        if part == "..":
            done = done.parent  # the parent of "/" is "/"
            continue
        try:
            if not stat.S_ISLNK(os.lstat(here(root, done / part)).st_mode):
                done = done / part
                continue
            target = PurePosixPath(os.readlink(here(root, done / part)))
        except OSError:
            return None
        links += 1
        if links > _MAX_SYMLINKS:
            return None
        if target.is_absolute():
            done = PurePosixPath("/")
            left.extend(reversed(target.parts[1:]))
        else:
            left.extend(reversed(target.parts))
    return done


def find(root: Path, name: str, dirs: Sequence[str]) -> PurePosixPath | None:
    """The first `<dir>/<name>` that is a regular file in the root, resolved inside the root."""
    for directory in dirs:
        found = resolve(root, PurePosixPath("/", directory, name))
        if found is not None and here(root, found).is_file():
            return found
    return None


def searched(root: Path, dirs: Sequence[str]) -> str:
    """The directories `find` looks in, as this container names them (for error messages)."""
    return ", ".join(str(here(root, PurePosixPath("/", d))) for d in dirs)


def load_library(root: Path, soname: str = NVML_LIBRARY) -> Path:
    """Load the root's library `soname` into this process, so that loading it by that name later (as
    pynvml does) gets this one. The path loaded; NvmlUnavailable when the root has no such library."""
    found = find(root, soname, LIBRARY_DIRS)
    if found is None:
        raise NvmlUnavailable(
            f"{soname} not found under the driver root {root} (--driver-root); searched "
            f"{searched(root, LIBRARY_DIRS)}"
        )
    path = here(root, found)
    try:
        ctypes.CDLL(str(path), mode=os.RTLD_GLOBAL)
    except OSError as err:
        raise NvmlUnavailable(
            f"cannot load {path} from the driver root {root} (--driver-root): {err}"
        ) from err
    try:  # a later load by name matches the loaded object's SONAME, not its file name
        ctypes.CDLL(soname, mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
    except OSError as err:
        raise NvmlUnavailable(
            f"{path} from the driver root {root} (--driver-root) does not have the SONAME {soname}"
        ) from err
    return path


def shared(root: Path, path: Path) -> bool:
    """Whether a tool run in the root finds the directory `path` there: the same directory, writable."""
    if not path.is_absolute():
        return False
    inside = resolve(root, PurePosixPath(path))
    if inside is None:
        return False
    there = here(root, inside)
    try:
        return os.path.samefile(path, there) and os.access(there, os.W_OK)
    except OSError:
        return False
