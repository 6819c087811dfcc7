"""The device model: a node's GPU inventory as resource.k8s.io/v1 devices and counter sets. Pure.

Whole GPUs are named `gpu-<minor>`, their shared devices `gpu-<minor>-shared`, MIG partitions
`gpu-<minor>-mig-<profile>-<placement start>` (the profile name reduced to a DNS label: `1g.10gb+me`
becomes `1g10gbme`). Attribute names are unqualified, so CEL sees them under the driver's domain, except
the standard `resource.kubernetes.io/` PCI ones.

Two MIG modes:

- "partitionable" (KEP-4815): every MIG profile x placement of a MIG-capable GPU is a device, and one
  counter set per GPU (`gpu-<minor>-counters`) keeps the scheduler to layouts the GPU can hold. It counts
  one `memory-slice-<i>` (value 1) per memory slice, and of `memory` (bytes), `multiprocessors`, each
  engine kind and `<profile>-instances` (for a profile that allows fewer instances than it has
  placements) those that some mix of non-overlapping offered placements could exceed. A partition
  consumes the slices of its placement plus its own amounts of those; the whole GPU consumes every
  counter, so it excludes every partition and they exclude it. The slice counters make overlapping
  placements exclusive; the totals of the others are the GPU's own (its memory and SMs, the engines of
  the profile that spans it), so partitions never share an engine the chip has only one of (two `+me`
  partitions on A30). A counter the slices already keep within its total is left out: each one costs the
  scheduler on every Filter call (on an H100 with every profile 10 counters instead of 15, and with
  1g.10gb and 3g.40gb only the 8 slices; BENCHMARKS.md, cluster scale).
- "static": whole GPUs with MIG off, plus the MIG devices that exist now; no counters but those that
  keep a whole GPU and its shared device apart (below).

In partitionable mode a GPU whose MIG mode switches without a reset (`Gpu.mig_mode_switchable`: Hopper
and newer on bare metal) offers itself and every partition whatever its mode, the counters keeping them
exclusive; the node plugin switches the mode when it prepares one. Any other MIG-capable GPU (Ampere, or
any GPU under virtualization, which cannot reset it) would need a reset to switch, so it offers its
partitions while MIG is on and itself while MIG is off, never both.

Each GPU's partitions are published in packing order (`placement.packing_order`): the scheduler takes
the first device that fits, so that order decides where first-fit puts each instance.

Each whole GPU is published twice (unless `shares=False`): `gpu-<minor>`, which one claim has to itself,
and right after it `gpu-<minor>-shared`, which several claims can each get a share of (KEP-5075,
consumable capacity: `allowMultipleAllocations`). The shared device carries the whole GPU's attributes,
so a selector reads the same on both, plus `shared: true` (what the DeviceClasses tell them apart by),
and two capacities that a claim asks for in `capacity.requests`:

- `memory`: the GPU's memory, requested in whole GiB, from 1Gi to the memory rounded down to whole GiB.
  A request that does not name it gets all of that: memory is what fails hard (an out-of-memory error
  mid-job), so a share that did not say how much it needs is not packed beside others on a guess.
- `compute`: percent of the GPU's SMs, 0 to 100 in steps of 1, value 100. A request that does not name
  it asks 0, meaning no SM share: no cap on the share and none kept for it, so shares that only size
  their memory still pack side by side.

With shares by count (`Publishing.shares_per_gpu` N, the device plugin's `replicas: N`, NVIDIA's
`--consumable-shares=N`), a third:

- `shares`: value N (at most one per whole GiB of memory, from 2 to 64), default 1, from 1 to N in steps
  of 1. Every share consumes at least one, so at most N claims share the GPU; and a request that does
  not name `memory` then gets N's part of it, the memory in whole GiB divided by N and rounded down, so
  N such shares fit side by side and MPS limits each to that much (its consumed memory is its pinned
  memory limit). Memory still bounds: a share that names more memory leaves less for the others, and
  `shares: 2` without memory still gets one part (name the memory to get more). The policy defaults
  are per device, not per request: the scheduler cannot scale one capacity's default by another's.

The scheduler adds up what the shares of one device request and keeps each total within the value.
The shared device, the whole GPU and every partition of the GPU exclude each other through counters:
the shared device consumes every counter of the GPU's set, as the whole GPU does, and the scheduler
counts a multi-allocatable device's counters once, when its first share is allocated. A GPU that has no
counter set otherwise (not MIG-capable, static mode, no profiles) gets `gpu-<minor>-counters` with one
`memory` counter, which the GPU and its shared device both consume in full. A GPU of less than 2 GiB is
not shared: a range of 1 GiB steps needs room for two.

Shares of a MIG partition (partitionable mode, `Publishing.mig_share_profiles`, opt-in per profile):
each placement of such a profile is published twice, the partition itself and right after it
`gpu-<minor>-mig-<profile>-<start>-shared`, which several claims each get a share of. It carries the
partition's attributes plus `shared: true`, and the capacities of a GPU's shared device, sized to the
partition: `memory` (the partition's, in whole GiB), `compute` (percent of the partition's SMs) and,
with shares by count, `shares` (N, at most one per whole GiB of the partition). It consumes exactly
the counters the partition at that placement consumes, so the two forms of one placement exclude each
other, and each excludes the whole GPU, its shared device and every overlapping partition as the
partition does; the scheduler counts those counters once for all the shares. Each shareable profile
adds one device per placement (seven for 1g.10gb on an H100) to what the scheduler reads on every
node, hence opt-in. The node plugin creates the partition with the first share it prepares and
destroys it with the last (gpudra.node.prepare); MPS keeps each share to its limits inside it.

A GPU found unhealthy is published with a device taint (KEP-5055, `with_health_taints`) on itself, its
shared device and every partition of it (a partition's own fault taints that partition only; see
gpudra.model.gpu_health), so the scheduler allocates none of them until the taint is lifted.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict, get_args

from gpudra.errors import ConfigError, HardwareError, NotSupported
from gpudra.model.inventory import Gpu, Inventory, MigDevice, MigPlacement, MigProfile
from gpudra.model.placement import packing_order
from gpudra.model.publishing import MigMode, PartitionAttributes, Publishing

STANDARD_DOMAIN = "resource.kubernetes.io"
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"
PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"
# GA in 1.37 (KEP-6072): the name every driver publishes a device's NUMA node under, so that a claim can
# keep a GPU and another driver's device (a NIC) on one node with matchAttribute. gpudra's own
# `numaNode` stays beside it for the claims written against it.
NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"

# The API caps string and version attributes at 64 characters; NVML names may be up to 96.
_MAX_STRING = 64

# (capacity name, counter name, MigProfile field) for each engine kind
_ENGINES = (
    ("copyEngines", "copy-engines", "copy_engines"),
    ("decoders", "decoders", "decoders"),
    ("encoders", "encoders", "encoders"),
    ("jpegEngines", "jpeg-engines", "jpegs"),
    ("ofaEngines", "ofa-engines", "ofas"),
)

_COUNTER_OF = {capacity: counter for capacity, counter, _ in _ENGINES}

_BINARY_SUFFIXES = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")

_GIB = 1024**3
SHARED_SUFFIX = "-shared"
# Set (true) on shared devices only. The DeviceClasses tell a GPU from its shared device by it rather than
# by `device.allowMultipleAllocations`, which the API server's CEL knows only where DRAConsumableCapacity
# is on (1.36+ by default): a class naming that field is refused on 1.34 and 1.35.
SHARED_ATTRIBUTE = "shared"
# A shared device's compute capacity: percent of the GPU's SMs
SHARED_COMPUTE = 100
# A shared device's count of shares (with shares by count only)
SHARES_CAPACITY = "shares"

UNHEALTHY_TAINT_KEY = "gpudra.io/unhealthy"
_MAX_LABEL_VALUE = 63


class DeviceAttribute(TypedDict, total=False):
    """Exactly one of the fields is set."""

    int: int
    bool: bool
    string: str
    version: str


class CapacityRequestPolicyRange(TypedDict):
    min: str
    max: NotRequired[str]
    step: NotRequired[str]


class CapacityRequestPolicy(TypedDict):
    """What a share of a multi-allocatable device may request of one capacity (all Quantities)."""

    default: NotRequired[str]  # what a request that does not name the capacity gets
    validRange: NotRequired[CapacityRequestPolicyRange]


class DeviceCapacity(TypedDict):
    value: str  # a Kubernetes Quantity
    requestPolicy: NotRequired[CapacityRequestPolicy]  # only on a device that allows multiple allocations


class Counter(TypedDict):
    value: str  # a Kubernetes Quantity


class CounterSet(TypedDict):
    name: str
    counters: dict[str, Counter]


class DeviceCounterConsumption(TypedDict):
    counterSet: str
    counters: dict[str, Counter]


class DeviceTaint(TypedDict):
    key: str
    value: NotRequired[str]
    effect: str


class Device(TypedDict):
    name: str
    attributes: dict[str, DeviceAttribute]
    capacity: dict[str, DeviceCapacity]
    allowMultipleAllocations: NotRequired[bool]
    consumesCounters: NotRequired[list[DeviceCounterConsumption]]
    taints: NotRequired[list[DeviceTaint]]


@dataclass(frozen=True)
class DeviceModel:
    """What one node publishes. Each device consumes at most one counter set, listed here."""

    devices: list[Device]
    counter_sets: list[CounterSet]
    # The metadata annotations of the pool's first slice: the health report (gpudra.model.health_report).
    annotations: Mapping[str, str] = field(default_factory=dict)


def build_devices(
    inventory: Inventory,
    *,
    mig_mode: MigMode,
    shares: bool = True,
    shares_per_gpu: int = 0,
    mig_profiles: frozenset[str] | None = None,
    switch_idle_mig: bool = False,
    partition_attributes: PartitionAttributes = "full",
    mig_share_profiles: frozenset[str] = frozenset(),
) -> DeviceModel:
    """The devices and counter sets that describe `inventory`, GPUs in minor order.

    With `shares`, each whole GPU published is followed by its shared device (`gpu-<minor>-shared`),
    offering `shares_per_gpu` shares by count when that is not 0 (see the module docstring).
    `mig_profiles` (partitionable mode): the MIG profiles offered on demand, by name; None offers every
    profile. Fewer profiles mean fewer devices for the scheduler to look at on every node (BENCHMARKS.md,
    cluster scale); the counters still cover the whole GPU, so any mix of the offered ones is exclusive.
    `switch_idle_mig` (static mode): see `Publishing.switch_idle_mig`. `partition_attributes`: see
    `PartitionAttributes` (gpudra.model.publishing). `mig_share_profiles` (partitionable mode): the
    offered profiles whose partitions are also published as shareable, each placement followed by its
    shared form (`shares_per_gpu` gives those a count too).
    """
    if mig_mode not in get_args(MigMode):
        raise ConfigError(
            f"{mig_mode!r} is not a MIG mode; use one of: partitionable, static", field="migMode"
        )
    versions = _driver_versions(inventory)
    devices: list[Device] = []
    counter_sets: list[CounterSet] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor):
        if mig_mode == "static":
            whole = not gpu.mig_enabled or (
                switch_idle_mig and gpu.mig_mode_switchable and not gpu.mig_devices
            )
            partitions = tuple(_existing_partitions(gpu))
            partition_counters = None
        else:
            whole = _offers_whole(gpu)
            partitions = _possible_partitions(gpu, mig_profiles) if _offers_partitions(gpu) else ()
            partition_counters = _counter_set(gpu, partitions) if partitions else None
        counters = partition_counters
        shared: Device | None = None
        if shares and whole and _shareable(gpu):
            if counters is None:
                counters = _memory_counter_set(gpu)
            shared = _shared_gpu(gpu, versions, consumes=counters, shares_per_gpu=shares_per_gpu)
        if counters is not None:
            counter_sets.append(counters)
        if whole:
            devices.append(_whole_gpu(gpu, versions, consumes=counters))
        if shared is not None:
            devices.append(shared)
        for p in partitions:
            partition = _partition_device(
                gpu, p, versions, consumes=partition_counters, minimal=partition_attributes == "minimal"
            )
            devices.append(partition)
            # Right after its exclusive form: the classes tell them apart, so each keeps packing order.
            if mig_mode == "partitionable" and p.profile in mig_share_profiles and p.memory_bytes >= 2 * _GIB:
                devices.append(_shared_partition(partition, p.memory_bytes, shares_per_gpu=shares_per_gpu))
    _check_unique_names(devices)
    return DeviceModel(devices=devices, counter_sets=counter_sets)


def publish(inventory: Inventory, publishing: Publishing) -> DeviceModel:
    """What a node with `inventory` publishes when configured with `publishing`.

    Raises ConfigError when `publishing` names MIG profiles none of the node's GPUs has (a typo would
    otherwise publish no partitions at all, silently), or shareable MIG profiles that are not offered.
    """
    offered = publishing.mig_profiles
    known = {p.name for gpu in inventory.gpus for p in gpu.mig_profiles}
    if offered is not None and publishing.mig_mode == "partitionable" and known and not offered & known:
        raise ConfigError(
            f"none of {', '.join(sorted(offered))} is a MIG profile of this node's GPUs; they have: "
            f"{', '.join(sorted(known))}",
            field="--mig-profiles",
        )
    shareable = publishing.mig_share_profiles
    if shareable and publishing.mig_mode == "partitionable":
        allowed = (offered if offered is not None else known) & known
        # A node without MIG-capable GPUs has nothing to share; a node group's values may still name them.
        if known and not shareable <= allowed:
            raise ConfigError(
                f"{', '.join(sorted(shareable - allowed))} is not a MIG profile offered on this node; "
                f"allowed: {', '.join(sorted(allowed))}",
                field="--mig-share-profiles",
            )
    return build_devices(
        inventory,
        mig_mode=publishing.mig_mode,
        shares=publishing.shares,
        shares_per_gpu=publishing.shares_per_gpu,
        mig_profiles=offered,
        switch_idle_mig=publishing.switch_idle_mig,
        partition_attributes=publishing.partition_attributes,
        mig_share_profiles=publishing.mig_share_profiles,
    )


def with_health_taints(model: DeviceModel, taints: Mapping[str, DeviceTaint]) -> DeviceModel:
    """`model` with each device named in `taints` carrying its taint (gpudra.model.gpu_health decides
    which: a GPU's devices follow it, a partition may have its own). The API server sets `timeAdded`.
    `model` is left as it is; an empty `taints` returns it unchanged."""
    if not taints:
        return model
    tainted: list[Device] = []
    for device in model.devices:
        taint = taints.get(device["name"])
        if taint is None:
            tainted.append(device)
        else:
            tainted.append({**device, "taints": [*device.get("taints", []), taint]})
    return dataclasses.replace(model, devices=tainted)


def without_devices(model: DeviceModel, names: Collection[str]) -> DeviceModel:
    """`model` less the named devices: what to publish for unhealthy devices where the API server drops
    device taints, so that the scheduler cannot hand them out."""
    if not names:
        return model
    kept = [d for d in model.devices if d["name"] not in names]
    return dataclasses.replace(model, devices=kept)


def gpu_uuid_of(device: Device) -> str:
    """The UUID of the GPU that `device` is, shares, or is a MIG partition of."""
    attributes = device["attributes"]
    return str((attributes.get("parentUUID") or attributes["uuid"])["string"])


def partition_of(device: Device) -> tuple[str, MigPlacement]:
    """A published MIG partition's profile name and placement, read back from its attributes."""
    attributes = device["attributes"]
    start, size = attributes["placementStart"].get("int", 0), attributes["placementSize"].get("int", 0)
    return str(attributes["profile"].get("string", "")), MigPlacement(int(start), int(size))


def dns_label(text: str) -> str:
    """`text` lower-cased, keeping letters, digits and inner dashes: `1g.10gb+me` -> `1g10gbme`."""
    return re.sub(r"[^a-z0-9-]", "", text.lower()).strip("-")


def bytes_quantity(count: int) -> str:
    """`count` bytes as the canonical Quantity the API server would store: 80 GiB -> "80Gi"."""
    for power, suffix in zip(range(len(_BINARY_SUFFIXES), 0, -1), _BINARY_SUFFIXES, strict=True):
        unit = 1024**power
        if count and count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


def semver(text: str, *, what: str) -> str:
    """A dotted version as semver: "580.65.06" -> "580.65.6", "13.0" -> "13.0.0"."""
    match = re.fullmatch(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text.strip())
    if match is None:
        raise HardwareError(f"{what} {text!r} is not a version of up to three dotted numbers")
    return ".".join(str(int(part or 0)) for part in match.groups())


@dataclass(frozen=True)
class _Partition:
    """One MIG GPU instance, possible or existing, with what it takes from its GPU."""

    profile: str
    placement: MigPlacement
    memory_bytes: int
    multiprocessors: int
    engines: tuple[tuple[str, int], ...]  # (capacity name, count); empty when the profile is unknown
    instance_limit: int | None  # the profile's max instances, when below its number of placements
    uuid: str | None  # the MIG device's UUID, for an existing one in static mode

    @property
    def name_part(self) -> str:
        return f"mig-{dns_label(self.profile)}-{self.placement.start}"

    @property
    def instance_counter(self) -> str:
        return f"{dns_label(self.profile)}-instances"


def _driver_versions(inventory: Inventory) -> dict[str, str]:
    """The version attributes every device of the node carries."""
    return {
        "driverVersion": semver(inventory.driver_version, what="driver version"),
        "cudaDriverVersion": semver(inventory.cuda_driver_version, what="CUDA driver version"),
    }


def _offers_whole(gpu: Gpu) -> bool:
    return gpu.mig_mode_switchable or not gpu.mig_enabled


def _offers_partitions(gpu: Gpu) -> bool:
    return gpu.mig_capable and (gpu.mig_enabled or gpu.mig_mode_switchable)


def _from_profile(profile: MigProfile, placement: MigPlacement, uuid: str | None) -> _Partition:
    return _Partition(
        profile=profile.name,
        placement=placement,
        memory_bytes=profile.memory_mib * 1024**2,
        multiprocessors=profile.multiprocessors,
        engines=tuple((capacity, getattr(profile, field)) for capacity, _, field in _ENGINES),
        instance_limit=profile.instance_count if profile.instance_count < len(profile.placements) else None,
        uuid=uuid,
    )


def _possible_partitions(gpu: Gpu, offered: frozenset[str] | None) -> tuple[_Partition, ...]:
    """Every profile x placement, smaller profiles first, each profile's placements in packing order.

    The order is the allocation policy: the scheduler takes the first published device that matches a
    request and whose counters fit. Ascending starts would land small instances on the low slices that
    7g, 4g and 3g need; `packing_order` puts first the placements that block the least of larger ones,
    so first-fit packs each GPU from the end away from them and keeps its large profiles placeable longer
    (tests/unit/model/test_fragmentation.py measures by how much). Names carry the start, so they do not
    change.
    """
    profiles = sorted(
        (p for p in gpu.mig_profiles if offered is None or p.name in offered),
        key=lambda p: (p.memory_slices, p.name),
    )
    return tuple(_from_profile(p, placement, None) for p in profiles for placement in packing_order(gpu, p))


def _existing_partitions(gpu: Gpu) -> list[_Partition]:
    profiles = {p.id: p for p in gpu.mig_profiles}
    return [_existing(device, profiles.get(device.profile_id)) for device in gpu.mig_devices]


def _existing(device: MigDevice, profile: MigProfile | None) -> _Partition:
    if profile is not None:
        return _from_profile(profile, device.placement, device.uuid)
    return _Partition(
        profile=device.profile_name,
        placement=device.placement,
        memory_bytes=device.memory_mib * 1024**2,
        multiprocessors=device.multiprocessors,
        engines=(),
        instance_limit=None,
        uuid=device.uuid,
    )


def _amounts(partition: _Partition) -> dict[str, int]:
    """What `partition` takes from its GPU's counters, besides memory slices."""
    amounts = {"memory": partition.memory_bytes, "multiprocessors": partition.multiprocessors}
    amounts.update((_COUNTER_OF[capacity], count) for capacity, count in partition.engines)
    if partition.instance_limit is not None:
        amounts[partition.instance_counter] = 1
    return amounts


def _full_profile(gpu: Gpu) -> MigProfile | None:
    """The profile that spans the whole GPU (7g on A100/H100), whose engines are the GPU's."""
    spans = [p for p in gpu.mig_profiles if MigPlacement(0, gpu.mig_memory_slices) in p.placements]
    return max(spans, key=lambda p: p.multiprocessors, default=None)


def _whole_amounts(gpu: Gpu) -> dict[str, int]:
    """The whole GPU's own memory, SMs and engines, as far as the inventory knows them (capacity names)."""
    full = _full_profile(gpu)
    amounts = {"memory": gpu.memory_bytes}
    if gpu.multiprocessors is not None:
        amounts["multiprocessors"] = gpu.multiprocessors
    elif full is not None:
        amounts["multiprocessors"] = full.multiprocessors
    if full is not None:
        amounts.update((capacity, getattr(full, field)) for capacity, _, field in _ENGINES)
    return amounts


def _counter_set(gpu: Gpu, partitions: tuple[_Partition, ...]) -> CounterSet:
    counters = {_COUNTER_OF.get(name, name): amount for name, amount in _whole_amounts(gpu).items() if amount}
    for partition in partitions:
        if partition.instance_limit is not None:
            counters[partition.instance_counter] = partition.instance_limit
    # A counter that no mix of the offered placements can exceed keeps nothing apart that the memory
    # slices do not, and every counter costs the scheduler on every node's Filter call (converting and
    # validating each consumption: BENCHMARKS.md, cluster scale), so only those that can bind are kept.
    takes = [(p.placement, _amounts(p)) for p in partitions]
    counters = {name: limit for name, limit in counters.items() if _most_at_once(takes, name) > limit}
    slice_count = max(gpu.mig_memory_slices, *(p.placement.start + p.placement.size for p in partitions))
    counters.update((f"memory-slice-{i}", 1) for i in range(slice_count))
    return {
        "name": f"gpu-{gpu.minor}-counters",
        "counters": {name: {"value": _quantity(name, amount)} for name, amount in counters.items()},
    }


def _most_at_once(takes: list[tuple[MigPlacement, dict[str, int]]], counter: str) -> int:
    """The most of `counter` that partitions of pairwise disjoint placements take together: what the
    memory-slice counters alone let the scheduler put on the GPU at once. Placements are intervals of
    memory slices, so this is weighted interval scheduling, the best total up to each slice boundary."""
    ends = max((placement.start + placement.size for placement, _ in takes), default=0)
    best = [0] * (ends + 1)
    for end in range(1, ends + 1):
        best[end] = max(
            [best[end - 1]]
            + [
                best[placement.start] + amounts.get(counter, 0)
                for placement, amounts in takes
                if placement.start + placement.size == end
            ]
        )
    return best[ends]


def _quantity(counter: str, amount: int) -> str:
    return bytes_quantity(amount) if counter == "memory" else str(amount)


def _consumption(counter_set: CounterSet, amounts: dict[str, int]) -> list[DeviceCounterConsumption]:
    used = {name: amount for name, amount in amounts.items() if amount}
    return [
        {
            "counterSet": counter_set["name"],
            "counters": {
                name: {"value": _quantity(name, used[name])}
                for name in counter_set["counters"]
                if name in used
            },
        }
    ]


def _parent_attributes(gpu: Gpu, versions: dict[str, str]) -> dict[str, DeviceAttribute]:
    """What a GPU and its partitions share, so one selector reads the same on both."""
    attributes: dict[str, DeviceAttribute] = {
        "productName": _string(gpu.name),
        "brand": _string(gpu.brand),
        "architecture": _string(gpu.architecture),
        "cudaComputeCapability": {
            "version": semver(gpu.cuda_compute_capability, what="CUDA compute capability")
        },
        **{name: {"version": version} for name, version in versions.items()},
        PCI_BUS_ID: _string(gpu.pci_bus_id),
    }
    if gpu.pcie_root is not None:
        attributes[PCIE_ROOT] = _string(gpu.pcie_root)
    if gpu.numa_node is not None:
        attributes["numaNode"] = {"int": gpu.numa_node}
        attributes[NUMA_NODE] = {"int": gpu.numa_node}
    if gpu.nvlink_domain is not None:
        attributes["nvlinkDomain"] = _string(gpu.nvlink_domain)
    return attributes


def _whole_attributes(gpu: Gpu, versions: dict[str, str]) -> dict[str, DeviceAttribute]:
    return {
        "type": {"string": "gpu"},
        "uuid": _string(gpu.uuid),
        "index": {"int": gpu.index},
        "minor": {"int": gpu.minor},
        "migCapable": {"bool": gpu.mig_capable},
        **_parent_attributes(gpu, versions),
    }


def _consumes_all(counter_set: CounterSet) -> list[DeviceCounterConsumption]:
    everything: dict[str, Counter] = {
        name: {"value": counter["value"]} for name, counter in counter_set["counters"].items()
    }
    return [{"counterSet": counter_set["name"], "counters": everything}]


def _whole_gpu(gpu: Gpu, versions: dict[str, str], *, consumes: CounterSet | None) -> Device:
    capacity: dict[str, DeviceCapacity] = {
        name: {"value": _quantity(name, amount)} for name, amount in _whole_amounts(gpu).items()
    }
    device: Device = {
        "name": f"gpu-{gpu.minor}",
        "attributes": _whole_attributes(gpu, versions),
        "capacity": capacity,
    }
    if consumes is not None:
        device["consumesCounters"] = _consumes_all(consumes)
    return device


def _shareable(gpu: Gpu) -> bool:
    """Whether the GPU's memory holds a range of 1 GiB steps: min + step must not pass the value."""
    return gpu.memory_bytes >= 2 * _GIB


def _memory_counter_set(gpu: Gpu) -> CounterSet:
    """The counter set of a GPU that has no other, so that it and its shared device exclude each other."""
    return {
        "name": f"gpu-{gpu.minor}-counters",
        "counters": {"memory": {"value": bytes_quantity(gpu.memory_bytes)}},
    }


def shares_of(gpu: Gpu, shares_per_gpu: int) -> int:
    """How many shares by count the GPU's shared device offers: `shares_per_gpu`, but at most one per
    whole GiB of its memory, so that each share's default memory is at least the 1Gi step. 0: off."""
    return _shares_within(gpu.memory_bytes, shares_per_gpu)


def _shares_within(memory_bytes: int, shares_per_gpu: int) -> int:
    return min(shares_per_gpu, memory_bytes // _GIB)


def _share_capacity(memory_bytes: int, shares_per_gpu: int) -> dict[str, DeviceCapacity]:
    """The capacities of a shared device (a whole GPU's or a partition's) of `memory_bytes`."""
    gib = memory_bytes // _GIB
    whole_gib = bytes_quantity(gib * _GIB)  # canonical, as the API server stores it
    shares = _shares_within(memory_bytes, shares_per_gpu)
    # By count, a share that names no memory gets its 1/N of the device's (whole GiB, rounded down).
    memory_default = bytes_quantity(gib // shares * _GIB) if shares else whole_gib
    capacity: dict[str, DeviceCapacity] = {
        "memory": {
            "value": bytes_quantity(memory_bytes),
            "requestPolicy": {
                "default": memory_default,
                "validRange": {"min": "1Gi", "max": whole_gib, "step": "1Gi"},
            },
        },
        "compute": {
            "value": str(SHARED_COMPUTE),
            "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": str(SHARED_COMPUTE), "step": "1"},
            },
        },
    }
    if shares:
        capacity[SHARES_CAPACITY] = {
            "value": str(shares),
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": str(shares), "step": "1"}},
        }
    return capacity


def _shared_gpu(
    gpu: Gpu, versions: dict[str, str], *, consumes: CounterSet, shares_per_gpu: int = 0
) -> Device:
    """The whole GPU as a device that several claims each get a share of (see the module docstring)."""
    capacity = _share_capacity(gpu.memory_bytes, shares_per_gpu)
    return {
        "name": f"gpu-{gpu.minor}{SHARED_SUFFIX}",
        "attributes": {**_whole_attributes(gpu, versions), SHARED_ATTRIBUTE: {"bool": True}},
        "capacity": capacity,
        "allowMultipleAllocations": True,
        "consumesCounters": _consumes_all(consumes),
    }


def _shared_partition(partition: Device, memory_bytes: int, *, shares_per_gpu: int) -> Device:
    """The shareable form of `partition` (see the module docstring): its attributes, counters and memory,
    with the request policies of a GPU's shared device sized to the partition."""
    device: Device = {
        "name": f"{partition['name']}{SHARED_SUFFIX}",
        "attributes": {**partition["attributes"], SHARED_ATTRIBUTE: {"bool": True}},
        "capacity": _share_capacity(memory_bytes, shares_per_gpu),
        "allowMultipleAllocations": True,
    }
    # The same counters: the scheduler then keeps this form, the exclusive one and everything that
    # overlaps them apart, and counts them once however many shares it hands out.
    if "consumesCounters" in partition:
        device["consumesCounters"] = partition["consumesCounters"]
    return device


def _partition_device(
    gpu: Gpu,
    partition: _Partition,
    versions: dict[str, str],
    *,
    consumes: CounterSet | None,
    minimal: bool = False,
) -> Device:
    attributes: dict[str, DeviceAttribute] = {
        "type": {"string": "mig"},
        "profile": _string(partition.profile),
        "parentUUID": _string(gpu.uuid),
        "parentMinor": {"int": gpu.minor},
        "placementStart": {"int": partition.placement.start},
        "placementSize": {"int": partition.placement.size},
        # minimal: only what names the partition, and the product (PartitionAttributes)
        **({"productName": _string(gpu.name)} if minimal else _parent_attributes(gpu, versions)),
    }
    if partition.uuid is not None:
        attributes["uuid"] = _string(partition.uuid)
    capacity: dict[str, DeviceCapacity] = {
        "memory": {"value": bytes_quantity(partition.memory_bytes)},
        "multiprocessors": {"value": str(partition.multiprocessors)},
    }
    if not minimal:
        capacity.update({name: {"value": str(count)} for name, count in partition.engines})
        capacity["memorySlices"] = {"value": str(partition.placement.size)}
    device: Device = {
        "name": f"gpu-{gpu.minor}-{partition.name_part}",
        "attributes": attributes,
        "capacity": capacity,
    }
    if consumes is not None:
        slices = {f"memory-slice-{s}": 1 for s in partition.placement.slices}
        device["consumesCounters"] = _consumption(consumes, _amounts(partition) | slices)
    return device


def label_value(text: str) -> str:
    """`text` as a label value: letters, digits, `-_.`, at most 63, alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9_.-]", "", text)[:_MAX_LABEL_VALUE].strip("-_.")


def _string(value: str) -> DeviceAttribute:
    return {"string": value[:_MAX_STRING]}


def _check_unique_names(devices: list[Device]) -> None:
    seen: set[str] = set()
    for device in devices:
        if device["name"] in seen:
            raise NotSupported(
                f"two devices would both be named {device['name']}: MIG profile names that differ only in "
                "punctuation, or several compute instances in one GPU instance, cannot be published"
            )
        seen.add(device["name"])
