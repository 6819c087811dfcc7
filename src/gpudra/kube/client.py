"""Typed access to the Kubernetes API for gpudra. I/O: the API server (the only importer of `kubernetes`).

resource.k8s.io/v1 objects travel as plain JSON dicts (what the API server sends), read through
CustomObjectsApi, so the pure modules (device model, slices, config resolution) work on the same shapes
the tests build by hand. API failures become `ClusterError` with the HTTP status.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from kubernetes import client, config, utils, watch
from kubernetes.client.exceptions import ApiException

from gpudra.errors import ClusterError

GROUP, VERSION = "resource.k8s.io", "v1"
Obj = dict[str, Any]


def _obj(value: object) -> Obj:
    """The client returns decoded JSON typed as `object`."""
    return cast(Obj, value)


class NotFound(ClusterError):
    """The object does not exist (HTTP 404)."""


class Conflict(ClusterError):
    """The object changed since it was read, or already exists (HTTP 409)."""


@contextmanager
def _api_errors(what: str) -> Iterator[None]:
    try:
        yield
    except ApiException as err:
        kind = {404: NotFound, 409: Conflict}.get(int(err.status or 0), ClusterError)
        raise kind(f"{what}: HTTP {err.status} {err.reason}") from err
    except (OSError, ValueError) as err:  # connection refused, reset, TLS errors, malformed replies
        raise ClusterError(f"{what}: {err}") from err


def connect(kubeconfig: str | None) -> client.ApiClient:
    """An API client from a kubeconfig file, or the in-cluster service account when none is given."""
    with _api_errors("loading cluster credentials"):
        if kubeconfig:
            api: client.ApiClient = config.new_client_from_config(kubeconfig)
            return api
        config.load_incluster_config()
        return client.ApiClient()


class Kube:
    """The API calls gpudra makes."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)

    def server_minor(self) -> int:
        with _api_errors("reading the server version"):
            info = client.VersionApi(self.api).get_code()
        return int("".join(ch for ch in info.minor if ch.isdigit()))

    def node_uid(self, name: str) -> str:
        with _api_errors(f"reading node {name}"):
            node = self._core.read_node(name)
        if node.metadata is None:
            raise ClusterError(f"node {name} has no metadata")
        return str(node.metadata.uid)

    # --- ResourceSlices ------------------------------------------------------------------------

    def list_slices(self, *, driver: str, node_name: str) -> list[Obj]:
        selector = f"spec.driver={driver},spec.nodeName={node_name}"
        with _api_errors("listing ResourceSlices"):
            result = _obj(
                self._custom.list_cluster_custom_object(
                    GROUP, VERSION, "resourceslices", field_selector=selector
                )
            )
        return list(result["items"])

    def create_slice(self, body: Obj) -> Obj:
        with _api_errors(f"creating ResourceSlice {body['metadata'].get('name')}"):
            return _obj(self._custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body))

    def replace_slice(self, body: Obj) -> Obj:
        name = body["metadata"]["name"]
        with _api_errors(f"updating ResourceSlice {name}"):
            return _obj(
                self._custom.replace_cluster_custom_object(GROUP, VERSION, "resourceslices", name, body)
            )

    def delete_slice(self, name: str) -> None:
        try:
            with _api_errors(f"deleting ResourceSlice {name}"):
                self._custom.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name)
        except NotFound:
            pass

    # --- ResourceClaims ------------------------------------------------------------------------

    def get_claim(self, namespace: str, name: str) -> Obj:
        with _api_errors(f"reading ResourceClaim {namespace}/{name}"):
            return _obj(
                self._custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", name)
            )

    def watch_claims(self, on_event: Callable[[str, Obj], None], *, stop: threading.Event) -> None:
        """List then watch every ResourceClaim, calling on_event(type, claim) until `stop` is set.

        The first call for each claim is ("ADDED", claim); a relist after an expired watch replays
        ADDED for everything, and "RESYNC" with an empty dict marks the end of each list.
        """
        while not stop.is_set():
            with _api_errors("listing ResourceClaims"):
                listing = _obj(self._custom.list_cluster_custom_object(GROUP, VERSION, "resourceclaims"))
            for item in listing["items"]:
                on_event("ADDED", item)
            on_event("RESYNC", {})
            version = listing["metadata"]["resourceVersion"]
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    self._custom.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    "resourceclaims",
                    resource_version=version,
                    timeout_seconds=30,
                    allow_watch_bookmarks=True,
                ):
                    if stop.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        on_event(event["type"], event["object"])
            except ApiException as err:
                if err.status != 410:  # 410 Gone: our version expired, relist
                    raise ClusterError(f"watching ResourceClaims: HTTP {err.status} {err.reason}") from err
            finally:
                stream.stop()

    # --- generic objects (the demo and tooling) --------------------------------------------------

    def create(self, objects: list[Obj], *, namespace: str) -> None:
        """Create manifests (any kind the client knows) in `namespace`."""
        for obj in objects:
            kind = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
            with _api_errors(f"creating {kind}"):
                try:
                    utils.create_from_dict(self.api, obj, namespace=namespace)
                except utils.FailToCreateError as err:
                    raise ClusterError(f"creating {kind}: {err}") from err

    def create_namespace(self, name: str) -> None:
        with _api_errors(f"creating namespace {name}"):
            self._core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    def list_pods(self, namespace: str) -> list[Obj]:
        with _api_errors(f"listing pods in {namespace}"):
            pods = self._core.list_namespaced_pod(namespace)
        return [_obj(self.api.sanitize_for_serialization(p)) for p in pods.items]

    def delete_pod(self, namespace: str, name: str) -> None:
        try:
            with _api_errors(f"deleting pod {namespace}/{name}"):
                self._core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except NotFound:
            pass

    def list_claims(self, namespace: str) -> list[Obj]:
        with _api_errors(f"listing ResourceClaims in {namespace}"):
            result = _obj(
                self._custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims")
            )
        return list(result["items"])
