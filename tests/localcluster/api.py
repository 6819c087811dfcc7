"""The API calls the demo makes that gpudra itself never needs. I/O: the API server.

Kept out of `gpudra.kube.client` so the production client holds only what the driver calls.
"""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client, utils

Obj = dict[str, Any]
GROUP, VERSION = "resource.k8s.io", "v1"


class DemoApi:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)

    def create(self, objects: list[Obj], *, namespace: str) -> None:
        """Create manifests (any kind the client knows) in `namespace`."""
        for obj in objects:
            utils.create_from_dict(self.api, obj, namespace=namespace)

    def create_namespace(self, name: str) -> None:
        self._core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    def list_pods(self, namespace: str) -> list[Obj]:
        pods = self._core.list_namespaced_pod(namespace)
        return [cast(Obj, self.api.sanitize_for_serialization(p)) for p in pods.items]

    def pod_log(self, namespace: str, name: str, container: str) -> str:
        return str(self._core.read_namespaced_pod_log(name, namespace, container=container))

    def service(self, namespace: str, name: str) -> Obj:
        found = self._core.read_namespaced_service(name, namespace)
        return cast(Obj, self.api.sanitize_for_serialization(found))

    def delete_pod(self, namespace: str, name: str) -> None:
        self._core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def list_claims(self, namespace: str) -> list[Obj]:
        result = self._custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims")
        return list(cast(Obj, result)["items"])

    def node_events(self, node: str, reason: str) -> list[Obj]:
        """The Events about Node `node` with this reason (gpudra's plugin posts them in `default`)."""
        selector = f"involvedObject.kind=Node,involvedObject.name={node},reason={reason}"
        found = self._core.list_namespaced_event("default", field_selector=selector)
        return [cast(Obj, self.api.sanitize_for_serialization(e)) for e in found.items]

    def list_slices(self, *, driver: str, node_name: str) -> list[Obj]:
        selector = f"spec.driver={driver},spec.nodeName={node_name}"
        result = self._custom.list_cluster_custom_object(
            GROUP, VERSION, "resourceslices", field_selector=selector
        )
        return list(cast(Obj, result)["items"])
