"""ResourceSlices as the scheduler reads them: each pool at its newest generation, its devices and shared
counters, and which devices a node sees. Pure.

A pool whose slices are not all there (`resourceSliceCount`), or that names a device twice or a counter
it lacks, is kept with its `problem`: the scheduler skips it, and `gpudra explain` says why.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpudra.errors import ConfigError
from gpudra.quantity import Amount, parse_quantity

__all__ = ["ANY_NODE", "ClusterInventory", "DeviceID", "Pool", "SliceDevice", "collector_paused", "quantity"]

# (driver, pool, device)
DeviceID = tuple[str, str, str]

ANY_NODE = "(any node)"  # the node of an inventory whose slices all say allNodes


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off for a pass over hundreds of thousands of devices.

    Such a pass allocates an object or more per device and creates no reference cycles, but each
    allocation counts towards the collector's next run, and with a large heap (a thousand nodes' parsed
    slices) its full runs cost more than the pass itself, and vary by seconds.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# --- quantities ----------------------------------------------------------------------------------

_QUANTITIES: dict[str, Amount] = {}


def quantity(text: object, *, field: str) -> Amount:
    """The exact value of a Quantity; ConfigError naming `field` when it is none. Cached: slices repeat
    the same few strings hundreds of thousands of times."""
    key = str(text)
    value = _QUANTITIES.get(key)
    if value is None:
        try:
            exact = parse_quantity(key)
        except ConfigError as err:
            raise ConfigError(err.reason, field=field) from None
        value = exact.numerator if exact.denominator == 1 else exact
        if len(_QUANTITIES) < 100_000:
            _QUANTITIES[key] = value
    return value


# --- devices and pools ---------------------------------------------------------------------------


class SliceDevice:
    """One device of a ResourceSlice; `attributes` and `capacity` are the slice's own maps."""

    __slots__ = (
        "_counters",
        "_raw",
        "allow_multiple_allocations",
        "attributes",
        "capacity",
        "driver",
        "id",
        "name",
        "node",
        "pool",
    )

    _NONE: Mapping[str, Any] = {}

    def __init__(self, raw: Mapping[str, Any], driver: str, pool: str, node: str | None) -> None:
        # Built for every device of every node: only what every selector check reads is copied out.
        self._raw = raw
        self.name: str = raw.get("name", "")
        self.driver = driver
        self.pool = pool
        self.node = node  # None: every node
        self.id: DeviceID = (driver, pool, self.name)
        self.attributes: Mapping[str, Mapping[str, Any]] = raw.get("attributes") or self._NONE
        self.capacity: Mapping[str, Mapping[str, Any]] = raw.get("capacity") or self._NONE
        self.allow_multiple_allocations = raw.get("allowMultipleAllocations") is True
        self._counters: dict[str, dict[str, Amount]] | None = None

    @property
    def consumes(self) -> Sequence[Mapping[str, Any]]:
        return self._raw.get("consumesCounters") or ()

    @property
    def taints(self) -> Sequence[Mapping[str, Any]]:
        return self._raw.get("taints") or ()

    def counters(self) -> dict[str, dict[str, Amount]]:
        """What the device consumes: counter set -> counter -> amount (parsed on first use)."""
        if self._counters is None:
            self._counters = {}
            for entry in self.consumes:
                into = self._counters.setdefault(str(entry.get("counterSet")), {})
                for name, counter in (entry.get("counters") or {}).items():
                    into[name] = into.get(name, 0) + quantity(
                        counter.get("value"), field=f"device {self.name}: consumesCounters {name}"
                    )
        return self._counters

    def capacity_value(self, name: str) -> Amount:
        return quantity(self.capacity[name].get("value"), field=f"device {self.name}: capacity {name}")

    def __repr__(self) -> str:
        return f"Device({'/'.join(self.id)})"


@dataclass
class Pool:
    """The slices of one pool at its newest generation."""

    driver: str
    name: str
    generation: int
    slice_count: int
    slices: list[Mapping[str, Any]] = field(default_factory=list)
    devices: list[SliceDevice] = field(default_factory=list)
    counter_sets: dict[str, dict[str, Amount]] = field(default_factory=dict)
    problem: str | None = None  # why the scheduler skips the pool: incomplete or invalid
    binding_conditions: bool = False  # a device waits for conditions before binding: tried last

    @property
    def key(self) -> tuple[str, str]:
        return (self.driver, self.name)


class ClusterInventory:
    """The ResourceSlices of a cluster, by pool, and which devices each node sees. The slice objects are
    read, not copied: they must not change while the ClusterInventory is in use.

    Slices with a `nodeSelector` (or per-device node selection) are not matched against nodes: offline
    there are no node labels. They are listed in `unsupported` and left out.
    """

    def __init__(self, slices: Iterable[Mapping[str, Any]], *, nodes: Iterable[str] = ()) -> None:
        self.pools: dict[tuple[str, str], Pool] = {}
        self.unsupported: list[str] = []
        named_nodes: set[str] = set(nodes)
        for slice_ in slices:
            self._add(slice_, named_nodes)
        self.nodes: list[str] = sorted(named_nodes)
        with collector_paused():
            for pool in self.pools.values():
                self._build(pool)
        self._for_node: dict[str | None, list[Pool]] = {}
        self._seen_by: dict[str, list[tuple[Pool, list[SliceDevice]]]] = {}
        self._flat: dict[str, list[tuple[Pool, SliceDevice]]] = {}
        for pool in sorted(self.pools.values(), key=lambda p: p.key):
            for node in {d.node for d in pool.devices}:
                self._for_node.setdefault(node, []).append(pool)
        if not self.nodes and None in self._for_node:
            self.nodes = [ANY_NODE]  # only slices for all nodes, and no node named: one stands for all

    def _add(self, slice_: Mapping[str, Any], nodes: set[str]) -> None:
        spec = slice_.get("spec") or {}
        name = str((slice_.get("metadata") or {}).get("name", ""))
        pool_spec = spec.get("pool") or {}
        driver, pool_name = str(spec.get("driver", "")), str(pool_spec.get("name", ""))
        generation = int(pool_spec.get("generation", 0))
        if spec.get("nodeSelector") is not None or spec.get("perDeviceNodeSelection"):
            self.unsupported.append(f"ResourceSlice {name}: node selectors are not evaluated; left out")
            return
        if spec.get("nodeName"):
            nodes.add(str(spec["nodeName"]))
        pool = self.pools.get((driver, pool_name))
        if pool is None or generation > pool.generation:
            pool = Pool(driver, pool_name, generation, int(pool_spec.get("resourceSliceCount", 1)))
            self.pools[(driver, pool_name)] = pool
        elif generation < pool.generation:
            return
        pool.slices.append(slice_)

    def _build(self, pool: Pool) -> None:
        pool.slices.sort(key=lambda s: str((s.get("metadata") or {}).get("name", "")))
        seen: set[str] = set()
        consumptions: list[Mapping[str, Any]] = []
        for slice_ in pool.slices:
            spec = slice_.get("spec") or {}
            node = str(spec["nodeName"]) if spec.get("nodeName") else None
            for counter_set in spec.get("sharedCounters") or ():
                set_name = str(counter_set.get("name"))
                if set_name in pool.counter_sets:
                    pool.problem = f"duplicate counter set name {set_name}"
                pool.counter_sets[set_name] = {
                    counter: quantity(value.get("value"), field=f"counter set {set_name}: {counter}")
                    for counter, value in (counter_set.get("counters") or {}).items()
                }
            for raw in spec.get("devices") or ():
                device = SliceDevice(raw, pool.driver, pool.name, node)
                if device.name in seen:
                    pool.problem = f"duplicate device name {device.name}"
                seen.add(device.name)
                pool.devices.append(device)
                consumptions.extend(raw.get("consumesCounters") or ())
                pool.binding_conditions = pool.binding_conditions or bool(raw.get("bindingConditions"))
        if len(pool.slices) != pool.slice_count:
            pool.problem = (
                f"incomplete: {len(pool.slices)} of {pool.slice_count} slices of generation {pool.generation}"
            )
            return
        # Every counter a device consumes must exist in the pool, else the scheduler skips the pool.
        for entry in consumptions:
            wanted = entry.get("counterSet")
            counters = pool.counter_sets.get(str(wanted))
            if counters is None:
                pool.problem = f"counter set {wanted} not found"
                return
            consumed = entry.get("counters") or {}
            if not counters.keys() >= consumed.keys():
                missing = min(set(consumed) - set(counters))
                pool.problem = f"counter {missing} not found in counter set {wanted}"
                return

    def pools_for(self, node: str) -> list[tuple[Pool, list[SliceDevice]]]:
        """The pools node `node` sees, in the scheduler's order (by driver and name, pools with devices
        that have binding conditions last), each with the devices it sees."""
        known = self._seen_by.get(node)
        if known is None:
            pools = {p.key: p for p in self._for_node.get(node, []) + self._for_node.get(None, [])}
            known = self._seen_by[node] = [
                (pool, [d for d in pool.devices if d.node in (node, None)])
                for pool in sorted(pools.values(), key=lambda p: (p.binding_conditions, p.key))
            ]
        return known

    def devices_for(self, node: str) -> list[tuple[Pool, SliceDevice]]:
        """Every device node `node` sees, with its pool, in the scheduler's order."""
        known = self._flat.get(node)
        if known is None:
            known = self._flat[node] = [(pool, d) for pool, devices in self.pools_for(node) for d in devices]
        return known
