"""Prometheus metrics of the kubelet plugin (served by gpudra.http_endpoint). Pure but for reading clocks.

Names are prefixed `gpudra_`; every series is created up front so dashboards see zeros, not gaps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpudra.http_endpoint import ApiRequests
from gpudra.model.publishing import WITHHELD_FORMS
from gpudra.service import Loop

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


@dataclass(frozen=True)
class ClaimDeviceUsage:
    """One prepared device of a claim, as last sampled (gpudra.node.usage)."""

    namespace: str
    claim: str
    pods: tuple[str, ...]  # the pods that reserve the claim
    device: str
    gpu_uuid: str  # the UUID NVML was asked: the GPU's, or the MIG device's (MIG-…) for a partition
    utilization: int | None  # percent; None where NVML reports none (MIG devices)
    memory_used: int | None  # bytes; None when the sample failed
    idle_seconds: float | None  # 0 while active; None while unknown


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
        self.checkpoint_rebuilds = Counter(
            "gpudra_checkpoint_rebuilds",
            "Damaged checkpoints copied aside and replaced, their claims rebuilt from the CDI specs on disk.",
            registry=self.registry,
        )
        self.mps_daemon_restarts = Counter(
            "gpudra_mps_daemon_restarts",
            "MPS control daemons of prepared claims found stopped and started again with the claims' "
            "limits (outcome started), and attempts that failed (outcome failed; retried).",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in ("started", "failed"):
            self.mps_daemon_restarts.labels(outcome)
        self.publishing_withheld = Gauge(
            "gpudra_publishing_withheld",
            "1 for each form of this node's GPUs that its options offer but the cluster cannot keep "
            "exclusive (the API server drops the fields, or its scheduler does not count them), so it is "
            "not published; 0 otherwise.",
            ["form"],
            registry=self.registry,
        )
        for form in WITHHELD_FORMS:
            self.publishing_withheld.labels(form)

    def observe_prepare(self, outcome: str, seconds: float) -> None:
        self.prepare_seconds.labels(outcome).observe(seconds)
        if outcome != "ok":
            self.errors.labels("prepare", outcome).inc()

    def observe_unprepare(self, outcome: str, seconds: float) -> None:
        self.unprepare_seconds.labels(outcome).observe(seconds)
        if outcome != "ok":
            self.errors.labels("unprepare", outcome).inc()

    def track_api_requests(self, requests: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        """API requests this plugin made since start, by verb and resource, read at scrape time."""
        self.registry.register(ApiRequests(requests))

    def track_claim_reads(self, gets: Callable[[], int]) -> None:
        """ResourceClaim reads from the API server since start (one GET per claim prepared)."""
        Gauge(
            "gpudra_claim_reads",
            "ResourceClaims read from the API server since start: one GET per claim prepared.",
            registry=self.registry,
        ).set_function(gets)

    def track_loops(self, loops: Sequence[Loop]) -> None:
        """Each background loop's failed steps since start, and whether its last step succeeded."""
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
        for loop in loops:
            failures.labels(loop.name).set_function(_failures_of(loop))
            healthy.labels(loop.name).set_function(_healthy_of(loop))

    def track_checkpoint(self, refusal: Callable[[], str | None]) -> None:
        """Whether the checkpoint is usable (0: the plugin refuses every claim; /readyz says why), and
        how many damaged checkpoints were copied aside and rebuilt from the CDI specs."""
        Gauge(
            "gpudra_checkpoint_usable",
            "1 when the checkpoint was loaded; 0 while it cannot be used and every claim is refused.",
            registry=self.registry,
        ).set_function(lambda: float(refusal() is None))

    def track_prepared(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Read (claims, devices) at scrape time, so the gauges can never drift from the checkpoint."""
        self.prepared_claims.set_function(lambda: counts()[0])
        self.prepared_devices.set_function(lambda: counts()[1])

    def track_mig_room(self, room: Callable[[], Mapping[str, tuple[str, int]]]) -> None:
        """Per MIG-capable GPU, the largest MIG profile still placeable beside the prepared partitions."""
        self.registry.register(_MigRoom(room))

    def track_claim_usage(self, usage: Callable[[], Iterable[ClaimDeviceUsage]]) -> None:
        """Per prepared device of each claim: GPU utilization, memory used, and how long it has been idle."""
        self.registry.register(_ClaimUsage(usage))


class _ClaimUsage(Collector):
    def __init__(self, usage: Callable[[], Iterable[ClaimDeviceUsage]]) -> None:
        self.usage = usage

    def collect(self) -> Iterator[Metric]:
        # Built at each scrape from the latest samples: an unprepared claim's series end with it, and a
        # figure NVML does not give is no series rather than a fake 0.
        labels = ["namespace", "claim", "pod", "device", "gpu_uuid"]
        utilization = GaugeMetricFamily(
            "gpudra_claim_gpu_utilization_percent",
            "Percent of NVML's last sample period in which a kernel ran on the claim's GPU (none for MIG "
            "devices; a shared GPU shows the whole GPU's on each claim).",
            labels=labels,
        )
        memory = GaugeMetricFamily(
            "gpudra_claim_gpu_memory_used_bytes",
            "Memory used on the claim's GPU or MIG device (a shared GPU shows the whole GPU's).",
            labels=labels,
        )
        idle = GaugeMetricFamily(
            "gpudra_claim_idle_seconds",
            "Seconds since the claim's device last showed activity in a sample (0: active now).",
            labels=labels,
        )
        for row in self.usage():
            values = [row.namespace, row.claim, ",".join(sorted(row.pods)), row.device, row.gpu_uuid]
            if row.utilization is not None:
                utilization.add_metric(values, row.utilization)
            if row.memory_used is not None:
                memory.add_metric(values, row.memory_used)
            if row.idle_seconds is not None:
                idle.add_metric(values, row.idle_seconds)
        yield from (utilization, memory, idle)


class _MigRoom(Collector):
    def __init__(self, room: Callable[[], Mapping[str, tuple[str, int]]]) -> None:
        self.room = room

    def collect(self) -> Iterator[Metric]:
        # The profile is a label, so a dashboard shows "3g.40gb" rather than a number; built at each
        # scrape, so a profile that no longer fits leaves no stale series behind.
        family = GaugeMetricFamily(
            "gpudra_mig_largest_placeable_slices",
            "GPU slices of the largest MIG profile that still fits beside the partitions prepared on this "
            "GPU (0: none fits, or the whole GPU is prepared), by GPU and that profile.",
            labels=["gpu", "profile"],
        )
        for gpu, (profile, slices) in sorted(self.room().items()):
            family.add_metric([gpu, profile], slices)
        yield family


def _failures_of(loop: Loop) -> Callable[[], float]:
    return lambda: float(loop.failures)


def _healthy_of(loop: Loop) -> Callable[[], float]:
    return lambda: float(loop.last_error is None)
