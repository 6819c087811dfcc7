"""The cluster's time from the API server's Date header, carried on the monotonic clock: a step of the
local wall clock does not move it."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from gpudra.kube.cluster_clock import ClusterClock


class Clocks:
    def __init__(self) -> None:
        self.wall = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
        self.monotonic = 1000.0


def test_before_a_reply_the_wall_clock_stands_in_and_there_is_no_skew() -> None:
    clocks = Clocks()
    clock = ClusterClock(wall=lambda: clocks.wall, monotonic=lambda: clocks.monotonic)
    assert clock.now() == clocks.wall and clock.skew_seconds() is None
    clock.observe(None)
    clock.observe("not a date")
    assert clock.skew_seconds() is None


def test_a_wall_clock_step_moves_neither_the_cluster_time_nor_what_is_dated_by_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clocks = Clocks()
    clock = ClusterClock(wall=lambda: clocks.wall, monotonic=lambda: clocks.monotonic)
    clock.observe("Thu, 03 Dec 2026 12:00:00 GMT")
    assert clock.skew_seconds() == 0
    clocks.monotonic += 30
    clocks.wall += timedelta(days=250, seconds=30)  # the step, and the time that passed
    assert clock.now() == datetime(2026, 12, 3, 12, 0, 30, tzinfo=UTC)
    with caplog.at_level(logging.INFO):
        clock.observe("Thu, 03 Dec 2026 12:00:30 GMT")
    assert clock.skew_seconds() == timedelta(days=250).total_seconds()
    assert [r.message for r in caplog.records] == [
        "this node's clock differs from the API server's; certificates are dated by the API server's"
    ]
    clocks.wall -= timedelta(days=250)  # put right
    caplog.clear()
    with caplog.at_level(logging.INFO):
        clock.observe("Thu, 03 Dec 2026 12:00:30 GMT")
    assert [r.message for r in caplog.records] == ["this node's clock agrees with the API server's again"]
