"""Small waiting and object helpers for integration tests (the official kubernetes client underneath)."""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any, TypeVar, cast

from kubernetes import client

from tests.localcluster import TOKEN, LocalCluster
from tests.localcluster.node_plugin import DRIVER

T = TypeVar("T")
RESOURCE = ("resource.k8s.io", "v1")
DEEP = "__DEEP__"  # in an object given to raw_request: arrays nested `depth` levels deep


def raw_request(
    cluster: LocalCluster, method: str, path: str, obj: dict[str, Any] | None = None, *, depth: int = 3000
) -> tuple[int, bytes]:
    """One request to the API server as curl or kubectl would send it, the reply undecoded: the
    kubernetes client (and json.dumps) cannot write or read an object nested thousands of levels deep,
    which the API server stores. A DEEP placeholder in `obj` becomes `depth` nested arrays."""
    body = None
    if obj is not None:
        body = json.dumps(obj).replace(json.dumps(DEEP), "[" * depth + "]" * depth).encode()
    request = urllib.request.Request(
        f"{cluster.server}{path}",
        data=body,
        method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    trust = ssl.create_default_context(cafile=str(cluster.directory / "pki" / "apiserver.crt"))
    try:
        with urllib.request.urlopen(request, context=trust, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def wait_scale() -> float:
    """How much longer than written a bounded wait may run. A test's timeout is how long the condition
    takes on a machine with a core to spare; make test runs more pytest-xdist workers than there are
    cores (each with its own control plane), where the same condition can take several times longer.
    The condition waited for is the same: only the point where a wait gives up moves.
    GPUDRA_WAIT_SCALE sets it outright."""
    if "GPUDRA_WAIT_SCALE" in os.environ:
        return float(os.environ["GPUDRA_WAIT_SCALE"])
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return 3.0 if workers > (os.cpu_count() or 1) else 1.0


def wait_for(what: str, probe: Callable[[], T | None], *, timeout: float = 60.0) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout` seconds (times
    `wait_scale()`)."""
    timeout *= wait_scale()
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


class Resources:
    """resource.k8s.io/v1 objects as plain dicts."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)

    def create(self, plural: str, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        if namespace:
            return cast(
                dict[str, Any],
                self.custom.create_namespaced_custom_object(*RESOURCE, namespace, plural, body),
            )
        return cast(dict[str, Any], self.custom.create_cluster_custom_object(*RESOURCE, plural, body))

    def get(self, plural: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        if namespace:
            return cast(
                dict[str, Any], self.custom.get_namespaced_custom_object(*RESOURCE, namespace, plural, name)
            )
        return cast(dict[str, Any], self.custom.get_cluster_custom_object(*RESOURCE, plural, name))

    def list(self, plural: str, namespace: str | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        if namespace:
            result = self.custom.list_namespaced_custom_object(*RESOURCE, namespace, plural, **kwargs)
        else:
            result = self.custom.list_cluster_custom_object(*RESOURCE, plural, **kwargs)
        return list(result["items"])

    def delete(self, plural: str, name: str, namespace: str | None = None) -> None:
        if namespace:
            self.custom.delete_namespaced_custom_object(*RESOURCE, namespace, plural, name)
        else:
            self.custom.delete_cluster_custom_object(*RESOURCE, plural, name)


def pool_devices(
    api: client.ApiClient, *, node: str, driver: str, timeout: float = 30.0
) -> dict[str, dict[str, Any]]:
    """Device name -> device, as published in the newest generation of `node`'s pool of `driver`, once
    that generation is complete.

    A pool is rewritten slice by slice: until every one of its `resourceSliceCount` slices is at the
    new generation, the newest slices hold only part of the devices (the scheduler ignores such a pool
    too), so an incomplete pool is read again instead of answered from."""
    (devices,) = wait_for(
        f"a complete pool of {node}",
        lambda: _complete_pool(
            Resources(api).list("resourceslices", field_selector=f"spec.nodeName={node},spec.driver={driver}")
        ),
        timeout=timeout,
    )
    return devices


def _complete_pool(slices: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]]] | None:
    """(device name -> device,) of the pool's newest generation, or None while it is incomplete (a
    1-tuple: an empty pool is an answer too)."""
    if not slices:
        return None
    newest = max(s["spec"]["pool"]["generation"] for s in slices)
    current = [s for s in slices if s["spec"]["pool"]["generation"] == newest]
    if len(current) < current[0]["spec"]["pool"]["resourceSliceCount"]:
        return None
    return ({d["name"]: d for s in current for d in s["spec"].get("devices", [])},)


def new_namespace(core: client.CoreV1Api, prefix: str) -> str:
    """A namespace named `<prefix>-<6 hex>`, created."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    return name


def unschedulable(core: client.CoreV1Api, name: str, namespace: str) -> bool:
    """Whether the scheduler gave up on the pod for now (PodScheduled False, Unschedulable)."""
    found = core.read_namespaced_pod(name, namespace)
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in found.status.conditions or []
    )


def pod_running(core: client.CoreV1Api, name: str, namespace: str) -> client.V1Pod | None:
    pod = core.read_namespaced_pod(name, namespace)
    return pod if pod.status.phase == "Running" else None


def pod_gone(core: client.CoreV1Api, name: str, namespace: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except client.ApiException as err:
        return err.status == 404
    return False


def pod_events(core: client.CoreV1Api, name: str, namespace: str) -> list[str]:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return [f"{e.reason}: {e.message}" for e in events.items]


def claim_template(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ResourceClaimTemplate for one whole gpudra GPU (request `gpu`), optionally with an opaque config."""
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpudra.io"}}]}
    if parameters is not None:
        devices["config"] = [
            {"requests": ["gpu"], "opaque": {"driver": "gpu.gpudra.io", "parameters": parameters}}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}},
    }


def claim_pod(name: str, claims: dict[str, str], node: str | None = None) -> dict[str, Any]:
    """A one-container pod using a claim per entry of `claims` (claim name -> template name)."""
    spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "image": "busybox", "resources": {"claims": [{"name": n} for n in claims]}}
        ],
        "resourceClaims": [{"name": n, "resourceClaimTemplateName": t} for n, t in claims.items()],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def unsatisfiable_claim() -> dict[str, Any]:
    """A claim no pod uses, asking more GPUs than the cluster has: it stays pending."""
    request = {"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 64}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "waits-for-64-gpus"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": request}]}},
    }
