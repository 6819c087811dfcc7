"""Whether a pod may go to a node at all, before any device is looked at, as the scheduler's filters
decide it: the node's NoSchedule and NoExecute taints against the pod's tolerations (an unschedulable
node counts as tainted node.kubernetes.io/unschedulable:NoSchedule), the pod's nodeSelector, and its
required node affinity (the terms ORed, each term's expressions ANDed; In, NotIn, Exists, DoesNotExist,
Gt, Lt on labels; matchFields on metadata.name). Pure.

`gpudra explain` counts a node this refuses as the scheduler does: not a place for the pod, whatever
devices it has. PreferNoSchedule taints and preferred affinity only rank nodes, so they are not here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FILTERING_EFFECTS = ("NoSchedule", "NoExecute")
UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def node_refusals(pod_spec: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Node name -> why the pod cannot be scheduled there, for the nodes that refuse it."""
    found = {}
    for node in nodes:
        reason = refusal(pod_spec, node)
        if reason is not None:
            found[str(_map(node.get("metadata")).get("name", ""))] = reason
    return found


def refusal(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """Why the pod cannot go to `node` (taints first, as the scheduler reports them), or None."""
    spec = _map(node.get("spec"))
    meta = _map(node.get("metadata"))
    labels = {str(k): str(v) for k, v in _map(meta.get("labels")).items()}
    taints = [_map(t) for t in _list(spec.get("taints"))] + (
        [UNSCHEDULABLE] if spec.get("unschedulable") else []
    )
    tolerations = [_map(t) for t in _list(pod_spec.get("tolerations"))]
    for taint in taints:
        if taint.get("effect") in FILTERING_EFFECTS and not any(_tolerates(t, taint) for t in tolerations):
            value = f"={taint['value']}" if taint.get("value") else ""
            taint_text = f"{taint.get('key')}{value}:{taint.get('effect')}"
            return f"the node has the taint {taint_text}, which the pod does not tolerate"
    for key, value in _map(pod_spec.get("nodeSelector")).items():
        if labels.get(str(key)) != str(value):
            return f"the node does not match the pod's nodeSelector {key}={value}"
    required = _map(
        _map(_map(pod_spec.get("affinity")).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    terms = [_map(t) for t in _list(required.get("nodeSelectorTerms"))]
    if required and not any(_term_matches(t, labels, str(meta.get("name", ""))) for t in terms):
        return "the node matches none of the pod's required node affinity terms"
    return None


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """The API's ToleratesTaint: effect (empty: all), then key and value by the operator."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if toleration.get("operator") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    expressions = [_map(e) for e in _list(term.get("matchExpressions"))]
    fields = [_map(e) for e in _list(term.get("matchFields"))]
    if not expressions and not fields:
        return False  # an empty term matches no node
    return all(_matches(e, labels) for e in expressions) and all(
        _matches(f, {"metadata.name": name}) for f in fields
    )


def _matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = str(expression.get("key", "")), expression.get("operator")
    values: Sequence[str] = [str(v) for v in _list(expression.get("values"))]
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
