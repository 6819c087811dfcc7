"""Where a pod may go before devices are looked at, as the scheduler's filters decide it
(gpudra.scheduling.node_fit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpudra.kube.client import context_namespace
from gpudra.scheduling.node_fit import node_refusals, refusal


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
