"""README's demo command works and leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys

from .procs import cluster_processes


def test_demo_runs_end_to_end_and_cleans_up() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.localcluster.demo"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for line in (
        "gpu-pair-nvlink  node-h100",
        "l4-inference     node-mixed",
        "mig-mixed        node-h100",
        "mig-1g           node-h100",
        "CDI spec files written: 13",
        "MIG devices created for the claims: 5",
        "MPS control daemons running for the claims: 4 "
        "(SM share/memory limit: 15%/10240M 25%/20480M 50%/16384M 50%/40960M)",
        "CDI spec files left: 0; GPU settings back to default: yes; MIG devices left: 0; MPS daemons left: 0",
        "no process left running",
    ):
        assert line in out, out
    assert "Warning" not in result.stderr, result.stderr
    assert cluster_processes("/tmp/gpudra-demo-") == []
