"""Where a pod may go before devices are looked at, as the scheduler's filters decide it
(gpudra.scheduling.node_fit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpudra.kube.client import context_namespace
from gpudra.model.cluster_objects import Node, Pod, PodSpec
from gpudra.scheduling import node_fit
from gpudra.scheduling.node_fit import Refusal

# The filters take typed records: these read the tests' objects first, as `gpudra explain` reads its
# inputs.


def refusal(pod: dict[str, Any], node: Any) -> Refusal | None:
    return node_fit.refusal(PodSpec.from_raw(pod), Node.from_raw(node))


def node_refusals(pod: dict[str, Any], nodes: list[Any], pods: list[Any] | None = None) -> dict[str, Refusal]:
    running = [Pod.from_raw(p) for p in pods or []]
    return node_fit.node_refusals(PodSpec.from_raw(pod), [Node.from_raw(n) for n in nodes], running)


def pod_requests(pod: dict[str, Any]) -> dict[str, Any]:
    return node_fit.pod_requests(PodSpec.from_raw(pod))


def unevaluated(pod: dict[str, Any]) -> list[str]:
    return node_fit.unevaluated(PodSpec.from_raw(pod))


def node(
    labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None, **spec: Any
) -> Any:
    return {"metadata": {"name": "n1", "labels": labels or {}}, "spec": {"taints": taints or [], **spec}}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


TAINT = {"key": "gpu", "value": "yes", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("pod", "the_node", "allowed"),
    [
        ({}, node(taints=[TAINT]), False),
        ({}, node(taints=[{**TAINT, "effect": "PreferNoSchedule"}]), True),
        ({"tolerations": [{"key": "gpu", "operator": "Exists"}]}, node(taints=[TAINT]), True),
        ({"tolerations": [{"operator": "Exists"}]}, node(taints=[TAINT]), True),
        ({"tolerations": [{"key": "gpu", "value": "yes"}]}, node(taints=[TAINT]), True),
        ({"tolerations": [{"key": "gpu", "value": "no"}]}, node(taints=[TAINT]), False),
        (
            {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}]},
            node(taints=[TAINT]),
            False,
        ),
        ({}, node(unschedulable=True), False),
        (
            {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]},
            node(unschedulable=True),
            True,
        ),
        ({"nodeName": "n1"}, node(), True),
        ({"nodeName": "n2"}, node(), False),
        ({"nodeSelector": {"a": "1"}}, node({"a": "1"}), True),
        ({"nodeSelector": {"a": "1"}}, node({"a": "2"}), False),
        (affinity(expr("a", "In", "1", "2")), node({"a": "2"}), True),
        (affinity(expr("a", "NotIn", "1")), node({}), True),
        (affinity(expr("a", "Exists")), node({}), False),
        (affinity(expr("a", "DoesNotExist")), node({}), True),
        (affinity(expr("gpus", "Gt", "4")), node({"gpus": "8"}), True),
        (affinity(expr("gpus", "Lt", "4")), node({"gpus": "8"}), False),
        (affinity(expr("a", "In", "x"), expr("b", "Exists")), node({"b": ""}), True),  # terms are ORed
        (affinity({}), node({"a": "1"}), False),  # an empty term matches no node
        (
            affinity({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}),
            node(),
            True,
        ),
    ],
)
def test_the_scheduler_s_filters(pod: dict[str, Any], the_node: Any, allowed: bool) -> None:
    assert (refusal(pod, the_node) is None) == allowed
    assert (node_refusals(pod, [the_node]) == {}) == allowed


def container(**requests: str) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": requests}}


def sized(cpu: str, memory: str, pods: str = "110") -> Any:
    return {**node(), "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": pods}}}


def bound(node_name: str, phase: str = "Running", **requests: str) -> dict[str, Any]:
    return {
        "spec": {"nodeName": node_name, "containers": [container(**requests)]},
        "status": {"phase": phase},
    }


def test_what_a_pod_requests_is_counted_as_the_scheduler_counts_it() -> None:
    spec = {
        "containers": [container(cpu="500m", memory="1Gi"), {"resources": {"limits": {"cpu": "1"}}}],
        "initContainers": [
            {**container(cpu="4"), "name": "migrate"},  # alone, before the rest: the peak
            {**container(memory="512Mi"), "restartPolicy": "Always"},  # a sidecar: beside the rest
        ],
        "overhead": {"memory": "100Mi"},
    }
    assert pod_requests(spec) == {"cpu": 4, "memory": (1024 + 512 + 100) * 2**20}


def test_cpu_and_memory_are_compared_with_what_is_left_of_allocatable() -> None:
    pod = {"containers": [container(cpu="2", memory="8Gi")]}
    assert refusal(pod, sized("4", "16Gi")) is None
    found = node_refusals(pod, [sized("4", "16Gi")], [bound("n1", cpu="3"), bound("n2", cpu="4")])
    assert found["n1"].check == "insufficient cpu"
    assert found["n1"].reason == (
        "insufficient cpu: the pod requests 2, the node has 1 free of 4 allocatable"
    )
    memory = node_refusals(pod, [sized("4", "16Gi")], [bound("n1", memory="8.5Gi")])["n1"]
    assert (
        memory.reason
        == "insufficient memory: the pod requests 8Gi, the node has 7.5Gi free of 16Gi allocatable"
    )
    # finished pods hold nothing; a full node refuses by pod count
    assert node_refusals(pod, [sized("4", "16Gi")], [bound("n1", "Succeeded", cpu="4")]) == {}
    assert node_refusals(pod, [sized("4", "16Gi", pods="1")], [bound("n1")])["n1"].check == "too many pods"


def test_every_refusal_names_its_filter_alike_on_every_node() -> None:
    pod = {"nodeSelector": {"gpu": "h100"}}
    nodes = [
        {**node({"gpu": "a100"}), "metadata": {"name": n, "labels": {"gpu": "a100"}}} for n in ("a", "b")
    ]
    assert {r.check for r in node_refusals(pod, nodes).values()} == {"nodeSelector gpu=h100"}


def test_pod_affinity_and_topology_spread_are_said_to_be_unevaluated() -> None:
    assert unevaluated({}) == []
    [line] = unevaluated({"affinity": {"podAntiAffinity": {"x": 1}}, "topologySpreadConstraints": [{}]})
    assert line.startswith("the pod's podAntiAffinity, topologySpreadConstraints are not evaluated")


def test_the_kubeconfig_context_names_the_namespace(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: a\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {}}]\n"
        "contexts:\n- {name: a, context: {cluster: c, user: u, namespace: team-a}}\n"
        "- {name: b, context: {cluster: c, user: u}}\n"
    )
    assert context_namespace(str(kubeconfig)) == "team-a"
    assert context_namespace(str(kubeconfig), "b") is None
