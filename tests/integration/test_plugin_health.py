"""Device health through the real kubelet: it watches gpudra's health stream instead of failing on it,
and a GPU that falls off the bus shows up in the pod's `allocatedResourcesStatus`, and clears again."""

from __future__ import annotations

import uuid
from typing import Any

from kubernetes import client, utils

from gpudra import sim
from tests.localcluster import LocalCluster
from tests.localcluster.node_plugin import DRIVER, PluginProcess

from .kube_helpers import Resources, claim_pod, claim_template, pod_gone, pod_running, wait_for

NODE = "node-mixed"
POD = "watched"


def _kubelet_log_since_registration(cluster: LocalCluster) -> list[str]:
    """The node's kubelet log from the plugin's latest registration on (earlier runs may predate health)."""
    lines = (cluster.directory / "logs" / f"kubelet-{NODE}.log").read_text(errors="replace").splitlines()
    socket = f"{DRIVER}-reg.sock"
    starts = [i for i, line in enumerate(lines) if "RegisterPlugin started" in line and socket in line]
    assert starts, f"the kubelet on {NODE} never registered {DRIVER}"
    return lines[starts[-1] :]


def _claim_health(core: client.CoreV1Api, namespace: str, health: str) -> tuple[str, dict[str, Any]] | None:
    """(name, resource) of the container's one allocatedResourcesStatus entry once its health is `health`.

    Read as the API server returns it, so no client model can drop a field.
    """
    pod: dict[str, Any] = core.read_namespaced_pod(POD, namespace, _preload_content=False).json()
    containers = pod.get("status", {}).get("containerStatuses") or []
    statuses = [status for c in containers for status in c.get("allocatedResourcesStatus") or []]
    if not statuses:
        return None
    (status,) = statuses
    (resource,) = status["resources"]
    return (status["name"], resource) if resource["health"] == health else None


def _wait_health(core: client.CoreV1Api, namespace: str, health: str) -> tuple[str, dict[str, Any]]:
    return wait_for(
        f"the device {health} in the pod status", lambda: _claim_health(core, namespace, health), timeout=90
    )


def test_a_lost_gpu_reaches_the_pod_status_through_the_kubelet(
    cluster: LocalCluster, api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> None:
    plugin = gpudra[NODE]
    core = client.CoreV1Api(api)
    ns = f"health-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    gpu_uuid = None
    try:
        utils.create_from_yaml(
            api,
            yaml_objects=[claim_template("one-gpu"), claim_pod(POD, {"gpu": "one-gpu"}, NODE)],
            namespace=ns,
        )
        pod = wait_for("pod Running", lambda: pod_running(core, POD, ns), timeout=90)
        claim = Resources(api).get(
            "resourceclaims", pod.status.resource_claim_statuses[0].resource_claim_name, ns
        )
        claim_uid = claim["metadata"]["uid"]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        (device,) = plugin.checkpoint_claims()[claim_uid]["devices"]
        (gpu_uuid,) = device["gpu_uuids"]
        resource_id = f"{DRIVER}/claim={claim_uid}-{result['device']}"  # the device's first CDI ID

        assert _wait_health(core, ns, "Healthy") == (
            "claim:gpu",
            {"resourceID": resource_id, "health": "Healthy"},
        )

        sim.set_gpu_lost(state_file=plugin.sim_state, gpu_uuid=gpu_uuid, lost=True)
        assert _wait_health(core, ns, "Unhealthy") == (
            "claim:gpu",
            {
                "resourceID": resource_id,
                "health": "Unhealthy",
                "message": f"GPU {gpu_uuid}: NVMLError_GpuIsLost",
            },
        )

        sim.set_gpu_lost(state_file=plugin.sim_state, gpu_uuid=gpu_uuid, lost=False)
        _wait_health(core, ns, "Healthy")
    finally:
        if gpu_uuid is not None:
            sim.set_gpu_lost(state_file=plugin.sim_state, gpu_uuid=gpu_uuid, lost=False)
        if not pod_gone(core, POD, ns):
            core.delete_namespaced_pod(POD, ns, grace_period_seconds=0)
            wait_for("pod deleted", lambda: pod_gone(core, POD, ns), timeout=60)
        core.delete_namespace(ns)

    # Checked last, so that the kubelet's 5 s stream retry has had many chances to fail.
    since = _kubelet_log_since_registration(cluster)
    ours = [line for line in since if f'pluginName="{DRIVER}"' in line]
    assert not [line for line in ours if "Method not found" in line], "\n".join(ours[-5:])
    assert not [line for line in ours if "Error receiving from WatchResources stream" in line]
    assert any("Successfully started WatchResources health stream" in line for line in since)
