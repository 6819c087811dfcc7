"""Finding processes by their command line (to prove a cluster left nothing behind)."""

from __future__ import annotations

from pathlib import Path


def cluster_processes(marker: str) -> list[int]:
    """PIDs of live processes whose command line mentions `marker` (a cluster directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry.name))
    return found
