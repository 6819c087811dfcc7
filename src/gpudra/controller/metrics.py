"""Prometheus metrics of the controller: the cluster's GPU picture, the leader (and, from
gpudra.runtime.metrics, the API load and the background loops). Pure but for the callbacks it reads at
each scrape.

The cluster series are built from the view at each scrape, so a node, claim or profile that is gone
leaves no stale series behind. Every replica exports them (each keeps the view); `gpudra_controller_leader`
tells which one writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from gpudra.runtime.metrics import Collector, Counter, DaemonMetrics, GaugeMetricFamily, Metric
from gpudra.scheduling.cluster_view import ClusterView

REVIEW_RESULTS = ("allowed", "denied", "error")


class ControllerMetrics(DaemonMetrics):
    def track_view(self, view: Callable[[], ClusterView]) -> None:
        self.registry.register(_View(view))

    def track_leader(self, leading: Callable[[], bool], transitions: Callable[[], int]) -> None:
        self.registry.register(_Leader(leading, transitions))

    def track_clock_skew(self, skew: Callable[[], float | None]) -> None:
        """This node's wall clock minus the API server's (its replies' Date), once it has answered."""
        self.registry.register(_ClockSkew(skew))

    def admission_reviews(self, kinds: Iterable[str]) -> Callable[[str, str], None]:
        """The webhook's answers (only a controller that serves the webhook exports them): call the
        result with the review's kind and result. The series of the `kinds` it judges start at 0, so
        the webhook-failing alert and the dashboard see a rate from the first scrape."""
        reviews = Counter(
            "gpudra_admission_reviews",
            "Admission reviews answered, by the kind of object and the result: allowed, denied (a bad "
            "gpudra config), error (a malformed review or a failure of the webhook).",
            ["kind", "result"],
            registry=self.registry,
        )
        for kind in kinds:
            for result in REVIEW_RESULTS:
                reviews.labels(kind, result)
        return lambda kind, result: reviews.labels(kind, result).inc()


class _View(Collector):
    def __init__(self, view: Callable[[], ClusterView]) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        view = self.view()
        gpus = GaugeMetricFamily(
            "gpudra_cluster_gpus",
            "Physical GPUs by node, product and state: published, allocated (a claim holds it or a part "
            "of it), shared (more than one claim or pod uses it), free, idle (allocated, every device on it "
            "reported without activity for the idle time), unhealthy (the GPU or a partition of it is "
            "unhealthy: tainted, or left out of the slices where the release drops device taints).",
            labels=["node", "product", "state"],
        )
        unhealthy: dict[tuple[str, str], set[str]] = {(row.node, row.product): set() for row in view.nodes}
        for bad in view.unhealthy:
            unhealthy.setdefault((bad.node, bad.product), set()).add(bad.uuid)
        for row in view.nodes:
            for state in ("gpus", "allocated", "shared", "free", "idle"):
                label = "published" if state == "gpus" else state
                gpus.add_metric([row.node, row.product, label], getattr(row, state))
        for (node, product), uuids in sorted(unhealthy.items()):
            gpus.add_metric([node, product, "unhealthy"], len(uuids))
        yield gpus
        room = GaugeMetricFamily(
            "gpudra_cluster_mig_largest_placeable_bytes",
            "Memory of the largest MIG partition still placeable on a MIG-capable GPU (0: none), with its "
            "profile.",
            labels=["node", "gpu", "product", "profile"],
        )
        for mig in view.mig:
            room.add_metric(
                [mig.node, mig.gpu, mig.product, mig.largest_placeable or ""], mig.largest_placeable_memory
            )
        yield room
        pending = GaugeMetricFamily(
            "gpudra_cluster_pending_claims",
            "ResourceClaims for this driver's DeviceClasses without an allocation, by namespace.",
            labels=["namespace"],
        )
        counts: dict[str, int] = {}
        for claim in view.pending:
            counts[claim.namespace] = counts.get(claim.namespace, 0) + 1
        for namespace, count in sorted(counts.items()):
            pending.add_metric([namespace], count)
        yield pending
        idle = GaugeMetricFamily(
            "gpudra_cluster_idle_device_seconds",
            "Seconds an allocated device has reported no activity, for those idle at least the idle time.",
            labels=["namespace", "claim", "pod", "node", "device"],
        )
        for device in view.idle:
            idle.add_metric(
                [device.namespace, device.claim, ",".join(device.pods), device.node, device.device],
                device.idle_seconds,
            )
        yield idle


class _ClockSkew(Collector):
    def __init__(self, skew: Callable[[], float | None]) -> None:
        self.skew = skew

    def collect(self) -> Iterator[Metric]:
        skew = self.skew()
        if skew is not None:
            yield GaugeMetricFamily(
                "gpudra_clock_skew_seconds",
                "This node's wall clock minus the API server's (the Date of its replies): the webhook's "
                "certificates are dated by the API server's, so a step here cannot make one it rejects.",
                value=skew,
            )


class _Leader(Collector):
    def __init__(self, leading: Callable[[], bool], transitions: Callable[[], int]) -> None:
        self.leading = leading
        self.transitions = transitions

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "gpudra_controller_leader", "1 while this replica leads (and alone writes).", value=self.leading()
        )
        yield GaugeMetricFamily(
            "gpudra_controller_leader_transitions",
            "How many times the Lease changed hands (its leaseTransitions, as this replica last saw it).",
            value=self.transitions(),
        )
