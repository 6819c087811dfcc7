"""The cluster-scale benchmark's table, and its section of BENCHMARKS.md. Pure but for the file."""

from __future__ import annotations

import platform
import re
from datetime import UTC, datetime
from pathlib import Path

from tests.scale.layouts import LAYOUTS, REFERENCE
from tests.scale.run import Batch, Run

START = "<!-- bench-scale:start -->"
END = "<!-- bench-scale:end -->"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def reference_cpu(runs: list[Run], run: Run, workload: str) -> float | None:
    """The reference layout's cost on the same release and node count: its CPU per failed attempt for
    an unschedulable pod, else per whole-GPU pod (it has no partitions or shares to compare with)."""
    for other in runs:
        if (other.release, other.nodes, other.layout) == (run.release, run.nodes, REFERENCE):
            for batch in other.batches:
                if workload == "unschedulable" and batch.workload == workload:
                    return batch.cpu_per_attempt
                if workload != "unschedulable" and batch.workload == "whole":
                    return batch.cpu_per_pod
    return None


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return "-"
    return f"{value / reference:.1f}x"


def _row(run: Run, batch: Batch, reference: float | None) -> tuple[str, ...]:
    cost = batch.cpu_per_attempt if batch.workload == "unschedulable" else batch.cpu_per_pod
    return (
        f"1.{run.server_minor}",
        str(run.nodes),
        run.layout,
        f"{run.devices_per_node}/{run.counter_sets_per_node}",
        batch.workload,
        f"{batch.bound}/{batch.pods}" if batch.workload != "unschedulable" else "-",
        f"{batch.pods_per_second:.1f}" if batch.workload != "unschedulable" else "-",
        f"{_s(batch.percentile(0.5))} / {_s(batch.percentile(0.99))}" if batch.latencies else "-",
        _ms(cost),
        _ratio(cost, reference),
        f"{run.scheduler_rss_mib:.0f} / {run.apiserver_rss_mib:.0f}",
    )


HEADER = (
    "release",
    "nodes",
    "layout",
    "devices / counter sets per node",
    "workload",
    "bound",
    "pods/s",
    "p50 / p99 to PodScheduled (s)",
    "scheduler CPU per pod, or per failed attempt (ms)",
    "x reference",
    "peak RSS scheduler / apiserver (MiB)",
)


def table(runs: list[Run]) -> str:
    rows = [HEADER, tuple("---" for _ in HEADER)]
    for run in runs:
        rows.extend(_row(run, batch, reference_cpu(runs, run, batch.workload)) for batch in run.batches)
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def run_lines(run: Run) -> str:
    return (
        "\n".join(
            f"  {b.workload}: {b.bound}/{b.pods} bound, {b.pods_per_second:.1f} pods/s, "
            f"CPU {_ms(b.cpu_per_attempt if b.workload == 'unschedulable' else b.cpu_per_pod)} ms"
            for b in run.batches
        )
        + f"\n  populated in {run.populate_seconds:.0f}s; scheduler RSS {run.scheduler_rss_mib:.0f} MiB"
    )


def hot_paths(runs: list[Run]) -> str:
    """The profiled runs' hot paths at the largest node count, for the reference and the layouts with
    partitions (the others lie between), each under a heading naming the run."""
    blocks = []
    largest = max((run.nodes for run in runs), default=0)
    for run in runs:
        if run.hot_path and run.nodes == largest and run.layout in (REFERENCE, "mig-profiles", "everything"):
            blocks.append(
                f"Scheduler CPU profile, 1.{run.server_minor}, {run.nodes} nodes, `{run.layout}`, "
                "while it placed whole-GPU pods (cumulative time, Kubernetes frames):"
                f"\n\n```\n{run.hot_path}\n```"
            )
    return "\n\n".join(blocks)


def rewrite_section(path: Path, table_text: str, *, argv: list[str], profiles: str = "") -> None:
    layouts = "\n".join(f"- `{layout.name}`: {layout.note}" for layout in LAYOUTS.values())
    section = "\n".join(
        [
            START,
            f"Measured {datetime.now(UTC):%Y-%m-%d} on {platform.node()} "
            f"(`python -m tests.scale {' '.join(argv)}`). Layouts (per DGX H100 node):",
            "",
            layouts,
            "",
            table_text,
            *(["", profiles] if profiles else []),
            END,
        ]
    )
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + "\n\n## Cluster scale (`make bench-scale`)\n\n" + section + "\n"
    path.write_text(text)
