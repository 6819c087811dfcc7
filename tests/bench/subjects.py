"""The plugins measured: gpudra on a simulated 8x H100 node, and the reference driver's kubelet plugin
(sigs.k8s.io/dra-example-driver, 8 simulated GPUs) with its default client rate limit and with it
raised, so that the comparison is with its code, not its throttle. Pure: command lines and names."""

from __future__ import annotations

import re
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from tests.localcluster.node_plugin import publishing_flags

GPUS = 8  # both simulate eight; device names are gpu-0 .. gpu-7 in both
# The peer's client-go defaults are 5 QPS, burst 10: every prepare GETs its claim, so the throttle,
# not the driver, sets its pace. Raised well above anything the benchmark asks for.
RAISED_QPS, RAISED_BURST = 1000, 1000
PEER_DESCRIPTION = (
    "sigs.k8s.io/dra-example-driver v0.4.0's kubelet plugin (8 simulated GPUs, driver gpu.example.com, "
    "built by `deploy/local/build-peer.sh`), with its default client rate limit (5 QPS, burst 10) and "
    f"with it raised to {RAISED_QPS} QPS, burst {RAISED_BURST}"
)


@dataclass(frozen=True)
class NodeDirs:
    """Everything one plugin instance keeps on its (pretend) node, under `root`."""

    node: str
    root: Path

    @property
    def registry(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins(self) -> Path:
        return self.root / "plugins"

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def log(self) -> Path:
        return self.root / "plugin.log"


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # A process the plugin needs beside it (gpudra's mps-host, as the chart runs it), started first and
    # waited for until `beside_ready` exists; it gets the same `env`.
    beside: list[str] | None = None
    beside_ready: Path | None = None


class Subject(ABC):
    key: str  # short, used in node names and as the table's column key
    label: str
    driver: str
    device_class: str
    error_line: re.Pattern[str]  # a line of its log that reports an error

    @abstractmethod
    def command(self, dirs: NodeDirs, *, kubeconfig: Path, resync_seconds: float | None) -> Command:
        """How to start it on the node `dirs`; `resync_seconds` None leaves its resync period (if it
        has one) at its default."""

    def registration_socket(self, dirs: NodeDirs) -> Path:
        """Where the kubelet's plugin watcher would find it: `<registry>/<driver>-reg.sock`."""
        return dirs.registry / f"{self.driver}-reg.sock"

    @staticmethod
    def gpu(index: int) -> str:
        return f"gpu-{index}"


class Gpudra(Subject):
    key, label = "gpudra", "gpudra"
    driver, device_class = "gpu.gpudra.io", "gpu.gpudra.io"
    mig_class = "mig.gpudra.io"
    profile = "dgx-h100"
    # A 1g.10gb partition at placement 0 of GPU 0 (model/devices.py names partitions this way).
    mig_device = "gpu-0-mig-1g10gb-0"
    error_line = re.compile(r"^\d\d:\d\d:\d\d [EC] |^Traceback")

    def command(self, dirs: NodeDirs, *, kubeconfig: Path, resync_seconds: float | None) -> Command:
        resync = [] if resync_seconds is None else [f"--resync-seconds={resync_seconds:g}"]
        socket = dirs.state / "mps-host" / "mps-host.sock"
        return Command(
            argv=[
                sys.executable,
                "-m",
                "gpudra",
                "kubelet-plugin",
                f"--node-name={dirs.node}",
                f"--kubeconfig={kubeconfig}",
                f"--nvml=sim:{self.profile}",
                *publishing_flags(self.profile),
                f"--registry-dir={dirs.registry}",
                f"--plugin-dir={dirs.plugins / self.driver}",
                f"--cdi-root={dirs.cdi_root}",
                f"--state-dir={dirs.state}",
                f"--mps-host-socket={socket}",
                "--toolkit-cdi-dirs=",
                *resync,
            ],
            # The simulated card's state (MIG instances, MPS daemons), private to this instance.
            env={"GPUDRA_SIM_STATE": str(dirs.root / "sim" / f"{self.profile}.json")},
            beside=[
                sys.executable,
                "-m",
                "gpudra",
                "mps-host",
                f"--nvml=sim:{self.profile}",
                f"--state-dir={dirs.state}",
                f"--mps-host-socket={socket}",
            ],
            beside_ready=socket,
        )


class Peer(Subject):
    driver, device_class = "gpu.example.com", "gpu.example.com"
    error_line = re.compile(r"^[EF]\d{4} ")

    def __init__(self, binary: Path, *, raised: bool) -> None:
        self.binary = binary
        self.raised = raised
        self.key = "peer-raised" if raised else "peer"
        self.label = f"peer, {RAISED_QPS} QPS" if raised else "peer"

    def command(self, dirs: NodeDirs, *, kubeconfig: Path, resync_seconds: float | None) -> Command:
        """`resync_seconds` does not apply: the peer has no periodic resync (a watch keeps its slices)."""
        argv = [
            str(self.binary),
            f"--node-name={dirs.node}",
            f"--kubeconfig={kubeconfig}",
            f"--cdi-root={dirs.cdi_root}",
            f"--kubelet-registrar-directory-path={dirs.registry}",
            f"--kubelet-plugins-directory-path={dirs.plugins}",
            f"--num-devices={GPUS}",
            "--healthcheck-port=-1",
            "--metrics-port=-1",
        ]
        if self.raised:
            argv += [f"--kube-api-qps={RAISED_QPS}", f"--kube-api-burst={RAISED_BURST}"]
        return Command(argv=argv)
