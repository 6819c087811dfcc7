"""`make bench-scale`'s section of BENCHMARKS.md: a partial re-run refreshes its rows, keeps the rest."""

from __future__ import annotations

from tests.scale import report


def _table(*rows: tuple[str, str, str, str]) -> str:
    lines = [report.HEADER, tuple("---" for _ in report.HEADER)]
    for release, nodes, layout, workload in rows:
        lines.append(
            (release, nodes, layout, "8/0", workload, "100/100", "40.0", "1 / 2", "10", "1.0x", "1 / 2")
        )
    return "\n".join("| " + " | ".join(row) + " |" for row in lines)


def _profile(release: str, nodes: str, layout: str, body: str) -> str:
    return (
        f"Scheduler CPU profile, {release}, {nodes} nodes, `{layout}`, while it placed:\n\n```\n{body}\n```"
    )


def _rows(body: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in body.splitlines()
        if line.startswith("| ") and not line.startswith(("| run |", "| --- |"))
    ]


def test_a_partial_run_replaces_only_the_rows_it_measured_again() -> None:
    first = report.merge_section(
        "",
        _table(("1.36", "500", "whole-gpus", "whole"), ("1.37", "500", "whole-gpus", "whole")),
        run="day one",
        profiles=_profile("1.36", "500", "whole-gpus", "old 1.36")
        + "\n\n"
        + _profile("1.37", "500", "whole-gpus", "old 1.37"),
    )
    second = report.merge_section(
        first,
        _table(("1.37", "500", "whole-gpus", "whole"), ("1.37", "500", "mig-profiles", "mig-1g")),
        run="day two",
        profiles=_profile("1.37", "500", "whole-gpus", "new 1.37"),
    )
    rows = _rows(second)
    assert [(r[0], r[1], r[3], r[5]) for r in rows] == [
        ("A", "1.36", "whole-gpus", "whole"),
        ("B", "1.37", "whole-gpus", "whole"),
        ("B", "1.37", "mig-profiles", "mig-1g"),
    ]
    assert "- A: day one" in second and "- B: day two" in second
    assert "old 1.36" in second and "new 1.37" in second and "old 1.37" not in second


def test_a_run_that_repeats_everything_leaves_one_run_and_a_table_without_the_column_is_replaced() -> None:
    old_format = _table(("1.36", "50", "whole-gpus", "whole"))  # no run column: from before merging
    body = report.merge_section(old_format, _table(("1.37", "50", "whole-gpus", "whole")), run="today")
    assert [r[:2] for r in _rows(body)] == [["A", "1.37"]]
    again = report.merge_section(body, _table(("1.37", "50", "whole-gpus", "whole")), run="later")
    assert "- A: later" in again and "today" not in again
