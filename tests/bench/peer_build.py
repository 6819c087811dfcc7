"""Where the peer's binary comes from. I/O: runs deploy/local/build-peer.sh (cached after the first
build, so a later call returns at once)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.bench.errors import BenchError
from tests.localcluster.binaries import repo_root


def peer_binary() -> Path:
    script = repo_root() / "deploy" / "local" / "build-peer.sh"
    result = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise BenchError(f"building the peer failed ({script} exited {result.returncode})")
    binary = Path(result.stdout.strip().splitlines()[-1])
    if not binary.is_file():
        raise BenchError(f"{script} printed {binary}, which is not a file")
    return binary
