"""ResourceClaim objects shaped as the API server returns them, for the kubelet plugin's tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpudra.api import API_VERSION

DRIVER = "gpu.gpudra.io"
NODE = "node-a"


def result(
    request: str, device: str, *, pool: str = NODE, driver: str = DRIVER, admin_access: bool = False
) -> dict[str, Any]:
    """One entry of status.allocation.devices.results."""
    item: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if admin_access:
        item["adminAccess"] = True
    return item


def config_entry(
    parameters: Any, *requests: str, source: str = "FromClaim", driver: str = DRIVER
) -> dict[str, Any]:
    """One entry of status.allocation.devices.config with opaque parameters."""
    item: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        item["requests"] = list(requests)
    return item


def from_class(parameters: Any, *requests: str) -> dict[str, Any]:
    return config_entry(parameters, *requests, source="FromClass")


def from_claim(parameters: Any, *requests: str) -> dict[str, Any]:
    return config_entry(parameters, *requests, source="FromClaim")


def time_slicing(interval: str) -> dict[str, Any]:
    """GpuConfig parameters asking for time-slicing with `interval`."""
    return {
        "apiVersion": API_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
    }


def mps(percentage: int = 50) -> dict[str, Any]:
    """GpuConfig parameters asking for MPS."""
    return {
        "apiVersion": API_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": percentage}},
    }


def resource_claim(
    uid: str,
    *,
    name: str | None = None,
    namespace: str = "default",
    results: Sequence[dict[str, Any]] | None = (),
    config: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A ResourceClaim; `results=None` leaves it unallocated."""
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name or f"claim-{uid}", "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {},
    }
    if results is not None:
        claim["status"]["allocation"] = {
            "devices": {"results": list(results), "config": list(config)},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        }
    return claim


def whole_gpus(uid: str, *devices: str, request: str = "gpu", **kwargs: Any) -> dict[str, Any]:
    """A claim allocated the whole GPUs `devices` in this node's pool, all for one request."""
    return resource_claim(uid, results=[result(request, device) for device in devices], **kwargs)
