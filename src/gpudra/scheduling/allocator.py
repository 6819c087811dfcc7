"""The scheduler's structured allocator, for one set of claims on one node. Pure.

A port of k8s.io/dynamic-resource-allocation/structured (v0.36, the "incubating" implementation, which
Kubernetes 1.36 runs with its default feature gates: prioritized lists, partitionable devices, device
taints, consumable capacity, admin access). `Search.run` answers what the scheduler's Filter answers for a
node: the first allocation of every request of every claim, found the way the scheduler finds it.

- A node sees the devices of complete pools whose slices name it (`nodeName`) or all nodes
  (`allNodes`), pools ordered by driver and name, slices by name, devices in slice order.
- Requests are allocated in order, each device the first in that order that is not in use, passes the
  DeviceClass's selectors then the request's, has capacity left for the request, keeps the pool's shared
  counters within their values, is not tainted against the request, and keeps the claim's constraints;
  when a later request cannot be met, the search backtracks. A request with `firstAvailable`
  subrequests takes the first subrequest that leads to a full allocation.
- A device is used once across all claims, unless it allows multiple allocations (a share: its
  consumable capacity is added up instead, and its counters are taken when the first share is). An
  admin-access request may take a device others hold, but not one whose counters they used up.

What other claims hold is `gpudra.scheduling.claims.Allocations`; the devices and pools come from
`gpudra.scheduling.pools`. Quirks of the Go code are kept on purpose (a distinctAttribute constraint
remembers one device per request; counters overdrawn anywhere in a pool block all of its devices that
consume counters); the search is as exhaustive as the scheduler's, so `budget` bounds the steps a node
may take.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpudra.errors import GpudraError
from gpudra.model.claim import Constraint, Request, Toleration
from gpudra.quantity import Amount
from gpudra.scheduling.cel import CelRuntimeError, Reference, Selector, compile_selector, reference_getter
from gpudra.scheduling.claims import Allocations, AllocatorClaim
from gpudra.scheduling.pools import ClusterInventory, DeviceID, Pool, SliceDevice, quantity

MAX_RESULTS = 32  # resource/v1 AllocationResultsMaxSize: devices one claim may get
DEFAULT_BUDGET = 100_000  # search steps per node before the answer is "undecided"


class AllocationError(GpudraError):
    """The scheduler would stop with an error for this pod (a CEL runtime error, a class gone, ...)."""


class SearchBudgetExceeded(GpudraError):
    """The search took more steps than allowed; the scheduler might still find an allocation."""


# --- selectors -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rejection:
    """Which selector turned a device down: the class's (`device_class` set) or the request's."""

    index: int
    expression: str
    device_class: str | None = None


class Matcher:
    """The selectors of each request, compiled once (`for_request`)."""

    def __init__(self, classes: Mapping[str, Sequence[str]], *, list_type_attributes: bool = False) -> None:
        self.classes = classes
        self.list_type_attributes = list_type_attributes
        self._requests: dict[Request, RequestMatcher] = {}

    def for_request(self, request: Request) -> RequestMatcher:
        """CelError for a selector that does not compile, KeyError for a class that does not exist."""
        known = self._requests.get(request)
        if known is None:
            selectors: list[tuple[Selector, str | None, int]] = [
                (compile_selector(e, list_type_attributes=self.list_type_attributes), request.device_class, i)
                for i, e in enumerate(self.classes[request.device_class])
            ]
            selectors += [
                (compile_selector(e, list_type_attributes=self.list_type_attributes), None, i)
                for i, e in enumerate(request.selectors)
            ]
            known = self._requests[request] = RequestMatcher(request, selectors)
        return known


_UNKNOWN = object()


@dataclass
class _Candidates:
    """A node's devices that pass a request's selectors (or fail on one: `error`), with their positions
    among the node's devices."""

    indexes: list[int]
    entries: list[tuple[int, Pool, SliceDevice, CelRuntimeError | None]]


class RequestMatcher:
    """Which devices pass one request's selectors, its class's first. The answer is remembered by the
    values of the device fields the selectors read, so that a thousand nodes of the same GPUs cost a
    handful of CEL evaluations."""

    def __init__(self, request: Request, selectors: list[tuple[Selector, str | None, int]]) -> None:
        self.request = request
        self.selectors = selectors  # (selector, its class or None for the request's own, index there)
        references: set[Reference] = set()
        for selector, _, _ in selectors:
            if selector.references is None:
                self._getters: tuple[Callable[[SliceDevice], Hashable], ...] | None = None
                break
            references |= selector.references
        else:
            self._getters = tuple(reference_getter(r) for r in sorted(references))
        self._memo: dict[tuple[Hashable, ...], Rejection | CelRuntimeError | None] = {}
        self._candidates: dict[str, _Candidates] = {}
        self._verdicts: dict[str, list[Rejection | CelRuntimeError | None]] = {}

    def check(self, device: SliceDevice) -> Rejection | CelRuntimeError | None:
        """None when `device` passes every selector, else the first that rejects it (or fails on it)."""
        getters = self._getters
        if getters is None:
            return self._evaluate(device)
        key = tuple([get(device) for get in getters])
        known = self._memo.get(key, _UNKNOWN)
        if known is _UNKNOWN:
            known = self._memo[key] = self._evaluate(device)
        return known  # type: ignore[return-value]  # a verdict, _UNKNOWN handled above

    def _evaluate(self, device: SliceDevice) -> Rejection | CelRuntimeError | None:
        for selector, source, index in self.selectors:
            try:
                if not selector.matches(device):
                    return Rejection(index, selector.expression, source)
            except CelRuntimeError as err:
                return err
        return None

    def verdicts(self, node: str, devices: Sequence[SliceDevice]) -> list[Rejection | CelRuntimeError | None]:
        """`check` of each of `devices` (all a node sees, in order), remembered per node."""
        known = self._verdicts.get(node)
        if known is None:
            check = self.check
            known = self._verdicts[node] = [check(d) for d in devices]
        return known

    def candidates(self, node: str, devices: Sequence[tuple[Pool, SliceDevice]]) -> _Candidates:
        """Those of a node's devices (`ClusterInventory.devices_for`) that pass the selectors or fail on one,
        leaving out pools the scheduler skips (incomplete, invalid)."""
        known = self._candidates.get(node)
        if known is None:
            known = _Candidates([], [])
            verdicts = self.verdicts(node, [d for _, d in devices])
            for index, ((pool, device), verdict) in enumerate(zip(devices, verdicts, strict=True)):
                if pool.problem is None and (verdict is None or isinstance(verdict, CelRuntimeError)):
                    known.indexes.append(index)
                    known.entries.append((index, pool, device, verdict))
            self._candidates[node] = known
        return known

    def selectable(self, claim: AllocatorClaim, device: SliceDevice) -> bool:
        """`check` as the allocator uses it: a selector failing on the device stops the scheduler."""
        verdict = self.check(device)
        if isinstance(verdict, CelRuntimeError):
            raise AllocationError(self.runtime_error(claim, verdict))
        return verdict is None

    def runtime_error(self, claim: AllocatorClaim, err: CelRuntimeError) -> str:
        """The scheduler's words for a selector that fails on a device."""
        for selector, source, index in self.selectors:
            if selector.expression == err.expression:
                owner = f"class {source}" if source else f"claim {claim.name}"
                return f"{owner}: selector #{index}: CEL runtime error: {err.detail}"
        return f"claim {claim.name}: CEL runtime error: {err.detail}"


# --- capacity ------------------------------------------------------------------------------------


def integer_value(value: Amount) -> int:
    """apimachinery's Quantity.Value(): the value rounded up to an integer."""
    return math.ceil(value)


def requested_amount(request: Request, device: SliceDevice, name: str) -> Amount:
    """What a request consumes of one capacity of `device`: what it asks rounded up to the capacity's
    request policy, the policy's default when it asks nothing, else the whole capacity."""
    capacity = device.capacity[name]
    policy = capacity.get("requestPolicy") or {}
    asked = dict(request.capacity).get(name)
    if asked is None:
        default = policy.get("default")
        return (
            quantity(default, field=f"device {device.name}: capacity {name}")
            if default is not None
            else (device.capacity_value(name))
        )
    valid_range = policy.get("validRange") or {}
    if valid_range.get("min") is not None:
        low = quantity(valid_range["min"], field=f"device {device.name}: capacity {name}")
        if asked < low:
            return low
        if valid_range.get("step") is None:
            return asked
        step = integer_value(quantity(valid_range["step"], field=f"device {device.name}: capacity {name}"))
        floor = integer_value(low)
        added = integer_value(asked) - floor
        return floor + step * -(-added // step)
    for option in policy.get("validValues") or ():
        value = quantity(option, field=f"device {device.name}: capacity {name}")
        if asked <= value:
            return value
    return asked


def violates_policy(amount: Amount, device: SliceDevice, name: str) -> bool:
    policy = device.capacity[name].get("requestPolicy")
    if not policy:
        return False
    where = f"device {device.name}: capacity {name}"
    if policy.get("default") is not None and amount == quantity(policy["default"], field=where):
        return False
    valid_range = policy.get("validRange")
    if valid_range:
        if valid_range.get("max") is not None and amount > quantity(valid_range["max"], field=where):
            return True
        if valid_range.get("step") is not None:
            step = integer_value(quantity(valid_range["step"], field=where))
            low = integer_value(quantity(valid_range.get("min", "0"), field=where))
            return (integer_value(amount) - low) % step != 0
        return False
    values = policy.get("validValues") or ()
    return bool(values) and all(amount != quantity(v, field=where) for v in values)


def capacity_shortfall(
    request: Request, device: SliceDevice, used: Mapping[str, Amount], allocating: Mapping[str, Amount]
) -> str | None:
    """Why `device` cannot give `request` its capacity (None: it can), given what other shares `used`
    and what this search is `allocating` of it (Kubernetes' CmpRequestOverCapacity)."""
    if not (request.capacity or used or allocating or device.allow_multiple_allocations):
        # Asked nothing of a device only it can have: it takes each capacity whole, which always fits
        # (request policies exist only on devices that allow multiple allocations).
        return None
    for name, _ in request.capacity:
        if name not in device.capacity:
            return f"has no capacity {name!r} (it has: {', '.join(sorted(device.capacity)) or 'none'})"
    short = []
    for name in device.capacity:
        amount = requested_amount(request, device, name)
        if violates_policy(amount, device, name):
            return f"{name}: {format_amount(amount)} is outside the request policy {_policy(device, name)}"
        value = device.capacity_value(name)
        total = used.get(name, 0) + amount + allocating.get(name, 0)
        if total > value:
            left = value - used.get(name, 0) - allocating.get(name, 0)
            short.append(
                f"{name}: needs {format_amount(amount)}, "
                f"{format_amount(max(left, 0))} of {format_amount(value)} left"
            )
    # Every capacity that runs short, not only the first: N shares by count that took their default
    # memory each leave both memory and shares short, and the count is the reason a user looks for.
    return "; ".join(short) or None


def _policy(device: SliceDevice, name: str) -> str:
    policy = device.capacity[name].get("requestPolicy") or {}
    valid_range = policy.get("validRange")
    if valid_range:
        return "range " + ", ".join(f"{k} {v}" for k, v in valid_range.items())
    return "values " + ", ".join(str(v) for v in policy.get("validValues") or ())


def consumed_capacity(request: Request, device: SliceDevice) -> dict[str, Amount]:
    return {name: requested_amount(request, device, name) for name in device.capacity}


def format_amount(value: Amount) -> str:
    """A quantity for people: binary suffixes when exact (80Gi), else the plain number."""
    if isinstance(value, int) or value.denominator == 1:
        number = int(value)
        for power, suffix in ((4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
            unit = 1024**power
            if number and number % unit == 0:
                return f"{number // unit}{suffix}"
        return str(number)
    return str(float(value))


# --- taints and attributes -----------------------------------------------------------------------


def blocking_taint(device: SliceDevice, request: Request) -> Mapping[str, Any] | None:
    """The first NoSchedule/NoExecute taint of `device` that `request` does not tolerate."""
    for taint in device.taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in request.tolerations):
            return taint
    return None


def _tolerates(toleration: Toleration, taint: Mapping[str, Any]) -> bool:
    if toleration.effect and toleration.effect != taint.get("effect"):
        return False
    if toleration.key and toleration.key != taint.get("key"):
        return False
    operator = toleration.operator or "Equal"
    if operator == "Equal":
        return toleration.value == (taint.get("value") or "")
    return operator == "Exists"


def lookup_attribute(device: SliceDevice, name: str) -> tuple[str, Any] | None:
    """A fully qualified attribute of `device` as (type, value), or None (Kubernetes' lookupAttribute)."""
    raw = device.attributes.get(name)
    if raw is None:
        domain, _, identifier = name.partition("/")
        if domain != device.driver:
            return None
        raw = device.attributes.get(identifier)
    if raw is None:
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in raw:
            return (kind, raw[kind])
    return ("unknown", None)


class _ConstraintState:
    """A constraint while the search adds and removes devices (Kubernetes' constraint.go)."""

    def __init__(self, constraint: Constraint) -> None:
        self.constraint = constraint
        self.value: tuple[str, Any] | None = None
        self.values: dict[str, tuple[str, Any]] = {}  # distinct: one remembered value per request name
        self.count = 0

    def applies(self, base: str, sub: str | None) -> bool:
        members = self.constraint.requests
        return not members or base in members or (sub is not None and f"{base}/{sub}" in members)

    def add(self, base: str, sub: str | None, device: SliceDevice) -> bool:
        if not self.applies(base, sub):
            return True
        attribute = lookup_attribute(device, self.constraint.attribute)
        if attribute is None or attribute[0] == "unknown":
            return False
        if self.constraint.distinct:
            if self.count and any(attribute == seen for seen in self.values.values()):
                return False
            self.values[base] = attribute
        elif self.count == 0:
            self.value = attribute
        elif attribute != self.value:
            return False
        self.count += 1
        return True

    def remove(self, base: str, sub: str | None) -> None:
        if not self.applies(base, sub):
            return
        if self.constraint.distinct:
            self.values.pop(base, None)
        self.count -= 1


# --- the search ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FoundDevice:
    """One device of a found allocation."""

    claim: str
    request: str
    device: SliceDevice
    admin_access: bool
    consumed: Mapping[str, Amount] | None  # a share's capacity


@dataclass
class Found:
    """An allocation of every claim; `chosen` is the subrequest index picked per (claim, request)."""

    devices: list[FoundDevice]
    chosen: dict[tuple[int, int], int]


class _MaxSize(Exception):
    """Kubernetes' errAllocationResultMaxSizeExceeded: more than 32 devices for one claim."""


@dataclass
class _RequestData:
    claim: AllocatorClaim
    request: Request
    matcher: RequestMatcher
    subrequests: bool
    count: int
    all_devices: list[tuple[Pool, SliceDevice]]


class Search:
    """One node's allocation attempt for `claims` (Kubernetes' Allocator.Allocate with a node).

    `skip_constraints` ((claim index, constraint index)) and `ignore_counters` relax the rules, to find
    out what stops an allocation.
    """

    def __init__(
        self,
        inventory: ClusterInventory,
        node: str,
        claims: Sequence[AllocatorClaim],
        allocations: Allocations,
        matcher: Matcher,
        *,
        skip_constraints: frozenset[tuple[int, int]] = frozenset(),
        ignore_counters: bool = False,
        budget: int = DEFAULT_BUDGET,
    ) -> None:
        self.claims = claims
        self.allocations = allocations
        self.matcher = matcher
        self.ignore_counters = ignore_counters
        self.budget = budget
        self.steps = 0
        self.node = node
        self.pools = inventory.pools_for(node)
        self.candidates = inventory.devices_for(node)
        self.constraints = [
            [_ConstraintState(c) for i, c in enumerate(claim.constraints) if (n, i) not in skip_constraints]
            for n, claim in enumerate(claims)
        ]
        self.allocating: dict[DeviceID, set[int]] = {}
        self.allocating_capacity: dict[DeviceID, dict[str, Amount]] = {}
        self.consumed: dict[tuple[str, str], dict[str, dict[str, Amount]]] = {}
        self.available: dict[tuple[str, str], dict[str, dict[str, Amount]]] = {}
        self.overdrawn: set[tuple[str, str]] = set()
        self.results: list[list[FoundDevice]] = [[] for _ in claims]
        self.chosen: dict[tuple[int, int], int] = {}
        self.data: dict[tuple[int, int, int], _RequestData] = {}

    def run(self) -> Found | None:
        """The allocation the scheduler would make on this node, or None when there is none.

        AllocationError when the scheduler would stop with an error; SearchBudgetExceeded when the search
        gives up."""
        for c, claim in enumerate(self.claims):
            least = 0
            for r, entry in enumerate(claim.requests):
                counts = []
                for s, request in enumerate(entry):
                    data = self._request_data(
                        claim, request, subrequests=len(entry) > 1 or request.sub is not None
                    )
                    self.data[(c, r, s)] = data
                    counts.append(data.count)
                least += min(counts)
            if least > MAX_RESULTS:
                raise AllocationError(
                    f"claim {claim.name}: number of requested devices {least} exceeds the claim limit "
                    f"of {MAX_RESULTS}"
                )
        try:
            done = self._allocate_one(0, 0, 0, 0, sub=False, start=0)
        except _MaxSize:
            return None
        if not done:
            return None
        return Found([a for claim in self.results for a in claim], dict(self.chosen))

    def _request_data(self, claim: AllocatorClaim, request: Request, *, subrequests: bool) -> _RequestData:
        if request.device_class not in self.matcher.classes:
            raise AllocationError(
                f"request {request.name}: device class {request.device_class} does not exist"
            )
        data = _RequestData(claim, request, self.matcher.for_request(request), subrequests, request.count, [])
        if not request.all_devices:
            return data
        for pool, devices in self.pools:
            if pool.problem is not None:
                state = "being updated" if pool.problem.startswith("incomplete") else "invalid"
                raise AllocationError(
                    f"claim {claim.name}, request {request.name}: asks for all devices, but resource pool "
                    f"{pool.name} is currently {state}"
                )
            for device in devices:
                if data.matcher.selectable(claim, device) and self._capacity_fits(request, device):
                    data.all_devices.append((pool, device))
        data.count = len(data.all_devices)
        return data

    def _allocate_one(self, c: int, r: int, s: int, d: int, *, sub: bool, start: int) -> bool:
        """Kubernetes' allocateOne: device `d` of subrequest `s` of request `r` of claim `c`, from the
        node's devices at `start` on; `sub` once a firstAvailable request has picked its subrequest."""
        self.steps += 1
        if self.steps > self.budget:
            raise SearchBudgetExceeded(f"gave up after {self.budget} search steps")
        if c >= len(self.claims):
            return True
        claim = self.claims[c]
        if r >= len(claim.requests):
            try:
                return self._allocate_one(c + 1, 0, 0, 0, sub=False, start=0)
            except _MaxSize:
                return False
        data = self.data[(c, r, s)]
        if not sub and data.subrequests:
            # a firstAvailable request: the first subrequest that leads to a full allocation
            all_exceeded = True
            index = 0
            while (c, r, index) in self.data:
                try:
                    done = self._allocate_one(c, r, index, d, sub=True, start=0)
                except _MaxSize:
                    index += 1
                    continue
                all_exceeded = False
                if done:
                    self.chosen[(c, r)] = index
                    return True
                index += 1
            if all_exceeded:
                raise _MaxSize
            return False
        request = data.request
        if request.all_devices and not data.all_devices:
            return False
        if d >= data.count:
            return self._allocate_one(c, r + 1, 0, 0, sub=False, start=0)
        if len(self.results[c]) + data.count - d > MAX_RESULTS:
            raise _MaxSize
        if request.all_devices:
            pool, device = data.all_devices[d]
            undo = self._allocate_device(c, data, pool, device, must=True)
            if undo is None:
                return False
            try:
                done = self._allocate_one(c, r, s, d + 1, sub=sub, start=0)
            except BaseException:
                undo()
                raise
            if not done:
                undo()
            return done
        candidates = data.matcher.candidates(self.node, self.candidates)
        for index, pool, device, error in candidates.entries[bisect_left(candidates.indexes, start) :]:
            if request.admin_access:
                if c in self.allocating.get(device.id, ()):
                    continue
            elif self._in_use(device.id):
                continue
            if error is not None:
                raise AllocationError(data.matcher.runtime_error(claim, error))
            if not self._capacity_fits(request, device):
                continue
            undo = self._allocate_device(c, data, pool, device, must=False)
            if undo is None:
                continue
            try:
                done = self._allocate_one(c, r, s, d + 1, sub=sub, start=index + 1)
            except BaseException:
                undo()
                raise
            if done:
                return True
            undo()
        return False

    def _in_use(self, device: DeviceID) -> bool:
        return device in self.allocations.dedicated or bool(self.allocating.get(device))

    def _capacity_fits(self, request: Request, device: SliceDevice) -> bool:
        used = self.allocations.consumed.get(device.id, {})
        return capacity_shortfall(request, device, used, self.allocating_capacity.get(device.id, {})) is None

    def _allocate_device(
        self, c: int, data: _RequestData, pool: Pool, device: SliceDevice, *, must: bool
    ) -> Callable[[], None] | None:
        request = data.request
        multi = device.allow_multiple_allocations
        if not multi and request.admin_access and c in self.allocating.get(device.id, ()):
            return None
        if not request.admin_access and self._in_use(device.id):
            return None
        undo: list[Callable[[], None]] = []

        def rollback() -> None:
            for step in reversed(undo):
                step()

        shared_already = multi and (
            device.id in self.allocations.consumed or device.id in self.allocating_capacity
        )
        if device.consumes and not shared_already and not self.ignore_counters:
            if not self._reserve_counters(pool, device):
                return None
            undo.append(lambda: self._release_counters(pool, device))
        if blocking_taint(device, request) is not None:
            rollback()
            return None
        for constraint in self.constraints[c]:
            if not constraint.add(request.base, request.sub, device):
                rollback()
                if must:
                    raise AllocationError(
                        f"claim {data.claim.name}, request {request.name}: cannot add device "
                        f"{'/'.join(device.id)} because a claim constraint would not be satisfied"
                    )
                return None
            undo.append(_remover(constraint, request))
        if not multi:
            self.allocating.setdefault(device.id, set()).add(c)
            undo.append(lambda: self.allocating[device.id].discard(c))
        if not self._capacity_fits(request, device):
            rollback()
            return None
        consumed = None
        if multi:
            consumed = consumed_capacity(request, device)
            existed = device.id in self.allocating_capacity
            total = self.allocating_capacity.setdefault(device.id, {})
            for name, amount in consumed.items():
                total[name] = total.get(name, 0) + amount

            def release(consumed: dict[str, Amount] = consumed) -> None:
                for name, amount in consumed.items():
                    total[name] -= amount
                if not existed and not any(total.values()):
                    del self.allocating_capacity[device.id]

            undo.append(release)
        self.results[c].append(
            FoundDevice(data.claim.name, request.name, device, request.admin_access, consumed)
        )
        undo.append(lambda: self._drop_result(c))
        return rollback

    def _drop_result(self, claim: int) -> None:
        self.results[claim].pop()

    def _counters_left(self, pool: Pool) -> dict[str, dict[str, Amount]]:
        left = self.available.get(pool.key)
        if left is None:
            left = self.available[pool.key] = counters_left(pool, self.allocations)
            if any(value < 0 for counters in left.values() for value in counters.values()):
                self.overdrawn.add(pool.key)
        return left

    def _reserve_counters(self, pool: Pool, device: SliceDevice) -> bool:
        left = self._counters_left(pool)
        if pool.key in self.overdrawn:
            # Kubernetes compares every counter of the pool: one that others' devices overdrew (they may,
            # when slices changed under allocations) fails every device that consumes counters here.
            return False
        consumed = self.consumed.setdefault(pool.key, {})
        for set_name, counters in device.counters().items():
            into = consumed.setdefault(set_name, {})
            for name, amount in counters.items():
                into[name] = into.get(name, 0) + amount
        for set_name in device.counters():
            taken = consumed[set_name]
            available = left.get(set_name, {})
            if any(value < taken.get(name, 0) for name, value in available.items()):
                self._release_counters(pool, device)
                return False
        return True

    def _release_counters(self, pool: Pool, device: SliceDevice) -> None:
        consumed = self.consumed[pool.key]
        for set_name, counters in device.counters().items():
            into = consumed[set_name]
            for name, amount in counters.items():
                into[name] -= amount


def _remover(constraint: _ConstraintState, request: Request) -> Callable[[], None]:
    return lambda: constraint.remove(request.base, request.sub)


def counters_left(pool: Pool, allocations: Allocations) -> dict[str, dict[str, Amount]]:
    """What of `pool`'s shared counters is left after the devices other claims hold took theirs."""
    left = {name: dict(counters) for name, counters in pool.counter_sets.items()}
    if not allocations.uses_pool(pool.key):
        return left
    for device in pool.devices:
        if allocations.is_allocated(device.id):
            for set_name, counters in device.counters().items():
                into = left.get(set_name, {})
                for name, amount in counters.items():
                    if name in into:
                        into[name] -= amount
    return left
