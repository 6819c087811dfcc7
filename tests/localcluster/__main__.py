"""`python -m tests.localcluster up|down [--dir DIR] [--nodes N] [--runtime R] [--image ARCHIVE]`: the
cluster behind make cluster-up/down.

`up` leaves the cluster running in the background and prints the kubeconfig path as its last line.
With `--runtime containerd` every node runs containerd (pods run for real) and each `--image` archive
is imported into it; `make cluster-up RUNTIME=containerd` passes the newest `make image` build.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpudra.errors import GpudraError
from tests.localcluster.cluster import LocalCluster, stop_cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.localcluster")
    parser.add_argument("action", choices=["up", "down"])
    default_dir = Path(os.environ.get("GPUDRA_CLUSTER_DIR", "/tmp/gpudra-cluster"))
    parser.add_argument("--dir", type=Path, default=default_dir, help=f"cluster directory ({default_dir})")
    parser.add_argument("--nodes", type=int, default=1, choices=[1, 2], help="number of kubelets")
    parser.add_argument("--runtime", default="fakecri", choices=["fakecri", "containerd"])
    parser.add_argument(
        "--image", type=Path, action="append", default=[], help="image archive to import (containerd)"
    )
    args = parser.parse_args(argv)
    try:
        if args.action == "down":
            print("stopped" if stop_cluster(args.dir) else f"no cluster running in {args.dir}")
            return 0
        if (args.dir / "state.json").exists():
            print(
                f"a cluster is already running in {args.dir}; run `make cluster-down` first", file=sys.stderr
            )
            return 1
        cluster = LocalCluster(
            args.dir,
            nodes=tuple(f"node-{i + 1}" for i in range(args.nodes)),
            runtime=args.runtime,
            images=tuple(args.image),
        )
        cluster.start()
    except GpudraError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"cluster up: {cluster.server}, nodes {', '.join(cluster.node_names)}", file=sys.stderr)
    print(cluster.kubeconfig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
