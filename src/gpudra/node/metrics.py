"""Prometheus metrics of the kubelet plugin. I/O: an HTTP listener when a port is given.

Names are prefixed `gpudra_`; every series is created up front so dashboards see zeros, not gaps.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.prepare_seconds = Histogram(
            "gpudra_prepare_seconds",
            "Time to prepare one claim.",
            ["outcome"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.unprepare_seconds = Histogram(
            "gpudra_unprepare_seconds",
            "Time to unprepare one claim.",
            ["outcome"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.errors = Counter(
            "gpudra_claim_errors",
            "Claims whose prepare or unprepare failed, by reason.",
            ["operation", "reason"],
            registry=self.registry,
        )
        self.prepared_claims = Gauge(
            "gpudra_prepared_claims", "Claims prepared on this node.", registry=self.registry
        )
        self.prepared_devices = Gauge(
            "gpudra_prepared_devices", "Devices prepared on this node.", registry=self.registry
        )
        self.slice_writes = Counter(
            "gpudra_resourceslice_writes",
            "ResourceSlice writes, by operation.",
            ["operation"],
            registry=self.registry,
        )
        for op in ("create", "update", "delete"):
            self.slice_writes.labels(op)

    def observe_prepare(self, outcome: str, seconds: float) -> None:
        self.prepare_seconds.labels(outcome).observe(seconds)
        if outcome != "ok":
            self.errors.labels("prepare", outcome).inc()

    def observe_unprepare(self, outcome: str, seconds: float) -> None:
        self.unprepare_seconds.labels(outcome).observe(seconds)
        if outcome != "ok":
            self.errors.labels("unprepare", outcome).inc()

    def track_prepared(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Read (claims, devices) at scrape time, so the gauges can never drift from the checkpoint."""
        self.prepared_claims.set_function(lambda: counts()[0])
        self.prepared_devices.set_function(lambda: counts()[1])

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        start_http_server(port, addr=address, registry=self.registry)
