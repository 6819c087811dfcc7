"""GPU quota per team with a ResourceQuota on gpudra's DeviceClasses (examples/quota/resourcequota.yaml,
docs/quota.md) on the real control plane: the API server charges each claim's devices to its class,
refuses the claim that would go over with its own message, and the claims it took are allocated by the
real scheduler and prepared by gpudra like any others."""

from __future__ import annotations

from functools import partial

from kubernetes import client, utils

from tests.localcluster.node_plugin import PluginProcess
from tests.localcluster.quota import apply_resource_quota, create_claim, device_claim, quota_resource

from .kube_helpers import new_namespace, pod_gone, pod_running, wait_for

NODE = "node-h100"
# A share asks for its size; the quota counts it as one device all the same.
CAPACITY = {"gpu-shared.gpudra.io": {"memory": "10Gi", "compute": "10"}}


def claim_pod(name: str, claim: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


def test_a_team_at_its_quota_has_its_next_claim_refused_and_what_it_got_is_prepared(
    api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> None:
    core = client.CoreV1Api(api)
    plugin = gpudra[NODE]
    ns = new_namespace(core, "team-a")
    try:
        allowed = apply_resource_quota(api, ns)
        assert set(allowed) == {"gpu.gpudra.io", "gpu-shared.gpudra.io", "mig.gpudra.io"}
        taken: list[str] = []
        for device_class, count in allowed.items():
            stem = device_class.split(".")[0]
            for i in range(count):
                name = f"{stem}-{i}"
                assert (
                    create_claim(
                        api, ns, device_claim(name, device_class, capacity=CAPACITY.get(device_class))
                    )
                    == ""
                )
                taken.append(name)
            refused = create_claim(
                api, ns, device_claim(f"{stem}-over", device_class, capacity=CAPACITY.get(device_class))
            )
            resource = quota_resource(device_class)
            assert refused == (
                f'resourceclaims.resource.k8s.io "{stem}-over" is forbidden: exceeded quota: gpus, '
                f"requested: {resource}=1, used: {resource}={count}, limited: {resource}={count}"
            )

        # What the quota let in runs: the scheduler allocates it, gpudra prepares it on the node.
        for name in taken:
            utils.create_from_dict(api, claim_pod(name, name), namespace=ns)
        for name in taken:
            wait_for(f"pod {name} running", partial(pod_running, core, name, ns), timeout=120)
        claims = client.CustomObjectsApi(api).list_namespaced_custom_object(
            "resource.k8s.io", "v1", ns, "resourceclaims"
        )["items"]
        uids = {c["metadata"]["uid"] for c in claims}
        assert len(uids) == len(taken)
        assert uids <= set(plugin.cdi_specs())

        # A claim that ends gives its device back to the team's quota.
        core.delete_namespaced_pod("gpu-0", ns, grace_period_seconds=0)
        wait_for("pod gpu-0 deleted", partial(pod_gone, core, "gpu-0", ns), timeout=90)
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            "resource.k8s.io", "v1", ns, "resourceclaims", "gpu-0"
        )
        wait_for(
            "the quota's room back",
            lambda: create_claim(api, ns, device_claim("gpu-again", "gpu.gpudra.io")) == "",
            timeout=60,
        )
    finally:
        for pod in core.list_namespaced_pod(ns).items:
            core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
        for pod in core.list_namespaced_pod(ns).items:
            wait_for("pod deleted", partial(pod_gone, core, pod.metadata.name, ns), timeout=90)
        core.delete_namespace(ns)
    wait_for("every claim of the team unprepared", lambda: not uids & set(plugin.cdi_specs()), timeout=90)
