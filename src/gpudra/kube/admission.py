"""The objects behind gpudra's admission webhook: the core/v1 Secret that holds its TLS material and the
admissionregistration.k8s.io/v1 ValidatingWebhookConfiguration that points the API server at it, read,
created and replaced whole. I/O: the API server, via gpudra.kube.client.

Objects travel as the JSON dicts the API server sends. A replace carries the `metadata.resourceVersion`
of the object it was made from, so of two replicas that read the same version and both write, exactly
one wins; the other gets `Conflict` (as does a create of a name that exists). What goes into the
objects is decided in gpudra.controller.webhook_tls.
"""

from __future__ import annotations

from urllib.parse import quote

from gpudra.kube.client import Kube, NotFound, Obj

_WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def _secrets(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/secrets"


def _named(collection: str, name: str) -> str:
    return f"{collection}/{quote(name, safe='')}"


class AdmissionObjects:
    """Secret and ValidatingWebhookConfiguration calls on the one client, each counted as `(verb,
    "secrets")` or `(verb, "validatingwebhookconfigurations")`; failures are `ClusterError`, a lost
    race `Conflict`. Implements gpudra.controller.webhook_tls.AdmissionApi."""

    def __init__(self, kube: Kube, *, owners: list[Obj] | None = None) -> None:
        self.kube = kube
        # ownerReferences given to what is created, so that deleting the owner removes it.
        self.owners = list(owners or [])

    def get_secret(self, namespace: str, name: str) -> Obj | None:
        """The Secret as stored now, or None when there is none."""
        try:
            return self.kube.request(
                f"reading Secret {namespace}/{name}", "GET", _named(_secrets(namespace), name)
            )
        except NotFound:
            return None

    def create_secret(self, namespace: str, secret: Obj) -> Obj:
        name = secret["metadata"]["name"]
        return self.kube.request(
            f"creating Secret {namespace}/{name}", "POST", _secrets(namespace), body=self._owned(secret)
        )

    def replace_secret(self, namespace: str, secret: Obj) -> Obj:
        name = secret["metadata"]["name"]
        return self.kube.request(
            f"updating Secret {namespace}/{name}", "PUT", _named(_secrets(namespace), name), body=secret
        )

    def get_webhook_configuration(self, name: str) -> Obj | None:
        """The configuration as stored now, or None when there is none."""
        try:
            return self.kube.request(
                f"reading ValidatingWebhookConfiguration {name}", "GET", _named(_WEBHOOKS, name)
            )
        except NotFound:
            return None

    def create_webhook_configuration(self, configuration: Obj) -> Obj:
        name = configuration["metadata"]["name"]
        return self.kube.request(
            f"creating ValidatingWebhookConfiguration {name}",
            "POST",
            _WEBHOOKS,
            body=self._owned(configuration),
        )

    def replace_webhook_configuration(self, configuration: Obj) -> Obj:
        name = configuration["metadata"]["name"]
        return self.kube.request(
            f"updating ValidatingWebhookConfiguration {name}",
            "PUT",
            _named(_WEBHOOKS, name),
            body=configuration,
        )

    def _owned(self, obj: Obj) -> Obj:
        if not self.owners:
            return obj
        return {**obj, "metadata": {**obj["metadata"], "ownerReferences": self.owners}}


def cluster_role_owner(kube: Kube, name: str) -> Obj:
    """An ownerReference to the ClusterRole `name` (the chart makes the controller's role the owner of
    what the controller creates, so `helm uninstall` leaves none of it: a cluster-scoped owner may own
    both cluster-scoped and namespaced objects)."""
    path = f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{quote(name, safe='')}"
    role = kube.request(f"reading ClusterRole {name} (--owner-cluster-role)", "GET", path)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "name": name,
        "uid": role["metadata"]["uid"],
    }
