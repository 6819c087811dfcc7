"""Claims a tenant can create that once broke every node's plugin (issue: faults and hostile input).

Opaque parameters nested 3000 levels deep fit in Kubernetes' 10 KiB limit and the API server accepts
them, but Python's JSON decoder refuses them with RecursionError. A claim of another driver must not
matter to gpudra at all (the plugin reads only the claims the kubelet asks it to prepare); a gpudra
claim that deep fails that claim alone, with a reason in the pod's event, while the pod's other claim
is prepared and the plugin goes on serving.
"""

from __future__ import annotations

import uuid
from typing import Any

from kubernetes import client, utils

from tests.localcluster.node_plugin import PluginProcess

from .kube_helpers import Resources, claim_pod, claim_template, pod_events, pod_running, wait_for

NODE = "node-h100"
DEPTH = 3000


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_deep_claims_fail_alone_and_foreign_ones_never_matter(
    api: client.ApiClient, gpudra: dict[str, PluginProcess]
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
                "config": [{"opaque": {"driver": "other.example.com", "parameters": {"deep": _deep(DEPTH)}}}],
            }
        },
    }
    deep_config = {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig", "deep": _deep(DEPTH)}
    utils.create_from_yaml(
        api,
        yaml_objects=[
            foreign,
            claim_template("good"),
            claim_template("deep", deep_config),
            claim_pod("mixed", {"good": "good", "deep": "deep"}, NODE),
        ],
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
    deep_uid = resources.get("resourceclaims", claims["deep"], ns)["metadata"]["uid"]
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
