"""gpudra's kubelet plugin on the real control plane and kubelet, with simulated GPUs.

Pods are scheduled by the real scheduler from gpudra's slices, claims come from templates through the
real claim controller, and the real kubelet registers the plugin and calls it; the fake runtime records
the CDI device IDs it received.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, utils

from tests.localcluster import LocalCluster, examples
from tests.localcluster.node_plugin import DRIVER, PluginProcess, publishing_flags

from .conftest import MACHINES, REPO
from .kube_helpers import Resources, claim_pod, claim_template, pod_events, pod_gone, pod_running, wait_for

EXAMPLES = REPO / "examples"


def _namespace(api: client.ApiClient, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    return name


def _apply(api: client.ApiClient, objects: list[dict[str, Any]], namespace: str) -> None:
    utils.create_from_yaml(api, yaml_objects=objects, namespace=namespace)


def _claims_of(api: client.ApiClient, pod: client.V1Pod) -> list[dict[str, Any]]:
    resources = Resources(api)
    ns = pod.metadata.namespace
    return [
        resources.get("resourceclaims", s.resource_claim_name, ns) for s in pod.status.resource_claim_statuses
    ]


def _cri_devices(cluster: LocalCluster, node: str, namespace: str, pod: str) -> dict[str, list[str]]:
    """Container name -> CDI device IDs the kubelet gave the runtime for it."""
    lines = Path(cluster.nodes[node].cri_record).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {
        r["container"]: r["cdiDevices"]
        for r in records
        if r["podNamespace"] == namespace and r["podName"] == pod
    }


def test_plugin_registers_and_publishes_valid_slices_for_every_machine(
    api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> None:
    resources = Resources(api)
    for node, profile in MACHINES.items():
        expected = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpudra",
                "inventory",
                f"--nvml=sim:{profile}",
                f"--node-name={node}",
                *publishing_flags(profile),
                "-o",
                "json",
            ],
            env={"GPUDRA_SIM_STATE": str(gpudra[node].sim_state), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        )
        wanted = {
            d["name"] for s in json.loads(expected.stdout)["items"] for d in s["spec"].get("devices", [])
        }

        def published(node: str = node) -> list[dict[str, Any]] | None:
            items = resources.list(
                "resourceslices", field_selector=f"spec.nodeName={node},spec.driver={DRIVER}"
            )
            complete = items and len(items) == items[0]["spec"]["pool"]["resourceSliceCount"]
            return items if complete else None

        slices = wait_for(f"slices of {node}", published, timeout=30)
        devices = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
        assert sorted(devices) == sorted(wanted), node
        assert len({s["spec"]["pool"]["generation"] for s in slices}) == 1
        assert all(s["metadata"]["ownerReferences"][0]["kind"] == "Node" for s in slices)
        assert gpudra[node].registrations() >= 1


@pytest.mark.parametrize(
    ("example", "node", "devices"),
    [
        ("single-gpu.yaml", None, 1),
        ("gpu-pair-nvlink.yaml", "node-h100", 2),
        ("gpu-by-product.yaml", "node-mixed", 1),
        ("time-slicing.yaml", None, 1),
        ("mig-1g.yaml", "node-h100", 1),
        ("mig-mixed.yaml", "node-h100", 3),
        ("mig-static.yaml", "node-a100", 1),
    ],
    ids=[
        "single-gpu",
        "gpu-pair-nvlink",
        "gpu-by-product",
        "time-slicing",
        "mig-1g",
        "mig-mixed",
        "mig-static",
    ],
)
def test_example_runs_and_cleans_up(
    cluster: LocalCluster,
    api: client.ApiClient,
    gpudra: dict[str, PluginProcess],
    example: str,
    node: str | None,
    devices: int,
) -> None:
    core = client.CoreV1Api(api)
    ns = _namespace(api, "example")
    objects = examples.objects(EXAMPLES / example, namespace=ns)
    pod_name = next(o["metadata"]["name"] for o in objects if o["kind"] == "Pod")
    _apply(api, objects, ns)

    pod = wait_for(f"{example} pod Running", lambda: pod_running(core, pod_name, ns), timeout=90)
    if node is not None:
        assert pod.spec.node_name == node
    plugin = gpudra[pod.spec.node_name]
    (claim,) = _claims_of(api, pod)
    uid = claim["metadata"]["uid"]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == devices
    expected_ids = sorted(f"{DRIVER}/claim={uid}-{r['device']}" for r in results)

    spec = plugin.cdi_specs()[uid]
    assert tuple(int(p) for p in spec["cdiVersion"].split(".")) >= (0, 5, 0)
    assert spec["kind"] == f"{DRIVER}/claim"
    assert sorted(f"{spec['kind']}={d['name']}" for d in spec["devices"]) == expected_ids
    given = _cri_devices(cluster, pod.spec.node_name, ns, pod_name)
    for container, ids in given.items():  # a container naming one request gets that request's devices
        assert set(ids) <= set(expected_ids), container
    assert sorted({i for ids in given.values() for i in ids}) == expected_ids
    assert plugin.checkpoint_claims()[uid]["state"] == "PrepareCompleted"
    if example == "time-slicing.yaml":
        gpu = next(d for d in claim_devices(plugin, uid))
        assert plugin.timeslices()[gpu] == 3  # Long

    core.delete_namespaced_pod(pod_name, ns, grace_period_seconds=0)
    wait_for("pod deleted", lambda: pod_gone(core, pod_name, ns), timeout=60)
    # The CDI spec goes first, then the checkpoint's entry (its save is group-committed): done when both are.
    wait_for(
        "CDI spec and checkpoint entry removed",
        lambda: uid not in plugin.cdi_specs() and uid not in plugin.checkpoint_claims(),
        timeout=60,
    )
    assert all(v == 0 for v in plugin.timeslices().values())
    core.delete_namespace(ns)


def claim_devices(plugin: PluginProcess, uid: str) -> list[str]:
    """GPU UUIDs the plugin's checkpoint records for a claim."""
    return [g for d in plugin.checkpoint_claims()[uid]["devices"] for g in d["gpu_uuids"]]


def test_bad_config_fails_with_field_in_pod_event_while_good_claim_is_prepared(
    api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> None:
    core = client.CoreV1Api(api)
    ns = _namespace(api, "badconfig")
    bad = {
        "apiVersion": "resource.gpudra.io/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}},
    }
    _apply(
        api,
        [
            claim_template("good"),
            claim_template("bad", bad),
            claim_pod("mixed", {"good": "good", "bad": "bad"}, "node-h100"),
        ],
        ns,
    )
    plugin = gpudra["node-h100"]

    def failed_event() -> list[str] | None:
        events = [e for e in pod_events(core, "mixed", ns) if "FailedPrepareDynamicResources" in e]
        return events or None

    events = wait_for("a prepare failure event", failed_event, timeout=90)
    assert "sharing.timeSlicingConfig.interval" in events[0], events[0]
    assert "Default, Short, Medium, Long" in events[0], events[0]
    pod = core.read_namespaced_pod("mixed", ns)
    assert pod.status.phase == "Pending"
    claims = {s.name: s.resource_claim_name for s in pod.status.resource_claim_statuses}
    resources = Resources(api)
    good_uid = resources.get("resourceclaims", claims["good"], ns)["metadata"]["uid"]
    bad_uid = resources.get("resourceclaims", claims["bad"], ns)["metadata"]["uid"]
    prepared = plugin.checkpoint_claims()
    assert prepared[good_uid]["state"] == "PrepareCompleted"
    assert bad_uid not in prepared
    assert good_uid in plugin.cdi_specs() and bad_uid not in plugin.cdi_specs()

    core.delete_namespaced_pod("mixed", ns, grace_period_seconds=0)
    wait_for("good claim unprepared", lambda: good_uid not in plugin.checkpoint_claims(), timeout=60)
    assert good_uid not in plugin.cdi_specs()
    core.delete_namespace(ns)


def test_unchanged_pool_is_not_rewritten_on_resync(
    api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> None:
    """The plugins resync every 5 s here; an unchanged model must cost no writes."""
    resources = Resources(api)

    def versions() -> dict[str, str]:
        return {
            s["metadata"]["name"]: s["metadata"]["resourceVersion"]
            for s in resources.list("resourceslices", field_selector=f"spec.driver={DRIVER}")
        }

    before = versions()
    time.sleep(12)  # more than two resync periods
    assert versions() == before
    # The resyncs did run: a slice deleted behind the plugin's back is published again.
    victim = sorted(before)[0]
    resources.delete("resourceslices", victim)
    wait_for("the deleted slice to be republished", lambda: victim in versions(), timeout=30)


def test_sigterm_stops_quickly_and_removes_sockets(gpudra: dict[str, PluginProcess]) -> None:
    plugin = gpudra["node-mixed"]
    registration = plugin.node.registry_dir / f"{DRIVER}-reg.sock"
    dra = plugin.node.plugins_dir / DRIVER / "dra.sock"
    assert registration.exists() and dra.exists()
    process = plugin.process
    assert process is not None
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    print(f"plugin stopped {time.monotonic() - started:.2f}s after SIGTERM")
    assert not registration.exists() and not dra.exists()
    plugin.start()
    assert registration.exists() and dra.exists()
