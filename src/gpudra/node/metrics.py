"""Prometheus metrics of the kubelet plugin. I/O: an HTTP listener when a port is given.

Names are prefixed `gpudra_`; every series is created up front so dashboards see zeros, not gaps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from wsgiref.simple_server import WSGIServer

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

    def track_claim_reads(
        self, *, connected: Callable[[], bool], lists: Callable[[], int], gets: Callable[[], int]
    ) -> None:
        """The claim cache's state and its reads from the API server, read at scrape time."""
        Gauge(
            "gpudra_claim_watch_connected",
            "1 while the ResourceClaim watch is connected (prepare reads from the cache), else 0.",
            registry=self.registry,
        ).set_function(lambda: float(connected()))
        reads = Gauge(
            "gpudra_claim_api_reads",
            "ResourceClaim reads from the API server since start: list (relists), get (cache bypassed).",
            ["verb"],
            registry=self.registry,
        )
        reads.labels("list").set_function(lists)
        reads.labels("get").set_function(gets)

    def track_loop_failures(self, failures: Mapping[str, Callable[[], int]]) -> None:
        """Failed steps of each background loop since start (each failure was logged and retried)."""
        gauge = Gauge(
            "gpudra_background_failures",
            "Failed steps of a background loop since start, by loop; each is logged and retried.",
            ["loop"],
            registry=self.registry,
        )
        for name, count in failures.items():
            gauge.labels(name).set_function(count)

    def track_prepared(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Read (claims, devices) at scrape time, so the gauges can never drift from the checkpoint."""
        self.prepared_claims.set_function(lambda: counts()[0])
        self.prepared_devices.set_function(lambda: counts()[1])


class MetricsEndpoint:
    """The HTTP listener that serves a registry to Prometheus, as a `service.Service`."""

    def __init__(self, registry: CollectorRegistry, *, address: str, port: int) -> None:
        self.registry = registry
        self.address = address
        self.port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._server, self._thread = start_http_server(self.port, addr=self.address, registry=self.registry)

    def stop(self, timeout: float) -> None:
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout)
