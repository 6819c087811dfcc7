"""A ResourceClaim as gpudra reads it: typed, read in one place. Pure.

The API server hands claims over as JSON objects. Each module that walked a claim by hand needed its own
`or {}` fallbacks and made its own guess at a missing field; this module reads a claim once into frozen
dataclasses, and everything past it (prepare, config resolution, usage, the scheduler's port, the
cluster view) works on those. Only what gpudra acts on is read: identity and creation time; the spec's
requests and constraints (as the scheduler's allocator reads them); the allocation's results and config
entries; the pods reserving the claim; and the entries of `status.devices`.

A claim's spec and the opaque parameters in it are written by a tenant, and anyone may write its
`status.devices`: reading tolerates any shape (`gpudra.model.tolerant`: a field of the wrong type reads
as absent, an entry of a list that is not an object is left out) and never raises. What the scheduler
would refuse in a spec is kept as `ClaimSpec.problems`, each naming its field
(`spec.devices.requests[0].exactly.deviceClassName: is required`), in the order the scheduler's port
checks them; the API server's full validation is not repeated. Deciding whether what is there is
acceptable is the job of the code that acts on it (config decoding, prepare's checks,
`ClaimSpec.check` for the allocator).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpudra.errors import ConfigError
from gpudra.model.tolerant import EMPTY, flag, items, mapping, objects, text, text_or_none
from gpudra.quantity import Amount, parse_quantity

# --- the spec: what the claim asks for ------------------------------------------------------------


@dataclass(frozen=True)
class Toleration:
    """One toleration: of device taints in a claim's request, of node taints in a pod
    (`gpudra.model.cluster_objects`); an absent field is empty."""

    key: str = ""
    operator: str = ""  # "Equal" when empty
    value: str = ""
    effect: str = ""

    @classmethod
    def from_raw(cls, raw: object) -> Toleration:
        toleration = mapping(raw)
        return cls(
            key=text(toleration.get("key")),
            operator=text(toleration.get("operator")),
            value=text(toleration.get("value")),
            effect=text(toleration.get("effect")),
        )


@dataclass(frozen=True)
class Request:
    """A request of a claim, or one `firstAvailable` subrequest (`name` is then `request/subrequest`)."""

    name: str
    base: str
    sub: str | None
    device_class: str
    selectors: tuple[str, ...]  # the CEL expressions
    all_devices: bool  # allocationMode All
    count: int  # 0 with allocationMode All
    admin_access: bool
    tolerations: tuple[Toleration, ...]
    capacity: tuple[tuple[str, Amount], ...]  # capacity.requests
    field: str  # where it is in the claim, e.g. spec.devices.requests[0].exactly


@dataclass(frozen=True)
class Constraint:
    requests: frozenset[str]  # empty: every request
    attribute: str  # fully qualified
    distinct: bool  # distinctAttribute rather than matchAttribute
    field: str

    @property
    def description(self) -> str:
        kind = "distinctAttribute" if self.distinct else "matchAttribute"
        over = ", ".join(sorted(self.requests)) if self.requests else "all requests"
        return f"{kind} {self.attribute} over {over}"


@dataclass(frozen=True)
class FieldProblem:
    """Something in a spec the scheduler would refuse, and where."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class ClaimSpec:
    """A ResourceClaimSpec's devices. Each entry of `requests` holds one request (`exactly`), or the
    subrequests of a `firstAvailable` request in their order. A request or constraint too malformed to
    read (not an object; neither or both of its alternatives) is left out, with its problem."""

    requests: tuple[tuple[Request, ...], ...] = ()
    constraints: tuple[Constraint, ...] = ()
    problems: tuple[FieldProblem, ...] = ()
    path: str = "spec"  # where it sits in its object: "spec", "spec.spec" in a template

    def check(self) -> None:
        """ConfigError naming the field of the first problem, if there is one."""
        if self.problems:
            first = self.problems[0]
            raise ConfigError(first.message, field=first.field)

    @property
    def device_classes(self) -> set[str]:
        """The DeviceClasses the requests and subrequests name."""
        return {r.device_class for entry in self.requests for r in entry if r.device_class}


# --- the status -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AllocationResult:
    """One entry of `status.allocation.devices.results`."""

    request: str  # "req", or "req/sub" for a subrequest
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None  # set for one share of a device several claims share
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)  # capacity name -> quantity

    @property
    def base_request(self) -> str:
        """The request name containers refer to (a subrequest's parent)."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True)
class ConfigEntry:
    """One entry of `status.allocation.devices.config`, at `index` in that list."""

    index: int
    source: str | None  # "FromClass" or "FromClaim" on a valid claim
    requests: frozenset[str]
    driver: str | None  # the opaque config's driver; None for an entry that is not opaque
    parameters: Any  # the opaque parameters as written (tenant input: decode before use)


@dataclass(frozen=True)
class Allocation:
    results: tuple[AllocationResult, ...] = ()
    config: tuple[ConfigEntry, ...] = ()

    def results_of(self, driver: str) -> tuple[AllocationResult, ...]:
        return tuple(result for result in self.results if result.driver == driver)


@dataclass(frozen=True)
class Consumer:
    """One entry of `status.reservedFor`: what uses the claim (a pod, on a running cluster)."""

    resource: str
    name: str


@dataclass(frozen=True)
class Condition:
    """A condition of a `status.devices` entry (metav1.Condition); an absent field is empty."""

    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str  # as written: RFC 3339 on a valid claim


@dataclass(frozen=True)
class DeviceStatus:
    """One entry of `status.devices` (a driver's report on a device), at `index` in that list. An absent
    driver, pool or device is empty."""

    index: int
    driver: str
    pool: str
    device: str
    share_id: str | None
    conditions: tuple[Condition, ...]


# --- the claim ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    uid: str | None
    namespace: str
    name: str
    allocation: Allocation | None  # None: not allocated
    spec: ClaimSpec = ClaimSpec()
    created: datetime | None = None  # metadata.creationTimestamp, in UTC
    reserved_for: tuple[Consumer, ...] = ()
    devices: tuple[DeviceStatus, ...] = ()  # status.devices

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"

    @property
    def namespaced_name(self) -> str:
        """namespace/name"""
        return f"{self.namespace}/{self.name}"

    @property
    def pods(self) -> tuple[str, ...]:
        """The names of the pods reserving the claim, sorted."""
        return tuple(sorted(c.name for c in self.reserved_for if c.resource == "pods"))


def read_claim(obj: Mapping[str, Any]) -> Claim:
    """The parts of a ResourceClaim object gpudra acts on."""
    metadata = mapping(obj.get("metadata"))
    status = mapping(obj.get("status"))
    allocation = mapping(status.get("allocation"))
    return Claim(
        uid=text_or_none(metadata.get("uid")),
        namespace=text(metadata.get("namespace")),
        name=text(metadata.get("name")),
        allocation=read_allocation(allocation) if allocation else None,
        spec=read_spec(obj.get("spec"), path="spec"),
        created=_time(metadata.get("creationTimestamp")),
        reserved_for=tuple(
            Consumer(resource=text(item.get("resource")), name=name)
            for item in objects(status.get("reservedFor"))
            if (name := text_or_none(item.get("name"))) is not None
        ),
        devices=tuple(
            _device_status(index, item)
            for index, item in enumerate(items(status.get("devices")))
            if isinstance(item, Mapping)
        ),
    )


def read_spec_of(obj: Mapping[str, Any]) -> ClaimSpec | None:
    """The ResourceClaimSpec of a ResourceClaim (at `spec`) or a ResourceClaimTemplate (at `spec.spec`);
    None for an object of another kind."""
    kind = obj.get("kind")
    if kind == "ResourceClaim":
        return read_spec(obj.get("spec"), path="spec")
    if kind != "ResourceClaimTemplate":
        return None
    return read_template_spec(obj.get("spec"))


def read_template_spec(spec: object) -> ClaimSpec:
    """The ResourceClaimSpec of a ResourceClaimTemplate whose `spec` is `spec` (it sits at `spec.spec`)."""
    problems: list[FieldProblem] = []
    template = _optional_object(spec, "spec", problems)
    if problems:
        return ClaimSpec(problems=tuple(problems), path="spec.spec")
    return read_spec(template.get("spec"), path="spec.spec")


def read_allocation(allocation: Mapping[str, Any]) -> Allocation:
    """A claim's `status.allocation`."""
    devices = mapping(allocation.get("devices"))
    return Allocation(
        results=tuple(_result(item) for item in objects(devices.get("results"))),
        config=tuple(
            _config_entry(index, item)
            for index, item in enumerate(items(devices.get("config")))
            if isinstance(item, Mapping)
        ),
    )


def _result(item: Mapping[str, Any]) -> AllocationResult:
    consumed = mapping(item.get("consumedCapacity"))
    return AllocationResult(
        request=text(item.get("request")),
        driver=text(item.get("driver")),
        pool=text(item.get("pool")),
        device=text(item.get("device")),
        admin_access=flag(item.get("adminAccess")),
        share_id=text(item.get("shareID")) or None,
        consumed_capacity={str(name): str(amount) for name, amount in consumed.items()},
    )


def _config_entry(index: int, item: Mapping[str, Any]) -> ConfigEntry:
    opaque = item.get("opaque")
    opaque = opaque if isinstance(opaque, Mapping) else None
    return ConfigEntry(
        index=index,
        source=text_or_none(item.get("source")),
        requests=frozenset(r for r in items(item.get("requests")) if isinstance(r, str)),
        driver=text_or_none(opaque.get("driver")) if opaque is not None else None,
        parameters=opaque.get("parameters") if opaque is not None else None,
    )


def _device_status(index: int, item: Mapping[str, Any]) -> DeviceStatus:
    return DeviceStatus(
        index=index,
        driver=text(item.get("driver")),
        pool=text(item.get("pool")),
        device=text(item.get("device")),
        share_id=text_or_none(item.get("shareID")),
        conditions=tuple(
            Condition(
                type=text(c.get("type")),
                status=text(c.get("status")),
                reason=text(c.get("reason")),
                message=text(c.get("message")),
                last_transition_time=text(c.get("lastTransitionTime")),
            )
            for c in objects(item.get("conditions"))
        ),
    )


# --- reading the spec -----------------------------------------------------------------------------
# The checks, their order and their messages are the scheduler port's (gpudra.scheduling.claims raises
# the first): a value that is absent, null or otherwise false counts as not given.


def read_spec(spec: object, *, path: str = "spec") -> ClaimSpec:
    """A ResourceClaimSpec found at `path` of its object ("spec"; "spec.spec" in a template)."""
    problems: list[FieldProblem] = []
    devices = _optional_object(
        _optional_object(spec, path, problems).get("devices"), f"{path}.devices", problems
    )
    requests: list[tuple[Request, ...]] = []
    names: set[str] = set()
    listed = _optional_list(devices.get("requests"), f"{path}.devices.requests", problems)
    for index, raw in enumerate(listed):
        where = f"{path}.devices.requests[{index}]"
        entry = _object(raw, where, problems)
        if entry is None:
            continue
        request_name = _name(entry, where, problems)
        if request_name and request_name in names:
            problems.append(FieldProblem(f"{where}.name", f"duplicate request name {request_name!r}"))
        names.add(request_name)
        exactly, first = entry.get("exactly"), entry.get("firstAvailable")
        if (exactly is None) == (first is None):
            problems.append(FieldProblem(where, "exactly one of exactly or firstAvailable is required"))
            continue
        if exactly is not None:
            body = _object(exactly, f"{where}.exactly", problems)
            if body is not None:
                requests.append((_request(request_name, None, body, f"{where}.exactly", problems),))
            continue
        subs = []
        alternatives = _list(first, f"{where}.firstAvailable", problems)
        for sub_index, sub_raw in enumerate(alternatives or ()):
            sub_where = f"{where}.firstAvailable[{sub_index}]"
            sub = _object(sub_raw, sub_where, problems)
            if sub is not None:
                subs.append(_request(request_name, _name(sub, sub_where, problems), sub, sub_where, problems))
        if alternatives == []:
            problems.append(FieldProblem(f"{where}.firstAvailable", "must list at least one subrequest"))
        if subs:
            requests.append(tuple(subs))
    constraints = []
    listed = _optional_list(devices.get("constraints"), f"{path}.devices.constraints", problems)
    for index, raw in enumerate(listed):
        where = f"{path}.devices.constraints[{index}]"
        entry = _object(raw, where, problems)
        if entry is None:
            continue
        match, distinct = entry.get("matchAttribute"), entry.get("distinctAttribute")
        if (match is None) == (distinct is None):
            problems.append(
                FieldProblem(where, "exactly one of matchAttribute or distinctAttribute is required")
            )
            continue
        attribute = str(match if match is not None else distinct)
        if "/" not in attribute:
            problems.append(
                FieldProblem(
                    f"{where}.{'matchAttribute' if match is not None else 'distinctAttribute'}",
                    f"{attribute!r} must be a fully qualified name "
                    f"(domain/name, e.g. gpu.gpudra.io/{attribute})",
                )
            )
            continue
        members = _optional_list(entry.get("requests"), f"{where}.requests", problems)
        constraints.append(
            Constraint(frozenset(str(r) for r in members), attribute, distinct is not None, where)
        )
    return ClaimSpec(tuple(requests), tuple(constraints), tuple(problems), path)


def _request(
    base: str, sub: str | None, raw: Mapping[str, Any], where: str, problems: list[FieldProblem]
) -> Request:
    device_class = raw.get("deviceClassName")
    if not device_class:
        problems.append(FieldProblem(f"{where}.deviceClassName", "is required"))
    mode = raw.get("allocationMode", "ExactCount")
    if mode not in ("ExactCount", "All"):
        problems.append(
            FieldProblem(
                f"{where}.allocationMode", f"{mode!r} is not an allocation mode; use ExactCount or All"
            )
        )
    count = raw.get("count", 1 if mode == "ExactCount" else 0)
    whole = isinstance(count, int) and not isinstance(count, bool) and count >= 1
    if mode == "ExactCount" and not whole:
        problems.append(
            FieldProblem(f"{where}.count", f"{count!r} is not a count; use a whole number of at least 1")
        )
    selectors = []
    for index, selector in enumerate(_optional_list(raw.get("selectors"), f"{where}.selectors", problems)):
        body = _object(selector, f"{where}.selectors[{index}]", problems)
        if body is None:
            continue
        # "cel": the field the scheduler port has always named for a `cel` that is not an object.
        expression = _optional_object(body.get("cel"), "cel", problems).get("expression")
        if not isinstance(expression, str):
            problems.append(FieldProblem(f"{where}.selectors[{index}].cel.expression", "is required"))
            continue
        selectors.append(expression)
    capacity = _optional_object(raw.get("capacity"), f"{where}.capacity", problems)
    asked = _optional_object(capacity.get("requests"), f"{where}.capacity.requests", problems)
    requested = []
    for name, value in asked.items():
        amount = _amount(value, f"{where}.capacity.requests.{name}", problems)
        if amount is not None:
            requested.append((str(name), amount))
    tolerations = []
    for index, item in enumerate(_optional_list(raw.get("tolerations"), f"{where}.tolerations", problems)):
        toleration = _object(item, f"{where}.tolerations[{index}]", problems)
        if toleration is not None:
            tolerations.append(Toleration.from_raw(toleration))
    return Request(
        name=f"{base}/{sub}" if sub else base,
        base=base,
        sub=sub,
        device_class=str(device_class) if device_class else "",
        selectors=tuple(selectors),
        all_devices=mode == "All",
        count=0 if mode == "All" else count if whole else 1,
        admin_access=bool(raw.get("adminAccess", False)),
        tolerations=tuple(tolerations),
        capacity=tuple(requested),
        field=where,
    )


def _name(entry: Mapping[str, Any], where: str, problems: list[FieldProblem]) -> str:
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        problems.append(FieldProblem(f"{where}.name", "is required"))
        return ""
    return name


def _amount(value: object, where: str, problems: list[FieldProblem]) -> Amount | None:
    try:
        exact = parse_quantity(str(value))
    except ConfigError as err:
        problems.append(FieldProblem(where, err.reason))
        return None
    return exact.numerator if exact.denominator == 1 else exact


def _object(value: object, where: str, problems: list[FieldProblem]) -> Mapping[str, Any] | None:
    if isinstance(value, Mapping):
        return value
    problems.append(FieldProblem(where, f"must be an object, not {type(value).__name__}"))
    return None


def _optional_object(value: object, where: str, problems: list[FieldProblem]) -> Mapping[str, Any]:
    """An object that may be left out (absent, null or otherwise false: empty)."""
    if not value:
        return EMPTY
    found = _object(value, where, problems)
    return EMPTY if found is None else found


def _list(value: object, where: str, problems: list[FieldProblem]) -> list[Any] | None:
    if isinstance(value, list):
        return value
    problems.append(FieldProblem(where, f"must be a list, not {type(value).__name__}"))
    return None


def _optional_list(value: object, where: str, problems: list[FieldProblem]) -> list[Any]:
    """A list that may be left out (absent, null or otherwise false: empty)."""
    if not value:
        return []
    found = _list(value, where, problems)
    return [] if found is None else found


# --- fields ---------------------------------------------------------------------------------------


def _time(value: Any) -> datetime | None:
    """A metav1.Time (RFC 3339, e.g. 2026-11-23T08:00:00Z) in UTC; None when it is none."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None
