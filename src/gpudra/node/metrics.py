"""Prometheus metrics of the kubelet plugin (served by gpudra.runtime.http_endpoint). Pure but for reading
clocks.

Names are prefixed `gpudra_`; every series is created up front so dashboards see zeros, not gaps. The
series both daemons export (API requests, background loops) come from gpudra.runtime.metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from gpudra.model.devices import DeviceTaint
from gpudra.model.gpu_health import CLOCK_SLOWDOWNS, TAINT_EFFECTS
from gpudra.model.publishing import WITHHELD_FORMS
from gpudra.node.sharing.mps_daemons import TAMPERING_KINDS
from gpudra.runtime.metrics import (
    Collector,
    CollectorRegistry,
    Counter,
    DaemonMetrics,
    Gauge,
    GaugeMetricFamily,
    Histogram,
    Metric,
)

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


class PluginMetrics(DaemonMetrics):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
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
        self.mps_tampering = Counter(
            "gpudra_mps_tampering",
            "Changes the containers of an MPS claim made in its pipe directory that gpudra found, by kind "
            "(the pid file removed, replaced by something that is not a regular file, or naming another "
            "process; the control socket replaced). gpudra trusts nothing there: it finds and stops the "
            "daemon by its own record.",
            ["kind"],
            registry=self.registry,
        )
        for kind in TAMPERING_KINDS:
            self.mps_tampering.labels(kind)
        self.mps_shared_pipe_commands = Counter(
            "gpudra_mps_shared_pipe_commands",
            "Commands to MPS control daemons sent through the claim's shared pipe directory because the "
            "driver's nvidia-cuda-mps-control did not reach the daemon through gpudra's private links to "
            "its checked sockets. Not 0: on this driver a container can swap the control socket between "
            "gpudra's check and the tool's connect (gpudra.node.sharing.mps_daemons).",
            registry=self.registry,
        )
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
        self.xid_errors = Counter(
            "gpudra_gpu_xid_errors",
            "XID errors NVML reported, by GPU (device name) and XID, application errors included "
            "(gpudra.model.gpu_health says which taint the GPU).",
            ["gpu", "xid"],
            registry=self.registry,
        )
        self.double_bit_ecc_errors = Counter(
            "gpudra_gpu_double_bit_ecc_errors",
            "Double-bit (uncorrectable) ECC errors seen, by GPU: from NVML events, or from the uncorrected "
            "count on GPUs that offer no ECC events.",
            ["gpu"],
            registry=self.registry,
        )
        self.events_monitored = Gauge(
            "gpudra_gpu_events_monitored",
            "1 when the GPU's XID events are watched; 0 when it offers none (NOT_SUPPORTED) and its health "
            "is polled only.",
            ["gpu"],
            registry=self.registry,
        )
        self.gpu_condition = Gauge(
            "gpudra_gpu_condition",
            "1 while the health poll reads the condition on the GPU, 0 when it reads it absent: "
            "RowRemapPending, RetiredPagesPending (a memory repair waits for a reset), RowRemapFailure, "
            "NvLinkDown (a link that was up is down). Only the conditions the GPU reports.",
            ["gpu", "condition"],
            registry=self.registry,
        )
        self.gpu_events = Counter(
            "gpudra_gpu_events",
            "NVML events that are not faults, by GPU and type: single_bit_ecc (a corrected ECC error), "
            "mig_config_change (MIG instances made or destroyed, by gpudra or anyone).",
            ["gpu", "type"],
            registry=self.registry,
        )
        self.foreign_mig = Gauge(
            "gpudra_mig_foreign_instances",
            "MIG GPU instances on the GPU that gpudra did not create (made by hand or by another tool); "
            "the devices they exclude are not offered (gpudra.node.health.foreign_mig).",
            ["gpu"],
            registry=self.registry,
        )
        self.clock_slowdown = Gauge(
            "gpudra_gpu_clock_slowdown",
            "1 while the reason holds the GPU's clocks down at the health poll (NVML's clocks event "
            "reasons): sw_power_cap, hw_slowdown, sw_thermal_slowdown, hw_thermal_slowdown, "
            "hw_power_brake_slowdown. Never a fault.",
            ["gpu", "reason"],
            registry=self.registry,
        )

    def track_tainted_devices(self, taints: Callable[[], Mapping[str, DeviceTaint]]) -> None:
        """Published devices tainted for their health (gpudra.node.health), by effect, read at scrape
        time: the GPU-unhealthy alert's series, 0 on a healthy node."""
        tainted = Gauge(
            "gpudra_tainted_devices",
            "Devices this node publishes with a health taint (a lost GPU, or an XID or ECC fault on it or "
            "its MIG partition; docs/health.md), by the taint's effect.",
            ["effect"],
            registry=self.registry,
        )
        for effect in TAINT_EFFECTS:
            tainted.labels(effect).set_function(_count_effect(taints, effect))

    def count_xid(self, gpu: str, xid: int) -> None:
        self.xid_errors.labels(gpu, str(xid)).inc()

    def count_double_bit_ecc(self, gpu: str) -> None:
        self.double_bit_ecc_errors.labels(gpu).inc()

    def set_events_monitored(self, gpu: str, monitored: bool) -> None:
        self.events_monitored.labels(gpu).set(1 if monitored else 0)

    def set_condition(self, gpu: str, condition: str, present: bool) -> None:
        self.gpu_condition.labels(gpu, condition).set(1 if present else 0)

    def count_event(self, gpu: str, kind: str) -> None:
        self.gpu_events.labels(gpu, kind).inc()

    def set_foreign_mig(self, gpu: str, count: int) -> None:
        self.foreign_mig.labels(gpu).set(count)

    def set_clock_slowdowns(self, gpu: str, reasons: frozenset[str]) -> None:
        for reason in CLOCK_SLOWDOWNS:
            self.clock_slowdown.labels(gpu, reason).set(1 if reason in reasons else 0)

    def observe_prepare(self, outcome: str, seconds: float) -> None:
        self.prepare_seconds.labels(outcome).observe(seconds)
        if outcome != "ok":
            self.errors.labels("prepare", outcome).inc()

    def observe_unprepare(self, outcome: str, seconds: float) -> None:
        self.unprepare_seconds.labels(outcome).observe(seconds)
        if outcome != "ok":
            self.errors.labels("unprepare", outcome).inc()

    def track_claim_reads(self, gets: Callable[[], int]) -> None:
        """ResourceClaim reads from the API server since start (one GET per claim prepared)."""
        Gauge(
            "gpudra_claim_reads",
            "ResourceClaims read from the API server since start: one GET per claim prepared.",
            registry=self.registry,
        ).set_function(gets)

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


def _count_effect(taints: Callable[[], Mapping[str, DeviceTaint]], effect: str) -> Callable[[], float]:
    return lambda: float(sum(1 for taint in taints().values() if taint["effect"] == effect))


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
