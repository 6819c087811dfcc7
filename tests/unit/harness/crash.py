"""The crash child: one prepare or unprepare in a new plugin process (`python -m
tests.unit.harness.crash`) that SIGKILLs itself at the step GPUDRA_CRASH_AT names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpudra.node.allocation import ClaimRef
from tests.unit.harness.node import Node

REPO = Path(__file__).resolve().parents[3]


def child(node: Node, action: str, claim: ClaimRef, crash_at: str) -> subprocess.CompletedProcess[str]:
    """Run `action` for `claim` in a new plugin process that kills itself at step `crash_at`."""
    command = [sys.executable, "-m", "tests.unit.harness.crash", str(node.root), node.profile, action]
    command += [claim.uid, claim.namespace, claim.name]
    env = {**os.environ, "GPUDRA_CRASH_AT": crash_at}
    return subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def main(argv: list[str]) -> None:
    root, profile, action, claim_uid, namespace, name = argv
    state = Node(Path(root), profile).state()
    claim = ClaimRef(uid=claim_uid, namespace=namespace, name=name)
    if action == "prepare":
        state.prepare(claim)
    else:
        state.unprepare(claim)


if __name__ == "__main__":
    main(sys.argv[1:])
