"""Runs the kubelet plugin: discovery, slices, claim reads, prepare state, device health, the kubelet's gRPC.
I/O: everything the plugin touches, wired here and nowhere else.

Start-up order matters: settle the checkpoint first (a crash may have left a prepare half done), then
start the health monitor, publish slices and open the sockets, registration socket last, so the kubelet
calls a ready plugin. Every background part is a `service.Service` started by `service.running`:
a part that fails to start stops the ones already started. Stop (SIGTERM) is the reverse order:
health streams end, no new calls, calls in flight finish, then the loops stop.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from gpudra import service, sim
from gpudra.gpu import nvml
from gpudra.gpu.tools import GpuTools
from gpudra.kube import client as kube
from gpudra.kube.claims import ClaimReader
from gpudra.kube.slice_sync import SliceController
from gpudra.model import devices
from gpudra.model.devices import MigMode
from gpudra.node import cdi, checkpoint
from gpudra.node.health import HealthMonitor
from gpudra.node.kubelet_grpc import KubeletServer, Observer
from gpudra.node.metrics import MetricsEndpoint, PluginMetrics
from gpudra.node.prepare import DeviceState
from gpudra.node.sharing import GpuSharing

log = logging.getLogger(__name__)
# Each service's share of shutdown: calls in flight finish, threads end.
STOP_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Options:
    node_name: str
    driver: str
    nvml: str
    mig_mode: MigMode
    kubeconfig: str | None
    registry_dir: Path
    plugin_dir: Path
    cdi_root: Path
    state_dir: Path
    toolkit_cdi_dirs: tuple[Path, ...]
    metrics_port: int
    metrics_address: str
    resync_seconds: float
    health_interval_seconds: float  # 0: no health service


def _tools(options: Options) -> GpuTools:
    if not options.nvml.startswith("sim:"):
        return GpuTools()
    state_file = nvml.sim_state_file(options.nvml)
    return GpuTools.with_directory_first(
        sim.write_tools(options.state_dir / "sim-tools", state_file=state_file)
    )


def run(options: Options, *, stop: threading.Event) -> None:
    options.state_dir.mkdir(parents=True, exist_ok=True)
    with nvml.connect(options.nvml) as session:
        inventory = session.inventory()
    model = devices.build_devices(inventory, mig_mode=options.mig_mode)
    log.info("discovered GPUs", extra={"gpus": len(inventory.gpus), "devices": len(model.devices)})

    client = kube.Kube(kube.connect(options.kubeconfig))
    metrics = PluginMetrics()
    claims = ClaimReader(client)
    state = DeviceState(
        driver=options.driver,
        node_name=options.node_name,
        inventory=inventory,
        devices={d["name"]: d for d in model.devices},
        claims=claims,
        sharing=GpuSharing(_tools(options)),
        cdi_root=options.cdi_root,
        checkpoint_path=options.state_dir / "checkpoint.json",
        boot_id=checkpoint.current_boot_id(),
        toolkit=cdi.ToolkitSpecs(options.toolkit_cdi_dirs),
    )
    state.recover()
    metrics.track_prepared(lambda: _counts(state))
    slices = SliceController(
        client,
        driver=options.driver,
        node_name=options.node_name,
        model=lambda: model,
        resync_seconds=options.resync_seconds,
        on_publish=lambda op: metrics.slice_writes.labels(op).inc(),
    )
    health = None
    if options.health_interval_seconds:
        health = HealthMonitor(
            pool=options.node_name,
            devices=model.devices,
            open_nvml=lambda: nvml.connect(options.nvml),
            interval=options.health_interval_seconds,
        )
    server = KubeletServer(
        driver=options.driver,
        backend=state,
        registry_dir=options.registry_dir,
        plugin_dir=options.plugin_dir,
        observer=Observer(prepared=metrics.observe_prepare, unprepared=metrics.observe_unprepare),
        health=health,
    )
    metrics.track_claim_reads(lambda: claims.gets)
    metrics.track_loops([slices.loop] + ([health.loop] if health is not None else []))
    services: list[service.Service] = []
    if options.metrics_port:
        services.append(
            MetricsEndpoint(metrics.registry, address=options.metrics_address, port=options.metrics_port)
        )
    if health is not None:
        services.append(health)
    # The kubelet's sockets last: it calls a plugin whose slices are already being published.
    services += [slices, server]
    with service.running(services, stop_timeout=STOP_TIMEOUT_SECONDS):
        stop.wait()
        log.info("stopping")


def _counts(state: DeviceState) -> tuple[int, int]:
    prepared = state.prepared_claims()
    return len(prepared), sum(len(entry.devices) for entry in prepared.values())
