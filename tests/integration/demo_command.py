"""README's demo command as the tests run it, and the summary it prints with either runtime: the
fake-CRI demo (test_demo.py) and the containerd one (tests/e2e/test_demo_containerd.py) check the same
lines."""

from __future__ import annotations

import subprocess
import sys

# What the demo prints with either runtime (tests/e2e/test_demo_containerd.py checks the containerd one).
SUMMARY = (
    "gpu-pair-nvlink  node-h100",
    "l4-inference     node-mixed",
    "mig-mixed        node-h100",
    "mig-1g           node-h100",
    "CDI spec files written: 13",
    "MIG devices created for the claims: 5",
    "MPS control daemons running for the claims: 4 "
    "(SM share/memory limit: 15%/10240M 25%/20480M 50%/16384M 50%/40960M)",
    "Unhealthy GPUs (tainted gpudra.io/unhealthy, or left out of the slices where the release drops device "
    "taints; docs/health.md):",
    "XID 119 (GSP RPC timeout), class reset; lifted when a GPU reset is observed",
    "taint gpudra.io/unhealthy=Xid119 lifted: a GPU reset was observed: it was unreachable and answers again",
    "CDI spec files left: 0; GPU settings back to default: yes; MIG devices left: 0; MPS daemons left: 0",
    "no process left running",
)


def run_demo(*args: str, timeout: float, expected: tuple[str, ...] = ()) -> str:
    """Run `python -m tests.localcluster.demo ARGS`; its output, once it exited 0, printed SUMMARY and
    `expected` and warned of nothing."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.localcluster.demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for line in (*SUMMARY, *expected):
        assert line in out, out
    assert "Warning" not in result.stderr, result.stderr
    return out
