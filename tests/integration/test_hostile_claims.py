"""Claims a tenant can create that once broke every node's plugin (issue: faults and hostile input).

Opaque parameters nested 3000 levels deep fit in Kubernetes' 10 KiB limit and the API server accepts
them, but Python's JSON decoder refuses them with RecursionError. A claim of another driver must not
matter to gpudra at all (the plugin reads only the claims the kubelet asks it to prepare); a gpudra
claim that deep fails that claim alone, with a reason in the pod's event, while the pod's other claim
is prepared and the plugin goes on serving.
"""

from __future__ import annotations

import json
import re
import ssl
import urllib.request
import uuid
from typing import Any

from kubernetes import client, utils

from tests.localcluster import TOKEN, LocalCluster
from tests.localcluster.node_plugin import PluginProcess

from .kube_helpers import Resources, claim_pod, claim_template, pod_events, pod_running, wait_for

NODE = "node-h100"
DEPTH = 3000


DEEP = "__DEEP__"


def _create(cluster: LocalCluster, path: str, obj: dict[str, Any]) -> None:
    """POST `obj` with its "__DEEP__" placeholder replaced by DEPTH nested lists, as raw JSON: the
    kubernetes client (and json.dumps) cannot serialise what is that deep, kubectl and curl can."""
    body = json.dumps(obj).replace(json.dumps(DEEP), "[" * DEPTH + "]" * DEPTH)
    request = urllib.request.Request(
        f"{cluster.server}{path}",
        data=body.encode(),
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    trust = ssl.create_default_context(cafile=str(cluster.directory / "pki" / "apiserver.crt"))
    with urllib.request.urlopen(request, context=trust, timeout=30) as response:
        assert response.status == 201


def _uid_of_deep_claim(api: client.ApiClient, namespace: str, name: str) -> str:
    """The claim's UID, read from the raw JSON (the client cannot decode an object this deep);
    the API server writes metadata.uid before ownerReferences."""
    raw: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "resource.k8s.io", "v1", namespace, "resourceclaims", name, _preload_content=False
    )
    found = re.search(r'"uid":"([^"]+)"', raw.data.decode())
    assert found is not None
    return found.group(1)


def test_deep_claims_fail_alone_and_foreign_ones_never_matter(
    api: client.ApiClient, cluster: LocalCluster, gpudra: dict[str, PluginProcess]
) -> None:
    core = client.CoreV1Api(api)
    ns = f"hostile-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    foreign = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "foreign"},
        "spec": {
            "devices": {
                "requests": [{"name": "x", "exactly": {"deviceClassName": "gpu.gpudra.io"}}],
                "config": [{"opaque": {"driver": "other.example.com", "parameters": {"deep": DEEP}}}],
            }
        },
    }
    deep_config = {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig", "deep": DEEP}
    _create(cluster, f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", foreign)
    _create(
        cluster,
        f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates",
        claim_template("deep", deep_config),
    )
    utils.create_from_yaml(
        api,
        yaml_objects=[claim_template("good"), claim_pod("mixed", {"good": "good", "deep": "deep"}, NODE)],
        namespace=ns,
    )
    plugin = gpudra[NODE]

    def failed_event() -> list[str] | None:
        events = [e for e in pod_events(core, "mixed", ns) if "FailedPrepareDynamicResources" in e]
        return events or None

    events = wait_for("a prepare failure event", failed_event, timeout=90)
    assert "nests too deeply to decode" in events[0], events[0]
    pod = core.read_namespaced_pod("mixed", ns)
    claims = {s.name: s.resource_claim_name for s in pod.status.resource_claim_statuses}
    resources = Resources(api)
    good_uid = resources.get("resourceclaims", claims["good"], ns)["metadata"]["uid"]
    deep_uid = _uid_of_deep_claim(api, ns, claims["deep"])
    prepared = plugin.checkpoint_claims()
    assert prepared[good_uid]["state"] == "PrepareCompleted"
    assert deep_uid not in prepared and deep_uid not in plugin.cdi_specs()

    # the plugin still serves: a plain pod on the same node runs
    utils.create_from_yaml(
        api, yaml_objects=[claim_template("plain"), claim_pod("plain", {"gpu": "plain"}, NODE)], namespace=ns
    )
    wait_for("the plain pod to run", lambda: pod_running(core, "plain", ns), timeout=90)
    assert plugin.process is not None and plugin.process.poll() is None

    for name in ("mixed", "plain"):
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    wait_for("claims unprepared", lambda: good_uid not in plugin.checkpoint_claims(), timeout=60)
    core.delete_namespace(ns)
