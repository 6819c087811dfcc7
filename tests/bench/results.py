"""What a run measured, and the figures the report shows from it. Pure.

A figure is computed per round (a p50 over that round's cycles, say) and then reduced to the median
across rounds; the idle figures are measured once per subject.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tests.bench.procfs import CpuTimes
from tests.bench.request_counts import Requests
from tests.bench.stats import across_rounds, percentile
from tests.bench.table import Row, number


@dataclass
class Latencies:
    """Seconds per call."""

    prepare: list[float] = field(default_factory=list)
    unprepare: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Round:
    """One subject's figures from one round."""

    getinfo_seconds: float
    slices_seconds: float
    slices: int
    devices: int
    slice_writes: int  # creates, updates and deletes of slices from spawn until all were visible
    rss_after_start_mib: float
    single: Latencies
    cpu: CpuTimes  # over the single cycles
    rss_after_cycles_mib: float  # after the single cycles
    batched: Latencies  # every GPU in one call
    claims_per_second: float
    mig: Latencies | None = None  # gpudra only
    mps: Latencies | None = None  # gpudra only


@dataclass(frozen=True)
class Idle:
    seconds: float
    resync_seconds: float | None  # None: the plugin has no resync period
    requests: Requests


@dataclass
class SubjectResults:
    rounds: list[Round] = field(default_factory=list)
    idle: Idle | None = None


def ms(seconds: float) -> float:
    return seconds * 1000


def _per_round(
    results: Mapping[str, SubjectResults], figure: Callable[[Round], float | None]
) -> dict[str, float | None]:
    return {key: across_rounds([figure(r) for r in found.rounds]) for key, found in results.items()}


def _idle(results: Mapping[str, SubjectResults], figure: Callable[[Idle], int]) -> dict[str, float | None]:
    return {key: None if found.idle is None else figure(found.idle) for key, found in results.items()}


def compared(results: Mapping[str, SubjectResults], *, cycles: int, idle_seconds: float) -> list[Row]:
    """The figures every subject has, medians across rounds."""

    def row(figure: str, of: Callable[[Round], float | None], *, counts: bool = False) -> Row:
        return Row(figure, _per_round(results, of), counts=counts)

    return [
        row("prepare p50, 1 whole GPU, no config (ms)", lambda r: ms(percentile(r.single.prepare, 50))),
        row("prepare p99 (ms)", lambda r: ms(percentile(r.single.prepare, 99))),
        row("unprepare p50 (ms)", lambda r: ms(percentile(r.single.unprepare, 50))),
        row("unprepare p99 (ms)", lambda r: ms(percentile(r.single.unprepare, 99))),
        row("one call with 8 claims: prepare p50 (ms)", lambda r: ms(percentile(r.batched.prepare, 50))),
        row("one call with 8 claims: unprepare p50 (ms)", lambda r: ms(percentile(r.batched.unprepare, 50))),
        row("throughput, 8 client threads (claims/s)", lambda r: r.claims_per_second),
        row("start → GetInfo answers (s)", lambda r: r.getinfo_seconds),
        row("start → all slices visible (s)", lambda r: r.slices_seconds),
        row("RSS after start (MiB)", lambda r: r.rss_after_start_mib),
        row(f"RSS after {cycles} cycles (MiB)", lambda r: r.rss_after_cycles_mib),
        row(f"plugin CPU over {cycles} cycles (s)", lambda r: r.cpu.own),
        row(f"its child processes' CPU over {cycles} cycles (s)", lambda r: r.cpu.children),
        Row(f"idle {idle_seconds:g} s: LISTs", _idle(results, lambda i: i.requests.lists), counts=True),
        Row(f"idle {idle_seconds:g} s: writes", _idle(results, lambda i: i.requests.writes), counts=True),
    ]


def gpudra_only(found: SubjectResults, *, explain: str) -> list[tuple[str, str]]:
    """gpudra's figures that the peer has no counterpart for, as (figure, text), medians across rounds."""

    def median_of(figure: Callable[[Round], float]) -> float:
        value = across_rounds([figure(r) for r in found.rounds])
        assert value is not None
        return value

    def latency_pair(which: Callable[[Round], Latencies | None]) -> str:
        prepare = median_of(lambda r: ms(percentile(_got(which(r)).prepare, 50)))
        unprepare = median_of(lambda r: ms(percentile(_got(which(r)).unprepare, 50)))
        return f"{number(prepare)} / {number(unprepare)} ms"

    first = found.rounds[0]
    return [
        ("MIG partition 1g.10gb: prepare / unprepare p50", latency_pair(lambda r: r.mig)),
        (
            "MPS on a whole GPU (GpuConfig sharing.strategy MPS): prepare / unprepare p50",
            latency_pair(lambda r: r.mps),
        ),
        (
            f"publish 8x H100 with partitions ({first.devices} devices, {first.slices} slices): "
            "slice writes, s to all visible",
            f"{number(median_of(lambda r: r.slice_writes), counts=True)} writes, "
            f"{number(median_of(lambda r: r.slices_seconds))} s",
        ),
        ("`gpudra explain` over 1,000 nodes' slices", explain),
    ]


def _got(latencies: Latencies | None) -> Latencies:
    assert latencies is not None, "measured on gpudra only"
    return latencies
