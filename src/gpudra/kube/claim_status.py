"""The entries of ResourceClaims' `status.devices` (format: gpudra.model.claim_usage): a node plugin
reads a claim and writes its own entries, the controller removes entries of nodes gone.
I/O: the API server, via gpudra.kube.client.

A node writes with server-side apply of the status subresource, one field manager per node
(`gpudra-<node>`), holding every entry the node has for the claim: entries of other managers (another
node, another driver, the scheduler's binding conditions) stay, and one the node leaves out is removed.
The claim's UID goes along as a precondition, so a claim deleted and created again under the same name
is never written with the old one's devices (the API server answers 409).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from gpudra.kube.client import Kube, Obj
from gpudra.model.claim import Claim, read_claim
from gpudra.model.kube_api import GROUP, VERSION


def field_manager(node_name: str) -> str:
    """The field manager of a node's entries (metadata.managedFields shows who wrote what)."""
    return f"gpudra-{node_name}"


class ClaimStatus:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def get(self, namespace: str, name: str) -> Claim:
        return read_claim(self.kube.get_claim(namespace, name))

    def apply_node_devices(
        self, *, node_name: str, namespace: str, name: str, uid: str, devices: Sequence[Obj]
    ) -> None:
        """Make `devices` the entries of node `node_name` in the claim's `status.devices` (NotFound:
        the claim is gone; Conflict: it is another claim now)."""
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "status": {"devices": list(devices)},
        }
        self.kube.request(
            f"writing the device status of ResourceClaim {namespace}/{name}",
            "PATCH",
            _status_path(namespace, name),
            query={"fieldManager": field_manager(node_name), "force": "true"},
            body=body,
            content_type="application/apply-patch+yaml",  # JSON is YAML: the body goes as JSON
        )

    def replace_devices(self, claim: Mapping[str, Any], devices: list[Obj]) -> None:
        """Make `devices` the claim's whole `status.devices`, if the claim is still as `claim` shows it
        (its resourceVersion is the precondition: Conflict when it changed since, NotFound when gone).
        `claim` is the object as the API server served it: the rest of its status goes back unchanged."""
        meta = claim["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceClaim",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
            },
            # An update of the status subresource replaces the whole status: the rest goes back as read.
            "status": {**(claim.get("status") or {}), "devices": devices},
        }
        self.kube.request(
            f"updating the device status of ResourceClaim {namespace}/{name}",
            "PUT",
            _status_path(namespace, name),
            body=body,
        )


def _status_path(namespace: str, name: str) -> str:
    return (
        f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}"
        f"/resourceclaims/{quote(name, safe='')}/status"
    )
