"""A node's device model split into resource.k8s.io/v1 ResourceSlices, and the API's checks on them. Pure.

One pool per node, named after it. The split follows the limits of the API server's minor version
(dra-api.md 2.1, 2.6):

- 1.34: a slice holds at most 128 devices and 32 shared counters in all; a device consuming a counter set
  must sit in that set's slice; a slice's devices consume at most 1024 counters in all.
- 1.35+: counter sets are pool-wide and live in slices of their own (at most 8 sets of at most 32
  counters each); a devices-only slice holds 128 devices, or 64 once one of them consumes counters or
  carries taints.

A GPU's shared device (`allowMultipleAllocations`) consumes the GPU's counter set, as the whole GPU
does, so it follows the same rules; validation also checks the API's rules on its `requestPolicy`.

Slice names are `<node>-<driver with dots as dashes>-<i>`, so a republish of the same model updates the
same objects.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import NotRequired, TypedDict

from gpudra.errors import ClusterError, ConfigError, NotSupported
from gpudra.model.devices import CounterSet, Device, DeviceModel
from gpudra.model.kube_api import API_VERSION, OLDEST_MINOR
from gpudra.quantity import QUANTITY_PATTERN, parse_quantity

MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS_OR_TAINTS = 64  # 1.35+
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_VALUE_LENGTH = 64  # string and version attributes
MAX_SHARED_COUNTERS_134 = 32  # all counter sets of one slice together
MAX_COUNTERS_PER_DEVICE_134 = 32
MAX_DEVICE_COUNTERS_PER_SLICE_134 = 1024
MAX_COUNTER_SETS = 8  # per slice, 1.35+
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2  # 1.35+
MAX_COUNTERS_PER_CONSUMPTION = 32
MAX_TAINTS_134 = 4
MAX_TAINTS = 16  # 1.35+
MAX_VALID_VALUES = 10  # options of a capacity's requestPolicy.validValues
MAX_NAME = 253

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUANTITY = re.compile(QUANTITY_PATTERN)
# semver.org's regular expression, as the API server applies it to version attributes
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)
_INDEX_ROOM = 7  # "-" and up to six digits of slice index


class OwnerReference(TypedDict):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class SliceMetadata(TypedDict):
    name: str
    ownerReferences: NotRequired[list[OwnerReference]]
    annotations: NotRequired[dict[str, str]]
    resourceVersion: NotRequired[str]  # set when updating an existing slice


class ResourcePool(TypedDict):
    name: str
    generation: int
    resourceSliceCount: int


class ResourceSliceSpec(TypedDict):
    driver: str
    nodeName: str
    pool: ResourcePool
    devices: NotRequired[list[Device]]
    sharedCounters: NotRequired[list[CounterSet]]


class ResourceSlice(TypedDict):
    apiVersion: str
    kind: str
    metadata: SliceMetadata
    spec: ResourceSliceSpec


def build_slices(
    model: DeviceModel,
    *,
    driver: str,
    node_name: str,
    generation: int,
    server_minor: int,
    node_uid: str | None = None,
) -> list[ResourceSlice]:
    """The slices of `node_name`'s pool that publish `model` to a 1.`server_minor` API server.

    A model without devices still gets one empty slice: it tells the cluster the driver runs here. The
    model's annotations go on the first slice.
    Raises NotSupported when one GPU's counters cannot be published within the limits at all, and
    ClusterError for a server older than 1.34.
    """
    if server_minor < OLDEST_MINOR:
        raise ClusterError(_too_old(server_minor))
    drafts = _split(model) if server_minor > OLDEST_MINOR else _combine(model)
    drafts = drafts or [_Draft()]
    prefix = _name_prefix(node_name, driver)
    slices: list[ResourceSlice] = []
    for index, draft in enumerate(drafts):
        metadata: SliceMetadata = {"name": f"{prefix}-{index}"}
        if node_uid is not None:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
            ]
        if index == 0 and model.annotations:
            metadata["annotations"] = dict(model.annotations)
        spec: ResourceSliceSpec = {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(drafts)},
        }
        if draft.counter_sets:
            spec["sharedCounters"] = draft.counter_sets
        if draft.devices:
            spec["devices"] = draft.devices
        slices.append(
            {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": spec}
        )
    return slices


def validate_slices(slices: Sequence[ResourceSlice], *, server_minor: int) -> list[str]:
    """Every way `slices` break the API's rules on a 1.`server_minor` server; empty when they pass.

    `slices` are taken to be all current slices of their pools, so pool-wide rules (unique names,
    counter references, resourceSliceCount) are checked across them.
    """
    if server_minor < OLDEST_MINOR:
        return [_too_old(server_minor)]
    problems: list[str] = []
    pools: dict[tuple[str, str], list[ResourceSlice]] = {}
    for slice_ in slices:
        problems.extend(_slice_problems(slice_, server_minor))
        spec = slice_["spec"]
        pools.setdefault((spec["driver"], spec["pool"]["name"]), []).append(slice_)
    for (driver, pool), members in pools.items():
        problems.extend(f"pool {pool} of {driver}: {p}" for p in _pool_problems(members, server_minor))
    return problems


@dataclass
class _Draft:
    devices: list[Device] = field(default_factory=list)
    counter_sets: list[CounterSet] = field(default_factory=list)


@dataclass
class _Group:
    """A counter set and the devices consuming it, or one device that consumes nothing."""

    counter_set: CounterSet | None
    devices: list[Device]

    @property
    def shared_counters(self) -> int:
        return len(self.counter_set["counters"]) if self.counter_set else 0

    @property
    def consumed_counters(self) -> int:
        return sum(_consumed_counters(d) for d in self.devices)


def _too_old(server_minor: int) -> str:
    return f"Kubernetes 1.{server_minor} does not serve {API_VERSION}; gpudra needs 1.{OLDEST_MINOR} or newer"


def _consumed_counters(device: Device) -> int:
    return sum(len(c["counters"]) for c in device.get("consumesCounters", []))


def _is_advanced(device: Device) -> bool:
    return bool(device.get("consumesCounters") or device.get("taints"))


def _check_counter_set(counter_set: CounterSet, *, server: str) -> None:
    count = len(counter_set["counters"])
    if count > MAX_COUNTERS_PER_SET:
        raise NotSupported(
            f"counter set {counter_set['name']} has {count} counters; a ResourceSlice on {server} holds "
            f"at most {MAX_COUNTERS_PER_SET}, so this GPU cannot be partitionable: use static MIG mode"
        )


def _split(model: DeviceModel) -> list[_Draft]:
    """1.35+: counter sets first, in slices of their own, then the devices."""
    for counter_set in model.counter_sets:
        _check_counter_set(counter_set, server="Kubernetes 1.35+")
    drafts = [
        _Draft(counter_sets=model.counter_sets[i : i + MAX_COUNTER_SETS])
        for i in range(0, len(model.counter_sets), MAX_COUNTER_SETS)
    ]
    current: list[Device] = []
    advanced = False  # whether `current` holds a device that lowers the limit to 64
    for device in model.devices:
        advanced = advanced or _is_advanced(device)
        if len(current) >= (MAX_DEVICES_WITH_COUNTERS_OR_TAINTS if advanced else MAX_DEVICES):
            drafts.append(_Draft(devices=current))
            current, advanced = [], _is_advanced(device)
        current.append(device)
    if current:
        drafts.append(_Draft(devices=current))
    return drafts


def _groups(model: DeviceModel) -> list[_Group]:
    """The model's devices in order, each consuming device gathered with its counter set."""
    by_set = {s["name"]: _Group(counter_set=s, devices=[]) for s in model.counter_sets}
    groups: list[_Group] = []
    for device in model.devices:
        consumed = device.get("consumesCounters")
        if not consumed:
            groups.append(_Group(counter_set=None, devices=[device]))
            continue
        group = by_set[consumed[0]["counterSet"]]
        if not group.devices:
            groups.append(group)
        group.devices.append(device)
    groups.extend(g for g in by_set.values() if not g.devices)
    return groups


def _combine(model: DeviceModel) -> list[_Draft]:
    """1.34: counter sets share slices with the devices that consume them, packed in order."""
    drafts: list[_Draft] = []
    current, shared, consumed = _Draft(), 0, 0
    for group in _groups(model):
        _check_fits_alone(group)
        if (
            len(current.devices) + len(group.devices) > MAX_DEVICES
            or shared + group.shared_counters > MAX_SHARED_COUNTERS_134
            or consumed + group.consumed_counters > MAX_DEVICE_COUNTERS_PER_SLICE_134
        ):
            drafts.append(current)
            current, shared, consumed = _Draft(), 0, 0
        current.devices.extend(group.devices)
        if group.counter_set is not None:
            current.counter_sets.append(group.counter_set)
        shared += group.shared_counters
        consumed += group.consumed_counters
    if current.devices or current.counter_sets:
        drafts.append(current)
    return drafts


def _check_fits_alone(group: _Group) -> None:
    if group.counter_set is None:
        return
    _check_counter_set(group.counter_set, server="Kubernetes 1.34")
    name = group.counter_set["name"]
    if len(group.devices) > MAX_DEVICES:
        raise NotSupported(
            f"{len(group.devices)} devices consume counter set {name}; on Kubernetes 1.34 they must share "
            f"its ResourceSlice, which holds at most {MAX_DEVICES}: use static MIG mode for this GPU"
        )
    if group.consumed_counters > MAX_DEVICE_COUNTERS_PER_SLICE_134:
        raise NotSupported(
            f"the devices consuming counter set {name} consume {group.consumed_counters} counters in all; on "
            f"Kubernetes 1.34 they must share one ResourceSlice, which allows "
            f"{MAX_DEVICE_COUNTERS_PER_SLICE_134}: use static MIG mode for this GPU"
        )


def _name_prefix(node_name: str, driver: str) -> str:
    """`<node>-<driver>`, shortened with a digest of the full text where a slice name would pass 253."""
    prefix = f"{node_name}-{driver.replace('.', '-')}"
    if len(prefix) + _INDEX_ROOM <= MAX_NAME:
        return prefix
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:10]
    kept = prefix[: MAX_NAME - _INDEX_ROOM - len(digest) - 1].rstrip("-.")
    return f"{kept}-{digest}"


# ---- validation


def _is_dns_label(text: object) -> bool:
    return isinstance(text, str) and len(text) <= 63 and _DNS_LABEL.fullmatch(text) is not None


def _is_dns_subdomain(text: object, max_length: int = MAX_NAME) -> bool:
    return isinstance(text, str) and len(text) <= max_length and _DNS_SUBDOMAIN.fullmatch(text) is not None


def _is_quantity(value: object) -> bool:
    return isinstance(value, str) and _QUANTITY.fullmatch(value) is not None


def _qualified_name_problem(name: str) -> str | None:
    domain, _, identifier = name.rpartition("/")
    if domain and not _is_dns_subdomain(domain.lower(), 63):
        return f"domain {domain!r} is not a DNS subdomain of at most 63 characters"
    if len(identifier) > 32 or _C_IDENTIFIER.fullmatch(identifier) is None:
        return f"{identifier!r} is not a C identifier of at most 32 characters"
    return None


def _attribute_problems(name: str, value: object) -> Iterable[str]:
    if (problem := _qualified_name_problem(name)) is not None:
        yield f"attribute name {name!r}: {problem}"
    if not isinstance(value, dict) or len(value) != 1:
        yield f"attribute {name} must set exactly one of int, bool, string, version"
        return
    ((kind, scalar),) = value.items()
    if kind == "int" and (type(scalar) is not int or not -(2**63) <= scalar < 2**63):
        yield f"attribute {name}: int {scalar!r} is not a 64-bit integer"
    elif kind == "bool" and type(scalar) is not bool:
        yield f"attribute {name}: bool {scalar!r} is not true or false"
    elif kind in ("string", "version") and (not isinstance(scalar, str) or len(scalar) > MAX_VALUE_LENGTH):
        yield f"attribute {name}: {kind} {scalar!r} is not a string of at most {MAX_VALUE_LENGTH} characters"
    elif kind == "version" and _SEMVER.fullmatch(str(scalar)) is None:
        yield f"attribute {name}: version {scalar!r} is not semver (MAJOR.MINOR.PATCH, no leading zeros)"
    elif kind not in ("int", "bool", "string", "version"):
        yield f"attribute {name}: {kind!r} is not one of int, bool, string, version"


def _counters_problems(where: str, counters: dict[str, object], limit: int) -> Iterable[str]:
    if not counters:
        yield f"{where} lists no counters"
    if len(counters) > limit:
        yield f"{where} has {len(counters)} counters; at most {limit} are allowed"
    for name, counter in counters.items():
        if not _is_dns_label(name):
            yield f"{where}: counter name {name!r} is not a DNS label"
        if not isinstance(counter, dict) or not _is_quantity(counter.get("value")):
            yield f"{where}: counter {name} needs a quantity value"


def _device_problems(device: Device, server_minor: int) -> Iterable[str]:
    name = device.get("name")
    where = f"device {name}"
    if not _is_dns_label(name):
        yield f"{where}: name is not a DNS label (lower-case letters, digits, '-'; at most 63)"
    attributes = device.get("attributes", {})
    capacity = device.get("capacity", {})
    for key, attribute in attributes.items():
        yield from (f"{where}: {p}" for p in _attribute_problems(key, attribute))
    multiple = device.get("allowMultipleAllocations")
    if multiple is not None and type(multiple) is not bool:
        yield f"{where}: allowMultipleAllocations {multiple!r} is not true or false"
    for key, amount in capacity.items():
        if (problem := _qualified_name_problem(key)) is not None:
            yield f"{where}: capacity name {key!r}: {problem}"
        if not isinstance(amount, dict) or not _is_quantity(amount.get("value")):
            yield f"{where}: capacity {key} needs a quantity value"
        elif (policy := amount.get("requestPolicy")) is not None:
            if multiple is not True:
                yield f"{where}: capacity {key}: requestPolicy is allowed only with allowMultipleAllocations"
            else:
                yield from (
                    f"{where}: capacity {key}: requestPolicy: {p}"
                    for p in _request_policy_problems(amount["value"], policy)
                )
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        yield (
            f"{where}: {len(attributes)} attributes and {len(capacity)} capacities; "
            f"at most {MAX_ATTRIBUTES_AND_CAPACITIES} together"
        )
    consumptions = device.get("consumesCounters", [])
    for set_name, count in Tally(c["counterSet"] for c in consumptions).items():
        if count > 1:
            yield f"{where}: consumes counter set {set_name} in {count} entries; one per set is allowed"
    for consumption in consumptions:
        set_name = consumption["counterSet"]
        if not _is_dns_label(set_name):
            yield f"{where}: counter set name {set_name!r} is not a DNS label"
        yield from _counters_problems(
            f"{where}: consumption of {set_name}", dict(consumption["counters"]), MAX_COUNTERS_PER_CONSUMPTION
        )
    taints = device.get("taints", [])
    if server_minor > OLDEST_MINOR:
        if len(consumptions) > MAX_CONSUMPTIONS_PER_DEVICE:
            yield f"{where}: consumes {len(consumptions)} counter sets; at most {MAX_CONSUMPTIONS_PER_DEVICE}"
        if len(taints) > MAX_TAINTS:
            yield f"{where}: {len(taints)} taints; at most {MAX_TAINTS}"
    else:
        if _consumed_counters(device) > MAX_COUNTERS_PER_DEVICE_134:
            yield (
                f"{where}: consumes {_consumed_counters(device)} counters; "
                f"at most {MAX_COUNTERS_PER_DEVICE_134} on Kubernetes 1.34"
            )
        if len(taints) > MAX_TAINTS_134:
            yield f"{where}: {len(taints)} taints; at most {MAX_TAINTS_134} on Kubernetes 1.34"


def _request_policy_problems(value: str, policy: object) -> Iterable[str]:
    """The API server's rules on a consumable capacity's requestPolicy (validateRequestPolicy)."""
    if not isinstance(policy, dict):
        yield "is not an object"
        return
    valid_range, options = policy.get("validRange"), policy.get("validValues") or []
    if valid_range is not None and options:
        yield "sets both validValues and validRange; at most one is allowed"
        return
    texts: dict[str, object] = {"default": policy.get("default")}
    texts.update((f"validValues[{i}]", option) for i, option in enumerate(options))
    if isinstance(valid_range, dict):
        texts.update((f"validRange.{k}", valid_range.get(k)) for k in ("min", "max", "step"))
    parsed = {name: _amount(text) for name, text in texts.items() if text is not None}
    amounts = {name: amount for name, amount in parsed.items() if amount is not None}
    if len(amounts) < len(parsed):
        yield from (f"{name} {texts[name]!r} is not a quantity" for name in parsed.keys() - amounts.keys())
        return
    default = amounts.get("default")
    if valid_range is None and not options:
        return
    if default is None:
        yield "default is required with validRange or validValues"
        return
    capacity = parse_quantity(value)
    if options:
        yield from _valid_values_problems(
            capacity, default, [amounts[f"validValues[{i}]"] for i in range(len(options))]
        )
    else:
        yield from _valid_range_problems(capacity, default, amounts)


def _amount(text: object) -> Fraction | None:
    if not _is_quantity(text):
        return None
    try:
        return parse_quantity(str(text))
    except ConfigError:  # an exponent out of range
        return None


def _valid_values_problems(capacity: Fraction, default: Fraction, options: list[Fraction]) -> Iterable[str]:
    if options != sorted(options):
        yield "validValues are not in ascending order"
    if len(options) > MAX_VALID_VALUES:
        yield f"{len(options)} validValues; at most {MAX_VALID_VALUES}"
    if len({math.ceil(o) for o in options}) < len(options):
        yield "validValues repeat a value"
    if any(o > capacity for o in options):
        yield "a validValues option is larger than the capacity's value"
    if default not in options:
        yield "default is not one of validValues"


def _valid_range_problems(
    capacity: Fraction, default: Fraction, amounts: dict[str, Fraction]
) -> Iterable[str]:
    low, high, step = (amounts.get(f"validRange.{k}") for k in ("min", "max", "step"))
    if low is None:
        yield "validRange.min is required"
        return
    if low > capacity:
        yield "validRange.min is larger than the capacity's value"
    if default < low:
        yield "default is less than validRange.min"
    if high is not None:
        if low > high:
            yield "validRange.min is larger than validRange.max"
        if high > capacity:
            yield "validRange.max is larger than the capacity's value"
        if default > high:
            yield "default is more than validRange.max"
    if step is None:
        return
    if low + step > capacity:
        yield "validRange.min plus one step is larger than the capacity's value"
    whole_step = math.ceil(step)  # the API server takes the steps on values rounded up to integers
    if whole_step <= 0:
        yield "validRange.step is not positive"
        return
    for name, amount in (("default", default), ("validRange.max", high)):
        if amount is not None and (math.ceil(amount) - math.ceil(low)) % whole_step:
            yield f"{name} is not a whole number of steps from validRange.min"


def _own_domain_problems(device: Device, driver: str) -> Iterable[str]:
    """A name qualified with the driver's own domain: the API takes it as another name than the bare
    one (a selector reading `device.attributes["<driver>"].uuid` finds the bare `uuid` only), and from
    1.38 the kubelet plugins' ResourceSlice helper refuses to publish it. Every release: gpudra writes
    its own names bare."""
    own = f"{driver}/"
    for kind, names in (
        ("attribute", device.get("attributes", {})),
        ("capacity", device.get("capacity", {})),
    ):
        for key in names:
            if key.startswith(own):
                yield (
                    f"device {device.get('name')}: {kind} name {key!r} carries the driver's own domain: "
                    f"write it bare, {key[len(own) :]!r}"
                )


def _slice_problems(slice_: ResourceSlice, server_minor: int) -> list[str]:
    spec = slice_["spec"]
    name = slice_["metadata"].get("name")
    where = f"slice {name}"
    problems: list[str] = []
    if not _is_dns_subdomain(name):
        problems.append(f"{where}: name is not a DNS subdomain of at most {MAX_NAME} characters")
    if not _is_dns_subdomain(spec["driver"].lower(), 63):
        problems.append(f"{where}: driver {spec['driver']!r} is not a DNS subdomain of at most 63 characters")
    pool = spec["pool"]
    if len(pool["name"]) > MAX_NAME or not all(_is_dns_subdomain(p) for p in pool["name"].split("/")):
        problems.append(f"{where}: pool name {pool['name']!r} is not DNS subdomains joined by '/'")
    if pool["generation"] < 0:
        problems.append(f"{where}: pool generation {pool['generation']} is negative")
    if pool["resourceSliceCount"] <= 0:
        problems.append(f"{where}: resourceSliceCount {pool['resourceSliceCount']} is not positive")
    if not _is_dns_subdomain(spec.get("nodeName")):
        problems.append(f"{where}: nodeName must be set to a node's name (gpudra publishes node-local pools)")
    devices = spec.get("devices") or []
    counter_sets = spec.get("sharedCounters", [])
    problems.extend(f"{where}: {p}" for d in devices for p in _device_problems(d, server_minor))
    problems.extend(f"{where}: {p}" for d in devices for p in _own_domain_problems(d, spec["driver"]))
    problems.extend(f"{where}: {p}" for p in _device_limit_problems(devices, server_minor))
    for counter_set in counter_sets:
        set_name = counter_set["name"]
        if not _is_dns_label(set_name):
            problems.append(f"{where}: counter set name {set_name!r} is not a DNS label")
        problems.extend(
            f"{where}: {p}"
            for p in _counters_problems(
                f"counter set {set_name}", dict(counter_set["counters"]), MAX_COUNTERS_PER_SET
            )
        )
    if server_minor > OLDEST_MINOR:
        if devices and counter_sets:
            problems.append(
                f"{where}: holds both devices and sharedCounters; from Kubernetes 1.35 one or the other"
            )
        if len(counter_sets) > MAX_COUNTER_SETS:
            problems.append(f"{where}: {len(counter_sets)} counter sets; at most {MAX_COUNTER_SETS}")
    else:
        problems.extend(f"{where}: {p}" for p in _combined_problems(devices, counter_sets))
    return problems


def _device_limit_problems(devices: list[Device], server_minor: int) -> Iterable[str]:
    limit = MAX_DEVICES
    if server_minor > OLDEST_MINOR and any(map(_is_advanced, devices)):
        limit = MAX_DEVICES_WITH_COUNTERS_OR_TAINTS
    if len(devices) > limit:
        yield f"{len(devices)} devices; at most {limit} here"


def _combined_problems(devices: list[Device], counter_sets: list[CounterSet]) -> Iterable[str]:
    """1.34's per-slice counter rules, where devices reference counter sets of their own slice."""
    shared = sum(len(s["counters"]) for s in counter_sets)
    if shared > MAX_SHARED_COUNTERS_134:
        yield f"{shared} shared counters; at most {MAX_SHARED_COUNTERS_134} in one slice on Kubernetes 1.34"
    consumed = sum(map(_consumed_counters, devices))
    if consumed > MAX_DEVICE_COUNTERS_PER_SLICE_134:
        yield (
            f"devices consume {consumed} counters; at most {MAX_DEVICE_COUNTERS_PER_SLICE_134} "
            "in one slice on Kubernetes 1.34"
        )
    for set_name, count in Tally(s["name"] for s in counter_sets).items():
        if count > 1:
            yield f"counter set {set_name} is defined {count} times"
    yield from _reference_problems(devices, counter_sets)


def _reference_problems(devices: Iterable[Device], counter_sets: Iterable[CounterSet]) -> Iterable[str]:
    known = {s["name"]: s["counters"].keys() for s in counter_sets}
    for device in devices:
        for consumption in device.get("consumesCounters", []):
            set_name = consumption["counterSet"]
            if set_name not in known:
                yield f"device {device['name']} consumes counter set {set_name}, which is not defined"
                continue
            for counter in consumption["counters"].keys() - known[set_name]:
                yield f"device {device['name']} consumes counter {counter}, missing from set {set_name}"


def _pool_problems(members: list[ResourceSlice], server_minor: int) -> Iterable[str]:
    generations = sorted({s["spec"]["pool"]["generation"] for s in members})
    if len(generations) > 1:
        yield f"slices of generations {generations}; a pool's slices share one generation"
    counts = sorted({s["spec"]["pool"]["resourceSliceCount"] for s in members})
    if counts != [len(members)]:
        yield f"resourceSliceCount {counts} but {len(members)} slices"
    for kind, names in (
        ("slice", [s["metadata"]["name"] for s in members]),
        ("device", [d["name"] for s in members for d in (s["spec"].get("devices") or [])]),
    ):
        for name, count in Tally(names).items():
            if count > 1:
                yield f"{kind} name {name} is used {count} times"
    if server_minor > OLDEST_MINOR:
        counter_sets = [c for s in members for c in s["spec"].get("sharedCounters", [])]
        for name, count in Tally(c["name"] for c in counter_sets).items():
            if count > 1:
                yield f"counter set {name} is defined {count} times"
        yield from _reference_problems(
            (d for s in members for d in (s["spec"].get("devices") or [])), counter_sets
        )
