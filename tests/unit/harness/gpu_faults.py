"""One kubelet plugin instance's GPU health on a simulated machine, its fault recording in its
publisher turn as gpudra.node.wiring runs it, so that two instances share one node as in a rolling
update. Run as `python -m tests.unit.harness.gpu_faults <profile> <sim state> <state dir>` it is a
child that prints `ready` once it records faults, and runs until it is killed (GPUDRA_CRASH_AT=
health-saved: by itself, after saving a fault and before posting its event)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from gpudra.gpu import nvml
from gpudra.model import devices
from gpudra.model.gpu_health import DEFAULT_CLASSIFICATION
from gpudra.node import gpu_driver
from gpudra.node.health.gpu_faults import GpuFaults
from gpudra.node.health.monitor import HealthMonitor
from gpudra.node.instances import PublisherTurn
from gpudra.node.metrics import PluginMetrics
from tests.unit.harness.kube import Events

BOOT_ID = "boot-1"


class Instance:
    """The health monitor, its faults (following the health file until their turn) and the turn."""

    def __init__(self, profile: str, sim_state: Path, state_dir: Path) -> None:
        self.profile, self.sim_state = profile, sim_state
        with self.session() as session:
            inventory = session.inventory()
        model = devices.build_devices(
            inventory, mig_mode="partitionable" if profile == "dgx-h100" else "static"
        )
        self.gpus = {f"gpu-{gpu.minor}": gpu.uuid for gpu in inventory.gpus}
        self.events = Events()
        self.metrics = PluginMetrics()
        self.annotation = ""
        self.faults = GpuFaults(
            devices=model.devices,
            open_nvml=self.session,
            classification=DEFAULT_CLASSIFICATION,
            clean_seconds=600,
            reset_effect="NoSchedule",
            state_file=state_dir / "health.json",
            boot_id=BOOT_ID,
            events=self.events,
            metrics=self.metrics,
            read_annotation=lambda: self.annotation,
            annotation_interval=0.05,
            writing=False,
        )
        self.monitor = HealthMonitor(
            pool="node-a", devices=model.devices, open_nvml=self.session, interval=0.05, faults=self.faults
        )
        self.turn = PublisherTurn(state_dir / "publisher.lock", [self.faults.turn], poll_seconds=0.05)

    def session(self) -> nvml.Nvml:
        return gpu_driver.connect(f"sim:{self.profile}", state_file=self.sim_state)

    def start(self) -> None:
        """As the plugin starts: the monitor, then the turn (the publishing services)."""
        self.monitor.start()
        self.turn.start()

    def stop(self) -> None:
        """As the plugin stops: the turn first, then the monitor."""
        self.turn.stop(5)
        self.monitor.stop()

    def watching(self) -> bool:
        """Whether its event set is open: it records the faults."""
        value = self.metrics.registry.get_sample_value("gpudra_gpu_events_monitored", {"gpu": "gpu-0"})
        return bool(value)

    def tainted(self) -> dict[str, str]:
        """Device -> "value:effect" of its taint."""
        return {name: f"{t.get('value')}:{t['effect']}" for name, t in self.monitor.taints().items()}

    def faults_posted(self) -> list[str]:
        return [message for _, reason, message in self.events.posted if reason == "GpuFault"]


def main(argv: list[str]) -> None:
    profile, sim_state, state_dir = argv
    instance = Instance(profile, Path(sim_state), Path(state_dir))
    instance.start()
    deadline = time.monotonic() + 30
    while not instance.watching():
        if time.monotonic() > deadline:
            sys.exit("never watched events")
        time.sleep(0.02)
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
