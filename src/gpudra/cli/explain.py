"""`gpudra explain FILE|claim/NAME|pod/NAME|KIND/NAME`: gathers what the scheduler would see, then
explains. I/O: the files named, the API server.

Offline (`--slices FILE`, repeatable): the ResourceSlices `gpudra inventory -o yaml` prints (several
nodes' outputs may be concatenated, or `kubectl get resourceslices -o yaml`), plus any ResourceClaims
there whose allocations hold devices (`kubectl get resourceclaims -A -o yaml`); DeviceClasses from
`--classes FILE`, by default gpudra's own (deploy/manifests/deviceclasses.yaml, which the package carries
as its data: `make manifests` writes both). FILE holds the claims:
ResourceClaims, ResourceClaimTemplates, or Pods (whose claims are explained together, as the scheduler
allocates them), and may add DeviceClasses and ResourceSlices of its own.

Online (no `--slices`): slices, classes and every claim's allocation come from the cluster, and
`claim/NAME`, `pod/NAME` or a workload's `KIND/NAME` (`deployment/NAME`, `statefulset/NAME`, `job/NAME`,
... as kubectl names them, TARGET_KINDS) names the object there; FILE then asks whether claims not yet
created would fit. The namespace is -n, else the kubeconfig context's (--context), else default, as
kubectl's.

A workload (Deployment, StatefulSet, ReplicaSet, DaemonSet, Job, CronJob), in FILE or in the cluster,
stands for a new pod of its template, with the claims its ResourceClaimTemplates would make. A pod goes
only to the nodes it may be scheduled to (`gpudra.scheduling.node_fit`: spec.nodeName, taints and
tolerations, nodeSelector and required node affinity, cpu and memory requests against allocatable less
what the pods bound there request): the cluster's Nodes and unfinished Pods online, the Nodes and Pods
in the --slices files offline (`kubectl get nodes,pods -A -o yaml` beside the slices; no Node: none is
ruled out). Pod affinity and topology spread are not evaluated, and the answer says so. A claim whose
gpudra config is invalid (the admission webhook's checks, `gpudra.model.manifests`) cannot fit; a valid
one that does otherwise than it may seem to (TimeSlicing on a MIG device) gets the webhook's warning as
a note.
Exit codes: 0 every claim fits, 1 one does not, 2 an error (gpudra.cli.EXIT_CODES).

What the API server keeps decides which forms of a GPU nodes can publish there (shares, MIG partitions
on demand: `gpudra.model.publishing.fit_to_server`, the kubelet plugin's own rule), so a request for a
form that none can is answered "needs feature gate X" or "not available before Kubernetes 1.N".
Online, the server is asked as the plugin asks it, by a server-side dry run of a probe ResourceSlice
(`gpudra.kube.field_probe`; nothing is stored); offline, `--server-minor` and `--feature-gates` say
(default: the newest supported release, its default gates).

Files are read with `gpudra.cli.manifest_files` (bounded: size, aliases, depth), the cluster's objects
with `gpudra.kube.client` (bounded per object); an object left out is named on stderr. Pods, Nodes,
claims and templates are read into their records here (`gpudra.model.cluster_objects`,
`gpudra.model.claim`), and only those go further. The judging is `gpudra.scheduling.explain`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudra.cli.explain_text import render_text
from gpudra.cli.manifest_files import read_documents
from gpudra.cli.output_format import dump, one_or_list
from gpudra.errors import ConfigError, GpudraError
from gpudra.model.claim import Claim, read_claim
from gpudra.model.cluster_objects import Node, Pod, ResourceClaimTemplate
from gpudra.model.kube_api import NEWEST_MINOR
from gpudra.model.manifests import document_warnings, validate_documents
from gpudra.model.publishing import ServerFields, parse_feature_gates
from gpudra.model.tolerant import mapping, text
from gpudra.scheduling.explain import (
    ClaimToExplain,
    Explanation,
    device_classes,
    explain,
    unpack_lists,
)
from gpudra.scheduling.node_fit import node_refusals, unevaluated
from gpudra.scheduling.pools import ClusterInventory

if TYPE_CHECKING:
    from gpudra.kube.client import Kube

# The node the probe slice names (a dry run: nothing is stored, no node need exist).
PROBE_NODE = "gpudra-explain-probe"
NODE_NAME_NOTE = (
    "spec.nodeName skips the scheduler, which is what allocates claims: the pod starts only once its "
    "claims are allocated by other means (a claim another, scheduled pod shares)"
)
# What `gpudra explain KIND/NAME` takes for KIND, kubectl's names and short names -> the kind.
TARGET_KINDS = {
    **dict.fromkeys(("claim", "resourceclaim", "resourceclaims"), "ResourceClaim"),
    **dict.fromkeys(("pod", "pods", "po"), "Pod"),
    **dict.fromkeys(("deployment", "deployments", "deploy"), "Deployment"),
    **dict.fromkeys(("statefulset", "statefulsets", "sts"), "StatefulSet"),
    **dict.fromkeys(("replicaset", "replicasets", "rs"), "ReplicaSet"),
    **dict.fromkeys(("daemonset", "daemonsets", "ds"), "DaemonSet"),
    **dict.fromkeys(("job", "jobs"), "Job"),
    **dict.fromkeys(("cronjob", "cronjobs", "cj"), "CronJob"),
}
# gpudra's DeviceClasses, package data (a copy of deploy/manifests/deviceclasses.yaml: make manifests).
DEFAULT_CLASSES = Path(__file__).with_name("deviceclasses.yaml")


@dataclass
class Inputs:
    """What the scheduler would see: classes, slices, the claims holding devices, and what to explain."""

    classes: dict[str, list[str]] = field(default_factory=dict)
    slices: list[Mapping[str, Any]] = field(default_factory=list)
    allocated: list[Claim] = field(default_factory=list)
    targets: list[list[ClaimToExplain]] = field(default_factory=list)  # each explained on its own
    pods: list[Pod | None] = field(default_factory=list)  # each target's pod, if any
    nodes: list[Node] = field(default_factory=list)
    # pods whose requests use their nodes, as listed or read from the files (`run` reads them once)
    running: list[Mapping[str, Any]] = field(default_factory=list)
    driver: str = ""
    fields: ServerFields | None = None  # what the API server keeps
    notes: list[str] = field(default_factory=list)


def run(args: argparse.Namespace) -> int:
    """The `gpudra explain` command: 0 when every target fits, 1 when one does not."""
    _check_target(args.target)
    offline = bool(args.slices)
    inputs = _offline(args) if offline else _online(args)
    if not inputs.targets:
        raise ConfigError("holds no ResourceClaim, ResourceClaimTemplate or Pod", field=args.target)
    inventory = ClusterInventory(inputs.slices)
    fields = inputs.fields or ServerFields.of_release(NEWEST_MINOR)
    pods = inputs.pods + [None] * (len(inputs.targets) - len(inputs.pods))
    running = [Pod.from_raw(pod) for pod in inputs.running]
    results = []
    for target, pod in zip(inputs.targets, pods, strict=True):
        spec = pod.spec if pod is not None else None
        result = explain(
            target,
            classes=inputs.classes,
            inventory=inventory,
            allocated=inputs.allocated,
            server=fields,
            driver=args.driver_name,
            node_refusals=node_refusals(spec, inputs.nodes, running) if spec is not None else None,
        )
        result.notes += [*(unevaluated(spec) if spec is not None else []), *inputs.notes]
        if pod is not None and _names_its_node(pod):
            result.notes.append(NODE_NAME_NOTE)
        results.append(result)
    _print(results, args)
    return 0 if all(r.fits for r in results) else 1


def _print(results: Sequence[Explanation], args: argparse.Namespace) -> None:
    if args.output in ("json", "yaml"):
        objects = [r.model_dump(mode="json", by_alias=True) for r in results]
        sys.stdout.write(dump(one_or_list(objects), args.output))
        return
    for index, result in enumerate(results):
        if len(results) > 1:
            print(("\n" if index else "") + f"== {', '.join(result.claims)} ==")
        sys.stdout.write(render_text(result, verbose=args.verbose or args.output == "wide"))


# --- offline ----------------------------------------------------------------------------------


def _offline(args: argparse.Namespace) -> Inputs:
    if _cluster_object(args.target) is not None:
        raise ConfigError(f"{args.target} names an object in a cluster; with --slices, pass a file of claims")
    inputs = Inputs(driver=args.driver_name)
    for path in args.slices:
        for obj in _objects(path):
            if obj.get("kind") == "ResourceSlice":
                inputs.slices.append(obj)
            elif obj.get("kind") == "ResourceClaim":
                inputs.allocated.append(read_claim(obj))
            elif obj.get("kind") == "Node":
                inputs.nodes.append(Node.from_raw(obj))
            elif obj.get("kind") == "Pod":
                inputs.running.append(obj)
    classes_file = args.classes or DEFAULT_CLASSES
    if not classes_file.exists():
        raise ConfigError(
            f"{classes_file} does not exist; pass gpudra's DeviceClasses file", field="--classes"
        )
    inputs.classes = device_classes(_objects(classes_file))
    _targets(inputs, _objects(Path(args.target)), cluster=None, namespace=args.namespace)
    minor = NEWEST_MINOR if args.server_minor is None else args.server_minor
    inputs.fields = ServerFields.of_release(minor, _gates(args))
    return inputs


def _gates(args: argparse.Namespace) -> dict[str, bool]:
    return parse_feature_gates(args.feature_gates)


def _objects(path: Path) -> list[Mapping[str, Any]]:
    """The Kubernetes objects in a YAML or JSON file, Lists unpacked."""
    try:
        read = read_documents(path)
    except ValueError as err:
        raise ConfigError(str(err), field=str(path)) from None
    for skipped in read.skipped:
        _warn(f"left out {path}: {skipped.where}: {skipped.reason}")
    found: list[Mapping[str, Any]] = []
    pending = [d for d in reversed(read.documents) if isinstance(d, Mapping)]  # a stack, first on top
    while pending:
        obj = pending.pop()
        items = obj.get("items")
        if str(obj.get("kind", "")).endswith("List") and isinstance(items, list):
            pending.extend(i for i in reversed(items) if isinstance(i, Mapping))
        elif "kind" in obj:
            found.append(obj)
    return found


def _targets(
    inputs: Inputs, objects: Iterable[Mapping[str, Any]], *, cluster: Kube | None, namespace: str | None
) -> None:
    """The claims to explain in a file: each pod's together, else each claim and template on its own.
    DeviceClasses and ResourceSlices in the file join the inputs."""
    objects = list(objects)
    inputs.classes.update(device_classes(objects))
    inputs.slices += [o for o in objects if o.get("kind") == "ResourceSlice"]
    inputs.nodes += [Node.from_raw(o) for o in objects if o.get("kind") == "Node"]
    pods = [pod for o in objects if (pod := _pod_of(o)) is not None]
    if not pods:
        found = claims_to_explain(objects, namespace=namespace or "default", driver=inputs.driver)
        inputs.targets += [[claim] for claim in found]
        return
    for pod in pods:
        inputs.targets.append(
            _pod_claims(pod, objects, cluster=cluster, namespace=namespace, driver=inputs.driver)
        )
        inputs.pods.append(pod)


# kind -> the path of its pod template
WORKLOADS = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


def _pod_of(obj: Mapping[str, Any]) -> Pod | None:
    """A Pod, or the pod a workload's template makes (named "<Kind>/<name>"); None for other objects."""
    kind = str(obj.get("kind", ""))
    if kind == "Pod":
        return Pod.from_raw(obj)
    if kind not in WORKLOADS:
        return None
    template: Any = obj
    for key in WORKLOADS[kind]:
        template = template.get(key) if isinstance(template, Mapping) else None
    meta = _object(obj.get("metadata"), f"{kind}: metadata")
    spec = template.get("spec") if isinstance(template, Mapping) else None
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"has no pod template at {'.'.join(WORKLOADS[kind])}.spec", field=f"{kind} {meta.get('name')}"
        )
    named = {k: v for k, v in meta.items() if k in ("name", "namespace")}
    return Pod.from_raw({"metadata": {**named, "name": f"{kind}/{meta.get('name', '')}"}, "spec": spec})


def _object(value: object, field: str) -> Mapping[str, Any]:
    """`value` as an object (absent: empty); a user's file may hold anything there."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"is {type(value).__name__}, not an object", field=field)
    return value


def _pod_claims(
    pod: Pod,
    objects: Sequence[Mapping[str, Any]],
    *,
    cluster: Kube | None,
    namespace: str | None,
    driver: str,
) -> list[ClaimToExplain]:
    """The claims a pod's `resourceClaims` name, from `objects` first, then from the cluster. A template
    whose claim the pod already has (status.resourceClaimStatuses) is explained as that claim."""
    pod_namespace = pod.namespace or namespace or "default"
    pod_name = f"Pod {pod_namespace}/{pod.name}"
    if pod.problems:  # its name or claims cannot be read
        first = pod.problems[0]
        raise ConfigError(
            first.message,
            field="Pod: metadata" if first.field == "metadata" else f"{pod_name}: {first.field}",
        )
    claims = []
    for entry in pod.spec.resource_claims:
        where = f"{pod_name}: spec.resourceClaims[{entry.index}]"
        if entry.resource_claim_name or entry.name in pod.claim_statuses:
            name = entry.resource_claim_name or pod.claim_statuses[entry.name]
            claims.append(
                _find(
                    objects, "ResourceClaim", pod_namespace, name, cluster=cluster, where=where, driver=driver
                )
            )
        elif entry.template_name:
            claims.append(
                _find(
                    objects,
                    "ResourceClaimTemplate",
                    pod_namespace,
                    entry.template_name,
                    cluster=cluster,
                    where=where,
                    driver=driver,
                )
            )
        else:
            raise ConfigError("names neither resourceClaimName nor resourceClaimTemplateName", field=where)
    if not claims:
        raise ConfigError("the pod has no resourceClaims", field=pod_name)
    return claims


def _find(
    objects: Sequence[Mapping[str, Any]],
    kind: str,
    namespace: str,
    name: str,
    *,
    cluster: Kube | None,
    where: str,
    driver: str,
) -> ClaimToExplain:
    for obj in objects:
        meta = mapping(obj.get("metadata"))
        if (
            obj.get("kind") == kind
            and meta.get("name") == name
            and meta.get("namespace", namespace) == namespace
        ):
            return _one_claim(obj, where, namespace, driver)
    if cluster is None:
        raise ConfigError(
            f"{kind} {namespace}/{name} is not in the file (and no cluster is read)", field=where
        )
    obj = (
        cluster.get_claim(namespace, name)
        if kind == "ResourceClaim"
        else cluster.get_claim_template(namespace, name)
    )
    return _one_claim(obj, where, namespace, driver)


def _one_claim(obj: Mapping[str, Any], where: str, namespace: str, driver: str) -> ClaimToExplain:
    found = claims_to_explain([obj], namespace=namespace, driver=driver)
    if len(found) != 1:
        raise ConfigError(f"is not a ResourceClaim or ResourceClaimTemplate: {obj.get('kind')}", field=where)
    return found[0]


# --- online -----------------------------------------------------------------------------------


def _online(args: argparse.Namespace) -> Inputs:
    # offline runs need no API client
    from gpudra.kube.client import Kube, connect, context_namespace, kubeconfig_path  # noqa: PLC0415

    kubeconfig = kubeconfig_path(args.kubeconfig)
    cluster = Kube(connect(kubeconfig, args.context), report_skipped=_warn)
    inputs = Inputs(classes=device_classes(cluster.list_device_classes()), driver=args.driver_name)
    _server(inputs, cluster, args)
    inputs.slices.extend(cluster.list_all_slices())
    inputs.nodes.extend(map(Node.from_raw, cluster.list_nodes()))
    inputs.allocated.extend(read_claim(obj) for obj in cluster.list_all_claims())
    if args.classes is not None:
        inputs.classes.update(device_classes(_objects(args.classes)))
    namespace = (
        args.namespace or (context_namespace(kubeconfig, args.context) if kubeconfig else None) or "default"
    )
    named = _cluster_object(args.target)
    explained: tuple[str, str] | None = None  # the pod explained, not to count against its own node
    if named is None:
        _targets(inputs, _objects(Path(args.target)), cluster=cluster, namespace=namespace)
    elif named[0] == "ResourceClaim":
        claim = _one_claim(cluster.get_claim(namespace, named[1]), args.target, namespace, args.driver_name)
        inputs.targets.append([claim])
    else:
        kind, name = named
        found = (
            cluster.get_pod(namespace, name) if kind == "Pod" else cluster.get_workload(kind, namespace, name)
        )
        pod = _pod_of(found)
        assert pod is not None  # a Pod or a workload
        inputs.targets.append(
            _pod_claims(pod, [], cluster=cluster, namespace=namespace, driver=args.driver_name)
        )
        inputs.pods.append(pod)
        explained = (namespace, name) if kind == "Pod" else None
    if inputs.pods:
        _running_pods(inputs, cluster, explained)
    return inputs


def _running_pods(inputs: Inputs, cluster: Kube, explained: tuple[str, str] | None) -> None:
    """The unfinished pods whose requests use their nodes, but the one explained; a caller who may not
    list pods cluster-wide (explaining one's own workload needs no such right) gets a note instead."""
    from gpudra.kube.client import Forbidden  # noqa: PLC0415 (offline runs need no API client)

    try:
        unfinished = cluster.list_unfinished_pods()
    except Forbidden as err:
        inputs.notes.append(
            "cpu, memory and pod counts are checked against allocatable only: the pods already on the "
            f"nodes could not be listed ({err})"
        )
        return
    inputs.running.extend(pod for pod in unfinished if explained is None or _namespace_name(pod) != explained)


def _check_target(target: str) -> None:
    """A KIND/NAME whose KIND explain does not read, and that is no file either, named as such."""
    kind, slash, name = target.partition("/")
    if slash and name and "/" not in name and kind.lower() not in TARGET_KINDS and not Path(target).exists():
        first_names: dict[str, str] = {}  # each kind's first name in TARGET_KINDS: claim, pod, ...
        for alias, named in TARGET_KINDS.items():
            first_names.setdefault(named, alias)
        kinds = ", ".join(first_names.values())
        raise ConfigError(f"is neither a file nor KIND/NAME of a kind explain reads ({kinds})", field=target)


def _names_its_node(pod: Pod) -> bool:
    """Whether the pod's spec.nodeName was set by its author (the scheduler never sees the pod), not by
    the scheduler's binding (PodScheduled True)."""
    return bool(pod.spec.node_name) and not pod.scheduled


def _cluster_object(target: str) -> tuple[str, str] | None:
    """(kind, name) of a KIND/NAME target (TARGET_KINDS), unless a file of that name exists; None for a
    file."""
    kind, slash, name = target.partition("/")
    if not slash or not name or "/" in name or kind.lower() not in TARGET_KINDS or Path(target).exists():
        return None
    return TARGET_KINDS[kind.lower()], name


def _namespace_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = mapping(obj.get("metadata"))
    return text(meta.get("namespace")), text(meta.get("name"))


def claims_to_explain(
    objects: Iterable[Mapping[str, Any]], *, namespace: str = "default", driver: str = ""
) -> list[ClaimToExplain]:
    """The ResourceClaims and ResourceClaimTemplates among `objects` (Lists unpacked), as claims; those
    that name no namespace are in `namespace`, as `kubectl apply -n` would put them. The objects come
    from files or the API server: this is where they are read, so only typed specs go further, with
    what is wrong with their `driver` config entries."""
    found = []
    for obj in unpack_lists(objects):
        template = obj.get("kind") == "ResourceClaimTemplate"
        if template:
            read: Claim | ResourceClaimTemplate = ResourceClaimTemplate.from_raw(obj)
        elif obj.get("kind") == "ResourceClaim":
            read = read_claim(obj)
        else:
            continue
        spec = read.spec
        name = f"{read.namespace or namespace}/{read.name}"
        invalid = tuple(
            f"{p.field}: {p.message}"
            for p in (validate_documents([("", obj)], driver=driver) if driver else [])
        )
        advice = tuple(
            f"{p.field}: {p.message}"
            for p in (document_warnings([("", obj)], driver=driver) if driver else [])
        )
        found.append(ClaimToExplain(f"template {name}" if template else name, spec, invalid, advice))
    return found


def _server(inputs: Inputs, cluster: Kube, args: argparse.Namespace) -> None:
    """What the cluster's API server keeps: what --server-minor and --feature-gates say when given,
    else what a server-side dry run of a probe slice shows (the kubelet plugin's own probe)."""
    from gpudra.kube import field_probe  # noqa: PLC0415 (offline runs need no API client)

    gates = _gates(args)
    minor = cluster.server_minor() if args.server_minor is None else args.server_minor
    if args.server_minor is not None or gates:
        inputs.fields = ServerFields.of_release(minor, gates)
        return
    try:
        inputs.fields = field_probe.probe(cluster, driver=args.driver_name, node_name=PROBE_NODE, minor=minor)
    except GpudraError as err:
        inputs.fields = ServerFields.of_release(minor)
        inputs.notes.append(
            f"what the API server keeps is assumed from Kubernetes 1.{minor}'s default feature gates: a "
            f"dry run of a probe ResourceSlice failed ({err}); --feature-gates says otherwise"
        )


def _warn(line: str) -> None:
    """An object left out of what is explained (nested too deeply, see gpudra.bounded_json)."""
    print(f"gpudra explain: warning: {line}", file=sys.stderr)
