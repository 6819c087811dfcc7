"""The cluster-scale benchmark's table, and its section of BENCHMARKS.md. Pure but for the file."""

from __future__ import annotations

import platform
import re
from datetime import UTC, datetime
from pathlib import Path

from tests.scale.layouts import LAYOUTS, REFERENCE, WORKLOADS
from tests.scale.run import Batch, Run

WORKLOAD_ORDER = list(WORKLOADS)
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
        if (
            run.hot_path
            and run.nodes == largest
            and run.layout in (REFERENCE, "mig-profiles", "mig-profiles-minimal", "everything")
        ):
            blocks.append(
                f"Scheduler CPU profile, 1.{run.server_minor}, {run.nodes} nodes, `{run.layout}`, "
                "while it placed whole-GPU pods (cumulative time, Kubernetes frames):"
                f"\n\n```\n{run.hot_path}\n```"
            )
    return "\n\n".join(blocks)


_RUN_LINE = re.compile(r"^- ([A-Z]): (.*)$")
_PROFILE_HEAD = "Scheduler CPU profile, "


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _key(cells: list[str]) -> tuple[str, str, str]:
    """A row's (release, nodes, layout): what one run measured, with its own reference beside it."""
    return cells[1], cells[2], cells[3]


def _profile_key(block: str) -> tuple[str, str, str] | None:
    found = re.match(r"Scheduler CPU profile, (1\.\d+), (\d+) nodes, `([^`]+)`", block)
    return (found.group(1), found.group(2), found.group(3)) if found else None


def _profile_blocks(text: str) -> list[str]:
    pieces = re.split(r"\n(?=" + re.escape(_PROFILE_HEAD) + ")", "\n" + text)
    return [piece.strip() for piece in pieces if piece.startswith(_PROFILE_HEAD)]


def merge_section(old: str, table_text: str, *, run: str, profiles: str = "") -> str:
    """The section's body with this run's rows in place of those it measured again. Rows of earlier
    runs that this one did not repeat are kept with their run named, so that partial re-runs (one
    release, one node count) refresh their rows without throwing the rest away; every row's ratio is
    against the reference of its own run. Pure: `old` is the previous body (or "")."""
    earlier_runs: dict[str, str] = {}
    earlier_rows: list[list[str]] = []
    for line in old.splitlines():
        named = _RUN_LINE.match(line)
        if named:
            earlier_runs[named.group(1)] = named.group(2)
        elif line.startswith("| ") and not line.startswith(("| run |", "| --- |")):
            cells = _cells(line)
            if len(cells) == len(HEADER) + 1:  # a table from before the run column is dropped
                earlier_rows.append(cells)
    earlier_profiles = _profile_blocks(old)
    new_rows = [_cells(line) for line in table_text.splitlines()[2:]]
    measured = {(cells[0], cells[1], cells[2]) for cells in new_rows}
    kept = [cells for cells in earlier_rows if _key(cells) not in measured]
    # letters again from A, in the order of first appearance, the new run last
    letters: dict[str, str] = {}
    runs: list[str] = []
    for cells in kept:
        if cells[0] not in letters and cells[0] in earlier_runs:
            letters[cells[0]] = chr(ord("A") + len(runs))
            runs.append(earlier_runs[cells[0]])
    kept = [[letters[cells[0]], *cells[1:]] for cells in kept if cells[0] in letters]
    mine = chr(ord("A") + len(runs))
    runs.append(run)
    rows = kept + [[mine, *cells] for cells in new_rows]
    layout_order = list(LAYOUTS)

    def order(cells: list[str]) -> tuple[int, int, int, int]:
        layout = layout_order.index(cells[3]) if cells[3] in layout_order else len(layout_order)
        workload = WORKLOAD_ORDER.index(cells[5]) if cells[5] in WORKLOAD_ORDER else len(WORKLOAD_ORDER)
        return int(cells[1].split(".")[1]), int(cells[2]), layout, workload

    rows.sort(key=order)
    header = ("run", *HEADER)
    lines = [header, tuple("---" for _ in header), *map(tuple, rows)]
    table = "\n".join("| " + " | ".join(row) + " |" for row in lines)
    remeasured = {_profile_key(block) for block in _profile_blocks(profiles)}
    blocks = [b for b in earlier_profiles if _profile_key(b) not in remeasured]
    if profiles:
        blocks.append(profiles.strip())
    layouts_text = "\n".join(f"- `{layout.name}`: {layout.note}" for layout in LAYOUTS.values())
    run_text = "\n".join(f"- {chr(ord('A') + i)}: {text}" for i, text in enumerate(runs))
    parts = [
        "Runs (a row names the run that measured it; its ratio is against that run's reference):",
        "",
        run_text,
        "",
        "Layouts (per DGX H100 node):",
        "",
        layouts_text,
        "",
        table,
    ]
    if blocks:
        parts += ["", "\n\n".join(blocks)]
    return "\n".join(parts)


def rewrite_section(path: Path, table_text: str, *, argv: list[str], profiles: str = "") -> None:
    """Rewrites BENCHMARKS.md's section: this run's rows replace those it measured again (merge_section)."""
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(START) + r"\n?(.*?)" + re.escape(END), re.DOTALL)
    found = pattern.search(text)
    run = f"{datetime.now(UTC):%Y-%m-%d} on {platform.node()}, `python -m tests.scale {' '.join(argv)}`"
    body = merge_section(found.group(1) if found else "", table_text, run=run, profiles=profiles)
    section = f"{START}\n{body}\n{END}"
    if found:
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + "\n\n## Cluster scale (`make bench-scale`)\n\n" + section + "\n"
    path.write_text(text)
