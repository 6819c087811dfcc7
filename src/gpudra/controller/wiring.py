"""Wires `gpudra controller`: the cluster watches, leader election, the admission webhook and its
certificates, housekeeping, metrics, and `/status` and the GPU map page (`/`, `/gpu-map.json`) on the
webhook's HTTPS port behind TokenReview and SubjectAccessReview (gpudra.controller.status_access). I/O:
everything the controller touches, wired here and nowhere else.

Every replica watches the cluster, serves the webhook (reviews write nothing) and answers `/status`,
`/metrics` and the GPU map; only the leader writes (the webhook's Secret and configuration,
housekeeping), and each writer asks `is_leader()` right before each write. Every part is a
`service.Service` started by `service.running` in order (a part that fails to start stops those
already started) and stopped in reverse on SIGTERM: the leader stops last but one, releasing the Lease
so the other replica takes over at once.
"""

from __future__ import annotations

import ctypes
import logging
import threading

from gpudra import build
from gpudra.controller.cluster import ClusterWatch
from gpudra.controller.gpu_map_page import PATHS, GpuMapPage
from gpudra.controller.housekeeping import Housekeeping
from gpudra.controller.leader import LeaderElector
from gpudra.controller.metrics import ControllerMetrics
from gpudra.controller.options import ControllerOptions
from gpudra.controller.status_access import StatusAccess, StatusPages
from gpudra.controller.webhook import JUDGED_KINDS, WebhookServer
from gpudra.controller.webhook_tls import CertificateKeeper
from gpudra.kube import client as kube
from gpudra.kube.access_review import AccessReviews
from gpudra.kube.admission import AdmissionObjects, cluster_role_owner
from gpudra.kube.claim_status import ClaimStatus
from gpudra.kube.lease import Leases
from gpudra.model.tolerant import mapping, text
from gpudra.runtime import service
from gpudra.runtime.http_endpoint import Check, HttpEndpoint, loops_alive

log = logging.getLogger(__name__)
STOP_TIMEOUT_SECONDS = 5.0
# glibc gives each thread that allocates while another does an arena of its own (up to 8 per core) and
# keeps what is freed in it: with the webhook's connection threads each reading and decoding reviews of
# megabytes, a controller peaked at 182-265 MiB under 32 reviews of 3 MiB at once, 108-122 MiB with two
# arenas (tests/integration/test_webhook_memory.py; 150 MiB since up to 16 bodies are read ahead of the
# decode bound), against the chart's 256 Mi limit. mallopt(3)'s
# M_ARENA_MAX, set before any thread starts; a libc without mallopt (musl) is left as it is.
M_ARENA_MAX = -8
MALLOC_ARENAS = 2


def few_malloc_arenas() -> None:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_ARENA_MAX, MALLOC_ARENAS)


def run(options: ControllerOptions, *, stop: threading.Event) -> None:
    few_malloc_arenas()
    client = kube.Kube(kube.connect(options.kubeconfig))
    role = options.owner_cluster_role
    owners = [cluster_role_owner(client, role)] if role else []
    cluster = ClusterWatch(
        client,
        driver=options.driver,
        idle_after_seconds=options.idle_after_seconds,
        server_minor=client.server_minor,
    )
    elector = LeaderElector(
        Leases(client, owners=owners),
        namespace=options.namespace,
        name=options.lease_name,
        identity=options.identity,
        lease_seconds=options.lease_seconds,
    )
    statuses = ClaimStatus(client)
    housekeeping = Housekeeping(
        driver=options.driver,
        claims=cluster.claims.objects,
        slices=cluster.slices.objects,
        synced=cluster.synced,
        is_leader=elector.is_leader,
        clear=statuses.replace_devices,
    )
    cluster.on_slices_change.append(housekeeping.wake)
    metrics = ControllerMetrics()
    metrics.track_view(cluster.view)
    metrics.track_leader(elector.is_leader, lambda: elector.transitions)
    metrics.track_api_requests(client.request_counts)
    metrics.track_skipped_objects(client.skipped.counts)
    metrics.track_clock_skew(client.clock.skew_seconds)
    loops = [*(i.loop for i in cluster.informers), elector.loop, housekeeping.loop]
    readiness = [Check("cluster-watches", cluster.current)]
    services: list[service.Service] = [cluster, elector]
    if options.webhook_port:
        pages = StatusPages(
            StatusAccess(AccessReviews(client)),
            view=cluster.view,
            namespaces=lambda: {
                text(mapping(c.get("metadata")).get("namespace")) for c in cluster.claims.objects()
            },
            map_app=GpuMapPage(cluster.survey).app if options.gpu_map else None,
            map_paths=PATHS,
        )
        webhook = WebhookServer(
            address=options.webhook_address,
            port=options.webhook_port,
            driver=options.driver,
            warnings=cluster.warnings,
            count_review=metrics.admission_reviews(JUDGED_KINDS),
            skipped=client.skipped.record,
            pages=pages.app,
        )
        keeper = CertificateKeeper(
            AdmissionObjects(client, owners=owners),
            options,
            webhook,
            is_leader=elector.is_leader,
            clock=client.clock.now,  # the API server's time: it judges the certificate by it
            warned_classes=cluster.warned_classes,
        )
        cluster.on_classes_change.append(keeper.loop.wake)
        loops.append(keeper.loop)
        readiness.append(Check("webhook", webhook.problem))
        services += [webhook, keeper]
    services.append(housekeeping)
    metrics.track_loops(loops)
    metrics.track_readiness("controller", {check.name: check.probe for check in readiness})
    if options.metrics_port:
        endpoint = HttpEndpoint(
            metrics.registry,
            address=options.metrics_address,
            port=options.metrics_port,
            liveness=loops_alive(loops),
            readiness=readiness,
        )
        services.insert(0, endpoint)
    log.info(
        "starting",
        extra={
            "version": build.version(),
            "revision": build.revision(),
            "identity": options.identity,
            "namespace": options.namespace,
        },
    )
    with service.running(services, stop_timeout=STOP_TIMEOUT_SECONDS):
        stop.wait()
        log.info("stopping")
