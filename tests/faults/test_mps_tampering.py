"""Tenants' changes to the MPS pipe directory their containers mount read-write, with the plugin SIGKILLed
while it unprepares their claim (issue 29, items 2 to 4).

Each case prepares an attacker's MPS claim beside a victim's, changes the attacker's pipe directory as
its container can (the pid file made a FIFO, given the victim daemon's pid, or deleted; the control
socket linked to the victim's; the directory filled with 200k files), and has a plugin process
unprepare the attacker's claim and SIGKILL itself at `unprepare-started`. A new plugin process must then
recover and finish the kubelet's retry within the child's time limit (a FIFO once blocked recovery
forever), stop exactly the attacker's daemon, and leave the victim's running and answering; once the
victim's claim is unprepared too, the auditor finds the node clean (no daemon, compute modes Default,
nothing in the checkpoint or the CDI root), and the trash the attacker's directory went to is emptied.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gpudra.node.sharing.mps_daemons import PID_FILE
from tests.faults.auditor import audit
from tests.faults.node import SimNode
from tests.unit.harness.crash import child
from tests.unit.harness.mps import (
    answers,
    assert_no_daemon,
    daemon_of,
    kill_leftover_daemons,  # noqa: F401 (an autouse fixture: every test kills what it left)
    mps_claim,
    mps_root,
    trash_of,
    wait_until_empty,
)
from tests.unit.harness.node import BOOT, Node, uid

ATTACKER, VICTIM = uid(1), uid(2)


def tamper(node: Node, how: str, victim_pid: int) -> None:
    pipe, victims = mps_root(node, ATTACKER) / "pipe", mps_root(node, VICTIM) / "pipe"
    match how:
        case "pid-file-fifo":
            (pipe / PID_FILE).unlink()
            os.mkfifo(pipe / PID_FILE)
        case "pid-file-naming-the-victim":
            (pipe / PID_FILE).write_text(f"{victim_pid}\n")
        case "pid-file-deleted":
            (pipe / PID_FILE).unlink()
        case "control-linked-to-the-victim":
            (pipe / "control").unlink()
            (pipe / "control").symlink_to(victims / "control")
        case "pipe-directory-filled":
            handle = os.open(pipe, os.O_RDONLY | os.O_DIRECTORY)
            try:
                for n in range(200_000):
                    os.mknod(f"f{n}", dir_fd=handle)
            finally:
                os.close(handle)


@pytest.mark.parametrize(
    "how",
    [
        "pid-file-fifo",
        "pid-file-naming-the-victim",
        "pid-file-deleted",
        "control-linked-to-the-victim",
        # The nice-19 trash unlinks the 200k files with what CPU the other test workers leave it: on two
        # busy cores that took more than 120 s (CI, 2026-12-03), so more than the layer's 300 s for all.
        pytest.param("pipe-directory-filled", marks=pytest.mark.timeout(900)),
    ],
)
def test_a_tampered_pipe_directory_and_a_sigkill_in_unprepare_stop_only_the_tenants_daemon(
    tmp_path: Path, how: str
) -> None:
    node = Node(tmp_path, "dgx-h100")
    attacker = node.claims.add(mps_claim(ATTACKER, "gpu-2"))
    victim = node.claims.add(mps_claim(VICTIM, "gpu-3", threads=20))
    state = node.state()
    state.prepare(victim)
    state.prepare(attacker)
    own, other = daemon_of(node, ATTACKER).pid, daemon_of(node, VICTIM).pid
    tamper(node, how, other)

    crashed = child(node, "unprepare", attacker, "unprepare-started")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert node.entries()[ATTACKER].state == "UnprepareStarted"
    retried = child(node, "unprepare", attacker, "")  # a new plugin: recovery, then the kubelet's retry
    assert retried.returncode == 0, retried.stderr

    assert_no_daemon(node, ATTACKER, [own])
    node.assert_nothing_left(ATTACKER)
    assert daemon_of(node, VICTIM).pid == other and answers(node, VICTIM)
    node.state().unprepare(victim)  # this process's trash empties what the killed plugins left there
    assert_no_daemon(node, VICTIM, [other])
    assert audit(SimNode(tmp_path), settled=True, boot=BOOT) == []
    wait_until_empty(trash_of(node))
