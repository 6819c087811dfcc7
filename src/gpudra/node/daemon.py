"""Runs the kubelet plugin: opens the kubelet's sockets, then loads and wires everything else.
I/O: the two sockets, through `kubelet_grpc`.

The sockets open within a fraction of a second of the process start, before the imports of NVML, the
API client, pydantic models and metrics (about 0.3 s) and before the checkpoint is settled, so the
kubelet registers the plugin at once. Calls that arrive meanwhile wait (see `kubelet_grpc`); nothing
is answered from a state that is not loaded, and /readyz says what is not ready yet.
"""

from __future__ import annotations

import threading

from gpudra.node import state_dir
from gpudra.node.kubelet_grpc import KubeletServer
from gpudra.node.options import PluginOptions

# Each service's share of shutdown: calls in flight finish, threads end.
STOP_TIMEOUT_SECONDS = 5.0


def run(options: PluginOptions, *, stop: threading.Event) -> None:
    state_dir.ensure(options.state_dir)
    server = KubeletServer(
        driver=options.driver,
        registry_dir=options.registry_dir,
        plugin_dir=options.plugin_dir,
        health_service=options.health_interval_seconds > 0,
        instance_id=options.instance_id,
    )
    server.start()
    try:
        # Imported only now, with the sockets open: this import is most of the start-up time.
        from gpudra.node import wiring  # noqa: PLC0415

        wiring.run(options, server, stop=stop)
    finally:
        server.stop(STOP_TIMEOUT_SECONDS)  # already stopped after a clean stop; at once after a failure
