"""MPS control daemons, one per claim. I/O: directories under the plugin's state dir, GPU tools, /proc.

A claim whose devices run under MPS gets one control daemon, in `<state dir>/mps/<daemon id>/` (the id
is 12 hex digits of the claim UID's SHA-256: unix socket paths are limited to 107 bytes, and a UUID
would take 36 of them):

    pipe/   CUDA_MPS_PIPE_DIRECTORY: the daemon's control socket and pid file; containers mount it
    log/    CUDA_MPS_LOG_DIRECTORY: control.log and server.log
    shm/    mounted as the containers' /dev/shm: MPS clients and their server share memory through it
    tool/   mode 0700, mounted nowhere: the pipe directory the control tool is given to send a command

The daemon is started with `nvidia-cuda-mps-control -d`, which detaches it into its own session, so the
end of the process that started it (a SIGKILL included) leaves it and its clients running; the end of
that process's container does not (its cgroup's processes are killed with it), which is why the chart
runs this code in `gpudra mps-host` (gpudra.node.mps_host), not in the plugin's container.

Nothing in `pipe/` is trusted: the claim's containers can write there (replace the pid file by a FIFO,
write another daemon's pid into it, delete it, put a symlink where the control socket was). The daemon
is found by the mark the plugin put in its environment, which the checkpoint records before the daemon
exists (`mps_processes`), and pinned by pid and start time. `start` is a no-op for a daemon that runs
(it is adopted: only its limits are set again); `stop` asks it to quit and kills it (and its servers)
by the mark if it does not, then removes the directory. Both are idempotent, so a crash between any two
steps is settled by calling again. The pipe directory is only looked at, never blocking: an entry is
opened only as a regular file (no FIFO, device or symlink is ever opened), a bounded number of bytes
read; a command is sent only when its control entry is a socket (a symlink could lead to another
claim's daemon) on which a process carrying the claim's mark listens (a socket a tenant bound there
could answer anything, or never: the listener is read from a connection made through an O_PATH and
O_NOFOLLOW descriptor of the entry, without waiting, SO_PEERCRED). What a tenant changed there is
reported (`Tampering`) and otherwise ignored.

Why commands go through `tool/`, not `pipe/`: `nvidia-cuda-mps-control` finds the daemon by the path
`$CUDA_MPS_PIPE_DIRECTORY/control` when it runs, a moment after the check, and in between a tenant can
put a socket of its own there, or rename the daemon's away and back (issue 29). So the very inode that
was checked (the descriptor's) is hard-linked into `tool/` (linkat of /proc/self/fd/N, which links what
the descriptor refers to; the link's device and inode are compared with the descriptor's), and the tool
is run with `tool/` as its pipe directory: what a tenant does to `pipe/` afterwards reaches nothing the
tool uses. `control_privileged`, which the tool may use when run as root, is linked too where it is a
socket, checked like `control`; anything else under that name is not linked. The links are removed
once the tool returned; a process killed before that leaves them, and the next command of that daemon
(commands of one daemon take turns) or its `stop` removes them. Whether the real tool needs more than
these sockets is not yet seen on a GPU (`tests/gpu/test_real_mps.py` checks it): if it says it cannot
find the daemon from `tool/` although the daemon was just seen listening there, the command is sent
through `pipe/` after the same check, as before, which leaves the race open on that driver; that is
logged once per process and counted (`on_shared_pipe`: the plugin's
`gpudra_mps_shared_pipe_commands_total`), so that it is seen and MPS keeps working.

`stop` removes the claim's directory by renaming it into the trash (`trash.Trash`), which a thread of its
own empties outside the node lock: a pipe directory a tenant filled with millions of files costs the
unprepare one rename.

Why the pipe directory is mounted read-write, not read-only: MPS documents it as the directory of "named
pipes and UNIX domain sockets" the daemon, its servers and the clients communicate through, and does not
say that clients create nothing there; a client connecting to an existing socket or FIFO needs no write
access to the mount (the kernel refuses writes on a read-only mount only to regular files, directories
and symlinks), but a client that makes a lock file or a socket of its own there would fail on a
read-only one, on real GPUs only. Until a real MPS client is seen to run under a read-only mount
(`tests/gpu/test_real_mps.py::test_whether_a_client_needs_to_write_in_the_pipe_directory`), the
directory stays writable and everything above holds whatever a tenant writes.

Limits are set as the daemon's defaults before any client can connect (the CDI spec that lets a container
reach the pipe is written only after `start` returns), and read back as the readiness check.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, get_args

from gpudra.errors import HardwareError
from gpudra.gpu.tools import MPS_CONTROL, MPS_NO_DAEMON, GpuTools
from gpudra.node import faults
from gpudra.node.sharing import mps_processes
from gpudra.node.sharing.mps_processes import DaemonMark, PinnedProcess, ProcSurvey
from gpudra.node.sharing.trash import Trash

log = logging.getLogger(__name__)

PID_FILE: Final = "nvidia-cuda-mps-control.pid"
CONTROL: Final = "control"  # the daemon's control socket in its pipe directory
CONTROL_PRIVILEGED: Final = "control_privileged"  # another socket of the daemon's (gpu-mechanics.md §3)
_TOOL_SOCKETS: Final = (CONTROL, CONTROL_PRIVILEGED)  # what `tool/` may hold
CONTAINER_PIPE_DIR: Final = "/tmp/nvidia-mps"  # CUDA_MPS_PIPE_DIRECTORY inside containers
MIB: Final = 2**20
# A unix socket path holds at most 107 bytes; MPS puts several sockets in the pipe directory.
_MAX_SOCKET_PATH: Final = 107
_LONGEST_SOCKET: Final = CONTROL_PRIVILEGED
_STOP_TIMEOUT_S: Final = 10.0
_KILL_TIMEOUT_S: Final = 5.0
_READY_TIMEOUT_S: Final = 10.0
_PID_FILE_BYTES: Final = 32  # a pid and a newline, with room to spare; more is not a pid file
# A pass over /proc answers `running` for this long: a round of checks over many claims costs one pass.
_SURVEY_REUSE_S: Final = 1.0
_UCRED: Final = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid
# What a daemon makes in its pipe directory (gpu-mechanics reference: `control`, `control_lock`,
# `control_privileged`, `log`, the pid file): removed before any other entry when a daemon restarts.
_MPS_NAMES: Final = (CONTROL, "control_lock", CONTROL_PRIVILEGED, "log", PID_FILE)
# Entries a daemon's restart removes from its pipe directory beyond those, under the node lock.
_RESTART_CLEAR_BUDGET: Final = 10_000

TamperingKind = Literal["pid-file-removed", "pid-file-replaced", "pid-file-foreign", "control-replaced"]
TAMPERING_KINDS: Final[tuple[TamperingKind, ...]] = get_args(TamperingKind)


def pipe_dir(root: Path) -> Path:
    return root / "pipe"


def tool_dir(root: Path) -> Path:
    """The pipe directory the control tool is given: links to the daemon's checked sockets. Its name is
    no longer than `pipe`'s, so the socket path limit `daemon_root` checks holds for both."""
    return root / "tool"


def trash_dir(mps_root: Path) -> Path:
    """Where stopped daemons' directories go to be removed (`trash.Trash`): beside the MPS root, in the
    same state directory (one filesystem, so a move is a rename), and not in it (nothing that lists
    daemon directories sees it)."""
    return mps_root.parent / "mps-trash"


def log_dir(root: Path) -> Path:
    return root / "log"


def shm_dir(root: Path) -> Path:
    return root / "shm"


def daemon_root(state_root: Path, claim_uid: str) -> Path:
    """The claim's daemon directory; HardwareError when its sockets' paths would be too long."""
    root = state_root / hashlib.sha256(claim_uid.encode()).hexdigest()[:12]
    longest = max((d / _LONGEST_SOCKET for d in (pipe_dir(root), tool_dir(root))), key=lambda p: len(str(p)))
    if len(os.fsencode(longest)) > _MAX_SOCKET_PATH:
        raise HardwareError(
            f"the MPS pipe directory {pipe_dir(root)} is too long for unix sockets ({len(str(longest))} "
            f"bytes with {_LONGEST_SOCKET}, at most {_MAX_SOCKET_PATH}): use a shorter --state-dir"
        )
    return root


def memory_limit(limit: int) -> str:
    """A limit in bytes as MPS takes it: whole MiB with suffix M (rounded down)."""
    return f"{limit // MIB}M"


@dataclass(frozen=True)
class Daemon:
    """A claim's control daemon as its checkpoint records name it."""

    root: Path  # <state dir>/mps/<daemon id>
    token: str | None  # the mark in its environment; None for a record without one

    @property
    def mark(self) -> DaemonMark:
        return DaemonMark(pipe=pipe_dir(self.root), token=self.token)


@dataclass(frozen=True)
class Tampering:
    """Something in a claim's pipe directory that its daemon did not put there."""

    kind: TamperingKind
    root: Path  # the claim's MPS directory
    detail: str  # what was found, and what gpudra did instead of trusting it


class MpsTampered(HardwareError):
    """A command for the daemon was not sent: its control socket is not the daemon's."""


class MpsDaemons:
    def __init__(
        self,
        tools: GpuTools,
        *,
        trash: Trash,
        on_tampering: Callable[[Tampering], None] | None = None,
        on_shared_pipe: Callable[[Path], None] | None = None,
        proc: Path = mps_processes.PROC,
    ) -> None:
        """`trash` takes stopped daemons' directories (see `trash_dir`); `on_shared_pipe` hears of each
        command sent through a claim's shared pipe directory (see the module docstring), with its daemon
        directory."""
        self.tools = tools
        self.trash = trash
        self.proc = proc  # the simulator's fake /proc in tests of many processes
        self.on_tampering = on_tampering
        self.on_shared_pipe = on_shared_pipe
        self._lock = threading.Lock()  # the keeper's thread checks while calls start and stop
        # One command at a time per daemon: a command clears the daemon's `tool/` before it links there.
        self._commanding: dict[Path, threading.Lock] = {}
        self._shared_pipe_logged = False
        self._pinned: dict[Daemon, PinnedProcess] = {}
        self._reported: set[tuple[Path, TamperingKind]] = set()  # until the daemon is stopped
        self._survey: tuple[float, ProcSurvey] | None = None  # the last pass over /proc, and when it began

    def running(self, daemon: Daemon) -> PinnedProcess | None:
        """The claim's control daemon if it runs: the pinned process, else found again by its mark in a
        pass over /proc at most `_SURVEY_REUSE_S` old (one pass serves a round over every claim; `start`
        looks afresh). Nothing in the pipe directory is read."""
        return self._running(daemon, reuse=True)

    def _running(self, daemon: Daemon, *, reuse: bool) -> PinnedProcess | None:
        with self._lock:
            pinned = self._pinned.get(daemon)
        if pinned is not None and mps_processes.running(pinned, self.proc):
            return pinned
        found = mps_processes.daemon(self._pass(reuse=reuse).find(daemon.mark))
        if found is not None and not mps_processes.running(found, self.proc):  # it ended since the pass
            found = None
        with self._lock:
            if found is None:
                self._pinned.pop(daemon, None)
            else:
                self._pinned[daemon] = found
        return found

    def _pass(self, *, reuse: bool) -> ProcSurvey:
        began = time.monotonic()
        with self._lock:
            last = self._survey
        if reuse and last is not None and began - last[0] < _SURVEY_REUSE_S:
            return last[1]
        survey = mps_processes.survey(self.proc)
        with self._lock:
            self._survey = (began, survey)
        return survey

    def start(
        self,
        daemon: Daemon,
        *,
        visible: Sequence[str],
        active_thread_percentage: int | None,
        pinned_memory_limits: Mapping[str, int],
    ) -> None:
        """Start (or adopt) the claim's daemon for the devices `visible` (UUIDs) with these limits."""
        root = daemon.root
        for directory in (pipe_dir(root), log_dir(root)):
            directory.mkdir(parents=True, exist_ok=True)
        shm_dir(root).mkdir(exist_ok=True)
        # Containers may run as any user: like /dev/shm, everyone may create files, only owners delete.
        os.chmod(shm_dir(root), 0o1777)
        faults.reached("prepare-mps-directories")
        started = self._running(daemon, reuse=False) is None
        if started:
            # What a daemon that died left there, or a container put there (a socket of its own where
            # the control socket goes would make the new daemon refuse to start, "already running").
            # This runs under the node lock, and a restarted daemon's directory is still its containers'
            # mount (it cannot go to the trash): a bounded clear, so that a tenant's millions of files
            # cost the node a bounded time. What is left is the tenant's own files in its own
            # directory; the claim's unprepare moves the whole directory to the trash.
            left = _clear(pipe_dir(root), budget=_RESTART_CLEAR_BUDGET)
            if left:
                log.warning(
                    "the MPS pipe directory holds more than a restart clears; the rest stays until unprepare",
                    extra={"pipe": str(pipe_dir(root)), "cleared": _RESTART_CLEAR_BUDGET},
                )
            self.tools.start_mps_daemon(
                env={
                    **daemon.mark.env(),
                    "CUDA_MPS_LOG_DIRECTORY": str(log_dir(root)),
                    "CUDA_VISIBLE_DEVICES": ",".join(visible),
                }
            )
            if self._running(daemon, reuse=False) is None:
                raise HardwareError(
                    f"{MPS_CONTROL} -d returned, but no MPS control daemon for {pipe_dir(root)} runs"
                )
        faults.reached("prepare-mps-started")
        commands = [
            *(
                [f"set_default_active_thread_percentage {active_thread_percentage}"]
                if active_thread_percentage is not None
                else []
            ),
            *(
                f"set_default_device_pinned_mem_limit {uuid} {memory_limit(limit)}"
                for uuid, limit in sorted(pinned_memory_limits.items())
            ),
        ]
        try:
            self._send_until_ready(daemon, commands)
            self._check_limits(daemon, active_thread_percentage)
        except HardwareError:
            if started:  # a daemon without its limits must not serve (the keeper tries again)
                self._end(daemon)
            raise

    def _send_until_ready(self, daemon: Daemon, commands: Sequence[str]) -> None:
        # The daemon may still be opening its socket when `-d` returns: retry until it answers.
        pipe = pipe_dir(daemon.root)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            try:
                replies = self._command(daemon, [*commands, "get_server_list"])
                break
            except MpsTampered:
                raise
            except HardwareError as err:
                if time.monotonic() > deadline:
                    raise HardwareError(
                        f"the MPS control daemon in {pipe} did not answer within {_READY_TIMEOUT_S:g}s: {err}"
                    ) from err
                time.sleep(0.05)
        refused = [line for line in replies.splitlines() if line.strip() and not _is_value(line)]
        if refused:
            raise HardwareError(f"the MPS control daemon in {pipe} refused a limit: {'; '.join(refused)}")

    def _check_limits(self, daemon: Daemon, active_thread_percentage: int | None) -> None:
        if active_thread_percentage is None:
            return
        reply = self._command(daemon, ["get_default_active_thread_percentage"]).strip()
        try:
            matches = float(reply) == float(active_thread_percentage)
        except ValueError:
            matches = False
        if not matches:
            raise HardwareError(
                f"the MPS control daemon in {pipe_dir(daemon.root)} reports an active thread percentage "
                f"of {reply!r}, not the {active_thread_percentage} it was given"
            )

    def _command(self, daemon: Daemon, commands: Sequence[str]) -> str:
        """Send `commands` to the claim's daemon, if its control entry is a socket on which a process with
        the claim's mark listens: a symlink there (or anything else) is not followed, since it could
        lead to another claim's daemon, and a tenant's own socket is sent nothing, since it could answer
        anything or never. The tool reaches the checked socket through `tool/` (module docstring)."""
        with self._lock:
            turn = self._commanding.setdefault(daemon.root, threading.Lock())
        with turn:
            tool = tool_dir(daemon.root)
            _make_tool_dir(tool)
            try:
                _clear(tool)  # what a process killed between its link and its unlink left
                self._link_checked(daemon, tool)
                faults.reached("mps-control-linked")
                try:
                    return self.tools.mps_control(commands, pipe_dir=tool)
                except HardwareError as err:
                    if MPS_NO_DAEMON not in str(err):
                        raise
                    unreached = err
            finally:
                with contextlib.suppress(FileNotFoundError):  # stopped meanwhile: trashed with its root
                    _clear(tool)
            return self._command_through_pipe(daemon, commands, unreached)

    def _command_through_pipe(self, daemon: Daemon, commands: Sequence[str], unreached: HardwareError) -> str:
        """The tool found no daemon from `tool/` although it listened on the socket linked there: this
        driver's tool needs more of the pipe directory than its sockets. Send through `pipe/` after the
        same check, leaving the race between the check and the tool's connect open; said once per
        process, counted every time."""
        pipe = pipe_dir(daemon.root)
        handle = _open_entry(pipe / CONTROL)
        try:
            self._check(daemon, pipe / CONTROL, handle)
        finally:
            os.close(handle)
        if not self._shared_pipe_logged:
            self._shared_pipe_logged = True
            log.warning(
                "the MPS control tool did not reach the daemon through gpudra's private links to its checked "
                "sockets; commands go through the claims' shared pipe directories, where a tenant can swap "
                "the control socket between gpudra's check and the tool's connect (logged once)",
                extra={"pipe": str(pipe), "error": str(unreached)},
            )
        if self.on_shared_pipe is not None:
            self.on_shared_pipe(daemon.root)
        return self.tools.mps_control(commands, pipe_dir=pipe)

    def _link_checked(self, daemon: Daemon, tool: Path) -> None:
        """Hard-link into `tool` the daemon's `control` socket and, where it is a socket, its
        `control_privileged`, each once checked through a descriptor of that very entry: the link is to
        the descriptor's inode, whatever the entry's name leads to by now."""
        pipe = pipe_dir(daemon.root)
        for name in _TOOL_SOCKETS:
            try:
                handle = _open_entry(pipe / name)
            except HardwareError:
                if name == CONTROL:
                    raise
                continue
            try:
                # Another entry under the other name is not the daemon's (a tenant's FIFO, file,
                # symlink): not linked, so the tool in `tool/` cannot be led by it.
                if name == CONTROL or stat.S_ISSOCK(os.fstat(handle).st_mode):
                    self._check(daemon, pipe / name, handle)
                    _link(handle, tool / name)
            finally:
                os.close(handle)

    def _check(self, daemon: Daemon, path: Path, handle: int) -> None:
        """That `handle` (an O_PATH descriptor of `path`) is a socket on which a process with the claim's
        mark listens; MpsTampered (reported) when it is something else or another process's socket,
        HardwareError when nothing listens there (yet)."""
        kind = stat.S_IFMT(os.fstat(handle).st_mode)
        what = _describe(kind)
        if kind == stat.S_IFSOCK:
            listener = _listener(path, handle)
            if listener is not None and mps_processes.carries(daemon.mark, listener):
                return
            what = f"a socket of pid {listener}" if listener else "a socket of a process not visible here"
        found = Tampering(
            "control-replaced",
            daemon.root,
            f"{path} is {what}, not the daemon's control socket; gpudra sent it nothing",
        )
        self._report([found])
        raise MpsTampered(found.detail)

    def stop(self, daemon: Daemon) -> None:
        """Stop the claim's daemon and its servers (whichever run) and remove its directory. Idempotent.

        The daemon is asked to quit (through its control socket, else SIGTERM); whatever carries its
        mark after that is killed. What a tenant changed in the pipe directory is reported first."""
        self._end(daemon)
        faults.reached("unprepare-mps-stopped")
        with self._lock:
            self._pinned.pop(daemon, None)
            self._reported = {seen for seen in self._reported if seen[0] != daemon.root}
            self._commanding.pop(daemon.root, None)
        # A rename under the node lock, whatever a tenant filled the pipe directory with; the trash's
        # thread removes it (module docstring).
        self.trash.put(daemon.root)
        faults.reached("unprepare-mps-trashed")
        self.trash.empty_later()
        if daemon.root.exists():
            raise HardwareError(f"cannot remove the MPS directory {daemon.root}")

    def _end(self, daemon: Daemon) -> None:
        """End the daemon's processes, found by its mark."""
        main = mps_processes.daemon(mps_processes.find(daemon.mark))
        if main is not None:
            self._report(_inspect(daemon, main))
            if not self._quit(daemon):
                mps_processes.kill([main], signal.SIGTERM)
            _wait_gone([main], _STOP_TIMEOUT_S)  # `quit` ends its servers first
        left = mps_processes.find(daemon.mark)
        if left:
            log.warning(
                "MPS daemon did not quit; killing its processes",
                extra={"pipe": str(pipe_dir(daemon.root)), "pids": [p.pid for p in left]},
            )
            mps_processes.kill(left, signal.SIGKILL)
            _wait_gone(left, _KILL_TIMEOUT_S)

    def _quit(self, daemon: Daemon) -> bool:
        """Ask the daemon to quit; whether the command went through."""
        try:
            self._command(daemon, ["quit"])
        except HardwareError as err:
            log.warning(
                "MPS daemon did not take quit", extra={"pipe": str(pipe_dir(daemon.root)), "error": str(err)}
            )
            return False
        return True

    def _report(self, found: Iterable[Tampering]) -> None:
        """Each finding once per daemon (until it is stopped)."""
        for tampering in found:
            with self._lock:
                key = (tampering.root, tampering.kind)
                if key in self._reported:
                    continue
                self._reported.add(key)
            log.warning(
                "MPS pipe directory tampered with",
                extra={"kind": tampering.kind, "directory": str(tampering.root), "detail": tampering.detail},
            )
            if self.on_tampering is not None:
                self.on_tampering(tampering)


def _inspect(daemon: Daemon, process: PinnedProcess) -> list[Tampering]:
    """What a tenant changed in the pipe directory of `daemon`, which runs as `process`."""
    pipe = pipe_dir(daemon.root)
    found = []
    pid_file = pipe / PID_FILE
    ignored = f"gpudra ignored it and stopped the daemon it started, pid {process.pid}"
    try:
        content = _read_regular(pid_file, _PID_FILE_BYTES + 1)
    except FileNotFoundError:
        found.append(Tampering("pid-file-removed", daemon.root, f"{pid_file} was removed; {ignored}"))
    except _NotRegular as err:
        found.append(Tampering("pid-file-replaced", daemon.root, f"{pid_file} is {err}; {ignored}"))
    except OSError as err:
        found.append(Tampering("pid-file-replaced", daemon.root, f"{pid_file}: {err.strerror}; {ignored}"))
    else:
        if content.strip() != str(process.pid).encode():
            shown = content[:_PID_FILE_BYTES].decode(errors="replace").strip()
            detail = f"{pid_file} names {shown!r}, not the daemon; {ignored}"
            found.append(Tampering("pid-file-foreign", daemon.root, detail))
    kind = _file_type(pipe / CONTROL)
    if kind != stat.S_IFSOCK:
        what = "missing" if kind is None else _describe(kind)
        found.append(
            Tampering(
                "control-replaced",
                daemon.root,
                f"{pipe / CONTROL} is {what}, not the daemon's control socket; gpudra sent it nothing and "
                f"stopped the daemon, pid {process.pid}, by signal",
            )
        )
    return found


class _NotRegular(OSError):
    """What is there is not a regular file (its description is the message)."""


def _read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of the regular file at `path`. Nothing else is opened: the path is first
    opened with O_PATH (which opens no FIFO, device or socket, and with O_NOFOLLOW no symlink's target),
    and that very inode is opened to read only once fstat says it is a regular file."""
    handle = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        kind = stat.S_IFMT(os.fstat(handle).st_mode)
        if kind != stat.S_IFREG:
            raise _NotRegular(_describe(kind))
        readable = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(handle)
    try:
        return os.read(readable, limit)
    finally:
        os.close(readable)


def _open_entry(path: Path) -> int:
    """An O_PATH descriptor of the entry at `path` itself (a symlink's own, never its target's): it opens
    no FIFO or device and waits for nothing. HardwareError when there is none (yet)."""
    try:
        return os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError as err:
        raise HardwareError(f"no control socket in {path.parent} (yet)") from err
    except OSError as err:
        raise HardwareError(f"{path}: {err.strerror}") from err


def _listener(path: Path, handle: int) -> int | None:
    """The pid of the process listening on the unix socket `handle` (an O_PATH descriptor of `path`);
    None when its pid is not visible in this pid namespace. HardwareError when nothing listens there
    (yet) or its backlog is full. The connection is made through the descriptor, so it reaches that
    inode whatever `path` names by now, does not wait, and is closed at once, before anything is sent."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(f"/proc/self/fd/{handle}")
        except OSError as err:  # refused: the daemon is not listening yet (or any more)
            raise HardwareError(f"nothing answers on {path} (yet): {err.strerror}") from err
        pid, _, _ = _UCRED.unpack(probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid or None


def _make_tool_dir(tool: Path) -> None:
    """`tool/`, a directory of this process's user, mode 0700: nothing but this process writes there.
    HardwareError when something else is in its place (only root could have put it there), or the
    daemon's directory is gone."""
    try:
        with contextlib.suppress(FileExistsError):
            tool.mkdir(mode=0o700)
        found = os.lstat(tool)
    except OSError as err:
        raise HardwareError(f"{tool}: {err.strerror}") from err
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise HardwareError(f"{tool} is not a directory of uid {os.geteuid()}; remove it")
    if stat.S_IMODE(found.st_mode) != 0o700:
        os.chmod(tool, 0o700)


def _link(handle: int, link: Path) -> None:
    """Hard-link the inode of `handle` at `link`, and check that `link` is that inode. linkat follows the
    /proc/self/fd magic link to the descriptor's inode (AT_SYMLINK_FOLLOW, which os.link passes when
    given a directory descriptor; plain link(2) would try to link the magic link itself)."""
    directory = os.open(link.parent, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.link(f"/proc/self/fd/{handle}", link.name, dst_dir_fd=directory, follow_symlinks=True)
        linked = os.stat(link.name, dir_fd=directory, follow_symlinks=False)
    finally:
        os.close(directory)
    checked = os.fstat(handle)
    if (linked.st_dev, linked.st_ino) != (checked.st_dev, checked.st_ino):
        raise HardwareError(f"{link} is not the socket that was checked; nothing was sent")


def _file_type(path: Path) -> int | None:
    """The type (stat.S_IFMT) of what is at `path`, not following a symlink; None when nothing is."""
    try:
        return stat.S_IFMT(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None


def _describe(kind: int) -> str:
    names = {
        stat.S_IFIFO: "a FIFO",
        stat.S_IFLNK: "a symlink",
        stat.S_IFDIR: "a directory",
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
        stat.S_IFSOCK: "a socket",
        stat.S_IFREG: "a regular file",
    }
    return names.get(kind, "not a regular file")


def _clear(pipe: Path, *, budget: int | None = None) -> bool:
    """Remove what is in `pipe`, unlinking entries (no link is followed, nothing is opened): the names
    MPS itself uses first, then at most `budget` other entries (None: all). True when entries are left.
    A directory of a tenant's counts as one entry, however deep (shutil.rmtree follows no link)."""

    def remove(path: str, is_dir: bool) -> None:
        if is_dir:
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(path)

    for name in _MPS_NAMES:
        remove(os.path.join(pipe, name), _file_type(pipe / name) == stat.S_IFDIR)
    removed = 0
    with os.scandir(pipe) as entries:
        for entry in entries:  # not listed whole first: the directory may hold millions
            if budget is not None and removed >= budget:
                return True
            remove(entry.path, entry.is_dir(follow_symlinks=False))
            removed += 1
    return False


def _wait_gone(processes: Sequence[PinnedProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(mps_processes.running(p) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.02)


def _is_value(line: str) -> bool:
    """Whether a reply line is a value (a set command's echo), not a refusal."""
    return line.strip().replace(".", "", 1).isdigit()
