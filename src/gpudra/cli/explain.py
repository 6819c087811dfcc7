"""`gpudra explain FILE|claim/NAME|pod/NAME`: gathers what the scheduler would see, then explains. I/O: the
files named, the API server.

Offline (`--slices FILE`, repeatable): the ResourceSlices `gpudra inventory -o yaml` prints (several
nodes' outputs may be concatenated, or `kubectl get resourceslices -o yaml`), plus any ResourceClaims
there whose allocations hold devices (`kubectl get resourceclaims -A -o yaml`); DeviceClasses from
`--classes FILE`, by default gpudra's own (deploy/manifests/deviceclasses.yaml). FILE holds the claims:
ResourceClaims, ResourceClaimTemplates, or Pods (whose claims are explained together, as the scheduler
allocates them), and may add DeviceClasses and ResourceSlices of its own.

Online (no `--slices`): slices, classes and every claim's allocation come from the cluster, and
`claim/NAME` or `pod/NAME` names the object there; FILE then asks whether claims not yet created would fit.

What the API server keeps decides which forms of a GPU nodes can publish there (shares, MIG partitions
on demand: `gpudra.model.publishing.fit_to_server`, the kubelet plugin's own rule), so a request for a
form that none can is answered "needs feature gate X" or "not available before Kubernetes 1.N".
Online, the server is asked as the plugin asks it, by a server-side dry run of a probe ResourceSlice
(`gpudra.kube.field_probe`; nothing is stored); offline, `--server-minor` and `--feature-gates` say
(default: the newest supported release, its default gates).

Files are read with `gpudra.cli.manifest_files` (bounded: size, aliases, depth), the cluster's objects
with `gpudra.kube.client` (bounded per object); an object left out is named on stderr. The judging is
`gpudra.scheduling.explain`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudra.cli.explain_text import render_text
from gpudra.cli.manifest_files import read_documents
from gpudra.errors import ConfigError, GpudraError
from gpudra.model.claim import Claim, read_claim, read_spec_of
from gpudra.model.kube_api import NEWEST_MINOR
from gpudra.model.publishing import ServerFields, parse_feature_gates
from gpudra.scheduling.explain import (
    ClaimToExplain,
    Explanation,
    device_classes,
    explain,
    unpack_lists,
)
from gpudra.scheduling.pools import Inventory

if TYPE_CHECKING:
    from gpudra.kube.client import Kube

# The node the probe slice names (a dry run: nothing is stored, no node need exist).
PROBE_NODE = "gpudra-explain-probe"
# gpudra's DeviceClasses in a source checkout; installed elsewhere, pass --classes.
DEFAULT_CLASSES = Path(__file__).resolve().parents[3] / "deploy" / "manifests" / "deviceclasses.yaml"


@dataclass
class Inputs:
    """What the scheduler would see: classes, slices, the claims holding devices, and what to explain."""

    classes: dict[str, list[str]] = field(default_factory=dict)
    slices: list[Mapping[str, Any]] = field(default_factory=list)
    allocated: list[Claim] = field(default_factory=list)
    targets: list[list[ClaimToExplain]] = field(default_factory=list)  # each explained on its own
    fields: ServerFields | None = None  # what the API server keeps
    notes: list[str] = field(default_factory=list)


def run(args: argparse.Namespace) -> int:
    """The `gpudra explain` command: 0 when every target fits, 1 when one does not."""
    offline = bool(args.slices)
    inputs = _offline(args) if offline else _online(args)
    if not inputs.targets:
        raise ConfigError("holds no ResourceClaim, ResourceClaimTemplate or Pod", field=args.target)
    inventory = Inventory(inputs.slices)
    fields = inputs.fields or ServerFields.of_release(NEWEST_MINOR)
    results = [
        explain(
            target,
            classes=inputs.classes,
            inventory=inventory,
            allocated=inputs.allocated,
            server=fields,
            driver=args.driver_name,
        )
        for target in inputs.targets
    ]
    for result in results:
        result.notes += inputs.notes
    _print(results, args)
    return 0 if all(r.fits for r in results) else 1


def _print(results: Sequence[Explanation], args: argparse.Namespace) -> None:
    if args.output == "json":
        for result in results:
            print(result.model_dump_json())
        return
    for index, result in enumerate(results):
        if len(results) > 1:
            print(("\n" if index else "") + f"== {', '.join(result.claims)} ==")
        sys.stdout.write(render_text(result, verbose=args.verbose))


# --- offline ----------------------------------------------------------------------------------


def _offline(args: argparse.Namespace) -> Inputs:
    if args.target.startswith(("claim/", "pod/")) and not Path(args.target).exists():
        raise ConfigError(f"{args.target} names an object in a cluster; with --slices, pass a file of claims")
    inputs = Inputs()
    for path in args.slices:
        for obj in _objects(path):
            if obj.get("kind") == "ResourceSlice":
                inputs.slices.append(obj)
            elif obj.get("kind") == "ResourceClaim":
                inputs.allocated.append(read_claim(obj))
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
    pods = [o for o in objects if o.get("kind") == "Pod"]
    if not pods:
        inputs.targets += [[claim] for claim in claims_to_explain(objects, namespace=namespace or "default")]
        return
    for pod in pods:
        inputs.targets.append(_pod_claims(pod, objects, cluster=cluster, namespace=namespace))


def _pod_claims(
    pod: Mapping[str, Any],
    objects: Sequence[Mapping[str, Any]],
    *,
    cluster: Kube | None,
    namespace: str | None,
) -> list[ClaimToExplain]:
    """The claims a pod's `resourceClaims` name, from `objects` first, then from the cluster. A template
    whose claim the pod already has (status.resourceClaimStatuses) is explained as that claim."""
    meta = pod.get("metadata") or {}
    pod_namespace = meta.get("namespace") or namespace or "default"
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if s.get("resourceClaimName")
    }
    claims = []
    for index, entry in enumerate((pod.get("spec") or {}).get("resourceClaims") or []):
        where = f"Pod {pod_namespace}/{meta.get('name')}: spec.resourceClaims[{index}]"
        if entry.get("resourceClaimName") or entry.get("name") in generated:
            name = entry.get("resourceClaimName") or generated[entry.get("name")]
            claims.append(_find(objects, "ResourceClaim", pod_namespace, name, cluster=cluster, where=where))
        elif entry.get("resourceClaimTemplateName"):
            claims.append(
                _find(
                    objects,
                    "ResourceClaimTemplate",
                    pod_namespace,
                    entry["resourceClaimTemplateName"],
                    cluster=cluster,
                    where=where,
                )
            )
        else:
            raise ConfigError("names neither resourceClaimName nor resourceClaimTemplateName", field=where)
    if not claims:
        raise ConfigError("the pod has no resourceClaims", field=f"Pod {pod_namespace}/{meta.get('name')}")
    return claims


def _find(
    objects: Sequence[Mapping[str, Any]],
    kind: str,
    namespace: str,
    name: str,
    *,
    cluster: Kube | None,
    where: str,
) -> ClaimToExplain:
    for obj in objects:
        meta = obj.get("metadata") or {}
        if (
            obj.get("kind") == kind
            and meta.get("name") == name
            and meta.get("namespace", namespace) == namespace
        ):
            return _one_claim(obj, where, namespace)
    if cluster is None:
        raise ConfigError(
            f"{kind} {namespace}/{name} is not in the file (and no cluster is read)", field=where
        )
    obj = (
        cluster.get_claim(namespace, name)
        if kind == "ResourceClaim"
        else cluster.get_claim_template(namespace, name)
    )
    return _one_claim(obj, where, namespace)


def _one_claim(obj: Mapping[str, Any], where: str, namespace: str) -> ClaimToExplain:
    found = claims_to_explain([obj], namespace=namespace)
    if len(found) != 1:
        raise ConfigError(f"is not a ResourceClaim or ResourceClaimTemplate: {obj.get('kind')}", field=where)
    return found[0]


# --- online -----------------------------------------------------------------------------------


def _online(args: argparse.Namespace) -> Inputs:
    from gpudra.kube.client import Kube, connect  # noqa: PLC0415 (offline runs need no API client)

    cluster = Kube(connect(_kubeconfig(args.kubeconfig)), report_skipped=_warn)
    inputs = Inputs(classes=device_classes(cluster.list_device_classes()))
    _server(inputs, cluster, args)
    inputs.slices.extend(cluster.list_all_slices())
    inputs.allocated.extend(read_claim(obj) for obj in cluster.list_all_claims())
    if args.classes is not None:
        inputs.classes.update(device_classes(_objects(args.classes)))
    namespace = args.namespace or "default"
    kind, _, name = args.target.partition("/")
    if kind == "claim" and name and not Path(args.target).exists():
        inputs.targets.append([_one_claim(cluster.get_claim(namespace, name), args.target, namespace)])
    elif kind == "pod" and name and not Path(args.target).exists():
        pod = cluster.get_pod(namespace, name)
        inputs.targets.append(_pod_claims(pod, [], cluster=cluster, namespace=namespace))
    else:
        _targets(inputs, _objects(Path(args.target)), cluster=cluster, namespace=namespace)
    return inputs


def claims_to_explain(
    objects: Iterable[Mapping[str, Any]], *, namespace: str = "default"
) -> list[ClaimToExplain]:
    """The ResourceClaims and ResourceClaimTemplates among `objects` (Lists unpacked), as claims; those
    that name no namespace are in `namespace`, as `kubectl apply -n` would put them. The objects come
    from files or the API server: this is where they are read, so only typed specs go further."""
    found = []
    for obj in unpack_lists(objects):
        spec = read_spec_of(obj)
        if spec is None:
            continue
        meta = obj.get("metadata") or {}
        name = f"{meta.get('namespace') or namespace}/{meta.get('name', '')}"
        template = obj.get("kind") == "ResourceClaimTemplate"
        found.append(ClaimToExplain(f"template {name}" if template else name, spec))
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


def _kubeconfig(given: str | None) -> str | None:
    """--kubeconfig, else $KUBECONFIG, else ~/.kube/config if there is one; None: in-cluster."""
    if given:
        return given
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"].split(os.pathsep)[0]
    default = Path.home() / ".kube" / "config"
    return str(default) if default.exists() else None
