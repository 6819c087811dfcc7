"""The controller exports its background loops' health as the plugin does
(gpudra.runtime.metrics.DaemonMetrics): `gpudra_background_failures`, `gpudra_background_healthy` and
`gpudra_background_last_success_timestamp_seconds`, by `loop`; the loops are the controller's own parts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpudra.controller.cluster import ClusterWatch
from gpudra.controller.housekeeping import Housekeeping
from gpudra.controller.leader import LeaderElector
from gpudra.controller.metrics import ControllerMetrics
from gpudra.errors import ClusterError
from gpudra.runtime.service import Loop
from gpudra.scheduling.cluster_view import build
from tests.unit.harness.cluster import (
    CLASS_OBJECTS,
    GPU0_LOST,
    H100_NODE,
    MIXED,
    NOW,
    reporting,
)
from tests.unit.harness.leases import MemoryLeases

DRIVER = "gpu.gpudra.io"
DOWN = ClusterError("cannot reach the API server (MaxRetryError)")
# A claim that holds a usage report of a node whose pool is gone: housekeeping writes to clear it.
STALE = {
    "metadata": {"namespace": "ns", "name": "c", "uid": "u", "resourceVersion": "1"},
    "status": {"devices": [{"driver": DRIVER, "pool": "gone", "device": "gpu-0"}]},
}


def sample(metrics: ControllerMetrics, name: str, loop: str) -> float | None:
    return metrics.registry.get_sample_value(f"gpudra_background_{name}", {"loop": loop})


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


class DownKube:
    """A Kube whose API server is away: every list fails."""

    def list_page(self, *args: Any, **kwargs: Any) -> Any:
        raise DOWN


def housekeeping(clear: Callable[[Any, list[Any]], None]) -> Housekeeping:
    return Housekeeping(
        driver=DRIVER,
        claims=lambda: [STALE],
        slices=lambda: [],
        synced=lambda: None,
        is_leader=lambda: True,
        clear=clear,
    )


def fail(claim: Any, keep: list[Any]) -> None:
    raise DOWN


@pytest.fixture
def running() -> Iterator[Callable[[list[Loop]], None]]:
    """Starts loops; stops them after the test."""
    started: list[Loop] = []

    def start(loops: list[Loop]) -> None:
        for loop in loops:
            started.append(loop)
            loop.start()

    yield start
    for loop in started:
        loop.stop(5)


def failed_twice(metrics: ControllerMetrics, name: str) -> Callable[[], bool]:
    return lambda: (sample(metrics, "failures", name) or 0) >= 2


def test_every_loop_is_exported_from_the_start_with_no_failure_and_no_success_yet() -> None:
    cluster = ClusterWatch(DownKube(), driver=DRIVER, idle_after_seconds=60)
    elector = LeaderElector(
        MemoryLeases(down=True), namespace="gpudra", name="gpudra-controller", identity="a"
    )
    loops = [*(i.loop for i in cluster.informers), elector.loop, housekeeping(fail).loop]
    metrics = ControllerMetrics()
    metrics.track_loops(loops)
    names = ["watch-resourceslices", "watch-resourceclaims", "watch-deviceclasses", "leader-election"]
    for name in [*names, "housekeeping"]:
        assert sample(metrics, "failures", name) == 0
        assert sample(metrics, "healthy", name) == 1
        assert sample(metrics, "last_success_timestamp_seconds", name) == 0


def test_a_failing_loop_counts_its_failures_and_reports_unhealthy(
    running: Callable[[list[Loop]], None],
) -> None:
    cluster = ClusterWatch(DownKube(), driver=DRIVER, idle_after_seconds=60)
    elector = LeaderElector(
        MemoryLeases(down=True), namespace="gpudra", name="gpudra-controller", identity="a", lease_seconds=1
    )
    failing = housekeeping(fail)
    loops = [cluster.claims.loop, elector.loop, failing.loop]
    metrics = ControllerMetrics()
    metrics.track_loops(loops)
    running(loops)
    for name in ("watch-resourceclaims", "leader-election", "housekeeping"):
        wait_for(failed_twice(metrics, name))
        assert sample(metrics, "healthy", name) == 0
        assert sample(metrics, "last_success_timestamp_seconds", name) == 0


def test_a_succeeding_loop_sets_its_last_success_time_and_is_healthy_again_after_failing(
    running: Callable[[list[Loop]], None],
) -> None:
    outcomes: list[Exception | None] = [DOWN, None]

    def clear(claim: Any, keep: list[Any]) -> None:
        outcome = outcomes.pop(0) if outcomes else None
        if outcome is not None:
            raise outcome

    keeper = housekeeping(clear)
    metrics = ControllerMetrics()
    metrics.track_loops([keeper.loop])
    before = time.time()
    running([keeper.loop])
    wait_for(lambda: (sample(metrics, "last_success_timestamp_seconds", "housekeeping") or 0) > 0)
    assert before <= (sample(metrics, "last_success_timestamp_seconds", "housekeeping") or 0) <= time.time()
    assert sample(metrics, "failures", "housekeeping") == 1  # the first step failed, the retry succeeded
    assert sample(metrics, "healthy", "housekeeping") == 1
    assert keeper.removed == 1


def test_unhealthy_gpus_are_counted_per_node_and_product_also_when_left_out_of_the_slices() -> None:
    left_out = reporting("node-h100", H100_NODE, GPU0_LOST, taints=False)
    view = build(
        driver=DRIVER,
        slices=left_out + MIXED,
        claims=[],
        classes=CLASS_OBJECTS,
        now=NOW,
        idle_after_seconds=60,
    )
    metrics = ControllerMetrics()
    metrics.track_view(lambda: view)

    def gpus(node: str, product: str, state: str) -> float | None:
        labels = {"node": node, "product": product, "state": state}
        return metrics.registry.get_sample_value("gpudra_cluster_gpus", labels)

    assert gpus("node-h100", "NVIDIA H100 80GB HBM3", "unhealthy") == 1
    assert gpus("node-h100", "NVIDIA H100 80GB HBM3", "published") == 1
    assert gpus("node-mixed", "NVIDIA L4", "unhealthy") == 0
