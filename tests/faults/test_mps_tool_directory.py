"""Commands reach a claim's MPS daemon through `tool/`, links to the sockets gpudra checked, never through
the pipe directory a tenant writes (issue 29: a socket swapped in between the check and the tool's
connect was sent the command). See gpudra.node.sharing.mps_daemons.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from gpudra.errors import HardwareError
from gpudra.gpu.tools import MPS_NO_DAEMON, GpuTools
from gpudra.node.sharing.mps_daemons import (
    CONTROL,
    CONTROL_PRIVILEGED,
    Daemon,
    MpsDaemons,
    Tampering,
    daemon_root,
    pipe_dir,
    tool_dir,
)
from gpudra.node.sharing.mps_processes import new_token
from gpudra.node.sharing.trash import Trash
from tests.unit.harness.crash import child
from tests.unit.harness.mps import (
    assert_no_daemon,
    daemon_of,
    kill_leftover_daemons,  # noqa: F401 (an autouse fixture: every test kills what it left)
    mps_claim,
    mps_root,
)
from tests.unit.harness.node import Node, uid


class ToolRunsWith(GpuTools):
    """The node's tools, with `around` wrapped about each run of the MPS control tool: what a tenant does
    while the tool runs, after gpudra checked the control socket and linked it."""

    def __init__(self, tools: GpuTools, around: Callable[[Path], contextlib.AbstractContextManager[None]]):
        super().__init__(search_path=tools.search_path, timeout=tools.timeout, driver_root=tools.driver_root)
        self.around = around
        self.pipe_dirs: list[Path] = []

    def mps_control(self, commands: Sequence[str], *, pipe_dir: Path) -> str:
        self.pipe_dirs.append(pipe_dir)
        with self.around(pipe_dir):
            return super().mps_control(commands, pipe_dir=pipe_dir)


class TenantsSocket:
    """A socket of the tenant's own bound at a path: it counts the connections it takes, holds them open
    unanswered, and keeps what it was sent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.connections = 0
        self.heard: list[bytes] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen()
        self._listener.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        held = []
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            connection.settimeout(0.2)
            held.append(connection)
            with contextlib.suppress(OSError):
                self.heard.append(connection.recv(4096))
        for connection in held:
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._listener.close()


def start(daemons: MpsDaemons, node: Node, daemon: Daemon, threads: int) -> None:
    daemons.start(daemon, visible=[node.uuid(2)], active_thread_percentage=threads, pinned_memory_limits={})


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path, "dgx-h100")


def daemons_of(
    node: Node,
    tools: GpuTools | None = None,
    *,
    on_tampering: Callable[[Tampering], None] | None = None,
    on_shared_pipe: Callable[[Path], None] | None = None,
) -> MpsDaemons:
    return MpsDaemons(
        tools or node.tools,
        trash=Trash(node.root / "mps-trash"),
        on_tampering=on_tampering,
        on_shared_pipe=on_shared_pipe,
    )


def claim_daemon(node: Node, n: int = 1) -> Daemon:
    return Daemon(daemon_root(node.root / "mps", uid(n)), new_token())


def test_a_control_socket_swapped_after_the_check_is_never_sent_the_command(node: Node) -> None:
    """Right after gpudra checked `pipe/control` and linked it, the tenant renames the daemon's socket away
    and binds its own in its place (putting the daemon's back once the tool returned, so that each
    command's check passes): every command still reaches the daemon, the tenant's socket not one."""
    daemon = claim_daemon(node)
    start(daemons_of(node), node, daemon, threads=50)
    control = pipe_dir(daemon.root) / CONTROL
    real = os.lstat(control)
    tenants: list[TenantsSocket] = []
    linked: list[int] = []

    @contextlib.contextmanager
    def swapped(tool: Path) -> Iterator[None]:
        os.rename(control, control.with_name("away"))
        tenants.append(TenantsSocket(control))
        assert os.lstat(control).st_ino != real.st_ino  # the shared name is the tenant's now
        linked.append(os.lstat(tool / CONTROL).st_ino)
        try:
            yield
        finally:
            tenants[-1].close()
            control.unlink()
            os.rename(control.with_name("away"), control)

    found: list[Tampering] = []
    tools = ToolRunsWith(node.tools, swapped)
    start(daemons_of(node, tools, on_tampering=found.append), node, daemon, threads=20)  # adopts, sets 20

    assert daemon_of(node, uid(1)).default_active_thread_percentage == 20.0  # the daemon got the commands
    assert tenants and [t.connections for t in tenants] == [0] * len(tenants)  # the tenant's socket none
    assert set(linked) == {real.st_ino}  # the tool's directory held the checked socket all along
    assert set(tools.pipe_dirs) == {tool_dir(daemon.root)}
    assert found == []
    assert list(tool_dir(daemon.root).iterdir()) == []  # the links are gone once the tool returned
    assert os.stat(tool_dir(daemon.root)).st_mode & 0o777 == 0o700
    daemons_of(node).stop(daemon)


def test_a_tenants_socket_at_control_privileged_is_not_linked_and_is_reported(node: Node) -> None:
    """The tool may use `control_privileged` when run as root: gpudra links it only as a socket the daemon
    listens on. The stand-in daemon binds none, so a tenant's there is another process's socket."""
    daemon = claim_daemon(node)
    daemons = daemons_of(node)
    start(daemons, node, daemon, threads=50)
    tenants = TenantsSocket(pipe_dir(daemon.root) / CONTROL_PRIVILEGED)
    found: list[Tampering] = []
    try:
        with pytest.raises(HardwareError, match="control_privileged is a socket of pid"):
            start(daemons_of(node, on_tampering=found.append), node, daemon, threads=20)
    finally:
        tenants.close()
    assert not any(tenants.heard)  # connected to, to see who listens, and closed before a word
    assert [f.kind for f in found] == ["control-replaced"]
    assert list(tool_dir(daemon.root).iterdir()) == []
    # A FIFO (or any other entry) under that name is not a socket of anyone's: not linked, not reported.
    (pipe_dir(daemon.root) / CONTROL_PRIVILEGED).unlink()
    os.mkfifo(pipe_dir(daemon.root) / CONTROL_PRIVILEGED)
    start(daemons, node, daemon, threads=20)
    assert daemon_of(node, uid(1)).default_active_thread_percentage == 20.0
    daemons.stop(daemon)


def test_links_a_killed_process_left_are_removed_by_the_next_command(node: Node) -> None:
    """`tool/` as a process killed between its link and its unlink leaves it (with a link to a socket that
    is no longer the daemon's, even): the next command clears it first, and links afresh."""
    daemon = claim_daemon(node)
    daemons = daemons_of(node)
    start(daemons, node, daemon, threads=50)
    stale = TenantsSocket(node.root / "stale.sock")
    try:
        for name in (CONTROL, CONTROL_PRIVILEGED):
            os.link(stale.path, tool_dir(daemon.root) / name)
        start(daemons, node, daemon, threads=20)
    finally:
        stale.close()
    assert stale.connections == 0
    assert daemon_of(node, uid(1)).default_active_thread_percentage == 20.0
    assert list(tool_dir(daemon.root).iterdir()) == []
    daemons.stop(daemon)


@pytest.mark.parametrize("action", ["prepare", "unprepare"])
def test_a_sigkill_between_link_and_unlink_leaves_a_link_that_recovery_removes(
    node: Node, action: str
) -> None:
    claim = node.claims.add(mps_claim(uid(1), "gpu-2"))
    state = node.state()
    if action == "unprepare":
        state.prepare(claim)
    daemon = daemon_of(node, uid(1)) if action == "unprepare" else None
    crashed = child(node, action, claim, "mps-control-linked")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    tool = mps_root(node, uid(1)) / "tool"
    assert [p.name for p in tool.iterdir()] == [CONTROL]  # the link the killed process made
    pid = daemon.pid if daemon else daemon_of(node, uid(1)).pid

    restarted = node.state()  # recovery rolls the prepare back, or finishes the unprepare
    assert_no_daemon(node, uid(1), [pid])  # its directory, `tool/` with it, is gone from the MPS root
    if action == "prepare":
        restarted.prepare(claim)  # the kubelet's retry
        assert list(tool.iterdir()) == []
        restarted.unprepare(claim)
    node.assert_nothing_left(uid(1))


class WantsMoreThanSockets(GpuTools):
    """An MPS control tool that finds no daemon unless its pipe directory is the daemon's own (as a real
    one that needed a file beside the sockets would)."""

    def mps_control(self, commands: Sequence[str], *, pipe_dir: Path) -> str:
        if pipe_dir.name != "pipe":
            raise HardwareError(f"nvidia-cuda-mps-control failed (1): {MPS_NO_DAEMON}")
        return super().mps_control(commands, pipe_dir=pipe_dir)


def test_a_tool_that_needs_more_than_the_sockets_falls_back_to_the_pipe_directory_logged_once_and_counted(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    shared: list[Path] = []
    tools = WantsMoreThanSockets(search_path=node.tools.search_path)
    daemons = daemons_of(node, tools, on_shared_pipe=shared.append)
    first, second = claim_daemon(node, 1), claim_daemon(node, 2)
    with caplog.at_level(logging.WARNING, logger="gpudra.node.sharing.mps_daemons"):
        start(daemons, node, first, threads=30)
        daemons.start(second, visible=[node.uuid(3)], active_thread_percentage=40, pinned_memory_limits={})
    assert daemon_of(node, uid(1)).default_active_thread_percentage == 30.0
    assert daemon_of(node, uid(2)).default_active_thread_percentage == 40.0
    # Each start sends two commands (the limits with the readiness check, the read-back).
    assert shared == [first.root, first.root, second.root, second.root]
    logged = [r for r in caplog.records if "did not reach the daemon" in r.getMessage()]
    assert len(logged) == 1
    # The shared pipe directory is still checked first: a tenant's socket there is sent nothing.
    control = pipe_dir(first.root) / CONTROL
    control.unlink()
    tenants = TenantsSocket(control)
    try:
        with pytest.raises(HardwareError, match="not the daemon's control socket"):
            start(daemons, node, first, threads=30)
    finally:
        tenants.close()
    assert not any(tenants.heard) and len(shared) == 4
    daemons.stop(first)
    daemons.stop(second)


def test_a_tool_that_fails_for_another_reason_is_not_run_again_in_the_pipe_directory(node: Node) -> None:
    """Only "cannot find the daemon" says the tool needs more than `tool/`: a tool that timed out (a hung
    daemon) is not run a second time; `quit` not going through, the daemon is stopped by signal."""
    shared: list[Path] = []
    runs: list[Path] = []

    @contextlib.contextmanager
    def timing_out(tool: Path) -> Iterator[None]:
        runs.append(tool)
        raise HardwareError("nvidia-cuda-mps-control did not finish in 30s")
        yield  # a generator, for contextmanager

    daemon = claim_daemon(node)
    start(daemons_of(node), node, daemon, threads=50)
    pid = daemon_of(node, uid(1)).pid
    daemons_of(node, ToolRunsWith(node.tools, timing_out), on_shared_pipe=shared.append).stop(daemon)
    assert runs == [tool_dir(daemon.root)] and shared == []
    assert_no_daemon(node, uid(1), [pid])
