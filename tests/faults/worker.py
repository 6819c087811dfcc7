"""The plugin process the random-SIGKILL test kills: a DeviceState on a simulated node, driven over stdin.

    python -m tests.faults.worker <node dir> exec|inproc

At start it recovers, as the plugin does, and prints `recovered`. Then it reads one command per line
and answers one line: `prepare <uid>` / `unprepare <uid>` answer `ok`, `refused <message>` (the claim
asks for a device another claim holds) or `error <message>`; `run <seed>` starts a random stream of
prepares and unprepares of the claims in `tests.faults.node.CLAIMS` that never ends: the test kills it.

While it runs, the stream appends to `<node dir>/journal` what the kubelet would know (`call <op> <uid>`
before a call, `done <outcome>` after it) and every crash point of `gpudra.node.faults` the call
passes (`step <name>`). A SIGKILL loses nothing written there (no user-space buffer), so the test
reads from it which call was in flight, and how far it got, at the moment of the kill.

`exec` runs the simulator's stand-in `nvidia-smi` as a separate executable, as the plugin does;
`inproc` runs the same stand-in code in this process (see `InProcessTools`).
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

from gpudra.errors import ClaimError, GpudraError
from gpudra.node import faults
from gpudra.node.prepare import DeviceState
from tests.faults.node import CLAIMS, REFS, SimNode, non_admin_devices

DEVICES = {claim["metadata"]["uid"]: non_admin_devices(claim) for claim in CLAIMS}


class Journal:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)

    def write(self, line: str) -> None:
        os.write(self.fd, f"{line}\n".encode())


def call(state: DeviceState, op: str, uid: str) -> str:
    try:
        if op == "prepare":
            state.prepare(REFS[uid])
        else:
            state.unprepare(REFS[uid])
    except ClaimError as err:
        if "is already prepared for ResourceClaim" in str(err):
            return f"refused {err}"
        return f"error {err}"
    except GpudraError as err:
        return f"error {err}"
    return "ok"


def stream(state: DeviceState, journal: Journal, seed: int) -> None:
    """Prepare and unprepare at random, as pods come and go, and check every answer; never returns."""
    rng = random.Random(seed)
    original = faults.reached

    def reached(step: str) -> None:
        journal.write(f"step {step}")
        original(step)

    faults.reached = reached
    prepared = set(state.prepared_claims())  # what the kubelet believes is prepared
    while True:
        draw = rng.random()
        if prepared and (draw < 0.35 or len(prepared) >= 4):
            op, uid = "unprepare", rng.choice(sorted(prepared))
        elif prepared and draw < 0.40:
            op, uid = "prepare", rng.choice(sorted(prepared))  # a repeated call answers the same
        elif draw < 0.45:
            op, uid = "unprepare", rng.choice(sorted(REFS.keys() - prepared))  # never prepared: fine
        else:
            op, uid = "prepare", rng.choice(sorted(REFS.keys() - prepared))
        journal.write(f"call {op} {uid}")
        outcome = call(state, op, uid)
        journal.write(f"done {outcome.partition(' ')[0]}")
        holders = {other for other in prepared - {uid} if DEVICES[other] & DEVICES[uid]}
        if op == "unprepare" and outcome == "ok":
            prepared.discard(uid)
        elif op == "prepare" and outcome == "ok" and not holders:
            prepared.add(uid)
        elif not (op == "prepare" and outcome.startswith("refused") and holders):
            raise AssertionError(f"{op} {uid}: {outcome} (claims holding its devices: {sorted(holders)})")


def main(argv: list[str]) -> None:
    root, tools = Path(argv[0]), argv[1]
    state = SimNode(root, in_process_tools=tools == "inproc").state()
    print("recovered", flush=True)
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "run":
            stream(state, Journal(root / "journal"), int(argument))
        uid = argument
        print(call(state, command, uid), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
