"""Device health through the real kubelet: it watches gpudra's health stream instead of failing on it,
and a GPU that falls off the bus shows up in the pod's `allocatedResourcesStatus`, and clears again.
Through the real scheduler: the lost GPU is tainted in the ResourceSlice, so no new claim gets it while
the pod already on it keeps running, and the taint is lifted when the GPU is back."""

from __future__ import annotations

import functools
import time
import uuid
from typing import Any

from kubernetes import client, utils

from gpudra import sim
from gpudra.model.devices import UNHEALTHY_TAINT_KEY
from tests.localcluster import LocalCluster
from tests.localcluster.node_plugin import DRIVER, PluginProcess

from .kube_helpers import Resources, claim_pod, claim_template, pod_gone, pod_running, pool_devices, wait_for

NODE = "node-mixed"
POD = "watched"
HOLDER, WAITER = "holder", "waiter"


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


def _pool_devices(api: client.ApiClient) -> dict[str, dict[str, Any]]:
    return pool_devices(api, node=NODE, driver=DRIVER)


def _tainted(api: client.ApiClient) -> dict[str, list[dict[str, Any]]]:
    """Device name -> its taints, for NODE's devices that have any."""
    return {name: d["taints"] for name, d in _pool_devices(api).items() if d.get("taints")}


def _allocated(api: client.ApiClient) -> set[str]:
    """NODE's devices that some claim in the cluster holds."""
    return {
        result["device"]
        for claim in Resources(api).list("resourceclaims")
        for result in (claim.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", [])
        if result["pool"] == NODE
    }


def _unschedulable(core: client.CoreV1Api, name: str, namespace: str) -> str | None:
    """The scheduler's message once it found no device for the pod's claim."""
    pod = core.read_namespaced_pod(name, namespace)
    for condition in pod.status.conditions or []:
        message = condition.message or ""
        if condition.type == "PodScheduled" and "cannot allocate all claims" in message:
            return str(message)
    return None


def _template_for_gpu(name: str, gpu_uuid: str) -> dict[str, Any]:
    """A ResourceClaimTemplate for the one whole GPU with this UUID."""
    template = claim_template(name)
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    selector = f'device.attributes["{DRIVER}"].uuid == "{gpu_uuid}"'
    request["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
    return template


def _still_running(core: client.CoreV1Api, name: str, namespace: str, uid: str) -> None:
    pod = core.read_namespaced_pod(name, namespace)
    assert (pod.metadata.uid, pod.status.phase, pod.metadata.deletion_timestamp) == (uid, "Running", None)


def test_a_lost_gpu_is_tainted_so_only_running_pods_keep_it(
    api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> None:
    plugin = gpudra[NODE]
    core = client.CoreV1Api(api)
    ns = f"taint-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    lost: list[str] = []
    try:
        # A pod on one GPU (X), and a free GPU (Y) that a second claim will ask for by UUID.
        utils.create_from_yaml(
            api,
            yaml_objects=[claim_template("one-gpu"), claim_pod(HOLDER, {"gpu": "one-gpu"}, NODE)],
            namespace=ns,
        )
        holder = wait_for("holder Running", lambda: pod_running(core, HOLDER, ns), timeout=90)
        devices = _pool_devices(api)
        held = _allocated(api)
        claim = Resources(api).get(
            "resourceclaims", holder.status.resource_claim_statuses[0].resource_claim_name, ns
        )
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        x = result["device"]
        x_gpu = devices[x]["attributes"]["uuid"]["string"]
        y = next(
            name
            for name in sorted(devices)
            if name not in held
            and not devices[name].get("allowMultipleAllocations")  # a whole GPU, not a share
            and devices[name]["attributes"]["uuid"]["string"] != x_gpu
        )
        uuids = {name: devices[name]["attributes"]["uuid"]["string"] for name in (x, y)}
        assert _tainted(api) == {}

        lost = list(uuids.values())
        started = time.monotonic()
        for gpu_uuid in lost:
            sim.set_gpu_lost(state_file=plugin.sim_state, gpu_uuid=gpu_uuid, lost=True)
        tainted = wait_for(
            "both lost GPUs tainted",
            lambda: (t := _tainted(api)) and set(t) == {x, f"{x}-shared", y, f"{y}-shared"} and t,
            timeout=60,
        )
        to_taint = time.monotonic() - started
        for name in (x, f"{x}-shared", y, f"{y}-shared"):  # each GPU and its shared device
            (taint,) = tainted[name]
            assert taint.pop("timeAdded")  # set by the API server: the DRADeviceTaints gate is on
            assert taint == {
                "key": UNHEALTHY_TAINT_KEY,
                "value": "NVMLError_GpuIsLost",
                "effect": "NoSchedule",
            }

        only_y = _template_for_gpu("only-y", uuids[y])
        utils.create_from_yaml(
            api, yaml_objects=[only_y, claim_pod(WAITER, {"gpu": "only-y"}, NODE)], namespace=ns
        )
        message = wait_for("the waiter unschedulable", lambda: _unschedulable(core, WAITER, ns), timeout=60)
        assert core.read_namespaced_pod(WAITER, ns).spec.node_name is None, message
        _still_running(core, HOLDER, ns, holder.metadata.uid)  # NoSchedule: nobody is evicted

        started = time.monotonic()
        for gpu_uuid in lost:
            sim.set_gpu_lost(state_file=plugin.sim_state, gpu_uuid=gpu_uuid, lost=False)
        wait_for("the taints lifted", lambda: _tainted(api) == {}, timeout=60)
        to_lift = time.monotonic() - started
        waiter = wait_for("the waiter Running on Y", lambda: pod_running(core, WAITER, ns), timeout=90)
        claim = Resources(api).get(
            "resourceclaims", waiter.status.resource_claim_statuses[0].resource_claim_name, ns
        )
        assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == [y]
        _still_running(core, HOLDER, ns, holder.metadata.uid)
        print(f"GPU lost -> taint in the slice {to_taint:.1f}s; GPU back -> taint lifted {to_lift:.1f}s")
    finally:
        for gpu_uuid in lost:
            sim.set_gpu_lost(state_file=plugin.sim_state, gpu_uuid=gpu_uuid, lost=False)
        for pod in (HOLDER, WAITER):
            if not pod_gone(core, pod, ns):
                core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
        for pod in (HOLDER, WAITER):
            wait_for(f"{pod} deleted", functools.partial(pod_gone, core, pod, ns), timeout=60)
        core.delete_namespace(ns)
