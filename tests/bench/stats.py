"""Percentiles and medians of the measured samples. Pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100) of `samples`, interpolating linearly between the two nearest
    ranks (numpy's default), so that p50 of an even count is the usual median."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def across_rounds(per_round: Sequence[float | None]) -> float | None:
    """The median of one figure over the rounds: a round that is slow because of something else on
    the machine moves it less than it would move a mean. None if no round measured it."""
    measured = [value for value in per_round if value is not None]
    return statistics.median(measured) if measured else None
