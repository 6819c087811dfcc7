"""The benchmark harness's pure parts: percentiles, medians across rounds, the API server's request
counts, pool completeness, number and ratio formatting, the tables and the report's marked section."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.bench import pool
from tests.bench.procfs import CpuTimes
from tests.bench.report import BEGIN, END, write_report
from tests.bench.request_counts import RequestKind, Requests, parse
from tests.bench.results import Idle, Latencies, Round, SubjectResults, compared, gpudra_only
from tests.bench.stats import across_rounds, percentile
from tests.bench.table import MISSING, Row, comparison, markdown, number, ratio

# --- percentiles and medians ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("samples", "q", "expected"),
    [
        ([5.0], 50, 5.0),
        ([5.0], 99, 5.0),
        ([3.0, 1.0, 2.0], 50, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),  # an even count: the mean of the middle two
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([float(i) for i in range(1, 101)], 99, 99.01),  # linear between ranks 99 and 100
    ],
)
def test_percentile_interpolates_between_the_nearest_ranks(
    samples: list[float], q: float, expected: float
) -> None:
    assert percentile(samples, q) == pytest.approx(expected)


def test_percentile_does_not_reorder_its_input() -> None:
    samples = [3.0, 1.0, 2.0]
    percentile(samples, 50)
    assert samples == [3.0, 1.0, 2.0]


@pytest.mark.parametrize(("samples", "q"), [([], 50), ([1.0], -1), ([1.0], 100.5)])
def test_percentile_refuses_no_samples_and_out_of_range(samples: list[float], q: float) -> None:
    with pytest.raises(ValueError):
        percentile(samples, q)


@pytest.mark.parametrize(
    ("per_round", "expected"),
    [
        ([2.0], 2.0),
        ([9.0, 1.0, 2.0], 2.0),  # one slow round does not move the median
        ([1.0, 2.0, 3.0, 4.0], 2.5),
        ([None, 4.0, None], 4.0),  # rounds that did not measure it are left out
        ([None], None),
        ([], None),
    ],
)
def test_a_figure_across_rounds_is_the_median(per_round: list[float | None], expected: float | None) -> None:
    assert across_rounds(per_round) == expected


# --- numbers, ratios, tables ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "counts", "text"),
    [
        (1529.4, False, "1529"),
        (188.26, False, "188"),
        (25.97, False, "26.0"),
        (3.416, False, "3.42"),
        (0.03125, False, "0.031"),
        (0.0, False, "0"),
        (3.0, True, "3"),
        (None, False, MISSING),
    ],
)
def test_numbers_keep_about_three_significant_digits(value: float | None, counts: bool, text: str) -> None:
    assert number(value, counts=counts) == text


@pytest.mark.parametrize(
    ("value", "other", "text"),
    [
        (1.0, 2.0, "0.50x"),
        (188.0, 3.4, "55.3x"),
        (3.0, 3.0, "1.00x"),
        (0.0, 5.0, "0.00x"),
        (3.0, 0.0, MISSING),  # no ratio to nothing (idle: the peer made no request)
        (None, 2.0, MISSING),
        (2.0, None, MISSING),
    ],
)
def test_ratio_is_the_first_over_the_second(value: float | None, other: float | None, text: str) -> None:
    assert ratio(value, other) == text


def test_markdown_lines_up_and_right_aligns_the_numbers() -> None:
    text = markdown(["figure", "a"], [["long figure name", "1"], ["x", "1234"]])
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1
    assert lines[0].startswith("| figure ")
    assert lines[1] == "|------------------|-----:|"
    assert lines[2] == "| long figure name |    1 |"
    assert lines[3] == "| x                | 1234 |"


def test_comparison_has_a_column_per_subject_then_the_ratios_to_the_base() -> None:
    subjects = {"gpudra": "gpudra", "peer": "peer", "fast": "peer, fast"}
    rows = [
        Row("prepare p50 (ms)", {"gpudra": 4.0, "peer": 200.0, "fast": 2.0}),
        Row("idle LISTs", {"gpudra": 3.0, "peer": 0.0, "fast": None}, counts=True),
    ]
    header, _, prepare, idle = comparison(rows, subjects, base="gpudra").splitlines()
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "figure",
        "gpudra",
        "peer",
        "peer, fast",
        "gpudra ÷ peer",
        "gpudra ÷ peer, fast",
    ]
    assert [c.strip() for c in prepare.strip("|").split("|")] == [
        "prepare p50 (ms)",
        "4.00",
        "200",
        "2.00",
        "0.02x",
        "2.00x",
    ]
    assert [c.strip() for c in idle.strip("|").split("|")] == [
        "idle LISTs",
        "3",
        "0",
        MISSING,
        MISSING,
        MISSING,
    ]


# --- what a run measured, as figures -------------------------------------------------------------


def _round(scale: float, *, gpudra: bool = False) -> Round:
    """A round whose every latency is `scale` ms and whose other figures are `scale` too."""
    calls = Latencies(prepare=[scale / 1000] * 4, unprepare=[scale / 2000] * 4)
    return Round(
        getinfo_seconds=scale,
        slices_seconds=scale,
        slices=5,
        devices=216,
        slice_writes=5,
        rss_after_start_mib=scale,
        single=calls,
        cpu=CpuTimes(own=scale, children=0.0),
        rss_after_cycles_mib=scale,
        batched=calls,
        claims_per_second=scale,
        mig=calls if gpudra else None,
        mps=calls if gpudra else None,
    )


def test_figures_are_medians_across_rounds_and_idle_is_measured_once() -> None:
    idle = Idle(
        seconds=90,
        resync_seconds=0.9,
        requests=Requests({RequestKind("LIST", "resource.k8s.io", "resourceslices", ""): 3}),
    )
    results = {
        "gpudra": SubjectResults(
            rounds=[_round(1, gpudra=True), _round(9, gpudra=True), _round(2, gpudra=True)], idle=idle
        ),
        "peer": SubjectResults(rounds=[_round(5)]),
    }
    rows = {row.figure: row for row in compared(results, cycles=300, idle_seconds=90)}
    assert rows["prepare p50, 1 whole GPU, no config (ms)"].values == {
        "gpudra": pytest.approx(2),
        "peer": pytest.approx(5),
    }
    assert rows["unprepare p99 (ms)"].values == {"gpudra": pytest.approx(1), "peer": pytest.approx(2.5)}
    assert rows["throughput, 8 client threads (claims/s)"].values == {"gpudra": 2, "peer": 5}
    assert rows["plugin CPU over 300 cycles (s)"].values == {"gpudra": 2, "peer": 5}
    assert rows["idle 90 s: LISTs"].values == {"gpudra": 3, "peer": None}
    assert rows["idle 90 s: writes"].values == {"gpudra": 0, "peer": None}
    assert all(
        isinstance(v, (int, float)) for r in rows.values() for k, v in r.values.items() if k == "gpudra"
    )

    only = dict(gpudra_only(results["gpudra"], explain="not built yet"))
    assert only["MIG partition 1g.10gb: prepare / unprepare p50"] == "2.00 / 1.00 ms"
    assert only["`gpudra explain` over 1,000 nodes' slices"] == "not built yet"
    [publish] = [text for figure, text in only.items() if figure.startswith("publish")]
    assert publish == "5 writes, 2.00 s"


# --- the API server's request counts -------------------------------------------------------------


def _sample(verb: str, group: str, resource: str, value: int, *, code: str = "200", sub: str = "") -> str:
    """One line of the API server's /metrics, labels as kube-apiserver 1.36 writes them."""
    labels = (
        f'code="{code}",component="apiserver",dry_run="",group="{group}",resource="{resource}",'
        f'scope="cluster",subresource="{sub}",verb="{verb}",version="v1"'
    )
    return f"apiserver_request_total{{{labels}}} {value}"


METRICS = "\n".join(
    [
        "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
        "# TYPE apiserver_request_total counter",
        _sample("LIST", "resource.k8s.io", "resourceslices", 7),
        _sample("LIST", "resource.k8s.io", "resourceslices", 1, code="500"),
        _sample("POST", "resource.k8s.io", "resourceslices", 5, code="201"),
        _sample("PUT", "resource.k8s.io", "resourceclaims", 2, sub="status"),
        _sample("GET", "", "nodes", 4),
        _sample("PUT", "coordination.k8s.io", "leases", 40),
        'apiserver_request_duration_seconds_count{verb="LIST"} 99',
    ]
)


def test_request_counts_sum_over_codes_and_keep_verb_and_resource() -> None:
    totals = parse(METRICS)
    assert totals[RequestKind("LIST", "resource.k8s.io", "resourceslices", "")] == 8
    assert totals[RequestKind("PUT", "resource.k8s.io", "resourceclaims", "status")] == 2
    assert len(totals) == 5


def test_requests_between_two_readings_count_only_what_a_plugin_can_ask_for() -> None:
    before = parse(METRICS)
    after = before + Counter(
        {
            RequestKind("LIST", "resource.k8s.io", "resourceslices", ""): 3,
            RequestKind("PUT", "resource.k8s.io", "resourceslices", ""): 2,
            RequestKind("POST", "", "events", ""): 1,
            RequestKind("GET", "", "nodes", ""): 1,
            RequestKind("PUT", "coordination.k8s.io", "leases", ""): 9,  # the API server's own
        }
    )
    requests = Requests.between(before, after)
    assert (requests.lists, requests.writes, requests.writes_to("resourceslices")) == (3, 3, 2)
    assert requests.describe() == (
        "1 GET nodes, 3 LIST resource.k8s.io/resourceslices, 1 POST events, "
        "2 PUT resource.k8s.io/resourceslices"
    )
    assert Requests.between(before, before).describe() == "none"


# --- pool completeness ---------------------------------------------------------------------------


def _slice(generation: int, count: int, devices: int = 1) -> dict[str, object]:
    return {
        "spec": {
            "pool": {"name": "node", "generation": generation, "resourceSliceCount": count},
            "devices": [{"name": f"d{i}"} for i in range(devices)],
        }
    }


def test_a_pool_is_complete_when_its_newest_generation_has_every_slice() -> None:
    assert not pool.complete([])
    assert not pool.complete([_slice(1, 2)])
    assert pool.complete([_slice(1, 2), _slice(1, 2)])
    # a rewrite under way: the newest generation counts, the older one is on its way out
    assert not pool.complete([_slice(1, 1), _slice(2, 2)])
    assert pool.complete([_slice(1, 1), _slice(2, 2, devices=3), _slice(2, 2, devices=4)])
    assert pool.device_count([_slice(1, 1, devices=9), _slice(2, 2, devices=3), _slice(2, 2, devices=4)]) == 7


# --- BENCHMARKS.md -------------------------------------------------------------------------------


def test_the_report_replaces_only_its_marked_section(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    write_report(path, "first run")
    assert path.read_text().count(BEGIN) == 1
    text = path.read_text().replace(END, END + "\n\n## Profiles\n\nwritten by hand")
    path.write_text("# Benchmarks\n\nintro by hand\n\n" + text.split("\n\n", 2)[2])
    write_report(path, "second run")
    updated = path.read_text()
    assert "first run" not in updated
    assert "second run" in updated
    assert (
        updated.index("intro by hand")
        < updated.index(BEGIN)
        < updated.index(END)
        < updated.index("written by hand")
    )


def test_the_report_is_appended_to_a_file_without_the_marks(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\nprofiles by hand\n")
    write_report(path, "a run")
    assert path.read_text() == f"# Benchmarks\n\nprofiles by hand\n\n{BEGIN}\n\na run\n{END}\n"
