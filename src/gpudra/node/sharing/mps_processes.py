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
the directory a tenant can write, so a symlink or a socket of the tenant's own could answer instead (they
serve the other way round: a command is sent only to a socket whose listener carries the mark).

/proc is read in bounded passes (`survey`): one pass reads every process's environment once, at most
`ENVIRON_BYTES` of it (the plugin puts the mark first, see `gpudra.gpu.tools`), and answers for every
mark at once, so a check of many claims costs one pass, not one per claim. Any process may be anyone's
(with `hostPID`, every container's): its command name, its environment and whether it is still there when
its files are read are the tenant's, so a process that vanished, cannot be read or reads as nonsense is
skipped, never an error.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

TOKEN_VARIABLE: Final = "GPUDRA_MPS_DAEMON_TOKEN"
PIPE_VARIABLE: Final = "CUDA_MPS_PIPE_DIRECTORY"
PROC: Final = Path("/proc")
# The most of a process's environment read. The mark comes first in a daemon's (gpudra.gpu.tools puts
# the variables it sets before the inherited ones), so it is read whatever else it holds (a pod's service
# links can add hundreds of kilobytes); any other process's is cut there, at no loss.
ENVIRON_BYTES: Final = 64 * 1024
_STAT_BYTES: Final = 4096  # /proc/<pid>/stat: 52 numbers and a command name of at most 64 bytes


def new_token() -> str:
    return secrets.token_hex(16)


@dataclass(frozen=True)
class DaemonMark:
    """What the plugin puts in the environment of a claim's MPS daemon."""

    pipe: Path  # CUDA_MPS_PIPE_DIRECTORY
    token: str | None  # None: a record without one (see the module docstring)

    def env(self) -> dict[str, str]:
        return {PIPE_VARIABLE: str(self.pipe), **({TOKEN_VARIABLE: self.token} if self.token else {})}


@dataclass(frozen=True)
class PinnedProcess:
    pid: int
    start_time: int  # field 22 of /proc/<pid>/stat: clock ticks after boot
    parent: int


@dataclass(frozen=True)
class ProcSurvey:
    """The processes that have an MPS pipe directory in their environment, read in one pass over /proc."""

    # by the pipe directory they name: each process with the token it carries (None: none)
    by_pipe: Mapping[bytes, tuple[tuple[PinnedProcess, bytes | None], ...]] = field(default_factory=dict)
    proc: Path = PROC

    def find(self, mark: DaemonMark) -> list[PinnedProcess]:
        """Every process of the pass that carries `mark`, oldest first."""
        found = []
        token = None if mark.token is None else mark.token.encode()
        for process, carried in self.by_pipe.get(os.fsencode(mark.pipe), ()):
            if token is not None:
                if carried == token:
                    found.append(process)
            elif _same_mount_namespace(self.proc, process.pid):
                found.append(process)
        return sorted(found, key=lambda p: (p.start_time, p.pid))


def survey(proc: Path = PROC) -> ProcSurvey:
    """One pass over `proc`: every live process whose environment names a pipe directory."""
    by_pipe: dict[bytes, list[tuple[PinnedProcess, bytes | None]]] = {}
    pipe_prefix, token_prefix = os.fsencode(f"{PIPE_VARIABLE}="), os.fsencode(f"{TOKEN_VARIABLE}=")
    for pid in _pids(proc):
        environ = _read(proc / str(pid) / "environ", ENVIRON_BYTES)
        if environ is None or pipe_prefix not in environ:
            continue
        pipe = token = None
        for variable in environ.split(b"\0"):
            if variable.startswith(pipe_prefix) and pipe is None:
                pipe = variable[len(pipe_prefix) :]
            elif variable.startswith(token_prefix) and token is None:
                token = variable[len(token_prefix) :]
        process = _process(proc, pid) if pipe is not None else None
        if pipe is not None and process is not None:
            by_pipe.setdefault(pipe, []).append((process, token))
    return ProcSurvey({pipe: tuple(found) for pipe, found in by_pipe.items()}, proc)


def find(mark: DaemonMark, proc: Path = PROC) -> list[PinnedProcess]:
    """Every live process that carries `mark`, oldest first (a pass of its own)."""
    return survey(proc).find(mark)


def carries(mark: DaemonMark, pid: int, proc: Path = PROC) -> bool:
    """Whether process `pid` carries `mark` (False when it is gone or cannot be read)."""
    environ = _read(proc / str(pid) / "environ", ENVIRON_BYTES)
    if environ is None:
        return False
    variables = environ.split(b"\0")
    if os.fsencode(f"{PIPE_VARIABLE}={mark.pipe}") not in variables:
        return False
    if mark.token is not None:
        return os.fsencode(f"{TOKEN_VARIABLE}={mark.token}") in variables
    return _same_mount_namespace(proc, pid)


def daemon(processes: Sequence[PinnedProcess]) -> PinnedProcess | None:
    """The control daemon among a mark's processes: the oldest whose parent carries no mark."""
    marked = {p.pid for p in processes}
    return next((p for p in processes if p.parent not in marked), None)


def running(process: PinnedProcess, proc: Path = PROC) -> bool:
    """Whether `process` still runs: the same pid with the same start time, and not a zombie."""
    now = _process(proc, process.pid)
    return now is not None and now.start_time == process.start_time


def kill(processes: Iterable[PinnedProcess], signum: signal.Signals) -> None:
    """Send `signum` to each of `processes` that still runs (checked right before, by its start time)."""
    for process in processes:
        if running(process):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)


def _pids(proc: Path) -> list[int]:
    return [int(name) for name in os.listdir(proc) if name.isdigit()]


def _read(path: Path, limit: int) -> bytes | None:
    """At most `limit` bytes of a /proc file; None when it is gone or not ours to read."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(handle, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:  # the process ended between the open and the read
        return None
    finally:
        os.close(handle)


def _process(proc: Path, pid: int) -> PinnedProcess | None:
    raw = _read(proc / str(pid) / "stat", _STAT_BYTES)
    if raw is None:
        return None
    # The command name (field 2) is in parentheses and may hold anything, spaces, ")" and bytes that are
    # no UTF-8 included: the fields are those after its last ")".
    fields = raw.rsplit(b")", 1)[-1].split()
    try:
        state, parent, start_time = fields[0], int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None
    if state in (b"Z", b"X"):  # exited: only its parent's wait is missing
        return None
    return PinnedProcess(pid=pid, start_time=start_time, parent=parent)


def _same_mount_namespace(proc: Path, pid: int) -> bool:
    """Whether process `pid` shares this process's mount namespace (no container process does)."""
    try:
        return os.readlink(proc / str(pid) / "ns" / "mnt") == os.readlink(proc / "self" / "ns" / "mnt")
    except OSError:
        return False
