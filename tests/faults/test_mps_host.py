"""`gpudra mps-host` as a process beside plugin processes: the daemons it runs are its children, outlive a
plugin killed at any moment, are adopted by the next plugin and stopped exactly by it; what it refuses."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from gpudra.errors import HardwareError
from gpudra.gpu.tools import MPS_NO_DAEMON, GpuTools
from gpudra.node import checkpoint as ckpt
from gpudra.node import mps_host as mps_host_module
from gpudra.node.sharing.mps_daemons import Daemon
from gpudra.node.sharing.mps_host_client import MpsHostDaemons
from gpudra.node.sharing.mps_host_protocol import (
    DaemonRef,
    HostReply,
    HostRequest,
    ProcessRef,
    Running,
    Start,
    Stop,
    receive,
    send,
)
from gpudra.node.sharing.mps_processes import new_token
from tests.unit.harness.crash import child
from tests.unit.harness.mps import (
    MpsHost,
    alive,
    assert_no_daemon,
    daemon_of,
    daemons,
    kill_leftover_daemons,  # noqa: F401 (an autouse fixture: every test kills what it left)
    mps_claim,
    mps_host,  # noqa: F401 (a fixture)
    parent,
)
from tests.unit.harness.node import Node, uid


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path, "dgx-h100")


def ask(host: MpsHost, request: bytes) -> HostReply:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(30)
        connection.connect(str(host.socket))
        connection.sendall(request)
        return receive(connection, HostReply)


def test_a_plugin_killed_after_prepare_leaves_the_daemon_to_mps_host_and_the_next_plugin_adopts_it(
    node: Node,
    mps_host: Callable[[Node], MpsHost],  # noqa: F811 (the fixture imported above)
) -> None:
    host = mps_host(node)
    claim = node.claims.add(mps_claim(uid(1), "gpu-2"))
    node.state()
    crashed = child(node, "prepare", claim, "prepare-completed")  # SIGKILLed once the claim is prepared
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    daemon = daemon_of(node, uid(1))
    assert parent(daemon.pid) == host.pid  # mps-host's child, not the plugin's

    restarted = node.state()
    assert daemon_of(node, uid(1)).pid == daemon.pid  # adopted: the same process
    assert restarted.prepared_claims()[uid(1)].state == "PrepareCompleted"
    other = node.claims.add(mps_claim(uid(2), "gpu-3"))
    restarted.prepare(other)
    restarted.unprepare(claim)  # exactly that daemon
    assert_no_daemon(node, uid(1), [daemon.pid])
    assert alive(daemon_of(node, uid(2)).pid)
    restarted.unprepare(other)


def test_a_daemon_that_dies_is_reaped_and_no_longer_running(
    node: Node,
    mps_host: Callable[[Node], MpsHost],  # noqa: F811 (the fixture imported above)
) -> None:
    mps_host(node)
    claim = node.claims.add(mps_claim(uid(1), "gpu-2"))
    sharing = node.sharing()
    [device] = node.state(sharing=sharing).prepare(claim)
    record = device.sharing
    assert isinstance(record, ckpt.MpsRecord)
    pid = daemon_of(node, uid(1)).pid
    os.kill(pid, signal.SIGKILL)
    while Path(f"/proc/{pid}").exists() and _state(pid) not in ("Z", "X"):
        time.sleep(0.01)  # the kill lands when the process is next scheduled
    assert sharing.mps.daemons.running(Daemon(record.root, record.token)) is None
    while Path(f"/proc/{pid}").exists():  # mps-host, its parent, reaps it: no zombie is left
        time.sleep(0.05)
    assert daemons(node) == []


def test_a_request_for_a_directory_outside_the_mps_root_is_refused(
    node: Node,
    mps_host: Callable[[Node], MpsHost],  # noqa: F811 (the fixture imported above)
) -> None:
    host = mps_host(node)
    for root in (Path("/etc"), node.root / "mps" / "0123456789ab" / "..", node.root / "mps" / "../state"):
        start = Start(
            daemon=DaemonRef(root=root, token="t"),
            visible=[node.uuid(0)],
            active_thread_percentage=None,
            pinned_memory_limits={},
        )
        reply = ask(host, HostRequest(request=start).model_dump_json().encode() + b"\n")
        assert reply.error is not None and "is not a daemon directory under" in reply.error
    assert daemons(node) == []


def test_what_is_not_a_request_gets_one_line_and_mps_host_serves_on(
    node: Node,
    mps_host: Callable[[Node], MpsHost],  # noqa: F811 (the fixture imported above)
) -> None:
    host = mps_host(node)
    for garbage in (b"{}\n", b"not json\n", b'{"request": {"op": "format-disk"}}\n', b"x" * 70000):
        reply = ask(host, garbage)
        assert reply.error is not None and reply.error.startswith("not a request: ")
        assert "Traceback" not in reply.error
    running = Running(daemon=DaemonRef(root=node.root / "mps" / "0123456789ab", token=None))
    assert ask(host, HostRequest(request=running).model_dump_json().encode() + b"\n") == HostReply()


def test_only_its_own_user_can_reach_the_socket(
    node: Node,
    mps_host: Callable[[Node], MpsHost],  # noqa: F811 (the fixture imported above)
) -> None:
    host = mps_host(node)
    assert stat.S_IMODE(host.socket.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(host.socket.lstat().st_mode) == 0o600
    # Another user (a tenant's container running as nobody with the directory somehow mounted):
    probe = (
        "import os, socket, sys; os.setgid(65534); os.setuid(65534); s = socket.socket(socket.AF_UNIX); "
        "s.connect(sys.argv[1])"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(host.socket)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0 and "PermissionError" in result.stderr


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return "X"


def test_commands_sent_through_the_shared_pipe_directory_reach_the_plugins_count(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mps-host runs the daemons, the plugin has the metric: mps-host's reply says how many of the
    request's commands went through the shared pipe directory (gpudra.node.sharing.mps_daemons), and the
    plugin's client hears each (`on_shared_pipe`)."""
    tool = GpuTools.mps_control

    def wants_more_than_sockets(self: GpuTools, commands: Sequence[str], *, pipe_dir: Path) -> str:
        if pipe_dir.name != "pipe":
            raise HardwareError(f"nvidia-cuda-mps-control failed (1): {MPS_NO_DAEMON}")
        return tool(self, commands, pipe_dir=pipe_dir)

    monkeypatch.setattr(GpuTools, "mps_control", wants_more_than_sockets)
    host = mps_host_module.MpsHost(node.tools, mps_root=node.root / "mps", socket_path=tmp_path / "unused")
    daemon = DaemonRef(root=node.root / "mps" / "0123456789ab", token=new_token())
    start = Start(daemon=daemon, visible=[node.uuid(2)], active_thread_percentage=30, pinned_memory_limits={})
    started = host.handle(HostRequest(request=start))
    assert started.error is None and started.shared_pipe_commands == 2  # the limits, then their read-back
    assert host.handle(HostRequest(request=Stop(daemon=daemon))).shared_pipe_commands == 1  # its `quit`

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "mps-host.sock"))
    listener.listen()

    def answer() -> None:
        connection, _ = listener.accept()
        with connection:
            receive(connection, HostRequest)
            send(connection, HostReply(shared_pipe_commands=3))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    heard: list[Path] = []
    MpsHostDaemons(tmp_path / "mps-host.sock", on_shared_pipe=heard.append).running(Daemon(daemon.root, None))
    thread.join()
    listener.close()
    assert heard == [daemon.root] * 3


def test_a_reply_names_only_what_is_not_at_its_default() -> None:
    """A plugin older than mps-host (rolled back) reads its replies with a schema that refuses fields it
    does not know: those added since are left out where they say nothing."""
    left, right = socket.socketpair()
    with left, right:
        send(left, HostReply(process=ProcessRef(pid=7, start_time=8, parent=1)))
        assert right.recv(4096) == b'{"process":{"pid":7,"start_time":8,"parent":1}}\n'
        send(left, HostReply(shared_pipe_commands=2))
        assert receive(right, HostReply) == HostReply(shared_pipe_commands=2)
