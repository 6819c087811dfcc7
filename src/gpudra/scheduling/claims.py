"""A ResourceClaim's requests and constraints as the scheduler's allocator reads them, and the devices
other claims' allocations hold. Pure.

`claim_from_spec` checks the shape as far as the allocator depends on it and names the field of what is
wrong (`spec.devices.requests[0].exactly.deviceClassName: is required`); the API server's full
validation is not repeated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudra.errors import ConfigError
from gpudra.scheduling.pools import Amount, DeviceID, quantity

__all__ = ["Allocations", "Claim", "Constraint", "Request", "claim_from_spec"]


@dataclass(frozen=True)
class Request:
    """A request of a claim, or one `firstAvailable` subrequest (`name` is then `request/subrequest`)."""

    name: str
    base: str
    sub: str | None
    device_class: str
    selectors: tuple[str, ...]
    all_devices: bool
    count: int
    admin_access: bool
    tolerations: tuple[tuple[tuple[str, Any], ...], ...]  # each toleration's fields; hashable
    capacity: tuple[tuple[str, Amount], ...]  # capacity.requests
    field: str  # where it is in the claim spec


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
class Claim:
    """A ResourceClaim spec as the allocator reads it. Each entry of `requests` holds one request, or
    the subrequests of a `firstAvailable` request in their order."""

    name: str
    requests: tuple[tuple[Request, ...], ...]
    constraints: tuple[Constraint, ...]


def claim_from_spec(name: str, spec: Mapping[str, Any], *, path: str = "spec") -> Claim:
    """The claim a ResourceClaimSpec (`spec`) describes; ConfigError naming the field when it is malformed."""
    devices = _mapping(spec.get("devices") or {}, f"{path}.devices")
    requests: list[tuple[Request, ...]] = []
    names: set[str] = set()
    for index, raw in enumerate(_list(devices.get("requests") or [], f"{path}.devices.requests")):
        where = f"{path}.devices.requests[{index}]"
        entry = _mapping(raw, where)
        request_name = _name(entry, where)
        if request_name in names:
            raise ConfigError(f"duplicate request name {request_name!r}", field=f"{where}.name")
        names.add(request_name)
        exactly, first = entry.get("exactly"), entry.get("firstAvailable")
        if (exactly is None) == (first is None):
            raise ConfigError("exactly one of exactly or firstAvailable is required", field=where)
        if exactly is not None:
            requests.append(
                (_request(request_name, None, _mapping(exactly, f"{where}.exactly"), f"{where}.exactly"),)
            )
            continue
        subs = []
        for sub_index, sub_raw in enumerate(_list(first, f"{where}.firstAvailable")):
            sub_where = f"{where}.firstAvailable[{sub_index}]"
            sub = _mapping(sub_raw, sub_where)
            subs.append(_request(request_name, _name(sub, sub_where), sub, sub_where))
        if not subs:
            raise ConfigError("must list at least one subrequest", field=f"{where}.firstAvailable")
        requests.append(tuple(subs))
    constraints = []
    for index, raw in enumerate(_list(devices.get("constraints") or [], f"{path}.devices.constraints")):
        where = f"{path}.devices.constraints[{index}]"
        entry = _mapping(raw, where)
        match, distinct = entry.get("matchAttribute"), entry.get("distinctAttribute")
        if (match is None) == (distinct is None):
            raise ConfigError("exactly one of matchAttribute or distinctAttribute is required", field=where)
        attribute = str(match if match is not None else distinct)
        if "/" not in attribute:
            raise ConfigError(
                f"{attribute!r} must be a fully qualified name (domain/name, e.g. gpu.gpudra.io/{attribute})",
                field=f"{where}.{'matchAttribute' if match is not None else 'distinctAttribute'}",
            )
        members = frozenset(str(r) for r in _list(entry.get("requests") or [], f"{where}.requests"))
        constraints.append(Constraint(members, attribute, distinct is not None, where))
    return Claim(name, tuple(requests), tuple(constraints))


def _request(base: str, sub: str | None, raw: Mapping[str, Any], where: str) -> Request:
    device_class = raw.get("deviceClassName")
    if not device_class:
        raise ConfigError("is required", field=f"{where}.deviceClassName")
    mode = raw.get("allocationMode", "ExactCount")
    if mode not in ("ExactCount", "All"):
        raise ConfigError(
            f"{mode!r} is not an allocation mode; use ExactCount or All", field=f"{where}.allocationMode"
        )
    count = raw.get("count", 1 if mode == "ExactCount" else 0)
    if mode == "ExactCount" and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise ConfigError(
            f"{count!r} is not a count; use a whole number of at least 1", field=f"{where}.count"
        )
    selectors = []
    for index, selector in enumerate(_list(raw.get("selectors") or [], f"{where}.selectors")):
        expression = _mapping(_mapping(selector, f"{where}.selectors[{index}]").get("cel") or {}, "cel").get(
            "expression"
        )
        if not isinstance(expression, str):
            raise ConfigError("is required", field=f"{where}.selectors[{index}].cel.expression")
        selectors.append(expression)
    capacity = _mapping((raw.get("capacity") or {}), f"{where}.capacity").get("requests") or {}
    requested = tuple(
        (str(name), quantity(value, field=f"{where}.capacity.requests.{name}"))
        for name, value in _mapping(capacity, f"{where}.capacity.requests").items()
    )
    return Request(
        name=f"{base}/{sub}" if sub else base,
        base=base,
        sub=sub,
        device_class=str(device_class),
        selectors=tuple(selectors),
        all_devices=mode == "All",
        count=int(count) if mode == "ExactCount" else 0,
        admin_access=bool(raw.get("adminAccess", False)),
        tolerations=tuple(
            tuple(sorted(_mapping(t, f"{where}.tolerations[{i}]").items()))
            for i, t in enumerate(_list(raw.get("tolerations") or [], f"{where}.tolerations"))
        ),
        capacity=requested,
        field=where,
    )


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"must be an object, not {type(value).__name__}", field=where)
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ConfigError(f"must be a list, not {type(value).__name__}", field=where)
    return value


def _name(entry: Mapping[str, Any], where: str) -> str:
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError("is required", field=f"{where}.name")
    return name


# --- what other claims hold ----------------------------------------------------------------------


@dataclass
class Allocations:
    """Devices other claims hold, as the scheduler counts them: dedicated devices, and shares of devices
    that allow multiple allocations with the capacity they consume. An admin-access result holds nothing.
    Values are the holding claims' names."""

    dedicated: dict[DeviceID, list[str]] = field(default_factory=dict)
    shares: dict[DeviceID, list[str]] = field(default_factory=dict)
    consumed: dict[DeviceID, dict[str, Amount]] = field(default_factory=dict)
    _pools: set[tuple[str, str]] | None = field(default=None, repr=False)

    @staticmethod
    def from_claims(claims: Iterable[Mapping[str, Any]], *, skip: Iterable[str] = ()) -> Allocations:
        """The allocations in the claims' `status.allocation`, leaving out the claims named in `skip`
        ("namespace/name": the claims being explained)."""
        held = Allocations()
        left_out = set(skip)
        for claim in claims:
            meta = claim.get("metadata") or {}
            name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            if name in left_out:
                continue
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for index, result in enumerate((allocation.get("devices") or {}).get("results") or ()):
                held.add(name, result, field=f"{name}: status.allocation.devices.results[{index}]")
        return held

    def add(self, holder: str, result: Mapping[str, Any], *, field: str) -> None:
        self._pools = None
        device: DeviceID = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
        if result.get("adminAccess"):
            return
        if result.get("shareID") is not None:
            self.shares.setdefault(device, []).append(holder)
            total = self.consumed.setdefault(device, {})
            for name, value in (result.get("consumedCapacity") or {}).items():
                total[name] = total.get(name, 0) + quantity(value, field=f"{field}.consumedCapacity.{name}")
        else:
            self.dedicated.setdefault(device, []).append(holder)

    def uses_pool(self, pool: tuple[str, str]) -> bool:
        """Whether other claims hold any device of the (driver, pool)."""
        if self._pools is None:
            self._pools = {d[:2] for d in (*self.dedicated, *self.shares, *self.consumed)}
        return pool in self._pools

    def holders(self, device: DeviceID) -> list[str]:
        return self.dedicated.get(device, []) + self.shares.get(device, [])

    def is_allocated(self, device: DeviceID) -> bool:
        return device in self.dedicated or device in self.shares or device in self.consumed
