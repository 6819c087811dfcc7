"""`gpudra mps-host`: the node component in whose container the claims' MPS control daemons live, so
that they outlive the plugin's container. I/O: its unix socket, the daemons (through `MpsDaemons`).

A daemon started by the plugin dies with the plugin's container (the runtime kills every process of a
container's cgroup when it stops), so a plugin restart, OOM kill or `helm upgrade` would end every MPS
workload on the node. mps-host is a second DaemonSet of the same image whose pods are replaced only when
an operator deletes them (`updateStrategy: OnDelete`, done while draining the node): the plugin asks it
to start, find and stop daemons, and it runs them with `MpsDaemons`, the code the plugin ran before, so
the rules stay one: the daemon is found by the mark in its environment (never by a file a tenant can
write), pinned by pid and start time, its limits set before the CDI spec exists. docs/architecture.md
says why this and not NVIDIA's pod per claim.

mps-host keeps no state: what daemons should run is in the plugin's checkpoint, which records each
daemon's mark before asking for it; the plugin's keeper asks mps-host again for each claim whose daemon
stopped. A restarted mps-host (its pod deleted) has lost its daemons with its container, and the plugin's
keeper starts them again.

Only the plugin may talk to it: the socket is in a directory that only the two pods mount (never a
claim's), mode 0600, and every connection's peer must be of mps-host's own user (SO_PEERCRED). A request
names a daemon directory, which must be one directly under the MPS root: a request cannot make it act on
any other path.

The daemons detach (`nvidia-cuda-mps-control -d`), so mps-host is their subreaper: they are its children,
whichever process it runs as (pid 1 of its container, or a process of the test harness), and it reaps
them when they exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from gpudra.errors import GpudraError
from gpudra.gpu.tools import GpuTools
from gpudra.node import gpu_driver
from gpudra.node.options import MpsHostOptions
from gpudra.node.sharing.mps_daemons import Daemon, MpsDaemons, Tampering, trash_dir
from gpudra.node.sharing.mps_host_protocol import (
    HostReply,
    HostRequest,
    ProcessRef,
    ProtocolError,
    Running,
    Start,
    Stop,
    TamperingReport,
    receive,
    send,
)
from gpudra.node.sharing.trash import Trash

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER: Final = 36  # prctl(2)
_DAEMON_DIRECTORY: Final = re.compile(r"[0-9a-f]{12}")  # see mps_daemons.daemon_root
_REQUEST_TIMEOUT_S: Final = 5.0  # to read a request: the plugin writes it at once
_MAX_CONNECTIONS: Final = 32  # the plugin's gRPC workers and its keeper, with room
_REAP_INTERVAL_S: Final = 1.0
_DRAIN_TIMEOUT_S: Final = 20.0  # within the pod's default grace period of 30 s


class _ReapedTools(GpuTools):
    """GpuTools whose runs the reaper waits for: a reaper that waited for any child while a tool ran
    would take the tool's exit status from the `subprocess` call that waits for it."""

    def __init__(self, tools: GpuTools, runs: threading.Condition) -> None:
        super().__init__(search_path=tools.search_path, timeout=tools.timeout, driver_root=tools.driver_root)
        self._runs = runs
        self.active = 0

    def run(
        self,
        tool: str,
        args: Sequence[str],
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        with self._runs:
            self.active += 1
        try:
            return super().run(tool, args, stdin=stdin, env=env)
        finally:
            with self._runs:
                self.active -= 1


class MpsHost:
    def __init__(self, tools: GpuTools, *, mps_root: Path, socket_path: Path) -> None:
        self.mps_root = mps_root
        self.socket_path = socket_path
        self._runs = threading.Condition()
        self._tools = _ReapedTools(tools, self._runs)
        # What the request in this thread found tampered with, and how many commands it sent through a
        # shared pipe directory.
        self._found = threading.local()
        self.daemons = MpsDaemons(
            self._tools,
            trash=Trash(trash_dir(mps_root)),  # what a killed mps-host left there is removed from now on
            on_tampering=self._heard,
            on_shared_pipe=self._through_pipe,
        )
        self._slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)

    def serve(self, stop: threading.Event, *, ready: Callable[[], None] = lambda: None) -> None:
        """Answer the plugin until `stop` is set; `ready` is called once the socket listens."""
        _become_subreaper()
        listener = self._listen()
        reaper = threading.Thread(target=self._reap, args=(stop,), name="mps-host-reaper", daemon=True)
        reaper.start()
        log.info(
            "mps-host listening", extra={"socket": str(self.socket_path), "mps_root": str(self.mps_root)}
        )
        ready()
        try:
            while not stop.is_set():
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    continue
                if not self._slots.acquire(blocking=False):
                    log.warning("mps-host: too many connections; one refused")
                    connection.close()
                    continue
                threading.Thread(target=self._answer, args=(connection,), daemon=True).start()
        finally:
            listener.close()
            self._drain()
            reaper.join(_REAP_INTERVAL_S * 2)

    def _drain(self) -> None:
        """Let the requests in flight finish (a start sets the daemon's limits before it answers), up to
        the pod's grace period."""
        deadline = time.monotonic() + _DRAIN_TIMEOUT_S
        taken = 0
        while taken < _MAX_CONNECTIONS and self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            taken += 1
        if taken < _MAX_CONNECTIONS:
            log.warning(
                "mps-host: requests still in flight at exit", extra={"requests": _MAX_CONNECTIONS - taken}
            )

    def _listen(self) -> socket.socket:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(self.socket_path.parent, 0o700)
        # Bound under a hidden name and renamed over the real one once it listens: the path never names
        # a socket that refuses connections (bound, not yet listening), and an mps-host before this
        # one is replaced in one step.
        bound = self.socket_path.with_name(f".{self.socket_path.name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            bound.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(bound))
        os.chmod(bound, 0o600)
        listener.listen(_MAX_CONNECTIONS)
        os.replace(bound, self.socket_path)
        listener.settimeout(0.5)  # to see `stop`
        return listener

    def _answer(self, connection: socket.socket) -> None:
        try:
            with connection:
                uid = _peer_uid(connection)
                if uid != os.geteuid():
                    log.warning("mps-host: a connection from another user refused", extra={"uid": uid})
                    return
                connection.settimeout(_REQUEST_TIMEOUT_S)
                try:
                    request = receive(connection, HostRequest)
                except (ProtocolError, OSError) as err:
                    log.warning("mps-host: a request refused", extra={"error": str(err)})
                    with contextlib.suppress(OSError, ProtocolError):
                        send(connection, HostReply(error=f"not a request: {err}"))
                    return
                connection.settimeout(None)  # a start may take the daemon's ready timeout
                with contextlib.suppress(OSError):  # the plugin went away: its next call asks again
                    send(connection, self.handle(request))
        finally:
            self._slots.release()

    def handle(self, request: HostRequest) -> HostReply:
        """Do what `request` asks; a failure is the reply's error."""
        operation = request.request
        root = operation.daemon.root
        if root.parent != self.mps_root or not _DAEMON_DIRECTORY.fullmatch(root.name):
            return HostReply(error=f"daemon.root {root} is not a daemon directory under {self.mps_root}")
        daemon = Daemon(root, operation.daemon.token)
        self._found.list = []
        self._found.shared_pipe = 0
        try:
            process = None
            if isinstance(operation, Running):
                process = self.daemons.running(daemon)
            elif isinstance(operation, Start):
                self.daemons.start(
                    daemon,
                    visible=operation.visible,
                    active_thread_percentage=operation.active_thread_percentage,
                    pinned_memory_limits=operation.pinned_memory_limits,
                )
                process = self.daemons.running(daemon)
            else:
                assert isinstance(operation, Stop)
                self.daemons.stop(daemon)
            error = None
        except (GpudraError, OSError) as err:  # OSError: its directories could not be made
            process, error = None, str(err)
        found: list[Tampering] = self._found.list
        return HostReply(
            process=None
            if process is None
            else ProcessRef(pid=process.pid, start_time=process.start_time, parent=process.parent),
            tampering=[TamperingReport(kind=t.kind, root=t.root, detail=t.detail) for t in found],
            shared_pipe_commands=self._found.shared_pipe,
            error=error,
        )

    def _heard(self, found: Tampering) -> None:
        self._found.list.append(found)  # MpsDaemons logged it; the plugin counts it and posts the event

    def _through_pipe(self, root: Path) -> None:
        self._found.shared_pipe += 1  # MpsDaemons logged it; the plugin counts it

    def _reap(self, stop: threading.Event) -> None:
        while not stop.wait(_REAP_INTERVAL_S):
            with self._runs:
                if self._tools.active:
                    continue
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    log.info("mps-host: a daemon process exited", extra={"pid": pid, "status": status})


def _peer_uid(connection: socket.socket) -> int:
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", credentials)
    return int(uid)


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.warning("mps-host: cannot become the daemons' subreaper", extra={"errno": ctypes.get_errno()})


def run(options: MpsHostOptions, *, stop: threading.Event) -> None:
    """`gpudra mps-host`: serve the plugin until `stop` (SIGTERM). The daemons are left running: the
    container's end ends them, a process's end (the test harness) does not."""
    state_dir = options.state_dir
    tools = gpu_driver.tools(
        options.nvml, driver_root=options.driver_root, directory=state_dir / "mps-host-tools"
    )
    MpsHost(tools, mps_root=state_dir / "mps", socket_path=options.mps_host_socket).serve(stop)
