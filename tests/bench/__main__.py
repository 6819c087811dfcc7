"""`python -m tests.bench [--quick] [...]`: the benchmark behind `make bench`."""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.bench.run import Settings, main
from tests.localcluster.binaries import repo_root

FULL = {"cycles": 300, "rounds": 3, "idle_seconds": 90.0, "throughput_seconds": 10.0}
QUICK = {"cycles": 10, "rounds": 1, "idle_seconds": 5.0, "throughput_seconds": 2.0}


def settings(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: defaults {QUICK}")
    parser.add_argument(
        "--cycles", type=int, help=f"prepare + unprepare cycles per subject per round ({FULL['cycles']})"
    )
    parser.add_argument("--rounds", type=int, help=f"interleaved rounds ({FULL['rounds']})")
    parser.add_argument(
        "--idle-seconds", type=float, help=f"idle window per subject ({FULL['idle_seconds']:g})"
    )
    parser.add_argument(
        "--throughput-seconds",
        type=float,
        help=f"longest throughput window per subject and round ({FULL['throughput_seconds']:g})",
    )
    root = repo_root()
    parser.add_argument(
        "--report", type=Path, default=root / "BENCHMARKS.md", help="markdown report (%(default)s)"
    )
    parser.add_argument(
        "--plot", type=Path, default=root / "docs" / "bench-latency.png", help="latency plot (%(default)s)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep cluster, plugin logs and state here (default: a temporary directory)",
    )
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    chosen = {
        name: default if getattr(args, name) is None else getattr(args, name)
        for name, default in defaults.items()
    }
    return Settings(
        cycles=int(chosen["cycles"]),
        rounds=int(chosen["rounds"]),
        idle_seconds=float(chosen["idle_seconds"]),
        throughput_seconds=float(chosen["throughput_seconds"]),
        report=args.report,
        plot=args.plot,
        workdir=args.workdir,
    )


if __name__ == "__main__":
    raise SystemExit(main(settings()))
