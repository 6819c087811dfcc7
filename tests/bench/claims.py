"""The ResourceClaims the benchmark prepares, with the allocation a scheduler would have written. Pure.

Each claim asks for one device under one request; its `status.allocation` names this plugin's driver,
the node's pool and the device, so that the plugin's GET of the claim finds a valid allocation without
a scheduler. An opaque config, where given, is both in the claim's spec and copied into the allocation,
as the scheduler copies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUEST = "gpu"

# gpudra's sharing config for an MPS claim, as in examples/mps.yaml.
MPS_CONFIG: dict[str, Any] = {
    "apiVersion": "resource.gpudra.io/v1beta1",
    "kind": "GpuConfig",
    "sharing": {
        "strategy": "MPS",
        "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "16Gi"},
    },
}


@dataclass(frozen=True)
class ClaimRef:
    """What the kubelet names in a prepare or unprepare call."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Wanted:
    """One claim to create: which device of which driver's pool, under which class, with which config."""

    namespace: str
    name: str
    driver: str
    pool: str
    device: str
    device_class: str
    config: dict[str, Any] | None = None

    def claim(self) -> dict[str, Any]:
        devices: dict[str, Any] = {
            "requests": [{"name": REQUEST, "exactly": {"deviceClassName": self.device_class}}]
        }
        if self.config is not None:
            devices["config"] = [self._config_entry()]
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"namespace": self.namespace, "name": self.name},
            "spec": {"devices": devices},
        }

    def allocation(self) -> dict[str, Any]:
        devices: dict[str, Any] = {
            "results": [{"request": REQUEST, "driver": self.driver, "pool": self.pool, "device": self.device}]
        }
        if self.config is not None:
            devices["config"] = [{"source": "FromClaim", **self._config_entry()}]
        return {
            "devices": devices,
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [self.pool]}]}
                ]
            },
        }

    def _config_entry(self) -> dict[str, Any]:
        return {"requests": [REQUEST], "opaque": {"driver": self.driver, "parameters": self.config}}
