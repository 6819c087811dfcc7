"""Stand-ins for the NVIDIA driver's device nodes. I/O: creates character devices under the given directory.

A container runtime that applies a CDI spec stats every device node the spec does not fully specify
on the host, to learn its type, major and minor, and refuses to start the container when it is
missing. On a machine without NVIDIA hardware these stand-ins are what it finds: real character
devices with the numbers the driver gives them, so that they can be injected and a container sees
them with `ls -l /dev/nvidia*`. Opening one fails (no driver behind the major), as it should.

What a node with the driver loaded has, and the numbers (`nodes`; the dynamic majors are the ones the
simulator's /proc/devices gives, `gpudra.sim.procfs`):
- `nvidia<minor>` for every GPU of the machine, c 195:<minor>, and `nvidiactl`, c 195:255, all 0666;
- `nvidia-uvm` and `nvidia-uvm-tools`, c <nvidia-uvm major>:0 and :1, 0666;
- on a machine with a MIG-capable GPU, `nvidia-caps/nvidia-cap1` (MIG config, 0400) and
  `nvidia-cap2` (MIG monitor, 0444), c <nvidia-caps major>:1 and :2, as `nvidia-modprobe` makes them.

The capability nodes of GPU and compute instances (`nvidia-cap<N>` for the minors of `mig-minors`) are
not made: a real node need not have them either (NVIDIA's DRA driver and gpudra give them in the spec
with type, major and minor, so the runtime creates them in the container without looking on the host).

Creating a device node needs CAP_MKNOD; without it `write` raises a ConfigError naming `--dev-root`.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gpudra.errors import ConfigError
from gpudra.sim import machines, procfs
from gpudra.sim.scratch import scratch as scratch_path

NVIDIACTL_MINOR = 255


@dataclass(frozen=True)
class CharDevice:
    """A character device at `path` in the dev directory (`nvidia0`, `nvidia-caps/nvidia-cap1`)."""

    path: PurePosixPath
    major: int
    minor: int
    mode: int  # permission bits


def nodes(machine: machines.Machine) -> tuple[CharDevice, ...]:
    """The driver's device nodes on `machine`. Pure."""
    found = [
        CharDevice(PurePosixPath(f"nvidia{gpu.minor}"), procfs.NVIDIA_MAJOR, gpu.minor, 0o666)
        for gpu in machine.gpus
    ]
    found += [
        CharDevice(PurePosixPath("nvidiactl"), procfs.NVIDIA_MAJOR, NVIDIACTL_MINOR, 0o666),
        CharDevice(PurePosixPath("nvidia-uvm"), procfs.NVIDIA_UVM_MAJOR, 0, 0o666),
        CharDevice(PurePosixPath("nvidia-uvm-tools"), procfs.NVIDIA_UVM_MAJOR, 1, 0o666),
    ]
    if any(gpu.model.mig_capable for gpu in machine.gpus):
        found += [
            CharDevice(PurePosixPath("nvidia-caps/nvidia-cap1"), procfs.NVIDIA_CAPS_MAJOR, 1, 0o400),
            CharDevice(PurePosixPath("nvidia-caps/nvidia-cap2"), procfs.NVIDIA_CAPS_MAJOR, 2, 0o444),
        ]
    return tuple(found)


def write(machine: machines.Machine, directory: Path) -> tuple[Path, ...]:
    """Creates `machine`'s device nodes under `directory` (made if missing); returns their paths.

    A node already there with the right type and numbers is kept (its mode set); anything else at its
    path is replaced, by rename, so that processes writing the same nodes at once never see a gap.
    Nodes of GPUs the machine lacks (left from another profile) are left alone: no spec names them.
    """
    written = []
    for node in nodes(machine):
        path = directory.joinpath(node.path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _place(path, node)
        except OSError as err:
            raise _error(path, err) from err
        written.append(path)
    return tuple(written)


def _place(path: Path, node: CharDevice) -> None:
    device = os.makedev(node.major, node.minor)
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISCHR(found.st_mode) and found.st_rdev == device:
            if stat.S_IMODE(found.st_mode) != node.mode:
                os.chmod(path, node.mode)
            return
    scratch = scratch_path(path)
    scratch.unlink(missing_ok=True)
    os.mknod(scratch, stat.S_IFCHR | node.mode, device)
    try:
        os.chmod(scratch, node.mode)  # mknod's mode went through the umask
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise


def _error(path: Path, err: OSError) -> ConfigError:
    reason = err.strerror or str(err)
    if err.errno == errno.EPERM:
        hint = (
            "creating device nodes needs CAP_MKNOD: run the plugin as root in a privileged container, or "
            "leave --dev-root at / to create none"
        )
    else:
        hint = "the dev root must be a writable directory on a file system that allows device nodes"
    return ConfigError(
        f"cannot create the simulated device node {path}: {reason} ({hint})", field="--dev-root"
    )
