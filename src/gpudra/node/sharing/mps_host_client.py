"""The plugin's side of `gpudra mps-host` (gpudra.node.mps_host): the claims' MPS daemons started,
found and stopped there, outside the plugin's container. I/O: mps-host's unix socket.

`MpsHostDaemons` does what `MpsDaemons` does, by asking mps-host: `Mps` takes either. The claim's
checkpoint record names the daemon (its directory and its token) before `start` is asked, so a plugin
killed at any step finds the daemon again by asking mps-host (`running`), and stops exactly that one
(`stop`): nothing in the pipe directory a tenant writes is read by the plugin.

Its crash points are the plugin's (GPUDRA_CRASH_AT is the plugin's): `prepare-mps-directories` before
the start is asked (the mark recorded, nothing asked yet), `prepare-mps-started` once mps-host answered
that the daemon runs with its limits, `unprepare-mps-stopped` once it answered that the daemon stopped.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from gpudra.errors import HardwareError
from gpudra.node import faults
from gpudra.node.sharing.mps_daemons import Daemon, Tampering
from gpudra.node.sharing.mps_host_protocol import (
    DaemonRef,
    HostReply,
    HostRequest,
    ProtocolError,
    Running,
    Start,
    Stop,
    receive,
    send,
)
from gpudra.node.sharing.mps_processes import PinnedProcess

# The longest answer: a start waits up to the daemon's ready timeout, a stop its quit and kill timeouts.
_REPLY_TIMEOUT_S: Final = 60.0


class MpsHostDaemons:
    def __init__(
        self,
        socket_path: Path,
        *,
        on_tampering: Callable[[Tampering], None] | None = None,
        on_shared_pipe: Callable[[Path], None] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.on_tampering = on_tampering
        self.on_shared_pipe = on_shared_pipe

    def running(self, daemon: Daemon) -> PinnedProcess | None:
        return self._ask(Running(daemon=_ref(daemon)))

    def start(
        self,
        daemon: Daemon,
        *,
        visible: Sequence[str],
        active_thread_percentage: int | None,
        pinned_memory_limits: Mapping[str, int],
    ) -> None:
        faults.reached("prepare-mps-directories")
        started = self._ask(
            Start(
                daemon=_ref(daemon),
                visible=list(visible),
                active_thread_percentage=active_thread_percentage,
                pinned_memory_limits=dict(pinned_memory_limits),
            )
        )
        if started is None:
            raise HardwareError(f"gpudra mps-host started no MPS daemon for {daemon.root}")
        faults.reached("prepare-mps-started")

    def stop(self, daemon: Daemon) -> None:
        self._ask(Stop(daemon=_ref(daemon)))
        faults.reached("unprepare-mps-stopped")

    def _ask(self, operation: Running | Start | Stop) -> PinnedProcess | None:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.settimeout(_REPLY_TIMEOUT_S)
                connection.connect(str(self.socket_path))
                send(connection, HostRequest(request=operation))
                reply = receive(connection, HostReply)
        except (OSError, ProtocolError) as err:
            raise HardwareError(
                f"cannot reach gpudra mps-host at {self.socket_path} (--mps-host-socket; its DaemonSet "
                f"must run on this node): {err}"
            ) from err
        for found in reply.tampering:
            if self.on_tampering is not None:
                self.on_tampering(Tampering(found.kind, found.root, found.detail))
        for _ in range(reply.shared_pipe_commands):
            if self.on_shared_pipe is not None:
                self.on_shared_pipe(operation.daemon.root)
        if reply.error is not None:
            raise HardwareError(f"gpudra mps-host: {reply.error}")
        process = reply.process
        return None if process is None else PinnedProcess(process.pid, process.start_time, process.parent)


def _ref(daemon: Daemon) -> DaemonRef:
    return DaemonRef(root=daemon.root, token=daemon.token)
