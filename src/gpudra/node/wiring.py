"""Wires the kubelet plugin's parts: discovery, slices, claim reads, prepare state, MPS daemons, device
health, claim usage, metrics.
I/O: everything the plugin touches, wired here and nowhere else (the sockets are opened by `daemon`).

Start-up order matters: settle the checkpoint first (a crash may have left a prepare half done), then
start the health monitor and the slice publishing, then hand the prepare state to the kubelet's server,
whose calls waited until then. While another instance runs on the node (a rolling update), recovery
waits for its calls in flight, and the slice publishing, claim usage and GPU fault recording (Node
events, the health file) wait until it exits (gpudra.node.instances, gpudra.node.health.gpu_faults). Every
background part is a `service.Service` started by `service.running`: a part that fails to start stops
the ones already started. Stop (SIGTERM): health streams end, no new calls, calls in flight finish (the
server stops first), then the loops stop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpudra import build
from gpudra.gpu import driver_root, nvml
from gpudra.gpu.tools import GpuTools
from gpudra.kube import client as kube
from gpudra.kube import field_probe
from gpudra.kube.claim_status import ClaimStatus
from gpudra.kube.claims import ClaimReader
from gpudra.kube.events import NodeEvents
from gpudra.kube.slice_sync import SliceController
from gpudra.model import devices
from gpudra.model.gpu_health import CLEAR_ANNOTATION
from gpudra.node import cdi, checkpoint, gpu_driver
from gpudra.node.dra_service import Observer
from gpudra.node.health.foreign_mig import ForeignMig
from gpudra.node.health.gpu_faults import GpuFaults
from gpudra.node.health.monitor import HealthMonitor
from gpudra.node.instances import PublisherTurn
from gpudra.node.kubelet_grpc import KubeletServer
from gpudra.node.metrics import PluginMetrics
from gpudra.node.mig import MigPartitions
from gpudra.node.mps_keeper import MpsKeeper, TamperingReports
from gpudra.node.options import PluginOptions
from gpudra.node.prepare import DeviceState
from gpudra.node.recovery import Recovery, recover
from gpudra.node.served_model import ServedModel
from gpudra.node.sharing import SharingCoordinator
from gpudra.node.usage import ClaimUsage
from gpudra.runtime import service
from gpudra.runtime.http_endpoint import Check, HttpEndpoint, loops_alive, writable_directory

log = logging.getLogger(__name__)
# Each service's share of shutdown: calls in flight finish, threads end.
STOP_TIMEOUT_SECONDS = 5.0
# How often a refused checkpoint is read again, so the plugin serves within seconds of the operator's fix.
CHECKPOINT_RETRY_SECONDS = 10.0
# Nothing to do for the checkpoint loop once the checkpoint is in use; wake() is not needed either.
IDLE_SECONDS = 3600.0


def _tools(options: PluginOptions) -> GpuTools:
    return gpu_driver.tools(
        options.nvml, driver_root=options.driver_root, directory=options.state_dir / "sim-tools"
    )


def _log_mps_reach(options: PluginOptions) -> None:
    """Whether the state directory, where MPS daemons keep their pipes, is the same directory inside a
    driver root other than `/`, where the daemons run (gpudra.gpu.driver_root): said once at start, so
    that an operator sees a missing mount before the first MPS claim fails on it."""
    if driver_root.is_host(options.driver_root):
        return
    where = {"driver_root": str(options.driver_root), "state_dir": str(options.state_dir)}
    if driver_root.shared(options.driver_root, options.state_dir):
        log.info("the state directory is at its own path inside the driver root: MPS can run", extra=where)
    else:
        log.warning(
            "the state directory is not the same writable directory inside the driver root: MPS claims "
            "and shares will fail (mount it at <driver root><state dir>, as the Helm chart does)",
            extra=where,
        )


def run(options: PluginOptions, server: KubeletServer, *, stop: threading.Event) -> None:
    """Build the plugin, hand it to `server` (started, its calls waiting), and run until `stop`."""
    log.info(
        "starting",
        extra={
            "version": build.version(),
            "revision": build.revision(),
            "node": options.node_name,
            "driver": options.driver,
        },
    )
    dev_dir = gpu_driver.device_node_dir(options.nvml, options.dev_root)
    if dev_dir is not None:
        # Before the first claim: the runtime stats the nodes a spec names when it starts a container.
        made = gpu_driver.write_device_nodes(options.nvml, dev_dir)
        log.info("simulated device nodes ready", extra={"directory": str(dev_dir), "nodes": len(made)})
    # One NVML session for the plugin's life: MIG prepare uses it from the gRPC threads (NVML is
    # thread-safe; opening it per call costs an init and handle lookups each time).
    with gpu_driver.connect(options.nvml, driver_root=options.driver_root) as session:
        _run(options, session, server, stop=stop)


def _run(options: PluginOptions, session: nvml.Nvml, server: KubeletServer, *, stop: threading.Event) -> None:
    inventory = session.inventory()
    model = devices.publish(inventory, options.publishing)
    log.info(
        "discovered GPUs",
        extra={
            "gpus": len(inventory.gpus),
            "devices": len(model.devices),
            "counter_sets": len(model.counter_sets),
            "publishing": options.publishing.describe(),
        },
    )
    _log_mps_reach(options)

    client = kube.Kube(kube.connect(options.kubeconfig))
    events = NodeEvents(client, node_name=options.node_name)
    metrics = PluginMetrics()
    claims = ClaimReader(client)
    tampering = TamperingReports(metrics=metrics, events=events)
    state = DeviceState(
        driver=options.driver,
        node_name=options.node_name,
        inventory=inventory,
        devices={d["name"]: d for d in model.devices},
        claims=claims,
        sharing=SharingCoordinator(
            _tools(options),
            mps_root=options.state_dir / "mps",
            mps_host=options.mps_host_socket,
            on_tampering=tampering,
            on_shared_pipe=lambda _root: metrics.mps_shared_pipe_commands.inc(),
        ),
        mig=MigPartitions(session, gpus={gpu.uuid: gpu for gpu in inventory.gpus}),
        cdi_root=options.cdi_root,
        checkpoint_path=options.state_dir / "checkpoint.json",
        boot_id=checkpoint.current_boot_id(),
        toolkit=cdi.ToolkitSpecs(options.toolkit_cdi_dirs),
        dev_root=options.dev_root,
        post_event=events.post,
    )
    tampering.claims = lambda: state.store.current.claims
    _report_recovery(recover(state), events, metrics)
    retry_checkpoint = service.Loop("checkpoint", lambda: _retry_recovery(state, events, metrics))
    metrics.track_prepared(lambda: _counts(state))
    metrics.track_checkpoint(lambda: state.refusal)
    metrics.track_mig_room(state.mig_room)
    served = ServedModel(
        inventory,
        options.publishing,
        model=model,
        probe=lambda minor: field_probe.probe(
            client, driver=options.driver, node_name=options.node_name, minor=minor
        ),
        events=events,
        withheld_gauge=lambda form, on: metrics.publishing_withheld.labels(form).set(1 if on else 0),
        on_model=lambda fitted: state.published.update({d["name"]: d for d in fitted.devices}),
    )
    # MIG instances made outside gpudra: the devices they exclude are left out of the slices.
    foreign = ForeignMig(
        devices=model.devices,
        gpus=inventory.gpus,
        hardware=session,
        claims=lambda: state.store.current.claims,
        mig_mode=options.publishing.mig_mode,
        interval=options.health_interval_seconds or options.resync_seconds,
        events=events,
        metrics=metrics,
    )
    slices = SliceController(
        client,
        driver=options.driver,
        node_name=options.node_name,
        # Unhealthy devices are published tainted; `health` is bound below, before anything starts.
        model=lambda: devices.without_devices(
            served.model(health.taints(), health.messages()) if health else served.model({}),
            foreign.withheld().keys(),
        ),
        resync_seconds=options.resync_seconds,
        on_publish=lambda op: metrics.slice_writes.labels(op).inc(),
        on_server_minor=served.on_server,
    )
    # Every instance on the node keeps daemons (not only the publishing one): after a rolling update
    # the new one must start those that died with the old pod; restarts take the node lock.
    keeper = None
    if options.mps_check_interval_seconds:
        keeper = MpsKeeper(state, interval=options.mps_check_interval_seconds, metrics=metrics, events=events)
    foreign.subscribe(slices.trigger)
    health = faults = None
    if options.health_interval_seconds:
        faults = _faults(
            options,
            model.devices,
            state=state,
            client=client,
            events=events,
            metrics=metrics,
            taints_kept=served.taints_kept,
        )
        faults.subscribe_mig_change(foreign.loop.wake)
        health = HealthMonitor(
            pool=options.node_name,
            devices=model.devices,
            open_nvml=lambda: gpu_driver.connect(options.nvml, driver_root=options.driver_root),
            interval=options.health_interval_seconds,
            on_change=slices.trigger,
            partitions=state.prepared_partitions,
            faults=faults,
            interrupted=keeper.interrupted_devices if keeper is not None else dict,
        )
        if keeper is not None:
            keeper.on_interrupted = health.loop.wake
    # Zeros where health is off: the series is there, an alert on it quiet.
    metrics.track_tainted_devices(health.taints if health is not None else dict)
    usage = None
    if options.usage_interval_seconds:
        usage = ClaimUsage(
            driver=options.driver,
            node_name=options.node_name,
            claims=state.prepared_claims,
            devices=state.devices,
            probe=session,
            api=ClaimStatus(client),
            interval=options.usage_interval_seconds,
        )
        metrics.track_claim_usage(usage.readings)
    metrics.track_claim_reads(lambda: claims.gets)
    metrics.track_api_requests(client.request_counts)
    metrics.track_skipped_objects(client.skipped.counts)
    loops = [*slices.loops, events.loop, retry_checkpoint] + (
        list(health.loops) if health is not None else []
    )
    loops += [usage.loop] if usage is not None else []
    loops += [foreign.loop]
    loops += [keeper.loop] if keeper is not None else []
    metrics.track_loops(loops)
    # What it writes to the API server, and the GPU faults' events and health file, one instance on the
    # node at a time (gpudra.node.instances). The faults' turn first: the slices start from the marks
    # the previous instance left.
    publishing = PublisherTurn(
        options.state_dir / "publisher.lock",
        ([faults.turn] if faults is not None else [])
        + ([usage] if usage is not None else [])
        + [foreign, slices],
    )

    def slices_published() -> str | None:
        # Standing by, the instance that publishes is alive: a rolling update must go on.
        return None if slices.synced.is_set() or publishing.standing_by else "not published yet"

    readiness = [
        Check("checkpoint", lambda: state.refusal),
        Check("kubelet-registration", server.registration_problem),
        Check("kubelet-calls", server.serving),
        Check("resourceslices", slices_published),
        Check("cdi-root", writable_directory(options.cdi_root)),
        Check("state-dir", writable_directory(options.state_dir)),
    ]
    metrics.track_readiness("kubelet-plugin", {check.name: check.probe for check in readiness})
    services: list[service.Service] = []
    if options.metrics_port:
        services.append(
            HttpEndpoint(
                metrics.registry,
                address=options.metrics_address,
                port=options.metrics_port,
                liveness=loops_alive(loops),
                readiness=readiness,
            )
        )
    services += [events, retry_checkpoint]
    if health is not None:
        services.append(health)
    if keeper is not None:
        services.append(keeper)
    services.append(publishing)
    with service.running(services, stop_timeout=STOP_TIMEOUT_SECONDS):
        # The kubelet's calls, waiting since the sockets opened, are answered from here on.
        server.serve(
            state,
            observer=Observer(prepared=metrics.observe_prepare, unprepared=metrics.observe_unprepare),
            health=health,
        )
        log.info("serving claims", extra={"prepared_claims": len(state.prepared_claims())})
        stop.wait()
        log.info("stopping")
        server.stop(STOP_TIMEOUT_SECONDS)  # first: no new calls, those in flight finish, streams end


def _faults(
    options: PluginOptions,
    published: list[devices.Device],
    *,
    state: DeviceState,
    client: kube.Kube,
    events: NodeEvents,
    metrics: PluginMetrics,
    taints_kept: Callable[[], bool],
) -> GpuFaults:
    log.info("GPU fault classes", extra={"xids": options.health_xids.describe()})
    return GpuFaults(
        devices=published,
        open_nvml=lambda: gpu_driver.connect(options.nvml, driver_root=options.driver_root),
        classification=options.health_xids,
        clean_seconds=options.health_recovery_seconds,
        reset_effect=options.health_reset_effect,
        state_file=options.state_dir / "health.json",
        boot_id=checkpoint.current_boot_id(),
        events=events,
        metrics=metrics,
        holders=lambda gpu, device: _holders(state, gpu, device),
        writing=False,  # until its turn (below) starts: another instance on the node may write
        read_annotation=lambda: client.node_annotation(options.node_name, CLEAR_ANNOTATION),
        taints_kept=taints_kept,
    )


def _holders(state: DeviceState, gpu_uuid: str, device: str | None) -> list[str]:
    """namespace/name of the prepared claims holding the device, or any device of the GPU."""
    return sorted(
        f"{entry.namespace}/{entry.name}"
        for entry in state.prepared_claims().values()
        if any(d.device == device if device else gpu_uuid in d.gpu_uuids for d in entry.devices)
    )


def _counts(state: DeviceState) -> tuple[int, int]:
    prepared = state.prepared_claims()
    return len(prepared), sum(len(entry.devices) for entry in prepared.values())


def _report_recovery(recovery: Recovery, events: NodeEvents, metrics: PluginMetrics) -> None:
    """Tell the operator (log, Node event, metric) what recovering the checkpoint found."""
    if recovery.refused is not None:
        log.error("checkpoint cannot be used; refusing every claim", extra={"error": recovery.refused})
        events.post(
            "Warning", "CheckpointRefused", f"gpudra refuses every claim on this node: {recovery.refused}"
        )
    elif recovery.damage is not None:
        metrics.checkpoint_rebuilds.inc()
        events.post(
            "Warning",
            "CheckpointRebuilt",
            f"gpudra's checkpoint was damaged ({recovery.damage}); a copy is at {recovery.copied_to} "
            f"and {recovery.rebuilt} prepared claim(s) were rebuilt from their CDI specs",
        )


def _retry_recovery(state: DeviceState, events: NodeEvents, metrics: PluginMetrics) -> float:
    """While the checkpoint is refused, read it again now and then: the operator's fix (moving a
    newer gpudra's file away, fixing a mount or permissions) takes effect without a restart."""
    if state.refusal is None:
        return IDLE_SECONDS
    recovery = recover(state)
    if recovery.refused is not None:
        return CHECKPOINT_RETRY_SECONDS
    _report_recovery(recovery, events, metrics)
    log.info("checkpoint usable again; serving claims")
    events.post("Normal", "CheckpointRecovered", "gpudra's checkpoint is usable again; claims are served")
    return IDLE_SECONDS
