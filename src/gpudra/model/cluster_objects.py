"""The cluster's objects gpudra reads besides claims and slices, as typed records: Nodes, Pods,
DeviceClasses, ResourceClaimTemplates. Pure.

They come from the API server (`gpudra explain` online, the controller's watches) or from a user's
files (`gpudra explain --slices`, a FILE of pods and workloads), and a file is never validated: each
record's `from_raw` is the one place its object is read, through `gpudra.model.tolerant` (a field of
the wrong type reads as absent, an entry of a list that is not an object is left out), and never
raises. Past it, the scheduler's filters (`gpudra.scheduling.node_fit`), explain and the cluster view
work on fields, not on `.get(...) or {}`.

Only what gpudra acts on is read. A Pod's spec is what the scheduler's node filters weigh, and the
claims it names; a DeviceClass is its selectors (its config entries are judged by
`gpudra.model.manifests` on the object as written, which must name the fields it refuses). Quantities,
labels and selector values are kept as text, as written: the code that compares them parses them, so
that an odd one costs only that comparison. A claim is `gpudra.model.claim`'s, and so is the claim spec
a template holds.

To read one more field: add it to the record here and to its `from_raw`, then use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudra.model.claim import ClaimSpec, FieldProblem, Toleration, read_template_spec
from gpudra.model.tolerant import EMPTY, flag, items, mapping, objects, scalar, text

__all__ = [
    "Container",
    "DeviceClass",
    "Node",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "Pod",
    "PodClaim",
    "PodSpec",
    "ResourceClaimTemplate",
    "Taint",
]


# --- nodes ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Taint:
    """A node's taint; an absent field is empty."""

    key: str = ""
    value: str = ""
    effect: str = ""

    @classmethod
    def from_raw(cls, raw: object) -> Taint:
        taint = mapping(raw)
        return cls(text(taint.get("key")), text(taint.get("value")), text(taint.get("effect")))


@dataclass(frozen=True, slots=True)
class Node:
    name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False  # spec.unschedulable: cordoned
    allocatable: Mapping[str, str] = field(default_factory=dict)  # status.allocatable, as written

    @classmethod
    def from_raw(cls, raw: object) -> Node:
        node = mapping(raw)
        metadata, spec = mapping(node.get("metadata")), mapping(node.get("spec"))
        return cls(
            name=text(metadata.get("name")),
            labels=_scalars(metadata.get("labels")),
            taints=tuple(Taint.from_raw(t) for t in objects(spec.get("taints"))),
            unschedulable=flag(spec.get("unschedulable")),
            allocatable=_scalars(mapping(node.get("status")).get("allocatable")),
        )


# --- pods -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    """One of a node selector term's matchExpressions (on labels) or matchFields (on the node's
    fields): `key`, an operator (In, NotIn, Exists, DoesNotExist, Gt, Lt) and its values."""

    key: str = ""
    operator: str = ""
    values: tuple[str, ...] = ()

    @classmethod
    def from_raw(cls, raw: object) -> NodeSelectorRequirement:
        requirement = mapping(raw)
        values = (scalar(v) for v in items(requirement.get("values")))
        return cls(
            key=text(requirement.get("key")),
            operator=text(requirement.get("operator")),
            values=tuple(v for v in values if v is not None),
        )


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """A term of required node affinity: its requirements ANDed (none at all matches no node)."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = ()
    match_fields: tuple[NodeSelectorRequirement, ...] = ()

    @classmethod
    def from_raw(cls, raw: object) -> NodeSelectorTerm:
        term = mapping(raw)
        return cls(
            match_expressions=tuple(
                map(NodeSelectorRequirement.from_raw, objects(term.get("matchExpressions")))
            ),
            match_fields=tuple(map(NodeSelectorRequirement.from_raw, objects(term.get("matchFields")))),
        )


@dataclass(frozen=True, slots=True)
class Container:
    """What the scheduler counts of a container: its resources (as written) and, for an init
    container, its restartPolicy (Always: a sidecar, running beside the others)."""

    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)
    restart_policy: str = ""

    @classmethod
    def from_raw(cls, raw: object) -> Container:
        container = mapping(raw)
        resources = mapping(container.get("resources"))
        return cls(
            requests=_scalars(resources.get("requests")),
            limits=_scalars(resources.get("limits")),
            restart_policy=text(container.get("restartPolicy")),
        )


@dataclass(frozen=True, slots=True)
class PodClaim:
    """An entry of the pod's `spec.resourceClaims`, at `index` in that list: a claim by name or a
    template to make one from (neither, on a pod the API server would refuse)."""

    index: int
    name: str = ""
    resource_claim_name: str = ""
    template_name: str = ""  # resourceClaimTemplateName


@dataclass(frozen=True, slots=True)
class PodSpec:
    """What the scheduler's node filters weigh of a pod's spec, and the claims it names."""

    node_name: str = ""
    tolerations: tuple[Toleration, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # required node affinity's terms, ORed; None without required node affinity (an empty one given
    # matches no node)
    required_node_affinity: tuple[NodeSelectorTerm, ...] | None = None
    # present, though the filters do not evaluate them (they depend on where other pods run)
    pod_affinity: bool = False
    pod_anti_affinity: bool = False
    topology_spread: bool = False
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] = ()
    overhead: Mapping[str, str] = field(default_factory=dict)
    resource_claims: tuple[PodClaim, ...] = ()

    @classmethod
    def from_raw(cls, raw: object) -> PodSpec:
        return _pod_spec(mapping(raw), [])


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod: where it is bound (`spec.node_name`), whether it has finished, and which claims it has.
    `problems`: what `gpudra explain` cannot read of the pod's name and claims (metadata, spec or
    status not an object, resourceClaims or resourceClaimStatuses not a list of objects), each
    naming its field; a pod whose claims cannot be read cannot be explained."""

    namespace: str = ""
    name: str = ""
    phase: str = ""  # status.phase: Pending, Running, Succeeded, Failed
    scheduled: bool = False  # its PodScheduled condition is True: the scheduler bound it
    spec: PodSpec = PodSpec()
    claim_statuses: Mapping[str, str] = field(default_factory=dict)  # pod claim -> the claim made for it
    problems: tuple[FieldProblem, ...] = ()

    @classmethod
    def from_raw(cls, raw: object) -> Pod:
        pod = mapping(raw)
        problems: list[FieldProblem] = []
        metadata = _object(pod.get("metadata"), "metadata", problems)
        status = _object(pod.get("status"), "status", problems)
        generated = {
            text(entry.get("name")): made
            for _, entry in _objects(
                status.get("resourceClaimStatuses"), "status.resourceClaimStatuses", problems
            )
            if (made := text(entry.get("resourceClaimName")))
        }
        spec = _pod_spec(_object(pod.get("spec"), "spec", problems), problems)
        return cls(
            namespace=text(metadata.get("namespace")),
            name=text(metadata.get("name")),
            phase=text(status.get("phase")),
            scheduled=any(
                c.get("type") == "PodScheduled" and c.get("status") == "True"
                for c in objects(status.get("conditions"))
            ),
            spec=spec,
            claim_statuses=generated,
            problems=tuple(problems),
        )


def _pod_spec(spec: Mapping[str, Any], problems: list[FieldProblem]) -> PodSpec:
    """The spec; what is wrong with its resourceClaims added to `problems`."""
    affinity = mapping(spec.get("affinity"))
    required = mapping(
        mapping(affinity.get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    claims = _objects(spec.get("resourceClaims"), "spec.resourceClaims", problems)
    return PodSpec(
        node_name=text(spec.get("nodeName")),
        tolerations=tuple(Toleration.from_raw(t) for t in objects(spec.get("tolerations"))),
        node_selector=_scalars(spec.get("nodeSelector")),
        required_node_affinity=(
            tuple(NodeSelectorTerm.from_raw(t) for t in objects(required.get("nodeSelectorTerms")))
            if required
            else None
        ),
        pod_affinity=bool(mapping(affinity.get("podAffinity"))),
        pod_anti_affinity=bool(mapping(affinity.get("podAntiAffinity"))),
        topology_spread=bool(items(spec.get("topologySpreadConstraints"))),
        containers=tuple(Container.from_raw(c) for c in objects(spec.get("containers"))),
        init_containers=tuple(Container.from_raw(c) for c in objects(spec.get("initContainers"))),
        overhead=_scalars(spec.get("overhead")),
        resource_claims=tuple(
            PodClaim(
                index=index,
                name=text(entry.get("name")),
                resource_claim_name=text(entry.get("resourceClaimName")),
                template_name=text(entry.get("resourceClaimTemplateName")),
            )
            for index, entry in claims
        ),
    )


# --- classes and templates ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str = ""
    # each selector's CEL expression, in their order (so that a problem names its index); empty for
    # a selector without one
    selectors: tuple[str, ...] = ()

    @classmethod
    def from_raw(cls, raw: object) -> DeviceClass:
        obj = mapping(raw)
        selectors = items(mapping(obj.get("spec")).get("selectors"))
        return cls(
            name=text(mapping(obj.get("metadata")).get("name")),
            selectors=tuple(text(mapping(mapping(s).get("cel")).get("expression")) for s in selectors),
        )


@dataclass(frozen=True, slots=True)
class ResourceClaimTemplate:
    namespace: str = ""
    name: str = ""
    # the spec of the claims it makes, at spec.spec
    spec: ClaimSpec = field(default_factory=lambda: ClaimSpec(path="spec.spec"))

    @classmethod
    def from_raw(cls, raw: object) -> ResourceClaimTemplate:
        obj = mapping(raw)
        metadata = mapping(obj.get("metadata"))
        return cls(
            namespace=text(metadata.get("namespace")),
            name=text(metadata.get("name")),
            spec=read_template_spec(obj.get("spec")),
        )


# --- fields ---------------------------------------------------------------------------------------


def _scalars(value: object) -> dict[str, str]:
    """A map of labels, selector values or quantities: the entries whose values are text (or numbers,
    as YAML reads `cpu: 2`), as text; the others left out."""
    return {str(key): found for key, item in mapping(value).items() if (found := scalar(item)) is not None}


# `gpudra explain` refuses a pod whose name or claims it cannot read, naming the field: these read as
# the tolerant helpers do, and note what they left out. Null stands for absent, as the API server
# reads it.


def _object(value: object, where: str, problems: list[FieldProblem]) -> Mapping[str, Any]:
    if value is None or isinstance(value, Mapping):
        return mapping(value)
    problems.append(FieldProblem(where, f"is {type(value).__name__}, not an object"))
    return EMPTY


def _objects(value: object, where: str, problems: list[FieldProblem]) -> list[tuple[int, Mapping[str, Any]]]:
    """The entries that are objects (null: an empty one), each with its index."""
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(FieldProblem(where, f"is {type(value).__name__}, not a list"))
        return []
    found = []
    for index, entry in enumerate(value):
        if entry is None or isinstance(entry, Mapping):
            found.append((index, mapping(entry)))
        else:
            problems.append(FieldProblem(f"{where}[{index}]", f"is {type(entry).__name__}, not an object"))
    return found
