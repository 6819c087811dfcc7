"""The trash that stopped MPS daemons' directories go to (gpudra.node.sharing.trash): a pipe directory a
tenant filled with 200k files costs unprepare one rename under the node lock, the files are removed by a
thread outside it, and after a SIGKILL by the next process; nothing in the trash is followed.

No test here times anything: each shows an order (unprepare returned while the trash's worker was held
back and the trash still held every file), and waits for the trash to empty without a bound on how long
that may take but the one that says it stopped emptying it.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

import pytest

from gpudra.node import faults
from gpudra.node.sharing.trash import Trash
from tests.unit.harness.crash import child
from tests.unit.harness.mps import (
    assert_no_daemon,
    daemon_of,
    kill_leftover_daemons,  # noqa: F401 (an autouse fixture: every test kills what it left)
    mps_claim,
    mps_root,
    returns_in_time,
    trash_of,
    wait_until_empty,
)
from tests.unit.harness.node import Node, uid

FILES = 200_000
DEPTH = 3000  # deeper than Python's recursion limit, and than one path of PATH_MAX can name


def fill(directory: Path, count: int) -> None:
    """`count` empty files in `directory`, as a tenant's container can make them in its pipe directory."""
    handle = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for n in range(count):
            os.mknod(f"f{n}", dir_fd=handle)
    finally:
        os.close(handle)


def entries(directory: Path) -> int:
    with os.scandir(directory) as found:
        return sum(1 for _ in found)


def hostile_tree(root: Path, outside: Path) -> None:
    """What a tenant can leave in its pipe directory: symlinks to a directory and a file outside it, a
    FIFO, a socket, and directories nested `DEPTH` deep with a symlink at the bottom."""
    root.mkdir()
    (root / "outside").symlink_to(outside)
    (root / "outside-file").symlink_to(outside / "keep")
    os.mkfifo(root / "fifo")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(root / "socket"))
    handle = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(DEPTH):
        os.mkdir("d", dir_fd=handle)
        os.mknod("f", dir_fd=handle)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=handle)
        os.close(handle)
        handle = inner
    os.symlink(outside, "outside", dir_fd=handle)
    os.close(handle)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the trash whose file nothing may remove."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "keep").write_text("kept")
    return directory


def test_the_trash_removes_a_hostile_tree_and_follows_nothing(tmp_path: Path, outside: Path) -> None:
    tree = tmp_path / "state" / "mps" / "0123456789ab"
    tree.parent.mkdir(parents=True)
    hostile_tree(tree, outside)
    trash = Trash(tmp_path / "state" / "mps-trash")
    trash.put(tree)
    assert not tree.exists()
    trash.put(tree)  # nothing there any more: nothing to do
    trash.empty_later()
    wait_until_empty(trash.directory)
    assert (outside / "keep").read_text() == "kept"


def test_a_trash_opened_over_what_a_killed_process_left_empties_it(tmp_path: Path, outside: Path) -> None:
    directory = tmp_path / "mps-trash"
    directory.mkdir()
    hostile_tree(directory / "0123456789ab.deadbeef", outside)
    fill(directory, 1000)
    Trash(directory)  # as at the plugin's or mps-host's start
    wait_until_empty(directory)
    assert (outside / "keep").read_text() == "kept"


def test_unprepare_returns_before_a_pipe_directory_of_200k_files_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trash's worker is held back until unprepare returned: had unprepare waited for the files to be
    removed, it would never have returned (returns_in_time fails it)."""
    node = Node(tmp_path, "dgx-h100")
    claim = node.claims.add(mps_claim(uid(1), "gpu-2"))
    state = node.state()
    state.prepare(claim)
    pid = daemon_of(node, uid(1)).pid
    fill(mps_root(node, uid(1)) / "pipe", FILES)
    held, sweeping = threading.Event(), threading.Event()
    sweep = Trash._sweep

    def held_back(self: Trash) -> None:
        sweeping.set()
        held.wait()
        sweep(self)

    monkeypatch.setattr(Trash, "_sweep", held_back)

    returns_in_time(lambda: state.unprepare(claim))
    assert_no_daemon(node, uid(1), [pid])  # its directory is gone from the MPS root...
    [moved] = trash_of(node).iterdir()
    assert entries(moved / "pipe") == FILES  # ...and all of it waits in the trash
    assert sweeping.wait(60)  # unprepare woke the worker, which it did not wait for
    held.set()
    wait_until_empty(trash_of(node))
    node.assert_nothing_left(uid(1))


def test_a_sigkill_after_the_move_into_the_trash_leaves_it_to_the_restart(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    claim = node.claims.add(mps_claim(uid(1), "gpu-2"))
    node.state().prepare(claim)
    pid = daemon_of(node, uid(1)).pid
    fill(mps_root(node, uid(1)) / "pipe", FILES)

    crashed = child(node, "unprepare", claim, "unprepare-mps-trashed")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    [moved] = trash_of(node).iterdir()
    assert entries(moved / "pipe") == FILES  # the killed process's worker was never woken

    restarted = node.state()  # recovery finishes the unprepare; the trash is emptied meanwhile
    assert_no_daemon(node, uid(1), [pid])
    wait_until_empty(trash_of(node))
    restarted.unprepare(claim)  # the kubelet's retry
    node.assert_nothing_left(uid(1))


@pytest.mark.parametrize("step", faults.MPS_DAEMON_STEPS)
def test_a_sigkill_where_the_daemons_run_during_an_unprepare_is_finished_at_restart(
    tmp_path: Path, step: str
) -> None:
    node = Node(tmp_path, "dgx-h100")
    claim = node.claims.add(mps_claim(uid(1), "gpu-2"))
    node.state().prepare(claim)
    pid = daemon_of(node, uid(1)).pid
    crashed = child(node, "unprepare", claim, step)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert node.entries()[uid(1)].state == "UnprepareStarted"

    restarted = node.state()
    assert restarted.prepared_claims() == {}
    assert_no_daemon(node, uid(1), [pid])
    wait_until_empty(trash_of(node))
    node.assert_nothing_left(uid(1))
