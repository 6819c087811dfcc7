"""The kubelet plugin's options, as `gpudra kubelet-plugin` parses them. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the options are read before the device model is imported
    from gpudra.model.devices import MigMode


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
    usage_interval_seconds: float  # 0: no claim usage sampling
    driver_root: Path  # where the NVIDIA driver's files are (gpudra.gpu.driver_root)
