"""When a driver's pool is all there: the scheduler's view of a node's slices. Pure.

A pool may take several slices (gpudra splits 200-odd devices to the API's per-slice limits), each
saying how many slices its generation has; the scheduler uses a pool only once every slice of its
newest generation is visible, so "all slices visible" means the same here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Slice = dict[str, Any]


def newest(slices: Sequence[Slice]) -> list[Slice]:
    """The slices of the newest generation among `slices` (one driver's pool)."""
    if not slices:
        return []
    top = max(int(s["spec"]["pool"]["generation"]) for s in slices)
    return [s for s in slices if int(s["spec"]["pool"]["generation"]) == top]


def complete(slices: Sequence[Slice]) -> bool:
    """Whether every slice of the pool's newest generation is among `slices`."""
    current = newest(slices)
    return bool(current) and len(current) == int(current[0]["spec"]["pool"]["resourceSliceCount"])


def device_count(slices: Sequence[Slice]) -> int:
    return sum(len(s["spec"].get("devices") or []) for s in newest(slices))
