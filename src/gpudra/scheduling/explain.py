"""Why a claim fits a node or not, by the scheduler's own rules (`gpudra explain`). Pure.

`explain` takes DeviceClasses, ResourceSlices, the claims to explain (a ResourceClaim, a
ResourceClaimTemplate, or the claims of one pod, which the scheduler allocates together) and the
ResourceClaims that hold devices already, and answers per node what the scheduler would: the devices it
would allocate (`gpudra.scheduling.allocator.Search`), or why none. The why comes from walking the same rules
one at a time for each request on each node:

1. selectors: which devices pass the class's selectors and the request's, and which selector (class or
   request, by index) turned each other device down;
2. the devices that match but cannot be had: held by other claims, their counters (MIG placements,
   memory) used up, too little consumable capacity left, a taint the request does not tolerate;
3. when every request alone has devices enough, the search is repeated without each constraint, then
   without counters, to name the constraint or the counter sets that make a fitting set impossible.

The first line of the text (`gpudra.cli.explain_text`) is the verdict ("fits on node-h100: gpu-3" /
"cannot fit: no device has productName == "NVIDIA H200" ..."), the node that came closest deciding the
reason; details follow. The result is a pydantic model, so tools get the same as JSON.

A claim being explained never counts against itself: its own allocation is ignored, as if it were
pending.

The whole of it, as a benchmark or another tool calls it (slices as `gpudra inventory -o yaml` prints
them, or as the API server lists them):

    inventory = ClusterInventory(slices)   # gpudra.scheduling.pools; reusable across claims
    answer = explain([ClaimToExplain("ns/name", read_spec(claim_spec))],   # gpudra.model.claim
                     classes=device_classes(class_objects), inventory=inventory,
                     allocated=[read_claim(obj) for obj in claim_objects])
    answer.verdict, answer.fits, answer.model_dump_json()
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from gpudra.model.claim import Claim, ClaimSpec, Request
from gpudra.model.cluster_objects import DeviceClass
from gpudra.model.kube_api import OUTPUT_API_VERSION
from gpudra.model.publishing import ServerFields, Withheld
from gpudra.quantity import Amount
from gpudra.scheduling import forms
from gpudra.scheduling.allocator import (
    DEFAULT_BUDGET,
    AllocationError,
    Found,
    Matcher,
    Rejection,
    Search,
    SearchBudgetExceeded,
    blocking_taint,
    capacity_shortfall,
    counters_left,
    format_amount,
    lookup_attribute,
)
from gpudra.scheduling.cel import CelCompileError, CelError, CelRuntimeError, CelUnsupported, compile_selector
from gpudra.scheduling.claims import Allocations, AllocatorClaim, claim_from_spec
from gpudra.scheduling.node_fit import Refusal
from gpudra.scheduling.pools import ClusterInventory, Pool, SliceDevice, collector_paused

__all__ = [
    "AllocatedDevice",
    "ClaimToExplain",
    "Exclusion",
    "Explanation",
    "NodeReport",
    "RequestReport",
    "SelectorRejections",
    "Unusable",
    "device_classes",
    "explain",
    "unpack_lists",
]

_EXAMPLES = 3  # device names shown per group
_REFUSED_BUT_DEVICES_FIT = 1_000  # a _Why stage above every device stage
_VALUES = 5  # published values shown in a hint


# --- the result ----------------------------------------------------------------------------------


class _ReportModel(BaseModel):
    """camelCase in JSON, as Kubernetes objects are (`-o json`); the Python names stay snake_case."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class SelectorRejections(_ReportModel):
    """Devices one selector turned down."""

    selector: str  # "class gpu.gpudra.io selector #0" or "request selector #1"
    expression: str
    devices: int
    examples: list[str]


class Unusable(_ReportModel):
    """A device that matches the request but cannot be allocated to it, and why."""

    device: str
    reason: str


class RequestReport(_ReportModel):
    """One request (or `firstAvailable` subrequest) against the devices of one node."""

    claim: str
    request: str
    device_class: str
    wants: str
    devices: int  # the node's devices
    matching: list[str]
    rejected: list[SelectorRejections]
    unusable: list[Unusable]
    usable: list[str]
    errors: list[str]


class AllocatedDevice(_ReportModel):
    claim: str
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    consumed_capacity: dict[str, str] | None = None


class NodeReport(_ReportModel):
    node: str
    fits: bool
    devices: list[AllocatedDevice]
    reason: str | None
    requests: list[RequestReport]
    notes: list[str]


class Exclusion(_ReportModel):
    """Nodes with devices that the pod cannot go to for one reason (`gpudra.scheduling.node_fit`)."""

    check: str  # "nodeSelector gpu=h100", "taint gpu=yes:NoSchedule", "insufficient cpu", ...
    nodes: list[str]


class Explanation(_ReportModel):
    """The answer for one claim or one pod's claims: `gpudra explain -o json`."""

    api_version: str = OUTPUT_API_VERSION
    kind: Literal["Explanation"] = "Explanation"
    claims: list[str]
    fits: bool
    verdict: str
    nodes: list[NodeReport]
    errors: list[str]
    notes: list[str]
    # one line per request that can only fit with what the API server does not keep: a feature gate
    # or a later release (gpudra.scheduling.forms)
    needs: list[str] = []
    # what this Kubernetes release's scheduler may do otherwise than the rules explain follows
    release: list[str] = []
    # the nodes with devices that the pod's nodeName, taints, node selection or resources rule out
    excluded: list[Exclusion] = []


# --- input ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimToExplain:
    """A claim's name ("namespace/name"; a template's is "template namespace/name") and its spec
    (`gpudra.model.claim.read_spec`, whose problems name fields where they sit in the object)."""

    name: str
    spec: ClaimSpec
    # what is wrong with its gpudra config entries (gpudra.model.manifests, the webhook's own checks):
    # such a claim is refused at admission or fails at prepare, so it cannot fit anywhere
    invalid_config: tuple[str, ...] = ()
    # what its valid gpudra config entries do otherwise than they may seem to (the webhook's warnings:
    # TimeSlicing on a MIG device sets nothing), shown as notes
    config_warnings: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        """Where the spec sits in its object, as its problems name fields: spec, or spec.spec."""
        return self.spec.path


def unpack_lists(objects: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    """`objects` with each List (`kind: …List`) replaced by its items, recursively."""
    for obj in objects:
        if isinstance(obj, Mapping):
            items = obj.get("items")
            if str(obj.get("kind", "")).endswith("List") and isinstance(items, list):
                yield from unpack_lists(items)
            else:
                yield obj


def device_classes(objects: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """DeviceClass name -> its selectors' CEL expressions."""
    classes: dict[str, list[str]] = {}
    for obj in unpack_lists(objects):
        if obj.get("kind") == "DeviceClass":
            read = DeviceClass.from_raw(obj)
            classes[read.name] = list(read.selectors)
    return classes


# --- explaining ----------------------------------------------------------------------------------


def explain(
    claims: Sequence[ClaimToExplain],
    *,
    classes: Mapping[str, Sequence[str]],
    inventory: ClusterInventory,
    allocated: Iterable[Claim] = (),
    server: ServerFields | None = None,
    driver: str = "",
    list_type_attributes: bool = False,
    budget: int = DEFAULT_BUDGET,
    node_refusals: Mapping[str, Refusal] | None = None,
) -> Explanation:
    """Whether `claims` can be allocated together, on which node and devices, and if not why.

    `classes` maps DeviceClass names to their selector expressions (`device_classes`), `inventory` holds
    the ResourceSlices (`ClusterInventory(slices)`), `allocated` the ResourceClaims that may hold devices (the
    explained claims among them are ignored). `server`: what the API server keeps, which decides what
    `driver`'s nodes can publish (`gpudra.scheduling.forms`): a request for a form none can and that gets
    no devices anywhere is reported as needing the feature gate or release that would serve it, and
    what the release's scheduler does otherwise than these rules is noted. `node_refusals`: the nodes
    the pod cannot go to whatever their devices (`gpudra.scheduling.node_fit`: nodeName, taints,
    nodeSelector, required node affinity, cpu and memory), and why; they are counted by reason in
    `excluded`, and the verdict names them. ConfigError when a claim spec is malformed.
    """
    names = [c.name for c in claims]
    invalid = [
        f"{c.name}: {problem}" if len(claims) > 1 else problem for c in claims for problem in c.invalid_config
    ]
    if invalid:
        verdict = f"cannot fit: invalid config: {invalid[0]}"
        return Explanation(claims=names, fits=False, verdict=verdict, nodes=[], errors=invalid, notes=[])
    parsed = [claim_from_spec(c.name, c.spec) for c in claims]
    allocations = Allocations.from_claims(allocated, skip=names)
    matcher = Matcher(classes, list_type_attributes=list_type_attributes)
    notes = [
        f"warning: {c.name}: {w}" if len(claims) > 1 else f"warning: {w}"
        for c in claims
        for w in c.config_warnings
    ]
    notes += inventory.unsupported
    problem = _static_problem(parsed, classes, matcher)
    if problem is not None:
        return Explanation(claims=names, fits=False, verdict=problem, nodes=[], errors=[problem], notes=notes)
    nodes = inventory.nodes or []
    reports: list[NodeReport] = []
    fatal: list[str] = []
    whys: dict[str, _Why] = {}
    excluded: dict[str, list[str]] = {}
    with collector_paused():
        for node in nodes:
            explainer = _NodeExplainer(inventory, node, parsed, allocations, matcher=matcher, budget=budget)
            report, why = explainer.report()
            refused = (node_refusals or {}).get(node)
            if refused is not None:
                # The scheduler filters the node out before devices; one whose devices would fit
                # came closest of all.
                stage = _REFUSED_BUT_DEVICES_FIT if report.fits else why.stage
                devices = _device_list(report.devices, several_claims=len(parsed) > 1)
                node_notes = (
                    [*report.notes, f"its devices would fit: {devices}"] if report.fits else report.notes
                )
                report = report.model_copy(
                    update={"fits": False, "devices": [], "reason": refused.reason, "notes": node_notes}
                )
                why = _Why(stage, refused.reason, progress=why.progress)
                excluded.setdefault(refused.check, []).append(node)
            reports.append(report)
            whys[node] = why
            fatal.extend(explainer.fatal)
    if fatal:
        verdict = f"cannot be scheduled: the scheduler stops with an error: {fatal[0]}"
        return Explanation(
            claims=names, fits=False, verdict=verdict, nodes=reports, errors=fatal, notes=notes
        )
    fits = any(r.fits for r in reports)
    gated: list[str] = []
    release: list[str] = []
    if server is not None and driver:
        if not fits:
            gated = _gated(parsed, classes, forms.withheld_on(server), reports, driver=driver)
        release = forms.release_limits(parsed, classes, server, driver=driver)
    exclusions = [
        Exclusion(check=check, nodes=names)
        for check, names in sorted(excluded.items(), key=lambda item: -len(item[1]))
    ]
    verdict = _verdict(reports, whys, parsed, exclusions)
    if gated:
        more = f" (and {len(gated) - 1} more below)" if len(gated) > 1 else ""
        verdict = f"cannot fit: {gated[0]}{more}"
    return Explanation(
        claims=names,
        fits=fits,
        verdict=verdict,
        nodes=reports,
        errors=[],
        notes=notes,
        needs=gated,
        release=release,
        excluded=exclusions,
    )


def _gated(
    claims: Sequence[AllocatorClaim],
    classes: Mapping[str, Sequence[str]],
    withheld: Sequence[Withheld],
    reports: Sequence[NodeReport],
    *,
    driver: str,
) -> list[str]:
    """One line per request that asks for a form this server cannot keep and that no node can serve
    (with all of a `firstAvailable` request's choices short)."""
    short: dict[tuple[str, str], bool] = {}
    for claim in claims:
        for entry in claim.requests:
            for request in entry:
                short[(claim.name, request.name)] = True
    for report in reports:
        for request_report in report.requests:
            key = (request_report.claim, request_report.request)
            if key in short and _enough(request_report, claims):
                short[key] = False
    lines: list[str] = []
    for found in forms.needs(claims, classes, withheld, driver=driver):
        claim = next(c for c in claims if c.name == found.claim)
        entry = next(e for e in claim.requests if found.request in e)
        line = f"claim {claim.name}: {found.line}" if len(claims) > 1 else found.line
        if all(short[(claim.name, r.name)] for r in entry) and line not in lines:
            lines.append(line)
    return lines


def _enough(report: RequestReport, claims: Sequence[AllocatorClaim]) -> bool:
    """Whether the node has devices enough for the request alone."""
    request = next(
        r for c in claims if c.name == report.claim for e in c.requests for r in e if r.name == report.request
    )
    if request.all_devices:
        return bool(report.matching) and len(report.usable) == len(report.matching)
    return len(report.usable) >= request.count


def _static_problem(
    claims: Sequence[AllocatorClaim], classes: Mapping[str, Sequence[str]], matcher: Matcher
) -> str | None:
    """What stops the claims before any device is looked at: a missing class, a selector that does not
    compile (the API server would have refused it), one gpudra cannot evaluate."""
    for claim in claims:
        for entry in claim.requests:
            for request in entry:
                if request.device_class not in classes:
                    known = ", ".join(sorted(classes)) or "none"
                    return (
                        f"cannot fit: request {request.name}: device class {request.device_class} "
                        f"does not exist (classes: {known})"
                    )
                for index, expression in enumerate(classes[request.device_class]):
                    err = _compile(expression, matcher)
                    if err is not None:
                        where = f"DeviceClass {request.device_class}: spec.selectors[{index}].cel.expression"
                        return _compile_problem(err, where)
                for index, expression in enumerate(request.selectors):
                    err = _compile(expression, matcher)
                    if err is not None:
                        return _compile_problem(
                            err, f"{claim.name}: {request.field}.selectors[{index}].cel.expression"
                        )
    return None


def _compile(expression: str, matcher: Matcher) -> CelError | None:
    try:
        compile_selector(expression, list_type_attributes=matcher.list_type_attributes)
    except CelError as err:
        return err
    return None


def _compile_problem(err: CelError, where: str) -> str:
    if isinstance(err, CelCompileError):
        return f"invalid: the API server refuses {err.field_error(where)}"
    assert isinstance(err, CelUnsupported)
    return f"cannot explain: {where}: {err.detail}"


@dataclass
class _Funnel:
    """One request on one node, rule by rule."""

    request: Request
    devices: int = 0
    matching: list[SliceDevice] = field(default_factory=list)
    rejected: dict[tuple[str | None, int], list[SliceDevice]] = field(default_factory=dict)
    expressions: dict[tuple[str | None, int], str] = field(default_factory=dict)
    unusable: list[tuple[SliceDevice, str]] = field(default_factory=list)
    usable: list[SliceDevice] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def enough(self) -> bool:
        if self.request.all_devices:
            return bool(self.matching) and not self.unusable
        return len(self.usable) >= self.request.count


class _NodeExplainer:
    def __init__(
        self,
        inventory: ClusterInventory,
        node: str,
        claims: Sequence[AllocatorClaim],
        allocations: Allocations,
        *,
        matcher: Matcher,
        budget: int,
    ) -> None:
        self.inventory = inventory
        self.node = node
        self.claims = claims
        self.allocations = allocations
        self.matcher = matcher
        self.budget = budget
        self.pools = inventory.pools_for(node)
        self.fatal: list[str] = []
        self._left: dict[tuple[str, str], dict[str, dict[str, Amount]]] = {}

    def _search(self, **relax: Any) -> Found | None:
        return Search(
            self.inventory,
            self.node,
            self.claims,
            self.allocations,
            self.matcher,
            budget=self.budget,
            **relax,
        ).run()

    def report(self) -> tuple[NodeReport, _Why]:
        notes = [
            f"pool {pool.name} ({pool.driver}) is skipped: {pool.problem}"
            for pool, _ in self.pools
            if pool.problem
        ]
        funnels = [
            [[self._funnel(request) for request in entry] for entry in claim.requests]
            for claim in self.claims
        ]
        try:
            found = self._search()
        except AllocationError as err:
            self.fatal.append(str(err))
            return self._node(False, [], str(err), funnels, notes), _Why(_FATAL, str(err))
        except SearchBudgetExceeded as err:
            why = _Why(_UNDECIDED, f"undecided: {err}")
            return self._node(False, [], why.text, funnels, notes), why
        if found is not None:
            notes += self._choices(found, funnels)
            return self._node(True, _allocated(found), None, funnels, notes), _Why(_FITS, "")
        why = self._why(funnels)
        progress = sum(len(f.matching) + len(f.usable) for claim in funnels for entry in claim for f in entry)
        why = _Why(why.stage, why.text, why.selector, why.published, progress)
        return self._node(False, [], why.text, funnels, notes), why

    def _node(
        self,
        fits: bool,
        devices: list[AllocatedDevice],
        reason: str | None,
        funnels: list[list[list[_Funnel]]],
        notes: list[str],
    ) -> NodeReport:
        requests = [
            _request_report(claim.name, funnel)
            for claim, claim_funnels in zip(self.claims, funnels, strict=True)
            for entry in claim_funnels
            for funnel in entry
        ]
        return NodeReport(
            node=self.node, fits=fits, devices=devices, reason=reason, requests=requests, notes=notes
        )

    def _choices(self, found: Found, funnels: list[list[list[_Funnel]]]) -> list[str]:
        notes = []
        for (c, r), chosen in sorted(found.chosen.items()):
            entry = self.claims[c].requests[r]
            tried = []
            for s, request in enumerate(entry[:chosen]):
                why = _request_reason(funnels[c][r][s], prefix="")
                tried.append(f"{request.sub}: {why.text if why else 'no allocation with the other requests'}")
            choice = f"({_ordinal(chosen + 1)} of {len(entry)} choices)"
            line = f"request {entry[0].base}: {entry[chosen].sub} {choice}"
            notes.append(line + (f"; tried first: {'; '.join(tried)}" if tried else ""))
        return notes

    # -- rule by rule --

    def _funnel(self, request: Request) -> _Funnel:
        funnel = _Funnel(request)
        claim = next(c for c in self.claims if any(request in entry for entry in c.requests))
        matcher = self.matcher.for_request(request)
        devices = self.inventory.devices_for(self.node)
        verdicts = matcher.verdicts(self.node, [d for _, d in devices])
        funnel.devices = len(devices)
        for (pool, device), verdict in zip(devices, verdicts, strict=True):
            if isinstance(verdict, CelRuntimeError):
                message = matcher.runtime_error(claim, verdict)
                if message not in funnel.errors:
                    funnel.errors.append(f"{message} (on {device.name})")
                continue
            if isinstance(verdict, Rejection):
                key = (verdict.device_class, verdict.index)
                funnel.rejected.setdefault(key, []).append(device)
                funnel.expressions[key] = verdict.expression
                continue
            funnel.matching.append(device)
            obstacle = pool.problem and f"pool {pool.name} is skipped: {pool.problem}"
            obstacle = obstacle or self._obstacle(request, pool, device)
            if obstacle:
                funnel.unusable.append((device, obstacle))
            else:
                funnel.usable.append(device)
        return funnel

    def _obstacle(self, request: Request, pool: Pool, device: SliceDevice) -> str | None:
        """Why `device` cannot go to `request` given what other claims hold, or None."""
        held = self.allocations.dedicated.get(device.id)
        if held and not request.admin_access:
            return f"allocated to {', '.join(held)}"
        taint = blocking_taint(device, request)
        if taint is not None:
            return (
                f"tainted {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} (no toleration)"
            )
        shortfall = capacity_shortfall(request, device, self.allocations.consumed.get(device.id, {}), {})
        if shortfall is not None:
            shares = self.allocations.shares.get(device.id)
            return shortfall + (f" (shared with {', '.join(shares)})" if shares else "")
        if not self.allocations.uses_pool(pool.key) or not device.consumes:
            return None
        if device.allow_multiple_allocations and device.id in self.allocations.consumed:
            return None  # its counters were taken with its first share
        return self._counter_shortfall(pool, device)

    def _counter_shortfall(self, pool: Pool, device: SliceDevice) -> str | None:
        left = self._left.get(pool.key)
        if left is None:
            left = self._left[pool.key] = counters_left(pool, self.allocations)
        for set_name, counters in device.counters().items():
            for name, amount in counters.items():
                remaining = left.get(set_name, {}).get(name)
                if remaining is not None and remaining < amount:
                    holders = sorted(
                        {
                            holder
                            for other in pool.devices
                            if name in other.counters().get(set_name, {})
                            and self.allocations.is_allocated(other.id)
                            for holder in self.allocations.holders(other.id)
                        }
                    )
                    return (
                        f"counter {name} of {set_name}: needs {format_amount(amount)}, "
                        f"{format_amount(max(remaining, 0))} left (held by {', '.join(holders)})"
                    )
        return None

    # -- the reason --

    def _why(self, funnels: list[list[list[_Funnel]]]) -> _Why:
        """How far the node got and why it stopped there."""
        if not any(devices for _, devices in self.pools):
            return _Why(_NO_DEVICES, "no devices published for this node")
        for stage in (_NO_CLASS_DEVICE, _NO_MATCH, _TOO_FEW):
            for claim, claim_funnels in zip(self.claims, funnels, strict=True):
                for entry in claim_funnels:
                    why = _entry_reason(entry)
                    if why is not None and why.stage == stage:
                        return why if len(self.claims) == 1 else why.for_claim(claim.name)
        return self._together()

    def _together(self) -> _Why:
        """Why requests that each have devices enough cannot be allocated together."""
        constraints = [(c, i) for c, claim in enumerate(self.claims) for i in range(len(claim.constraints))]
        try:
            if constraints and self._search(skip_constraints=frozenset(constraints)) is not None:
                for c, i in constraints:
                    if self._search(skip_constraints=frozenset({(c, i)})) is not None:
                        return _Why(_TOGETHER, self._constraint_reason(self.claims[c], i))
                described = "; ".join(self.claims[c].constraints[i].description for c, i in constraints)
                return _Why(_TOGETHER, f"the constraints cannot all be met at once: {described}")
            if self._search(ignore_counters=True) is not None:
                return _Why(
                    _TOGETHER,
                    "the requests together need more of the shared counters than is left (counter sets "
                    f"{', '.join(self._counter_sets())}: the MIG placements overlap, or memory, "
                    "multiprocessors or engines run out)",
                )
        except (SearchBudgetExceeded, AllocationError) as err:
            return _Why(_UNDECIDED, f"undecided: {err}")
        return _Why(
            _TOGETHER,
            "the requests compete for the same devices: each has devices enough alone, not all together",
        )

    def _candidates(self, request: Request) -> list[SliceDevice]:
        devices = self.inventory.devices_for(self.node)
        verdicts = self.matcher.for_request(request).verdicts(self.node, [d for _, d in devices])
        return [d for (_, d), verdict in zip(devices, verdicts, strict=True) if verdict is None]

    def _counter_sets(self) -> list[str]:
        used: set[str] = set()
        for claim in self.claims:
            for entry in claim.requests:
                for request in entry:
                    for device in self._candidates(request):
                        used.update(device.counters())
        return sorted(used)

    def _constraint_reason(self, claim: AllocatorClaim, index: int) -> str:
        constraint = claim.constraints[index]
        values: dict[str, list[str]] = {}
        for entry in claim.requests:
            for request in entry:
                if constraint.requests and not {request.base, request.name} & constraint.requests:
                    continue
                for device in self._candidates(request):
                    value = lookup_attribute(device, constraint.attribute)
                    names = values.setdefault("unset" if value is None else _show(value[1]), [])
                    if device.name not in names:
                        names.append(device.name)
        grouped = "; ".join(f"{v}: {', '.join(_first(n))}" for v, n in list(values.items())[:_VALUES])
        attribute = constraint.attribute.rsplit("/", 1)[-1]
        return (
            f"constraint {constraint.description} cannot be met "
            f"(the matching devices' {attribute}: {grouped})"
        )


# How far a node got: the higher, the closer the claims came to fitting it.
_FATAL, _NO_DEVICES, _NO_CLASS_DEVICE, _NO_MATCH, _TOO_FEW, _TOGETHER, _UNDECIDED, _FITS = range(-1, 7)


@dataclass(frozen=True)
class _Why:
    """Why a node cannot take the claims. `selector` and `published` are set when a request selector
    turns down every device of the class: (request, shortened expression, index), and the values those
    devices publish for what the expression reads."""

    stage: int
    text: str
    selector: tuple[str, str, int] | None = None
    published: tuple[tuple[str, tuple[str, ...]], ...] = ()
    progress: int = 0  # devices that match and can be had: among nodes that stop alike, the closest

    def for_claim(self, claim: str) -> _Why:
        return _Why(self.stage, f"claim {claim}: {self.text}", self.selector, self.published)


def _entry_reason(entry: Sequence[_Funnel]) -> _Why | None:
    """Why a request, or every one of its `firstAvailable` subrequests, gets no devices; None if one can."""
    if len(entry) == 1 and entry[0].request.sub is None:
        return _request_reason(entry[0], prefix=f"request {entry[0].request.name}: ")
    reasons = [_request_reason(f, prefix="") for f in entry]
    if any(r is None for r in reasons):
        return None
    parts = [f"{f.request.sub}: {r.text}" for f, r in zip(entry, reasons, strict=True) if r is not None]
    stage = max(r.stage for r in reasons if r is not None)
    return _Why(
        stage, f"request {entry[0].request.base}: none of its {len(entry)} choices fits: " + "; ".join(parts)
    )


def _request_reason(funnel: _Funnel, *, prefix: str) -> _Why | None:
    """Why one request gets no devices on the node, or None when it has enough."""
    request = funnel.request
    if funnel.errors:
        return _Why(_TOO_FEW, prefix + funnel.errors[0])
    if not funnel.matching:
        request_rejections = {k: v for k, v in funnel.rejected.items() if k[0] is None}
        if not request_rejections:
            return _Why(_NO_CLASS_DEVICE, prefix + f"no device of class {request.device_class} on this node")
        (_, index), devices = max(request_rejections.items(), key=lambda kv: len(kv[1]))
        expression = shorten(funnel.expressions[(None, index)])
        published = _published(funnel.expressions[(None, index)], devices)
        hint = "; ".join(f"{name}: {', '.join(_few(values))}" for name, values in published)
        return _Why(
            _NO_MATCH,
            prefix
            + f"no device has {expression} (selector #{index})"
            + (f"; the devices of class {request.device_class} here publish {hint}" if hint else ""),
            (request.name, expression, index),
            published,
        )
    if funnel.enough:
        return None
    taken = "; ".join(f"{d.name}: {why}" for d, why in funnel.unusable[:_EXAMPLES])
    more = f" (and {len(funnel.unusable) - _EXAMPLES} more)" if len(funnel.unusable) > _EXAMPLES else ""
    if request.all_devices:
        text = (
            f"asks for all {len(funnel.matching)} matching devices, "
            f"{len(funnel.unusable)} cannot be allocated"
        )
    elif len(funnel.matching) < request.count:
        text = f"needs {_count(request.count)}, only {len(funnel.matching)} match"
        if funnel.unusable:
            text += f" and {len(funnel.usable)} of them can be allocated"
    else:
        text = (
            f"needs {_count(request.count)}, {len(funnel.matching)} match "
            f"but only {len(funnel.usable)} can be allocated"
        )
    return _Why(_TOO_FEW, prefix + text + (f": {taken}{more}" if taken else ""))


_ATTRIBUTE = re.compile(r'device\.attributes\["[^"]+"\]\.')
_CAPACITY = re.compile(r'device\.capacity\["[^"]+"\]\.')


def shorten(expression: str) -> str:
    """A selector as people read it: `device.attributes["gpu.gpudra.io"].productName` as `productName`."""
    text = _CAPACITY.sub("capacity.", _ATTRIBUTE.sub("", expression))
    return " ".join(text.split())


def _published(expression: str, devices: Sequence[SliceDevice]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The values `devices` publish for the attributes and capacities `expression` reads."""
    try:
        references = compile_selector(expression).references or frozenset()
    except CelError:
        return ()
    found = []
    for reference in sorted(references):
        if reference[0] not in ("attributes", "capacity"):
            continue
        kind, domain, name = reference
        seen: dict[str, None] = {}
        for device in devices:
            if kind == "attributes":
                value = lookup_attribute(device, f"{domain}/{name}")
                seen.setdefault("unset" if value is None else _show(value[1]))
            else:
                entry = device.capacity.get(name) if device.driver == domain else None
                entry = entry or device.capacity.get(f"{domain}/{name}")
                seen.setdefault("unset" if entry is None else str(entry.get("value")))
        found.append((name, tuple(seen)))
    return tuple(found)


def _few(values: Sequence[str]) -> list[str]:
    return [*values[:_VALUES], f"... ({len(values)} values)"] if len(values) > _VALUES else list(values)


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def _first(names: Sequence[str]) -> list[str]:
    return [*names[:_EXAMPLES], f"+{len(names) - _EXAMPLES} more"] if len(names) > _EXAMPLES else list(names)


def _count(count: int) -> str:
    return f"{count} device" + ("" if count == 1 else "s")


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _request_report(claim: str, funnel: _Funnel) -> RequestReport:
    request = funnel.request
    rejected = [
        SelectorRejections(
            selector=f"class {source} selector #{index}" if source else f"request selector #{index}",
            expression=funnel.expressions[(source, index)],
            devices=len(devices),
            examples=[d.name for d in devices[:_EXAMPLES]],
        )
        for (source, index), devices in funnel.rejected.items()
    ]
    return RequestReport(
        claim=claim,
        request=request.name,
        device_class=request.device_class,
        wants="all matching devices" if request.all_devices else _count(request.count),
        devices=funnel.devices,
        matching=[d.name for d in funnel.matching],
        rejected=rejected,
        unusable=[Unusable(device=d.name, reason=why) for d, why in funnel.unusable],
        usable=[d.name for d in funnel.usable],
        errors=funnel.errors,
    )


def _allocated(found: Found) -> list[AllocatedDevice]:
    return [
        AllocatedDevice(
            claim=a.claim,
            request=a.request,
            driver=a.device.driver,
            pool=a.device.pool,
            device=a.device.name,
            admin_access=a.admin_access,
            consumed_capacity={k: format_amount(v) for k, v in a.consumed.items()} if a.consumed else None,
        )
        for a in found.devices
    ]


def _verdict(
    reports: Sequence[NodeReport],
    whys: Mapping[str, _Why],
    claims: Sequence[AllocatorClaim],
    exclusions: Sequence[Exclusion] = (),
) -> str:
    """The first line: where the claims fit, else why not: the nodes the pod cannot go to counted by
    reason ("3 nodes excluded by nodeSelector gpu=h100"), then why the others' devices do not do."""
    if any(r.fits for r in reports) or not exclusions:
        return _device_verdict(reports, whys, claims)
    out = {node for e in exclusions for node in e.nodes}
    first, *more = exclusions
    counted = ", ".join(
        [
            f"{_nodes(len(first.nodes))} excluded by {first.check}",
            *(f"{len(e.nodes)} by {e.check}" for e in more),
        ]
    )
    rest = [r for r in reports if r.node not in out]
    if not rest:
        would = [r.node for r in reports if whys[r.node].stage == _REFUSED_BUT_DEVICES_FIT]
        if would:
            counted += f" (the devices of {_nodes(len(would))} would fit: {', '.join(_first(would))})"
        return f"cannot fit: {counted}"
    return f"cannot fit: {counted}; on the other {_nodes(len(rest))}: {_why_none(rest, whys, claims)}"


def _nodes(count: int) -> str:
    return f"{count} node{'' if count == 1 else 's'}"


def _device_verdict(
    reports: Sequence[NodeReport], whys: Mapping[str, _Why], claims: Sequence[AllocatorClaim]
) -> str:
    fitting = [r for r in reports if r.fits]
    if fitting:
        first = fitting[0]
        devices = _device_list(first.devices, several_claims=len(claims) > 1)
        others = [r.node for r in fitting[1:]]
        also = ""
        if others:
            listed = ", ".join(others[:_VALUES]) + (", ..." if len(others) > _VALUES else "")
            also = f" (also on {len(others)} more node{'s' if len(others) > 1 else ''}: {listed})"
        return f"fits on {first.node}: {devices}{also}"
    if not reports:
        return "cannot fit: no ResourceSlices, so no node has devices"
    why = _why_none(reports, whys, claims)
    if why.startswith("closest is "):
        return f"cannot fit on any of {len(reports)} nodes; {why}"
    return f"cannot fit: {why}"


def _why_none(
    reports: Sequence[NodeReport], whys: Mapping[str, _Why], claims: Sequence[AllocatorClaim]
) -> str:
    """Why none of `reports`' nodes (at least one) can have the claims: one reason if they share it,
    else the closest node's ("closest is NODE: ...")."""
    best = max(whys[r.node].stage for r in reports)
    closest = sorted((r for r in reports if whys[r.node].stage == best), key=lambda r: -whys[r.node].progress)
    selectors = {whys[r.node].selector for r in closest}
    if len(selectors) == 1 and None not in selectors:
        return _no_match([whys[r.node] for r in closest], several_claims=len(claims) > 1)
    if len({r.reason for r in reports}) == 1:
        return str(reports[0].reason)
    return f"closest is {closest[0].node}: {closest[0].reason}"


def _no_match(whys: Sequence[_Why], *, several_claims: bool) -> str:
    """One request selector turns down every device of its class on every node that has any."""
    selector = whys[0].selector
    assert selector is not None
    request, expression, index = selector
    published: dict[str, dict[str, None]] = {}
    for why in whys:
        for name, values in why.published:
            for value in values:
                published.setdefault(name, {}).setdefault(value)
    hint = "; ".join(f"{name}: {', '.join(_few(list(values)))}" for name, values in published.items())
    claim = whys[0].text.split(": request ", 1)[0] + ", " if several_claims else ""
    return f"no device has {expression} ({claim}request {request}, selector #{index})" + (
        f"; the devices of its class publish {hint}" if hint else ""
    )


def _device_list(devices: Sequence[AllocatedDevice], *, several_claims: bool) -> str:
    if not several_claims:
        return ", ".join(d.device for d in devices) or "nothing to allocate"
    by_claim: dict[str, list[str]] = {}
    for device in devices:
        by_claim.setdefault(device.claim, []).append(device.device)
    return "; ".join(f"{claim}: {', '.join(names)}" for claim, names in by_claim.items())
