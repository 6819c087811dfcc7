"""100 SIGKILLs at random moments of a stream of prepares and unprepares, each followed by a restart.

A worker process (`tests.faults.worker`) runs the plugin's DeviceState on a simulated DGX H100 and
prepares and unprepares the claims of `tests.faults.node.CLAIMS` at random, competing claims included.
After a random delay the test SIGKILLs its whole process group (the plugin and any `nvidia-smi` it
runs, as when a pod's container is killed), audits the node as the kill left it, starts a fresh
worker on the same node, which recovers (the MPS daemons run on in the node's `gpudra mps-host`, a
process the kills spare, as the chart's DaemonSet is); the test audits again, plays the kubelet's retry of the
call that was in flight and audits, unprepares every claim as the kubelet does when the pods go, and
audits that nothing is left. Then the fresh worker starts its own stream and is killed in turn.

Two nodes run side by side, one per core: one where the plugin exec's the simulator's stand-in
`nvidia-smi`, as in production, and one where the stand-in runs in the plugin's process (faster
calls, so more kills land in the checkpoint and CDI writes between them).

The seed is printed; `GPUDRA_FAULT_SEED=<seed>` repeats the same streams and delays (the moments the
kills land still depend on the machine's speed).
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from tests.faults.auditor import audit
from tests.faults.node import REFS, SimNode
from tests.unit.harness.mps import MpsHost, mps_processes

REPO = Path(__file__).resolve().parents[2]
KILLS = {"exec": 30, "inproc": 70}  # per node, so that both take about as long; 100 in all
MAX_DELAY = 0.4  # seconds from the start of a stream to its kill

# The step a call was in when it was killed, from the last crash point it passed (see worker.py).
STEP_AFTER = {
    ("prepare", None): "prepare: read claim, plan, save PrepareStarted",
    ("prepare", "prepare-started"): "prepare: create MIG devices, save their live ids",
    ("prepare", "prepare-mig-created"): "prepare: switch MIG mode, set time-slices and compute modes",
    ("prepare", "prepare-mps-directories"): "prepare: mps-host starts the MPS daemon with its limits",
    ("prepare", "prepare-mps-started"): "prepare: MPS daemon started",
    ("prepare", "prepare-applied"): "prepare: write CDI spec",
    ("prepare", "prepare-cdi-written"): "prepare: save PrepareCompleted",
    ("prepare", "prepare-completed"): "prepare: return",
    ("unprepare", None): "unprepare: save UnprepareStarted",
    ("unprepare", "unprepare-started"): "unprepare: stop the MPS daemon, or reset time-slices",
    ("unprepare", "unprepare-mps-stopped"): "unprepare: restore compute modes, reset time-slices",
    ("unprepare", "unprepare-undone"): "unprepare: destroy MIG devices",
    ("unprepare", "unprepare-mig-destroyed"): "unprepare: delete CDI spec",
    ("unprepare", "unprepare-cdi-deleted"): "unprepare: save without the claim",
}


@dataclass
class Tally:
    steps: collections.Counter[str] = field(default_factory=collections.Counter)
    checkpoint: collections.Counter[str] = field(default_factory=collections.Counter)


class Worker:
    def __init__(self, node: SimNode, tools: str, log: IO[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.worker", str(node.root), tools],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,  # its own process group: the kill takes its nvidia-smi too
        )
        self.log = log

    def expect(self, answer: str) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        assert line == answer, self._died(f"expected {answer!r}, got {line!r}")

    def call(self, op: str, uid: str) -> str:
        self.send(f"{op} {uid}")
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{line}\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # it died by itself: the returncode says so
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        assert self.process.returncode == -signal.SIGKILL, self._died("the worker ended by itself")
        for stream in (self.process.stdin, self.process.stdout):
            assert stream is not None
            stream.close()

    def _died(self, what: str) -> str:
        self.log.flush()
        return f"{what}; worker stderr:\n{Path(self.log.name).read_text()[-4000:]}"


def in_flight(journal: Path) -> tuple[str, str, str | None] | None:
    """The call the kill interrupted (op, claim UID, last crash point passed), None between calls."""
    current: tuple[str, str, str | None] | None = None
    for line in journal.read_text().splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "call":
            op, uid = rest.split()
            current = (op, uid, None)
        elif kind == "step" and current is not None:
            current = (current[0], current[1], rest)
        elif kind == "done":
            current = None
    return current


def run_node(node: SimNode, tools: str, kills: int, seed: int, tally: Tally) -> None:
    rng = random.Random(f"{seed}-{tools}")
    root = node.root
    started = time.monotonic()
    retry: list[tuple[str, str]] = []
    with (root / "worker.log").open("w") as log:
        for kill in range(kills):
            where = f"seed {seed}, node {tools}, kill {kill}"
            worker = Worker(node, tools, log)
            worker.expect("recovered")
            assert audit(node, settled=True) == [], where
            for op, uid in retry:  # the kubelet retries the call that failed with the plugin
                answer = worker.call(op, uid)
                assert answer == "ok" or answer.startswith("refused"), f"{where}: retry {op} {uid}: {answer}"
                assert (uid in node.specs()) == (op == "prepare" and answer == "ok"), (
                    f"{where}: retry {op} {uid}"
                )
                assert audit(node, settled=True) == [], f"{where}: after the retry of {op} {uid}"
            for uid in REFS:  # the pods go: the kubelet unprepares every claim
                answer = worker.call("unprepare", uid)
                assert answer == "ok", f"{where}: unprepare {uid}: {answer}"
            assert (node.entries(), node.specs(), audit(node, settled=True)) == ({}, set(), []), where
            assert set(node.timeslices().values()) == {0}, where

            worker.send(f"run {rng.randrange(2**32)}")
            time.sleep(rng.uniform(0, MAX_DELAY))
            worker.kill()

            interrupted = in_flight(root / "journal")
            if interrupted is None:
                tally.steps["between calls"] += 1
                tally.checkpoint["between calls"] += 1
                retry = []
            else:
                op, uid, step = interrupted
                tally.steps[STEP_AFTER[(op, step)]] += 1
                entry = node.entries().get(uid)
                tally.checkpoint[f"{op}: {entry.state if entry else 'no entry'}"] += 1
                retry = [(op, uid)]
            assert audit(node, settled=False) == [], f"{where}: right after the kill in {interrupted}"
    print(f"node {tools}: {kills} kills and restarts in {time.monotonic() - started:.0f} s")


# Its own timeout, over the layer's: the MPS claims' daemons are started and stopped by exec'ing the
# stand-in tools on both nodes. 634 s for the slower node at a load average of 23 on two cores (without
# MPS claims it took 48 s on two busy cores).
@pytest.mark.timeout(1200)
def test_random_sigkills_during_prepare_and_unprepare_leave_nothing_behind() -> None:
    seed = int(os.environ.get("GPUDRA_FAULT_SEED") or random.SystemRandom().randrange(2**32))
    print(f"random kills: seed {seed} (GPUDRA_FAULT_SEED={seed} repeats the streams and delays)")
    tallies = {tools: Tally() for tools in KILLS}
    # Not under pytest's tmp_path: the MPS sockets' paths (under the node) must fit in 107 bytes.
    short = Path(tempfile.mkdtemp(prefix="gpudra-kills-"))
    nodes = {tools: SimNode(short / tools) for tools in KILLS}  # one at a time: NVML is per process
    # The MPS daemons live in each node's mps-host, which the kills (the worker's process group) spare.
    hosts = [MpsHost(node).start() for node in nodes.values()]
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(len(KILLS)) as pool:
        for host in hosts:
            stack.callback(host.stop)
        stack.callback(shutil.rmtree, short, ignore_errors=True)
        stack.callback(_kill_daemons, short)  # those of the claims prepared at the last kill
        runs = [
            pool.submit(run_node, nodes[tools], tools, kills, seed, tallies[tools])
            for tools, kills in KILLS.items()
        ]
        for run in runs:
            run.result()

    steps = sum((t.steps for t in tallies.values()), collections.Counter[str]())
    states = sum((t.checkpoint for t in tallies.values()), collections.Counter[str]())
    assert steps.total() == sum(KILLS.values())
    print("kills by the step they interrupted:")
    for step, count in sorted(steps.items()):
        print(f"  {count:3}  {step}")
    print("kills by the interrupted claim's checkpoint entry found at restart:")
    for state, count in sorted(states.items()):
        print(f"  {count:3}  {state}")


def _kill_daemons(under: Path) -> None:
    for pid in mps_processes(under):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
