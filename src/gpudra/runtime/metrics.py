"""Prometheus metrics: the one owner of `prometheus_client` (.importlinter), and the series every daemon
exports. Pure but for the callbacks it reads at each scrape.

`DaemonMetrics` holds a daemon's registry and the series both daemons export: which build runs
(`gpudra_build_info`), the requests it made to the API server (`track_api_requests`), the objects it
left out of their replies (`track_skipped_objects`), the health of its background loops (`track_loops`)
and its readiness checks (`track_readiness`). Each daemon's own series are defined beside it
(gpudra.node.metrics, gpudra.controller.metrics), in a subclass, with the classes this module hands on.
Names are prefixed `gpudra_`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpudra import build
from gpudra.runtime.service import Loop

__all__ = [
    "Collector",
    "CollectorRegistry",
    "Counter",
    "CounterMetricFamily",
    "DaemonMetrics",
    "Gauge",
    "GaugeMetricFamily",
    "Histogram",
    "Metric",
    "wsgi_app",
]


def wsgi_app(registry: CollectorRegistry) -> Callable[..., Any]:
    """The WSGI application that serves `registry` in the Prometheus text format
    (gpudra.runtime.http_endpoint)."""
    return make_wsgi_app(registry)


class DaemonMetrics:
    """A daemon's registry, with the series every daemon exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # The usual `_build_info` convention: value 1, the build in the labels, so a query can join it.
        Gauge(
            "gpudra_build_info",
            "1, labelled with the running gpudra's version (pyproject.toml) and git revision (the image's).",
            ["version", "revision"],
            registry=self.registry,
        ).labels(build.version(), build.revision()).set(1)

    def track_api_requests(self, requests: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        """API requests this daemon made since start, by verb and resource (`Kube.request_counts`),
        read at scrape time."""
        self.registry.register(_ApiRequests(requests))

    def track_skipped_objects(self, skipped: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        """Objects left out of what the API server sent (or sent for admission) because they break
        gpudra.bounded_json's bounds, by resource and reason (`SkippedObjects.counts`), read at scrape
        time."""
        self.registry.register(_SkippedObjects(skipped))

    def track_readiness(self, daemon: str, checks: Mapping[str, Callable[[], str | None]]) -> None:
        """Each readiness check of /readyz (name -> probe: None when it passes, else why not), run at
        scrape time, so an alert sees what the kubelet's probe sees without kube-state-metrics."""
        ready = Gauge(
            "gpudra_ready",
            "1 while the daemon's readiness check passes, 0 while it fails (/readyz says why), by daemon "
            "(kubelet-plugin, controller) and check.",
            ["daemon", "check"],
            registry=self.registry,
        )
        for name, probe in checks.items():
            ready.labels(daemon, name).set_function(_passes(probe))

    def track_loops(self, loops: Sequence[Loop]) -> None:
        """Each background loop's failed steps since start, whether its last step succeeded, and when a
        step last succeeded, read at scrape time (`loop` label: the loop's name)."""
        failures = Gauge(
            "gpudra_background_failures",
            "Failed steps of a background loop since start, by loop; each is logged and retried.",
            ["loop"],
            registry=self.registry,
        )
        healthy = Gauge(
            "gpudra_background_healthy",
            "1 when the loop's last step succeeded (or it has not failed yet), 0 while it is failing.",
            ["loop"],
            registry=self.registry,
        )
        last_success = Gauge(
            "gpudra_background_last_success_timestamp_seconds",
            "Unix time at which the loop's last successful step ended (0: none yet). A watch loop's "
            "step lasts as long as its watch (up to 5 minutes).",
            ["loop"],
            registry=self.registry,
        )
        for loop in loops:
            failures.labels(loop.name).set_function(_failures_of(loop))
            healthy.labels(loop.name).set_function(_healthy_of(loop))
            last_success.labels(loop.name).set_function(_last_success_of(loop))


class _ApiRequests(Collector):
    """`gpudra_api_requests` from a daemon's `Kube.request_counts`: the load it puts on the API server."""

    def __init__(self, requests: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        self.requests = requests

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "gpudra_api_requests",
            "Requests to the API server since start, by verb and resource (failed ones included).",
            labels=["verb", "resource"],
        )
        for (verb, resource), count in sorted(self.requests().items()):
            family.add_metric([verb, resource], count)
        yield family


class _SkippedObjects(Collector):
    """`gpudra_skipped_objects` from `SkippedObjects.counts`: each object version once."""

    def __init__(self, skipped: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        self.skipped = skipped

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "gpudra_skipped_objects",
            "Objects left out since start because they nest too deeply or are too large to decode "
            "(reason too-deep, too-large), by resource; each version of an object counts once and is "
            "logged once with its namespace and name.",
            labels=["resource", "reason"],
        )
        for (resource, reason), count in sorted(self.skipped().items()):
            family.add_metric([resource, reason], count)
        yield family


def _passes(probe: Callable[[], str | None]) -> Callable[[], float]:
    def value() -> float:
        try:
            return float(probe() is None)
        except Exception:  # a broken probe fails its check, as on /readyz
            return 0.0

    return value


def _failures_of(loop: Loop) -> Callable[[], float]:
    return lambda: float(loop.failures)


def _healthy_of(loop: Loop) -> Callable[[], float]:
    return lambda: float(loop.last_error is None)


def _last_success_of(loop: Loop) -> Callable[[], float]:
    return lambda: loop.last_success or 0.0
