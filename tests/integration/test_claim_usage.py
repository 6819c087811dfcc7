"""Claim usage through the real API server: the plugin samples a running pod's GPU and writes its Idle
condition into the claim's `status.devices` with server-side apply (the API server validates each entry
against the allocation), and shows the figures in its metrics under the claim's and pod's names."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, utils

from gpudra import sim
from gpudra.model import claim_usage
from gpudra.model.claim import read_claim
from tests.localcluster.cluster import free_port
from tests.localcluster.node_plugin import DRIVER, PluginProcess

from .kube_helpers import Resources, claim_pod, claim_template, pod_gone, pod_running, wait_for

NODE = "node-mixed"
POD = "busy"


@pytest.fixture
def plugin(gpudra: dict[str, PluginProcess]) -> Iterator[PluginProcess]:
    """NODE's plugin sampling every second, with metrics; put back as the session runs it afterwards."""
    plugin = gpudra[NODE]
    plugin.stop()
    plugin.start(metrics_port=free_port(), usage_interval=1)
    try:
        yield plugin
    finally:
        plugin.stop()
        plugin.start()


def _idle(claim: dict[str, Any], device: str) -> dict[str, Any] | None:
    """The Idle condition of `device` in the claim's status, once there is one."""
    for entry in (claim.get("status") or {}).get("devices") or []:
        if (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, NODE, device):
            (condition,) = entry["conditions"]
            return dict(condition)
    return None


def test_a_pods_gpu_use_reaches_its_claim_and_the_metrics(
    api: client.ApiClient, plugin: PluginProcess
) -> None:
    core = client.CoreV1Api(api)
    resources = Resources(api)
    ns = f"usage-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    gpu_uuid = None
    try:
        utils.create_from_yaml(
            api,
            yaml_objects=[claim_template("one-gpu"), claim_pod(POD, {"gpu": "one-gpu"}, NODE)],
            namespace=ns,
        )
        pod = wait_for("pod Running", lambda: pod_running(core, POD, ns), timeout=90)
        name = pod.status.resource_claim_statuses[0].resource_claim_name
        claim = resources.get("resourceclaims", name, ns)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        device = result["device"]
        (prepared,) = plugin.checkpoint_claims()[claim["metadata"]["uid"]]["devices"]
        (gpu_uuid,) = prepared["gpu_uuids"]

        def condition(status: str) -> dict[str, Any] | None:
            found = _idle(resources.get("resourceclaims", name, ns), device)
            return found if found is not None and found["status"] == status else None

        sim.set_utilization(state_file=plugin.sim_state, gpu_uuid=gpu_uuid, percent=60)
        busy = wait_for("Idle=False on the claim", lambda: condition("False"), timeout=30)
        assert (busy["reason"], busy["message"]) == ("Active", "kernels run on the GPU")
        # as the exposition writes them: in name order
        labels = f'claim="{name}",device="{device}",gpu_uuid="{gpu_uuid}",namespace="{ns}",pod="{POD}"'
        samples = wait_for(
            "the utilization in the metrics",
            lambda: (
                (m := plugin.metrics()).get(f"gpudra_claim_gpu_utilization_percent{{{labels}}}") == 60 and m
            ),
            timeout=30,
        )
        assert samples[f"gpudra_claim_idle_seconds{{{labels}}}"] == 0
        assert samples[f"gpudra_claim_gpu_memory_used_bytes{{{labels}}}"] == 0

        sim.set_utilization(state_file=plugin.sim_state, gpu_uuid=gpu_uuid, percent=0)
        idle = wait_for("Idle=True on the claim", lambda: condition("True"), timeout=30)
        assert idle["reason"] == "NoActivity"
        assert idle["message"] == f"no kernel ran on the GPU since {idle['lastTransitionTime']}"
        claim = resources.get("resourceclaims", name, ns)
        since = claim_usage.idle_since(read_claim(claim), driver=DRIVER)[(NODE, device)]
        assert claim_usage.format_time(since) == idle["lastTransitionTime"]
        # Written by this node's field manager, with server-side apply, through the status subresource.
        managers = {
            (m["manager"], m["operation"], m.get("subresource")) for m in claim["metadata"]["managedFields"]
        }
        assert (f"gpudra-{NODE}", "Apply", "status") in managers
    finally:
        if gpu_uuid is not None:
            sim.set_utilization(state_file=plugin.sim_state, gpu_uuid=gpu_uuid, percent=0)
        if not pod_gone(core, POD, ns):
            core.delete_namespaced_pod(POD, ns, grace_period_seconds=0)
            wait_for("pod deleted", lambda: pod_gone(core, POD, ns), timeout=60)
        core.delete_namespace(ns)
