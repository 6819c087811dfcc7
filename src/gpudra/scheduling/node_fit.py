"""Whether a pod may go to a node at all, before any device is looked at, as the scheduler's filters
decide it, in their order: an unschedulable (cordoned) node counts as tainted
node.kubernetes.io/unschedulable:NoSchedule (NodeUnschedulable), the pod's spec.nodeName (NodeName), the
node's NoSchedule and NoExecute taints against the pod's tolerations (TaintToleration), the pod's
nodeSelector and required node affinity (NodeAffinity: the terms ORed, each term's expressions ANDed;
In, NotIn, Exists, DoesNotExist, Gt, Lt on labels; matchFields on metadata.name), and its cpu, memory
and ephemeral-storage requests and the pod count against the node's allocatable, less what the pods
already bound there request (NodeResourcesFit). Pure.

`gpudra explain` counts a node this refuses as the scheduler does: not a place for the pod, whatever
devices it has. Each refusal names the filter that made it (`Refusal.check`), the same text for every
node it refuses, so that explain can say "3 nodes excluded by nodeSelector gpu=h100". PreferNoSchedule
taints and preferred affinity only rank nodes, so they are not here; pod (anti-)affinity and topology
spread constraints depend on where other pods run and are not evaluated (`unevaluated` names them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gpudra.errors import ConfigError
from gpudra.quantity import parse_quantity

FILTERING_EFFECTS = ("NoSchedule", "NoExecute")
UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
# The resources NodeResourcesFit compares that gpudra's inputs carry (extended resources are left out:
# the DRA extended-resource mapping makes some of them claims' business).
RESOURCES = ("cpu", "memory", "ephemeral-storage")
_FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Refusal:
    """Why a pod cannot go to a node. `check` names the filter and what in the pod it applies (the same
    for every node it refuses: "nodeSelector gpu=h100", "insufficient cpu"); `reason` says it of this
    node."""

    check: str
    reason: str


@dataclass
class NodeUse:
    """What the pods bound to a node and not finished request, and how many they are."""

    requested: dict[str, Fraction] = field(default_factory=dict)
    pods: int = 0


def node_refusals(
    pod_spec: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]] = ()
) -> dict[str, Refusal]:
    """Node name -> why the pod cannot be scheduled there, for the nodes that refuse it. `pods`: the
    cluster's pods, whose requests use up the nodes they are bound to (none given: only the nodes'
    allocatable is compared)."""
    use = node_use(pods)
    found = {}
    for node in nodes:
        name = str(_map(node.get("metadata")).get("name", ""))
        reason = refusal(pod_spec, node, use.get(name))
        if reason is not None:
            found[name] = reason
    return found


def refusal(
    pod_spec: Mapping[str, Any], node: Mapping[str, Any], use: NodeUse | None = None
) -> Refusal | None:
    """Why the pod cannot go to `node` (the first filter that refuses it, in the scheduler's order), or
    None."""
    spec = _map(node.get("spec"))
    meta = _map(node.get("metadata"))
    name = str(meta.get("name", ""))
    labels = {str(k): str(v) for k, v in _map(meta.get("labels")).items()}
    tolerations = [_map(t) for t in _list(pod_spec.get("tolerations"))]
    if spec.get("unschedulable") and not any(_tolerates(t, UNSCHEDULABLE) for t in tolerations):
        return Refusal(
            "cordoned (unschedulable)",
            "the node is cordoned (spec.unschedulable), and the pod does not tolerate "
            "node.kubernetes.io/unschedulable:NoSchedule",
        )
    wanted = pod_spec.get("nodeName")
    if wanted and str(wanted) != name:
        return Refusal(f"spec.nodeName {wanted}", f"the pod names another node in spec.nodeName: {wanted}")
    for taint in (_map(t) for t in _list(spec.get("taints"))):
        if taint.get("effect") in FILTERING_EFFECTS and not any(_tolerates(t, taint) for t in tolerations):
            value = f"={taint['value']}" if taint.get("value") else ""
            taint_text = f"{taint.get('key')}{value}:{taint.get('effect')}"
            return Refusal(
                f"taint {taint_text}", f"the node has the taint {taint_text}, which the pod does not tolerate"
            )
    for key, value in _map(pod_spec.get("nodeSelector")).items():
        if labels.get(str(key)) != str(value):
            return Refusal(
                f"nodeSelector {key}={value}", f"the node does not match the pod's nodeSelector {key}={value}"
            )
    required = _map(
        _map(_map(pod_spec.get("affinity")).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    terms = [_map(t) for t in _list(required.get("nodeSelectorTerms"))]
    if required and not any(_term_matches(t, labels, name) for t in terms):
        return Refusal(
            "required node affinity", "the node matches none of the pod's required node affinity terms"
        )
    return _resources(pod_spec, _map(_map(node.get("status")).get("allocatable")), use or NodeUse())


def unevaluated(pod_spec: Mapping[str, Any]) -> list[str]:
    """What in the pod the scheduler weighs that these filters do not: one line, or none."""
    affinity = _map(pod_spec.get("affinity"))
    named = [
        what
        for what, present in (
            ("podAffinity", affinity.get("podAffinity")),
            ("podAntiAffinity", affinity.get("podAntiAffinity")),
            ("topologySpreadConstraints", pod_spec.get("topologySpreadConstraints")),
        )
        if present
    ]
    if not named:
        return []
    return [
        f"the pod's {', '.join(named)} {'is' if len(named) == 1 else 'are'} not evaluated (they depend on "
        "where other pods run): the scheduler may turn down more nodes than these"
    ]


# --- node resources ----------------------------------------------------------------------------


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """What the scheduler counts a pod as requesting: its containers' requests summed, or the largest
    init container's if more (sidecars, init containers with restartPolicy Always, run beside both), plus
    the pod overhead. A container's limits stand for requests it does not state, as the API server
    defaults them."""
    total: dict[str, Fraction] = {}
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in (_map(c) for c in _list(pod_spec.get("initContainers"))):
        wants = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add_to(sidecars, wants)
            continue
        for resource in RESOURCES:
            running = wants.get(resource, Fraction(0)) + sidecars.get(resource, Fraction(0))
            init_peak[resource] = max(init_peak.get(resource, Fraction(0)), running)
    for container in (_map(c) for c in _list(pod_spec.get("containers"))):
        _add_to(total, _container_requests(container))
    _add_to(total, sidecars)
    for resource, peak in init_peak.items():
        total[resource] = max(total.get(resource, Fraction(0)), peak)
    _add_to(total, _quantities(_map(pod_spec.get("overhead"))))
    return {r: v for r, v in total.items() if v}


def node_use(pods: Iterable[Mapping[str, Any]]) -> dict[str, NodeUse]:
    """Node name -> what the pods bound to it and not finished request."""
    use: dict[str, NodeUse] = {}
    for pod in pods:
        spec = _map(pod.get("spec"))
        node = spec.get("nodeName")
        if not node or _map(pod.get("status")).get("phase") in _FINISHED:
            continue
        entry = use.setdefault(str(node), NodeUse())
        _add_to(entry.requested, pod_requests(spec))
        entry.pods += 1
    return use


def _resources(pod_spec: Mapping[str, Any], allocatable: Mapping[str, Any], use: NodeUse) -> Refusal | None:
    """NodeResourcesFit: the pod count, then each resource the pod requests that the node states."""
    room = _quantities(allocatable)
    if "pods" in room and use.pods + 1 > room["pods"]:
        return Refusal(
            "too many pods", f"the node runs {use.pods} pods, as many as it allows (allocatable pods)"
        )
    for resource, wanted in pod_requests(pod_spec).items():
        if resource not in room:
            continue
        free = room[resource] - use.requested.get(resource, Fraction(0))
        if wanted > free:
            return Refusal(
                f"insufficient {resource}",
                f"insufficient {resource}: the pod requests {_amount(resource, wanted)}, the node has "
                f"{_amount(resource, max(free, Fraction(0)))} free of {_amount(resource, room[resource])} "
                "allocatable",
            )
    return None


def _container_requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
    resources = _map(container.get("resources"))
    return {**_quantities(_map(resources.get("limits"))), **_quantities(_map(resources.get("requests")))}


def _quantities(values: Mapping[str, Any]) -> dict[str, Fraction]:
    """The resources of RESOURCES (and pods) among `values`; a value that is no quantity counts as
    absent (the API server refuses such an object; a file may hold one)."""
    found = {}
    for resource in (*RESOURCES, "pods"):
        if resource in values:
            try:
                found[resource] = parse_quantity(str(values[resource]))
            except ConfigError:
                continue
    return found


def _add_to(total: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for resource, value in more.items():
        total[resource] = total.get(resource, Fraction(0)) + value


def _amount(resource: str, value: Fraction) -> str:
    """cpu in cores or millicores (2, 500m); bytes with a binary suffix (16Gi, 1.5Gi)."""
    if resource == "cpu":
        return str(int(value)) if value.denominator == 1 else f"{round(value * 1000)}m"
    for power, suffix in ((4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
        unit = 1024**power
        if value >= unit:
            shown = value / unit
            return f"{int(shown)}{suffix}" if shown.denominator == 1 else f"{float(shown):.1f}{suffix}"
    return str(round(value))


# --- affinity and tolerations ------------------------------------------------------------------


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
