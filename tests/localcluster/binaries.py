"""Where the local cluster's Kubernetes binaries come from. I/O: runs deploy/local/build.sh.

The binaries are built from the Go module proxy by `deploy/local/build.sh` into a cache directory
outside the repository (keyed by the pinned version and the harness' sources) and reused after that.
`GPUDRA_K8S_BIN` points at a ready directory instead (e.g. binaries built elsewhere).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpudra.errors import ClusterError

BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubelet",
    "kube-proxy",
    "fakecri",
)


def repo_root() -> Path:
    """The checkout this package runs from (the launcher is a development and CI tool)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "deploy" / "local" / "build.sh").is_file():
        raise ClusterError(
            f"deploy/local/build.sh not found under {root}: the local cluster needs a gpudra checkout "
            "(or GPUDRA_K8S_BIN pointing at prebuilt binaries)"
        )
    return root


def ensure_binaries() -> Path:
    """Return the directory holding every binary in BINARIES, building them first if needed."""
    override = os.environ.get("GPUDRA_K8S_BIN")
    if override:
        directory = Path(override)
    else:
        script = repo_root() / "deploy" / "local" / "build.sh"
        result = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
        if result.returncode != 0:
            raise ClusterError(
                f"building the Kubernetes binaries failed ({script} exited {result.returncode})"
            )
        directory = Path(result.stdout.strip().splitlines()[-1])
    missing = [name for name in BINARIES if not (directory / name).is_file()]
    if missing:
        raise ClusterError(f"{directory} lacks {', '.join(missing)}")
    return directory
