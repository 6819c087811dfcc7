"""Runs the kubelet plugin: discovery, slices, claim cache, prepare state, device health, the kubelet's gRPC.
I/O: everything the plugin touches, wired here and nowhere else.

Start-up order matters: settle the checkpoint first (a crash may have left a prepare half done), then
start the health monitor, publish slices and open the sockets, registration socket last, so the kubelet
calls a ready plugin. Stop (SIGTERM) is the reverse: health streams end, no new calls, calls in flight
finish, then the threads stop.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from gpudra import sim
from gpudra.gpu import nvml
from gpudra.gpu.tools import GpuTools
from gpudra.kube import client as kube
from gpudra.kube.claim_cache import ClaimCache
from gpudra.kube.slice_sync import SliceController
from gpudra.model import devices
from gpudra.model.devices import MigMode
from gpudra.node import cdi, checkpoint
from gpudra.node.health import HealthMonitor
from gpudra.node.kubelet_grpc import KubeletServer, Observer
from gpudra.node.metrics import PluginMetrics
from gpudra.node.prepare import DeviceState
from gpudra.node.sharing import GpuSharing

log = logging.getLogger(__name__)


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
    claims = ClaimCache(client, driver=options.driver, pool=options.node_name)
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
    if options.metrics_port:
        metrics.serve(options.metrics_port)
    if health is not None:
        health.start()
    claims.start()
    slices.start()
    server.start()
    stop.wait()
    log.info("stopping")
    server.stop()
    if health is not None:
        health.stop()
    slices.stop()
    claims.stop()


def _counts(state: DeviceState) -> tuple[int, int]:
    prepared = state.prepared_claims()
    return len(prepared), sum(len(entry.devices) for entry in prepared.values())
