"""The run's figures as text (stdout and BENCHMARKS.md) and as a plot of the latency distributions.
I/O: the two files.

BENCHMARKS.md is shared with people: profiles and notes written by hand go anywhere outside the marked
section, which each run rewrites (or appends, the first time).
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt
from matplotlib import ticker

from tests.bench.kubelet_client import POLL_SECONDS
from tests.bench.results import SubjectResults, compared, gpudra_only, ms
from tests.bench.table import comparison, markdown

BEGIN = "<!-- `make bench` rewrites from here to the end mark; write anywhere else in this file -->"
END = "<!-- end of `make bench` output -->"
MAX_PROBLEM_LINES = 8  # per subject; the logs stay in the work directory
TITLE = "# Benchmarks\n\nWhat `make bench` (issue 15) measured last; how, below the figures.\n"


@dataclass(frozen=True)
class Run:
    """The facts printed with the figures: without them the figures cannot be compared."""

    date: str
    machine: str
    load_before: str
    load_after: str
    minutes: float
    cycles: int
    rounds: int
    batches: int
    throughput_seconds: float
    idle_seconds: float
    idle_resync_seconds: float
    idle_settle_seconds: float
    peer: str  # what the peer is and how it runs


def figures(
    results: Mapping[str, SubjectResults],
    labels: Mapping[str, str],
    run: Run,
    *,
    explain: str,
    problems: Mapping[str, Sequence[str]],
) -> str:
    """The tables and the facts around them, in markdown; printed and written alike."""
    table = comparison(
        compared(results, cycles=run.cycles, idle_seconds=run.idle_seconds), labels, base="gpudra"
    )
    only = markdown(
        ["gpudra only", "value"], [list(r) for r in gpudra_only(results["gpudra"], explain=explain)]
    )
    idle = "\n".join(
        f"- {labels[key]}: {found.idle.requests.describe()}"
        for key, found in results.items()
        if found.idle is not None
    )
    trouble = "\n".join(
        f"- {labels[key]}: {line}"
        for key, lines in problems.items()
        for line in [
            *lines[:MAX_PROBLEM_LINES],
            *([f"and {len(lines) - MAX_PROBLEM_LINES} more"] if len(lines) > MAX_PROBLEM_LINES else []),
        ]
    )
    return f"""\
{run.date} on {run.machine}.
Load average (1, 5, 15 min) before the run: {run.load_before}; after: {run.load_after}. \
Wall time {run.minutes:.1f} min.

{table}

Medians of {run.rounds} interleaved round(s). Ratio columns are gpudra ÷ that column: below 1 favours gpudra
everywhere but throughput, where above 1 does.

{only}

API requests while idle ({run.idle_seconds:g} s, each plugin alone; gpudra's resync period \
{run.idle_resync_seconds:g} s, i.e. {run.idle_seconds / run.idle_resync_seconds:.0f} periods; \
the API server counts a WATCH when it ends):
{idle}

Problems seen (plugin exits, error lines in the plugins' logs):
{trouble or "- none"}
"""


def method(run: Run) -> str:
    """How the figures were taken, for BENCHMARKS.md."""
    bullets = [
        "One local control plane (etcd + kube-apiserver of the pinned Kubernetes release, built by "
        "`deploy/local/build.sh`); no scheduler, controller manager or kubelet. The harness (`tests/bench`) "
        "plays the kubelet: it calls GetInfo and NotifyRegistrationStatus on each plugin's registration "
        "socket and NodePrepareResources / NodeUnprepareResources (DRA v1) on its DRA socket, with gpudra's "
        "generated stubs, the same client for every plugin. It writes each claim's `status.allocation` "
        "itself, as the scheduler would, before the timed sections.",
        "Subjects: gpudra's `kubelet-plugin` on a simulated 8x H100 node (`--nvml sim:dgx-h100`, "
        f"MIG-capable, partitions published); {run.peer}.",
        "Every start is on a fresh node (Node object, directories, checkpoint), so each publishes from "
        "scratch. Rounds are interleaved, the subjects' order rotating each round. Per round and subject: "
        f"an untimed warm-up (each GPU prepared and unprepared once); {run.cycles} prepare + unprepare "
        "cycles of one whole GPU with no config, one claim per call, the GPUs in turn (p50 and p99 per "
        f"round); {run.batches} calls with a claim for each of the 8 GPUs, each followed by the matching "
        "unprepare call; throughput: 8 client threads, one per GPU, cycling through their own claims until "
        f"{run.cycles // 8} each or {run.throughput_seconds:g} s; gpudra only: {run.batches} cycles of a "
        "1g.10gb MIG partition and of an MPS-shared whole GPU, each after an untimed one.",
        "Start: from spawning the process until GetInfo answers on the registration socket (polled every "
        f"{POLL_SECONDS * 1000:g} ms), and until every slice of the pool's newest generation is visible "
        "through a watch. RSS is VmRSS of the plugin process once both happened, and after the single "
        "cycles; CPU is utime + stime over the single cycles, its reaped children's (GPU tools it runs) "
        "separately.",
        f"Idle: each plugin started alone on a fresh node, {run.idle_settle_seconds:g} s to settle, then "
        "the API server's own `apiserver_request_total` is read before and after "
        f"{run.idle_seconds:g} s; requests on resource.k8s.io objects, nodes and events count (the API "
        "server's own lease and flow-control traffic is on other resources). Writes are POST, PUT, PATCH, "
        "DELETE.",
        f"Settings: {run.rounds} round(s) x {run.cycles} cycles; `python -m tests.bench --help` for the "
        "knobs.",
    ]
    wrapped = [textwrap.fill(b, width=105, initial_indent="- ", subsequent_indent="  ") for b in bullets]
    return "### How measured\n\n" + "\n".join(wrapped) + "\n"


def write_report(path: Path, text: str) -> None:
    """Replace the marked section of `path` with `text` (or append it), keeping everything else."""
    section = f"{BEGIN}\n\n{text}\n{END}\n"
    current = path.read_text() if path.exists() else TITLE
    if BEGIN in current and END in current:
        head, _, rest = current.partition(BEGIN)
        _, _, tail = rest.partition(END)
        updated = head + section + tail.removeprefix("\n")
    else:
        updated = current.rstrip("\n") + "\n\n" + section
    path.write_text(updated)


def plot(results: Mapping[str, SubjectResults], labels: Mapping[str, str], run: Run, path: Path) -> None:
    """The distribution (cumulative, log time axis) of single-claim prepare and unprepare latencies of
    every subject, all rounds together."""
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for axis, call in zip(axes, ("prepare", "unprepare"), strict=True):
        for key, found in results.items():
            samples = sorted(ms(s) for r in found.rounds for s in getattr(r.single, call))
            fractions = [(i + 1) / len(samples) for i in range(len(samples))]
            axis.step(samples, fractions, where="post", label=labels[key])
        axis.set_xscale("log")
        # Plain numbers at 1, 2, 5 per decade: a few milliseconds to a few hundred fit one axis.
        axis.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        axis.xaxis.set_minor_formatter(ticker.NullFormatter())
        axis.set_xlabel("ms per call (log scale)")
        axis.set_title(f"{call}, 1 whole GPU, no config")
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("fraction of calls at most x")
    axes[0].legend(loc="lower right")
    figure.suptitle(f"make bench, {run.date}: {run.rounds} round(s) x {run.cycles} cycles")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def image_link(report: Path, image: Path) -> str:
    return f"![prepare and unprepare latency distributions]({os.path.relpath(image, report.parent)})"
