"""The API server the benchmark runs against, and what the harness asks of it. I/O: processes, HTTP.

Only etcd and kube-apiserver run: the benchmark client plays the kubelet itself (it calls the plugins'
sockets and writes each claim's allocation as the scheduler would), so a scheduler, a controller manager
and kubelets would only take CPU from the two cores and add their own requests to the API server's
request counters, which is where the idle figures come from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from kubernetes import client, config

from tests.bench.errors import BenchError
from tests.localcluster import TOKEN, LocalCluster, binaries
from tests.localcluster.cluster import free_port
from tests.localcluster.processes import http_get

RESOURCE = ("resource.k8s.io", "v1")


class ControlPlane(LocalCluster):
    """LocalCluster without scheduler, controller manager and nodes."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, nodes=())

    def start(self) -> None:
        self.bin = binaries.ensure_binaries()
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "logs").mkdir(exist_ok=True)
        for name in ("etcd-client", "etcd-peer", "apiserver"):
            self._ports[name] = free_port()
        self.server = f"https://127.0.0.1:{self._ports['apiserver']}"
        try:
            self._write_credentials()
            self._start_etcd()
            self.start_apiserver()
        except BaseException:
            self.stop()
            raise

    def api(self) -> client.ApiClient:
        return config.new_client_from_config(str(self.kubeconfig))

    def metrics_text(self) -> str:
        """The API server's /metrics, read with the admin token."""
        status, body = http_get(f"{self.server}/metrics", token=TOKEN, timeout=10)
        if status != 200:
            raise BenchError(f"the API server's GET /metrics answered {status}")
        return body.decode()


class Objects:
    """The few objects the harness creates: nodes, namespaces, claims with their allocation; and the
    slices it cleans up."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def create_node(self, name: str) -> None:
        """A Node object without a kubelet: both plugins make it the owner of their slices."""
        self.core.create_node({"metadata": {"name": name}})

    def create_namespace(self, name: str) -> None:
        self.core.create_namespace({"metadata": {"name": name}})

    def create_allocated_claim(self, claim: dict[str, Any], allocation: dict[str, Any]) -> dict[str, Any]:
        """Create `claim`, then write `allocation` to its status as the scheduler would."""
        namespace = claim["metadata"]["namespace"]
        created = cast(
            dict[str, Any],
            self.custom.create_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims", claim),
        )
        created["status"] = {"allocation": allocation}
        name = created["metadata"]["name"]
        return cast(
            dict[str, Any],
            self.custom.replace_namespaced_custom_object_status(
                *RESOURCE, namespace, "resourceclaims", name, created
            ),
        )

    def delete_claims(self, namespace: str) -> None:
        self.custom.delete_collection_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims")

    def delete_slices(self, *, node: str) -> None:
        """What a kubelet does when it starts: no slice of a node outlives the node's plugins."""
        found = self.custom.list_cluster_custom_object(
            *RESOURCE, "resourceslices", field_selector=f"spec.nodeName={node}"
        )
        for item in cast(dict[str, Any], found)["items"]:
            self.custom.delete_cluster_custom_object(*RESOURCE, "resourceslices", item["metadata"]["name"])
