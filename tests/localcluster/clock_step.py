"""A process whose wall clock is stepped while every other clock of the machine stays right: libfaketime
preloaded into it (Debian's libfaketime, installed on first use), with its monotonic clock left alone,
as a node whose clock an operator or a broken NTP stepped. I/O: the package install, the library's
path."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpudra.errors import ClusterError

REPO = Path(__file__).resolve().parents[2]
LIBRARY_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"


def _library() -> Path | None:
    return next(iter(sorted(Path("/").glob(LIBRARY_GLOB.lstrip("/")))), None)


def stepped_clock_env(offset: str) -> dict[str, str]:
    """The environment for a child whose wall clock reads `offset` from now (libfaketime's relative
    form: "+250d", "-30d"); CLOCK_MONOTONIC and its kin unchanged, as a step leaves them."""
    library = _library()
    if library is None:
        done = subprocess.run(
            ["bash", "-c", "source deploy/packages.sh && ensure_packages libfaketime"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        library = _library()
        if done.returncode != 0 or library is None:
            raise ClusterError(f"installing libfaketime failed: {done.stderr.strip()[-500:]}")
    return {
        "LD_PRELOAD": str(library),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
