"""A claim's MPS processes, found in /proc by what the plugin alone set. I/O: /proc, signals.

Nothing in the daemon's pipe directory can say which process the daemon is: the claim's containers
mount that directory read-write, so its pid file holds whatever a tenant wrote there (a FIFO that blocks
its reader, the pid of another tenant's daemon, nothing at all). What does say it is the daemon's
environment, which the plugin sets when it starts the daemon and which nobody can change afterwards
(`/proc/<pid>/environ` is what the process was started with):

- `TOKEN_VARIABLE`, a random 128-bit token, recorded in the claim's checkpoint record before the daemon
  is started, so that a crash anywhere in the start is settled by finding the token. No tenant can read
  it (the checkpoint is the plugin's, mode 0600; the plugin's processes and their environment are not
  visible to an unprivileged container), so no tenant process can carry it, whichever processes the
  plugin sees (with `hostPID`, every container's). It works in whatever container or namespace the
  daemon runs, so a daemon that outlives the plugin's container (issue 32) is found the same way.
- A record without a token (written by a gpudra before tokens, or rebuilt from a CDI spec after the
  checkpoint was damaged): `CUDA_MPS_PIPE_DIRECTORY` naming the claim's pipe directory, in a process of
  the plugin's own mount namespace, which no container process shares.

The control daemon hands its environment on to the MPS servers it starts, so the mark finds them too:
the daemon is the marked process whose parent is not marked. Once found, a process is pinned by pid and
start time (field 22 of /proc/<pid>/stat, clock ticks since boot): a pid the kernel hands out again later
never matches. Why not the peer credentials of the control socket (SO_PEERCRED): the socket's path is in
the directory a tenant can write, so a symlink or a socket of the tenant's own could answer instead.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

TOKEN_VARIABLE: Final = "GPUDRA_MPS_DAEMON_TOKEN"
PIPE_VARIABLE: Final = "CUDA_MPS_PIPE_DIRECTORY"
_PROC: Final = Path("/proc")


def new_token() -> str:
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Mark:
    """What the plugin puts in the environment of a claim's MPS daemon."""

    pipe: Path  # CUDA_MPS_PIPE_DIRECTORY
    token: str | None  # None: a record without one (see the module docstring)

    def env(self) -> dict[str, str]:
        return {PIPE_VARIABLE: str(self.pipe), **({TOKEN_VARIABLE: self.token} if self.token else {})}

    def carried_by(self, pid: int, environ: Sequence[bytes]) -> bool:
        """Whether process `pid`, whose environment is `environ`, carries the mark."""
        if os.fsencode(f"{PIPE_VARIABLE}={self.pipe}") not in environ:
            return False
        if self.token is not None:
            return os.fsencode(f"{TOKEN_VARIABLE}={self.token}") in environ
        namespace = _mount_namespace(str(pid))
        return namespace is not None and namespace == _mount_namespace("self")


@dataclass(frozen=True)
class Process:
    pid: int
    start_time: int  # field 22 of /proc/<pid>/stat: clock ticks after boot
    parent: int


def find(mark: Mark) -> list[Process]:
    """Every live process that carries `mark`, oldest first."""
    found = []
    for pid in _pids():
        try:
            environ = (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        if not mark.carried_by(pid, environ):
            continue
        process = _process(pid)
        if process is not None:
            found.append(process)
    return sorted(found, key=lambda p: (p.start_time, p.pid))


def daemon(processes: Sequence[Process]) -> Process | None:
    """The control daemon among a mark's processes: the oldest whose parent carries no mark."""
    marked = {p.pid for p in processes}
    return next((p for p in processes if p.parent not in marked), None)


def running(process: Process) -> bool:
    """Whether `process` still runs: the same pid with the same start time, and not a zombie."""
    now = _process(process.pid)
    return now is not None and now.start_time == process.start_time


def kill(processes: Iterable[Process], signum: signal.Signals) -> None:
    """Send `signum` to each of `processes` that still runs (checked right before, by its start time)."""
    for process in processes:
        if running(process):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir(_PROC) if name.isdigit()]


def _process(pid: int) -> Process | None:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold anything, spaces and ")" included.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        state, parent, start_time = fields[0], int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None
    if state in ("Z", "X"):  # exited: only its parent's wait is missing
        return None
    return Process(pid=pid, start_time=start_time, parent=parent)


def _mount_namespace(pid: str) -> str | None:
    try:
        return os.readlink(_PROC / pid / "ns" / "mnt")
    except OSError:
        return None
