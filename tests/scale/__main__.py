"""`python -m tests.scale`: the cluster-scale benchmark behind `make bench-scale` (see tests.scale.run).

Prints one table per run and rewrites the "Cluster scale" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from gpudra.node import gpu_driver
from tests.localcluster.binaries import repo_root
from tests.scale import layouts, report
from tests.scale.run import Run, run_one


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.scale", description=__doc__)
    parser.add_argument("--nodes", default="50,200,500", help="node counts, comma-separated (%(default)s)")
    parser.add_argument(
        "--releases",
        default="pinned,v1.36.3",
        help="Kubernetes releases, comma-separated; pinned: deploy/local/go.mod's (%(default)s)",
    )
    parser.add_argument("--layouts", default=",".join(layouts.LAYOUTS), help="layouts (%(default)s)")
    parser.add_argument("--workloads", default=",".join(layouts.WORKLOADS), help="workloads (%(default)s)")
    parser.add_argument("--pods", type=int, default=100, help="pods per batch (%(default)s)")
    parser.add_argument(
        "--limit", type=float, default=60.0, help="seconds a batch may take before it is cut (%(default)s)"
    )
    parser.add_argument(
        "--profile-seconds",
        type=int,
        default=0,
        help="also take a scheduler CPU profile of this many seconds per run (0: none)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 nodes, 10 pods, two layouts")
    parser.add_argument("--report", type=Path, default=None, help="markdown file whose section is rewritten")
    parser.add_argument("--workdir", type=Path, default=None, help="keep each plane's logs here")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.pods, args.layouts, args.releases = "20", 10, "whole-gpus,everything", "pinned"
    chosen = [name for name in args.layouts.split(",") if name]
    unknown = [name for name in chosen if name not in layouts.LAYOUTS]
    if unknown:
        parser.error(f"--layouts: unknown {', '.join(unknown)}; choose from {', '.join(layouts.LAYOUTS)}")
    if layouts.REFERENCE not in chosen:
        chosen.insert(0, layouts.REFERENCE)  # every ratio needs it, in the same run
    workloads = tuple(w for w in args.workloads.split(",") if w)
    bad = [w for w in workloads if w not in layouts.WORKLOADS]
    if bad:
        parser.error(f"--workloads: unknown {', '.join(bad)}; choose from {', '.join(layouts.WORKLOADS)}")
    with gpu_driver.connect("sim:dgx-h100") as session:
        dgx = session.inventory()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpudra-scale-"))
    runs: list[Run] = []
    for release in [r for r in args.releases.split(",") if r]:
        for nodes in [int(n) for n in args.nodes.split(",") if n]:
            for name in chosen:
                print(f"{release} {nodes} nodes {name} ...", flush=True)
                run = run_one(
                    workdir=workdir,
                    repo=repo_root(),
                    release=None if release == "pinned" else release,
                    nodes=nodes,
                    layout=layouts.LAYOUTS[name],
                    dgx=dgx,
                    pods=args.pods,
                    limit=args.limit,
                    workloads=workloads,
                    profile_seconds=args.profile_seconds,
                )
                runs.append(run)
                print(report.run_lines(run), flush=True)
    table = report.table(runs)
    print()
    print(table)
    if args.report:
        report.rewrite_section(args.report, table, argv=sys.argv[1:], profiles=report.hot_paths(runs))
        print(f"\n{args.report}: the cluster-scale section rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
