"""The figures as markdown tables: one value per subject, and gpudra's ratio to each peer. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MISSING = "—"


@dataclass(frozen=True)
class Row:
    """One figure: its value for each subject (by key); None where that subject has no such figure."""

    figure: str
    values: Mapping[str, float | None]
    counts: bool = False  # a whole number (requests, writes): printed without decimals


def number(value: float | None, *, counts: bool = False) -> str:
    """About three significant digits, never in exponent form: 1529, 188, 3.42, 0.031."""
    if value is None:
        return MISSING
    if counts or value == 0:
        return f"{value:.0f}"
    size = abs(value)
    decimals = 0 if size >= 100 else 1 if size >= 10 else 2 if size >= 1 else 3
    return f"{value:.{decimals}f}"


def ratio(value: float | None, other: float | None) -> str:
    """`value ÷ other` ("0.52x"); MISSING where either is missing or `other` is zero."""
    if value is None or other is None or other == 0:
        return MISSING
    quotient = value / other
    return f"{quotient:.1f}x" if quotient >= 10 else f"{quotient:.2f}x"


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table padded to line up in a terminal too; the first column left-aligned, the
    others (numbers) right-aligned."""
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def comparison(rows: Sequence[Row], subjects: Mapping[str, str], *, base: str) -> str:
    """One column per subject (key -> label, in order), then `base` ÷ each other subject."""
    others = [key for key in subjects if key != base]
    header = [
        "figure",
        *subjects.values(),
        *(f"{subjects[base]} ÷ {subjects[key]}" for key in others),
    ]
    body = [
        [
            row.figure,
            *(number(row.values.get(key), counts=row.counts) for key in subjects),
            *(ratio(row.values.get(base), row.values.get(key)) for key in others),
        ]
        for row in rows
    ]
    return markdown(header, body)
