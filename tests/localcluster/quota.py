"""ResourceQuota on gpudra's DeviceClasses, as a platform team applies it (examples/quota/): the
manifest, claims that count against it, and the API server's answer. I/O: the API server. Used by the
integration test on the pinned release and by `make compat` on the others."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from gpudra.errors import ClusterError

REPO = Path(__file__).resolve().parents[2]
RESOURCE_QUOTA = REPO / "examples" / "quota" / "resourcequota.yaml"
SUFFIX = ".deviceclass.resource.k8s.io/devices"


def quota_resource(device_class: str) -> str:
    """The quota resource the API server charges a claim's devices of `device_class` to."""
    return device_class + SUFFIX


def apply_resource_quota(api: client.ApiClient, namespace: str, *, timeout: float = 60) -> dict[str, int]:
    """examples/quota/resourcequota.yaml in `namespace`; returns DeviceClass -> devices allowed once
    the quota controller has written the quota's status (admission refuses every claim until then)."""
    body = yaml.safe_load(RESOURCE_QUOTA.read_text())
    core = client.CoreV1Api(api)
    core.create_namespaced_resource_quota(namespace, body)
    deadline = time.monotonic() + timeout
    while not (core.read_namespaced_resource_quota(body["metadata"]["name"], namespace).status.hard or {}):
        if time.monotonic() > deadline:
            raise ClusterError(f"ResourceQuota {namespace}/{body['metadata']['name']}: no status")
        time.sleep(0.1)
    return {name.removesuffix(SUFFIX): int(value) for name, value in body["spec"]["hard"].items()}


def device_claim(name: str, device_class: str, *, capacity: dict[str, str] | None = None) -> dict[str, Any]:
    """A ResourceClaim for one device of `device_class` (a share's size in `capacity`)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def create_claim(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> str:
    """Create the claim; "" when the API server took it, else its refusal (status 403, the message)."""
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "resource.k8s.io", "v1", namespace, "resourceclaims", body
        )
    except client.ApiException as err:
        if err.status != 403:
            raise
        return str(yaml.safe_load(err.body)["message"])
    return ""
