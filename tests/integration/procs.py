"""Finding processes by their command line (to prove a cluster left nothing behind)."""

from __future__ import annotations

from tests.localcluster.processes import live_processes


def cluster_processes(marker: str) -> list[int]:
    """PIDs of live processes whose command line mentions `marker` (a cluster directory)."""
    return [pid for pid, argv in live_processes() if marker in b" ".join(argv).decode(errors="replace")]
