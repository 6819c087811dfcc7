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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from gpudra.errors import ConfigError
from gpudra.model.claim import Toleration
from gpudra.model.cluster_objects import (
    Container,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    PodSpec,
    Taint,
)
from gpudra.quantity import parse_quantity

FILTERING_EFFECTS = ("NoSchedule", "NoExecute")
UNSCHEDULABLE = Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule")
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


def node_refusals(pod: PodSpec, nodes: Iterable[Node], pods: Iterable[Pod] = ()) -> dict[str, Refusal]:
    """Node name -> why the pod cannot be scheduled there, for the nodes that refuse it. `pods`: the
    cluster's pods, whose requests use up the nodes they are bound to (none given: only the nodes'
    allocatable is compared)."""
    use = node_use(pods)
    found = {}
    for node in nodes:
        reason = refusal(pod, node, use.get(node.name))
        if reason is not None:
            found[node.name] = reason
    return found


def refusal(pod: PodSpec, node: Node, use: NodeUse | None = None) -> Refusal | None:
    """Why the pod cannot go to `node` (the first filter that refuses it, in the scheduler's order), or
    None."""
    if node.unschedulable and not any(_tolerates(t, UNSCHEDULABLE) for t in pod.tolerations):
        return Refusal(
            "cordoned (unschedulable)",
            "the node is cordoned (spec.unschedulable), and the pod does not tolerate "
            "node.kubernetes.io/unschedulable:NoSchedule",
        )
    wanted = pod.node_name
    if wanted and wanted != node.name:
        return Refusal(f"spec.nodeName {wanted}", f"the pod names another node in spec.nodeName: {wanted}")
    for taint in node.taints:
        if taint.effect in FILTERING_EFFECTS and not any(_tolerates(t, taint) for t in pod.tolerations):
            value = f"={taint.value}" if taint.value else ""
            taint_text = f"{taint.key}{value}:{taint.effect}"
            return Refusal(
                f"taint {taint_text}", f"the node has the taint {taint_text}, which the pod does not tolerate"
            )
    for key, value in pod.node_selector.items():
        if node.labels.get(key) != value:
            return Refusal(
                f"nodeSelector {key}={value}", f"the node does not match the pod's nodeSelector {key}={value}"
            )
    terms = pod.required_node_affinity
    if terms is not None and not any(_term_matches(t, node) for t in terms):
        return Refusal(
            "required node affinity", "the node matches none of the pod's required node affinity terms"
        )
    return _resources(pod, node.allocatable, use or NodeUse())


def unevaluated(pod: PodSpec) -> list[str]:
    """What in the pod the scheduler weighs that these filters do not: one line, or none."""
    named = [
        what
        for what, present in (
            ("podAffinity", pod.pod_affinity),
            ("podAntiAffinity", pod.pod_anti_affinity),
            ("topologySpreadConstraints", pod.topology_spread),
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


def pod_requests(pod: PodSpec) -> dict[str, Fraction]:
    """What the scheduler counts a pod as requesting: its containers' requests summed, or the largest
    init container's if more (sidecars, init containers with restartPolicy Always, run beside both), plus
    the pod overhead. A container's limits stand for requests it does not state, as the API server
    defaults them."""
    total: dict[str, Fraction] = {}
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in pod.init_containers:
        wants = _container_requests(container)
        if container.restart_policy == "Always":
            _add_to(sidecars, wants)
            continue
        for resource in RESOURCES:
            running = wants.get(resource, Fraction(0)) + sidecars.get(resource, Fraction(0))
            init_peak[resource] = max(init_peak.get(resource, Fraction(0)), running)
    for container in pod.containers:
        _add_to(total, _container_requests(container))
    _add_to(total, sidecars)
    for resource, peak in init_peak.items():
        total[resource] = max(total.get(resource, Fraction(0)), peak)
    _add_to(total, _quantities(pod.overhead))
    return {r: v for r, v in total.items() if v}


def node_use(pods: Iterable[Pod]) -> dict[str, NodeUse]:
    """Node name -> what the pods bound to it and not finished request."""
    use: dict[str, NodeUse] = {}
    for pod in pods:
        if not pod.spec.node_name or pod.phase in _FINISHED:
            continue
        entry = use.setdefault(pod.spec.node_name, NodeUse())
        _add_to(entry.requested, pod_requests(pod.spec))
        entry.pods += 1
    return use


def _resources(pod: PodSpec, allocatable: Mapping[str, str], use: NodeUse) -> Refusal | None:
    """NodeResourcesFit: the pod count, then each resource the pod requests that the node states."""
    room = _quantities(allocatable)
    if "pods" in room and use.pods + 1 > room["pods"]:
        return Refusal(
            "too many pods", f"the node runs {use.pods} pods, as many as it allows (allocatable pods)"
        )
    for resource, wanted in pod_requests(pod).items():
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


def _container_requests(container: Container) -> dict[str, Fraction]:
    return {**_quantities(container.limits), **_quantities(container.requests)}


def _quantities(values: Mapping[str, str]) -> dict[str, Fraction]:
    """The resources of RESOURCES (and pods) among `values`; a value that is no quantity counts as
    absent (the API server refuses such an object; a file may hold one)."""
    found = {}
    for resource in (*RESOURCES, "pods"):
        if resource in values:
            try:
                found[resource] = parse_quantity(values[resource])
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


def _tolerates(toleration: Toleration, taint: Taint) -> bool:
    """The API's ToleratesTaint: effect (empty: all), then key and value by the operator."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return not toleration.key or toleration.key == taint.key
    return toleration.key == taint.key and toleration.value == taint.value


def _term_matches(term: NodeSelectorTerm, node: Node) -> bool:
    if not term.match_expressions and not term.match_fields:
        return False  # an empty term matches no node
    return all(_matches(e, node.labels) for e in term.match_expressions) and all(
        _matches(f, {"metadata.name": node.name}) for f in term.match_fields
    )


def _matches(requirement: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    key, operator, values = requirement.key, requirement.operator, requirement.values
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
