"""What a node publishes besides whole GPUs, and the warning when that costs the cluster's scheduler."""

from __future__ import annotations

from typing import Any

import pytest

from gpudra.model import devices
from gpudra.model.publishing import Publishing, counter_sets_slow_scheduler
from gpudra.node.wiring import _counter_cost_notice
from tests.unit import inventories as inv


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def post(self, type_: str, reason: str, message: str) -> None:
        self.posted.append((type_, reason, message))


@pytest.mark.parametrize(("minor", "slow"), [(34, True), (35, True), (36, True), (37, False), (38, False)])
def test_which_releases_pay_for_counter_sets(minor: int, slow: bool) -> None:
    assert counter_sets_slow_scheduler(minor) is slow


def _notice(publishing: Publishing) -> tuple[Any, Events]:
    events = Events()
    model = devices.publish(inv.h100_node(), publishing)
    return _counter_cost_notice(model, publishing, events), events


def test_counter_sets_on_a_slow_release_are_reported_once() -> None:
    notice, events = _notice(Publishing(mig_mode="partitionable", shares=True))
    notice(36)
    notice(36)  # the server version is read again after an error: still one event
    ((type_, reason, message),) = events.posted
    assert (type_, reason) == ("Warning", "CounterSetsSlowScheduler")
    assert "1.36 scheduler" in message and "docs/install.md" in message


@pytest.mark.parametrize(
    ("publishing", "minor"),
    [(Publishing(), 36), (Publishing(mig_mode="partitionable", shares=True), 37)],
    ids=["default-on-1.36", "counters-on-1.37"],
)
def test_nothing_is_reported_when_the_scheduler_does_not_pay(publishing: Publishing, minor: int) -> None:
    notice, events = _notice(publishing)
    notice(minor)
    assert events.posted == []


def test_describe_names_what_is_offered() -> None:
    assert Publishing().describe() == "whole GPUs, existing MIG devices, no shares"
    offered = Publishing(
        mig_mode="partitionable", shares=True, mig_profiles=frozenset({"3g.40gb", "1g.10gb"})
    )
    assert offered.describe() == "whole GPUs, MIG partitions on demand (1g.10gb,3g.40gb), shares"
