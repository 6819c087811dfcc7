"""The stand-in MPS daemons of a simulated node: claim configs, each claim's MPS directory, the daemons
that run (in the machine's state and in /proc), and killing what a test left behind."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudra.errors import HardwareError
from gpudra.node.sharing import SharingCoordinator
from gpudra.node.sharing.mps_daemons import Tampering
from gpudra.sim import state as sim_state
from tests.unit.claims import from_claim, mps, whole_gpus
from tests.unit.harness.node import Node


def mps_config(threads: int | None = None, memory: str | None = None) -> dict[str, Any]:
    parameters = mps(threads or 50)
    settings = parameters["sharing"]["mpsConfig"]
    if threads is None:
        del settings["defaultActiveThreadPercentage"]
    if memory is not None:
        settings["defaultPinnedDeviceMemoryLimit"] = memory
    return parameters


def mps_claim(claim_uid: str, *devices: str, threads: int = 50) -> dict[str, Any]:
    return whole_gpus(claim_uid, *devices, config=[from_claim(mps_config(threads))])


class MpsHost:
    """`gpudra mps-host` for `node`, as a process (as on the fakecri cluster): the node's plugin states
    then run their MPS daemons there (`Node.mps_host`)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.socket = node.root / "mps-host" / "mps-host.sock"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> MpsHost:
        command = [sys.executable, "-m", "gpudra", "mps-host", "--nvml", f"sim:{self.node.profile}"]
        command += ["--state-dir", str(self.node.root), "--log-format", "json"]
        env = {**os.environ, "GPUDRA_SIM_STATE": str(self.node.state_file)}
        with (self.node.root / "mps-host.log").open("ab") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            assert self.process.poll() is None, (self.node.root / "mps-host.log").read_text()
            assert time.monotonic() < deadline, "mps-host did not listen within 30 s"
            time.sleep(0.02)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            # As the kubelet stops a pod: SIGTERM, the default grace period of 30 s (mps-host lets the
            # requests in flight finish for up to 20 s: a start waits for its daemon), then SIGKILL.
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture
def mps_host(tmp_path: Path) -> Iterator[Callable[[Node], MpsHost]]:
    """Starts `gpudra mps-host` for a node; stops it after the test."""
    started: list[MpsHost] = []

    def start(node: Node) -> MpsHost:
        started.append(MpsHost(node).start())
        return started[-1]

    yield start
    for host in started:
        host.stop()


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[1])


def mps_root(node: Node, claim_uid: str) -> Path:
    return node.root / "mps" / hashlib.sha256(claim_uid.encode()).hexdigest()[:12]


def trash_of(node: Node) -> Path:
    """Where the node's stopped daemons' directories go to be removed (mps_daemons.trash_dir)."""
    return node.root / "mps-trash"


def wait_until_empty(directory: Path, stalled: float = 120.0) -> None:
    """Wait until a trash's worker thread (this process's or another's) has emptied `directory`; fail if
    what it holds stopped shrinking for `stalled` seconds (the worker stopped emptying it). Progress, not
    a deadline: the worker runs at nice 19, and beside four busy test workers on two cores it gets a
    percent of a core, so unlinking 200k files can take minutes while it still makes steady progress."""
    left = _entries(directory)
    since = time.monotonic()
    while left:
        time.sleep(0.05 if left < 1000 else 2.0)
        now = _entries(directory)
        if now < left:
            left, since = now, time.monotonic()
        assert time.monotonic() - since < stalled, f"{directory} still holds {_first(directory)}"


def _first(directory: Path) -> list[Path]:
    """A few of the trash's entries, for a failure's message (listed only then)."""
    return sorted(directory.iterdir())[:5] if directory.exists() else []


def _entries(directory: Path) -> int:
    """How many entries the tree under `directory` holds (symlinks not followed); 0 when it is gone. A
    stack, not os.walk, which recurses in Python 3.11 and overflows on the trees nested thousands deep
    that the trash tests make; entries removed meanwhile are skipped."""
    count, stack = 0, [directory]
    while stack:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(stack.pop()) as listing:
            for entry in listing:
                count += 1
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
    return count


def daemons(node: Node) -> list[sim_state.MpsDaemon]:
    """The daemons registered in the machine's state that still run."""
    return [d for d in sim_state.StateFile(node.state_file).read().mps_daemons if alive(d.pid)]


def daemon_of(node: Node, claim_uid: str) -> sim_state.MpsDaemon:
    """The running daemon of the claim's pipe directory."""
    pipe = str(mps_root(node, claim_uid) / "pipe")
    [daemon] = [d for d in daemons(node) if d.pipe_directory == pipe]
    return daemon


def answers(node: Node, claim_uid: str) -> bool:
    """Whether a daemon answers in the claim's pipe directory (as its MPS clients reach it)."""
    try:
        node.tools.mps_control(["get_server_list"], pipe_dir=mps_root(node, claim_uid) / "pipe")
    except HardwareError:
        return False
    return True


def reporting_sharing(node: Node) -> tuple[SharingCoordinator, list[Tampering]]:
    """The node's SharingCoordinator, and the list of what it reports tampered with."""
    found: list[Tampering] = []
    sharing = SharingCoordinator(
        node.tools, mps_root=node.root / "mps", mps_host=node.mps_host, on_tampering=found.append
    )
    return sharing, found


def returns_in_time(action: Callable[[], object], seconds: float = 60.0) -> None:
    """Run `action` in a thread and fail if it has not returned within `seconds` (it blocked)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as err:  # handed to the test's thread
            raised.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"blocked for {seconds:g}s"
    if raised:
        raise raised[0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        status = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return not status.rsplit(") ", 1)[-1].startswith("Z")


def environment(pid: int) -> dict[str, str]:
    """The environment process `pid` was started with."""
    pairs = (entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_text().split("\0") if entry)
    return {name: value for name, value in pairs}


def mps_processes(under: Path) -> dict[int, Path]:
    """pid -> pipe directory of every live stand-in MPS daemon whose pipe directory is under `under`."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        pipe = next((v[24:] for v in environ if v.startswith(b"CUDA_MPS_PIPE_DIRECTORY=")), None)
        if b"mps_control\0-f" in command and pipe and alive(int(proc.name)):
            found[int(proc.name)] = Path(os.fsdecode(pipe))
    return {pid: path for pid, path in found.items() if path.is_relative_to(under)}


def assert_no_daemon(node: Node, claim_uid: str, pids: list[int]) -> None:
    """No daemon of the claim runs (not `pids`, none serving its pipe) and its directory is gone."""
    root = mps_root(node, claim_uid)
    assert [pid for pid in pids if alive(pid)] == []
    assert [d.pid for d in daemons(node) if d.pipe_directory == str(root / "pipe")] == []
    assert [pid for pid, pipe in mps_processes(node.root).items() if pipe == root / "pipe"] == []
    assert not root.exists()


@pytest.fixture(autouse=True)
def kill_leftover_daemons(tmp_path: Path) -> Iterator[None]:
    yield
    for pid in mps_processes(tmp_path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
