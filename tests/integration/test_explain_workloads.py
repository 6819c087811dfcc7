"""`gpudra explain KIND/NAME` against the real control plane: workloads' pod templates and their
ResourceClaimTemplates read from the API server, and the node filters (nodeSelector, cpu requests
against the real kubelets' allocatable) agreeing with what the real scheduler does with the same pods."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from kubernetes import client

from tests.localcluster import LocalCluster
from tests.localcluster.node_plugin import DRIVER, PluginProcess

from .kube_helpers import Resources, new_namespace, unschedulable, wait_for

T4 = "Tesla T4"  # only node-mixed has them
TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "t4"},
    "spec": {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.gpudra.io",
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": f'device.attributes["{DRIVER}"].productName == "{T4}"'
                                    }
                                }
                            ],
                        },
                    }
                ]
            }
        }
    },
}


def pod_template(app: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t4"}],
            **spec,
        },
    }


def deployment(name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template(name, **spec),
        },
    }


@pytest.fixture
def namespace(api: client.ApiClient, gpudra: dict[str, PluginProcess]) -> Iterator[str]:
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "explain-workloads")
    try:
        yield ns
    finally:
        # nothing here is allocated (the pods stay unschedulable): the namespace goes with its objects
        core.delete_namespace(ns)


def scheduler_says(core: client.CoreV1Api, namespace: str, pods: list[client.V1Pod]) -> str:
    """The message of the pod's PodScheduled condition: "0/3 nodes are available: ..."."""
    (pod,) = pods
    found = core.read_namespaced_pod(pod.metadata.name, namespace)
    return " ".join(c.message or "" for c in found.status.conditions or [] if c.type == "PodScheduled")


def gpudra_explain(cluster: LocalCluster, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "gpudra",
        "explain",
        "-n",
        namespace,
        f"--kubeconfig={cluster.kubeconfig}",
    ]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120, check=False)


def test_workloads_are_explained_from_the_cluster_as_the_scheduler_places_their_pods(
    cluster: LocalCluster, api: client.ApiClient, namespace: str
) -> None:
    core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
    Resources(api).create("resourceclaimtemplates", TEMPLATE, namespace)
    spread = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}]
    apps.create_namespaced_deployment(namespace, deployment("idle", 0, topologySpreadConstraints=spread))
    picky = {"nodeSelector": {"kubernetes.io/hostname": "node-h100"}}
    apps.create_namespaced_deployment(namespace, deployment("picky", 1, **picky))
    hungry = pod_template("hungry", restartPolicy="Never")
    hungry["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1000"}
    batch.create_namespaced_job(
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "hungry"},
            "spec": {"backoffLimit": 0, "template": hungry},
        },
    )
    apps.create_namespaced_daemon_set(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "nowhere"},
            "spec": {
                "selector": {"matchLabels": {"app": "nowhere"}},
                "template": pod_template("nowhere", nodeSelector={"gpudra.io/test": "none"}),
            },
        },
    )

    # A Deployment with no pods yet: a new pod of its template, its claim as the template makes it.
    done = gpudra_explain(cluster, namespace, "deployment/idle", "-o", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["apiVersion"], result["kind"]) == ("gpudra.io/v1alpha1", "Explanation")
    assert result["claims"] == [f"template {namespace}/t4"]
    assert result["verdict"].startswith("fits on node-mixed")
    assert any("topologySpreadConstraints is not evaluated" in note for note in result["notes"])

    # What the scheduler does with the workloads' pods, and what explain says of them.
    def pods_of(app: str) -> list[client.V1Pod]:
        return list(core.list_namespaced_pod(namespace, label_selector=f"app={app}").items)

    def refused(app: str) -> list[client.V1Pod]:
        return [p for p in pods_of(app) if unschedulable(core, p.metadata.name, namespace)]

    for app in ("picky", "hungry"):
        wait_for(f"the {app} pod to be unschedulable", partial(refused, app), timeout=120)
    # the scheduler's own reasons, which explain's must match
    assert "didn't match Pod's node affinity/selector" in scheduler_says(core, namespace, pods_of("picky"))
    assert "Insufficient cpu" in scheduler_says(core, namespace, pods_of("hungry"))
    done = gpudra_explain(cluster, namespace, "deploy/picky")
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[0].startswith(
        "cannot fit: 2 nodes excluded by nodeSelector kubernetes.io/hostname=node-h100; on the other 1 node: "
        'no device has productName == "Tesla T4"'
    ), done.stdout
    # the pod itself, whose claim the resourceclaim controller made from the template
    (pod,) = pods_of("picky")
    done = gpudra_explain(cluster, namespace, f"pod/{pod.metadata.name}")
    assert done.returncode == 1 and "2 nodes excluded by nodeSelector" in done.stdout, (
        done.stdout + done.stderr
    )

    done = gpudra_explain(cluster, namespace, "job/hungry")
    assert done.returncode == 1, done.stderr
    first = done.stdout.splitlines()[0]
    assert (
        first
        == "cannot fit: 3 nodes excluded by insufficient cpu (the devices of 1 node would fit: node-mixed)"
    )
    assert "the pod requests 1000, the node has" in done.stdout

    done = gpudra_explain(cluster, namespace, "ds/nowhere")
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("cannot fit: 3 nodes excluded by nodeSelector gpudra.io/test=none")

    done = gpudra_explain(cluster, namespace, "statefulset/missing")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"gpudra explain: reading StatefulSet {namespace}/missing: HTTP 404")
    assert len(done.stderr.splitlines()) == 1
