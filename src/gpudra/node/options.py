"""The kubelet plugin's options, as `gpudra kubelet-plugin` parses them. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpudra.model.gpu_health import DEFAULT_CLASSIFICATION, Classification
from gpudra.model.publishing import Publishing


@dataclass(frozen=True)
class PluginOptions:
    node_name: str
    driver: str
    nvml: str
    publishing: Publishing  # what the node offers besides whole GPUs
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
    usage_interval_seconds: float  # 0: no claim usage sampling
    mps_check_interval_seconds: float  # 0: stopped MPS daemons are started again only at plugin start
    driver_root: Path  # where the NVIDIA driver's files are (gpudra.gpu.driver_root)
    # The host directory whose dev/ holds the NVIDIA device nodes, named as hostPath in claim specs
    # (gpudra.node.cdi) unless it is /; with the simulator, also where its stand-in nodes are made.
    dev_root: Path = Path("/")
    # Which XIDs are application errors, recoverable, or need a reset (gpudra.model.gpu_health).
    health_xids: Classification = DEFAULT_CLASSIFICATION
    health_recovery_seconds: float = 600.0  # a recoverable fault's taint is lifted after this long quiet
    health_reset_effect: str = "NoSchedule"  # the taint effect of faults that need a reset (or NoExecute)
    # Names this instance's kubelet sockets (the pod's UID), so that two pods of a rolling update both
    # stay registered (gpudra.node.kubelet_grpc); None: the names every instance shares.
    instance_id: str | None = None
    # `gpudra mps-host`'s socket: the claims' MPS daemons run there (gpudra.node.mps_host); None: here.
    mps_host_socket: Path | None = None

    @property
    def sim_dev_dir(self) -> Path | None:
        """Where the simulator makes its device nodes: `<dev root>/dev` with --nvml sim:... and a dev
        root other than / (never the node's own /dev)."""
        if not self.nvml.startswith("sim:") or self.dev_root == Path("/"):
            return None
        return self.dev_root / "dev"
