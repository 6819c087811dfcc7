"""The GPU map's model: nodes x GPUs, each GPU with its MIG placement slots and the claims holding them,
its shares and their sizes, idle and unhealthy GPUs marked, and the pending GPU claims with `gpudra
explain`'s one-line reason. Pure: the controller and `gpudra status --web` serve it
(gpudra.controller.gpu_map_page).

Built in two steps, so that a server can keep the first while nothing changes:

- `survey` walks the slices and claims once: every GPU of every node, with what holds it. Counts (idle
  GPUs, pending claims) come from `gpudra.scheduling.cluster_view`, so the page and `gpudra status`
  never disagree.
- `draw` filters the survey by node, product and namespace and cuts one page of nodes, with the
  pending claims of that namespace (all of them without one).
- `reason` is explain's one-line verdict for one pending claim (`gpudra.scheduling.explain`), asked by
  the page for each pending claim it shows, one at a time: an explanation walks every node's devices
  (seconds at a thousand nodes with every MIG placement published), so it is never part of drawing a
  page, and each is kept in the survey.

Everything here comes from the API server, and claim names and namespaces are a tenant's: the model
keeps them as plain strings and the page sets them as text, never as markup.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from gpudra.errors import GpudraError
from gpudra.model.claim import Claim
from gpudra.model.devices import UNHEALTHY_TAINT_KEY
from gpudra.quantity import Amount
from gpudra.scheduling import cluster_view
from gpudra.scheduling.claims import Allocations
from gpudra.scheduling.cluster_view import ClusterView, UnhealthyDevice, attribute, gpu_minor, gpu_uuid
from gpudra.scheduling.explain import ClaimToExplain, device_classes, explain
from gpudra.scheduling.pools import ClusterInventory, Pool, SliceDevice, quantity

# Nodes on one page unless the query says otherwise, and the most it may ask: a page of 200 DGX nodes
# is about 1,600 GPUs, as much as a browser lays out without stalling.
PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
# A query value is a node name, a product or a namespace: no legitimate one is longer.
MAX_QUERY_VALUE = 253
# Pending claims a page lists (the oldest first); filtering by namespace shows the others.
MAX_PENDING = 200


class _MapModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class Partition(_MapModel):
    """An allocated MIG partition: its placement (memory slices start..start+size-1) and its holders."""

    device: str
    profile: str
    start: int
    size: int
    claims: list[str]  # "namespace/name"


class Share(_MapModel):
    """One claim's share of a GPU's shared device, with what it consumes (0: not asked)."""

    claim: str
    memory: int  # bytes
    compute: int  # percent of the SMs


GpuState = Literal["free", "whole", "mig", "shared"]


class GpuCard(_MapModel):
    name: str  # the whole-GPU device, e.g. gpu-3
    uuid: str
    product: str
    memory: int  # bytes
    state: GpuState  # what holds it: nothing, one claim whole, MIG partitions, shares
    holders: list[str]  # the claims holding it whole
    mig_slots: int  # memory slices of a MIG-capable GPU; 0 when it has none
    partitions: list[Partition]
    largest_placeable: str | None  # the largest MIG profile still placeable (cluster_view)
    shares: list[Share]
    idle: bool  # allocated, and every device of it idle for idle_after (cluster_view)
    # the taint that keeps the scheduler off it, "key=value:effect", or that it is left out of the slices,
    # with the node's words for the fault
    unhealthy: str | None


class NodeMap(_MapModel):
    name: str
    gpus: list[GpuCard]


class PendingReason(_MapModel):
    namespace: str
    name: str
    age_seconds: float
    device_classes: list[str]
    reason: str  # explain's verdict once `reason` was asked for it in this survey, else empty


class GpuMap(_MapModel):
    generated: datetime  # when the survey drawn was built
    age_seconds: float  # how old that survey was when this page was drawn
    rebuilding: bool  # a newer survey is being built (the next refresh shows it)
    driver: str
    idle_after_seconds: float
    nodes_total: int
    nodes_matched: int
    page: int
    pages: int
    page_size: int
    nodes: list[NodeMap]
    pending: list[PendingReason]  # the MAX_PENDING oldest
    pending_total: int
    products: list[str]  # every product in the cluster, for the filter's choices
    namespaces: list[str]  # every namespace with a GPU claim
    query: dict[str, str]  # the filters in effect
    notes: list[str]  # what the map could not read (a list the caller may not read)


@dataclass(frozen=True)
class MapQuery:
    """The page's filters: node (a part of the name), product (exact), namespace (exact: nodes with a
    GPU held by a claim there, and that namespace's pending claims), and which page of nodes."""

    node: str = ""
    product: str = ""
    namespace: str = ""
    page: int = 1
    size: int = PAGE_SIZE

    @staticmethod
    def parse(params: Mapping[str, Iterable[str]]) -> MapQuery:
        """From a URL's query parameters (as urllib.parse.parse_qs gives them). GpudraError naming the
        parameter and its allowed values on a bad one."""
        known = {"node", "product", "namespace", "page", "size"}
        for name in params:
            if name not in known:
                raise QueryError(f"unknown query parameter {name!r}; allowed: {', '.join(sorted(known))}")
        values = {name: _one(params, name) for name in known}
        return MapQuery(
            node=values["node"],
            product=values["product"],
            namespace=values["namespace"],
            page=_number(values["page"], "page", default=1, low=1, high=1_000_000),
            size=_number(values["size"], "size", default=PAGE_SIZE, low=1, high=MAX_PAGE_SIZE),
        )

    def as_dict(self) -> dict[str, str]:
        found = {"node": self.node, "product": self.product, "namespace": self.namespace}
        return {k: v for k, v in found.items() if v}


class QueryError(GpudraError):
    """A query parameter the page cannot take (HTTP 400)."""


def _one(params: Mapping[str, Iterable[str]], name: str) -> str:
    values = list(params.get(name, ()))
    if len(values) > 1:
        raise QueryError(f"query parameter {name} given {len(values)} times; give it once")
    value = values[0] if values else ""
    if len(value) > MAX_QUERY_VALUE:
        raise QueryError(f"query parameter {name} is {len(value)} characters; at most {MAX_QUERY_VALUE}")
    return value


def _number(text: str, name: str, *, default: int, low: int, high: int) -> int:
    if not text:
        return default
    if not re.fullmatch(r"[0-9]{1,7}", text) or not low <= int(text) <= high:
        raise QueryError(f"query parameter {name} must be a whole number from {low} to {high}")
    return int(text)


@dataclass
class Survey:
    """Every node's GPUs and the pending claims, built once per change of the cluster; `draw` cuts pages
    of it. `reasons` caches explain's verdicts for this survey's claims."""

    view: ClusterView
    nodes: list[NodeMap]
    namespaces_of_node: dict[str, frozenset[str]]
    inventory: ClusterInventory
    classes: dict[str, list[str]]
    claims: list[Claim]
    notes: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)


def survey(
    *,
    driver: str,
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Claim],
    classes: Iterable[Mapping[str, Any]],
    now: datetime,
    idle_after_seconds: float,
    notes: Iterable[str] = (),
) -> Survey:
    """Every GPU of `driver` in the cluster with what holds it. Slices and classes as the API server
    serves them; claims read by `gpudra.model.claim.read_claim`. `notes`: what could not be read, shown
    on the page."""
    slices = [s for s in slices if (s.get("spec") or {}).get("driver") == driver]
    claims, classes = list(claims), list(classes)
    view = cluster_view.build(
        driver=driver,
        slices=slices,
        claims=claims,
        classes=classes,
        now=now,
        idle_after_seconds=idle_after_seconds,
    )
    inventory = ClusterInventory(slices)
    allocations = Allocations.from_claims(claims)
    idle = cluster_view.idle_gpus(inventory, view.idle, claims, driver=driver)
    room = {(m.node, m.uuid): m.largest_placeable for m in view.mig}
    shares = _shares(claims, driver)
    gpus: dict[tuple[str, str], _MapGpu] = {}
    for pool in inventory.pools.values():
        for device in pool.devices:
            uuid = gpu_uuid(device)
            if uuid is None:
                continue
            node = device.node or pool.name
            gpu = gpus.setdefault((node, uuid), _MapGpu(node=node, uuid=uuid))
            gpu.add(device, pool, allocations, shares)
    for bad in view.unhealthy:  # the words of the node's health report, and what the slices left out
        gpu = gpus.setdefault(
            (bad.node, bad.uuid),
            _MapGpu(node=bad.node, uuid=bad.uuid, name=bad.device.split("-mig-")[0], product=bad.product),
        )
        gpu.report(bad)
    nodes: dict[str, list[GpuCard]] = {}
    namespaces: dict[str, set[str]] = {}
    for gpu in sorted(gpus.values(), key=lambda g: (g.node, gpu_minor(g.name), g.uuid)):
        nodes.setdefault(gpu.node, []).append(gpu.card(idle=gpu.uuid in idle, room=room))
        namespaces.setdefault(gpu.node, set()).update(c.split("/", 1)[0] for c in gpu.claims())
    return Survey(
        view=view,
        nodes=[NodeMap(name=name, gpus=cards) for name, cards in sorted(nodes.items())],
        namespaces_of_node={node: frozenset(found) for node, found in namespaces.items()},
        inventory=inventory,
        classes=device_classes({**c, "kind": "DeviceClass"} for c in classes),
        claims=claims,
        notes=list(notes),
    )


def draw(
    found: Survey,
    query: MapQuery,
    *,
    age_seconds: float = 0.0,
    rebuilding: bool = False,
    notes: Iterable[str] = (),
) -> GpuMap:
    """One page of the map: the nodes that pass the query's filters, and the pending claims of its
    namespace (all of them without one), with the reasons already found. `age_seconds`, `rebuilding`:
    how old the survey is and whether a newer one is on its way (the server's cache); `notes`: the
    server's, after the survey's own."""
    nodes = [
        node
        for node in found.nodes
        if query.node in node.name
        and (not query.product or any(g.product == query.product for g in node.gpus))
        and (not query.namespace or query.namespace in found.namespaces_of_node.get(node.name, ()))
    ]
    if query.product:
        nodes = [
            n.model_copy(update={"gpus": [g for g in n.gpus if g.product == query.product]}) for n in nodes
        ]
    pages = max(1, -(-len(nodes) // query.size))
    page = min(query.page, pages)
    pending = [p for p in found.view.pending if not query.namespace or p.namespace == query.namespace]
    oldest = sorted(pending, key=lambda p: -p.age_seconds)[:MAX_PENDING]
    return GpuMap(
        generated=found.view.generated,
        age_seconds=round(age_seconds, 3),
        rebuilding=rebuilding,
        driver=found.view.driver,
        idle_after_seconds=found.view.idle_after_seconds,
        nodes_total=len(found.nodes),
        nodes_matched=len(nodes),
        page=page,
        pages=pages,
        page_size=query.size,
        nodes=nodes[(page - 1) * query.size : page * query.size],
        pending=[
            PendingReason(
                namespace=p.namespace,
                name=p.name,
                age_seconds=p.age_seconds,
                device_classes=p.device_classes,
                reason=found.reasons.get(f"{p.namespace}/{p.name}", ""),
            )
            for p in oldest
        ],
        pending_total=len(pending),
        products=sorted({g.product for n in found.nodes for g in n.gpus}),
        namespaces=sorted(
            {ns for names in found.namespaces_of_node.values() for ns in names}
            | {p.namespace for p in found.view.pending}
        ),
        query=query.as_dict(),
        notes=[*found.notes, *notes],
    )


def reason(found: Survey, name: str) -> str:
    """Explain's one-line verdict for the pending claim `name` ("namespace/name"), kept in the survey;
    QueryError when no such claim is pending."""
    verdict = found.reasons.get(name)
    if verdict is None:
        if not any(f"{p.namespace}/{p.name}" == name for p in found.view.pending):
            raise QueryError(f"no pending GPU claim {name!r}: give one the map lists, as namespace/name")
        claim = next(c for c in found.claims if c.namespaced_name == name)
        try:
            answer = explain(
                [ClaimToExplain(name, claim.spec)],
                classes=found.classes,
                inventory=found.inventory,
                allocated=found.claims,
                driver=found.view.driver,
            )
            verdict = answer.verdict
        except GpudraError as err:  # a malformed spec: the scheduler refuses it too
            verdict = f"cannot be scheduled: {err}"
        found.reasons[name] = verdict
    return verdict


# --- one GPU ---------------------------------------------------------------------------------------

# device id -> (claim, the capacity its share consumes)
_Shares = dict[tuple[str, str, str], list[tuple[str, Mapping[str, str]]]]


def _shares(claims: Iterable[Claim], driver: str) -> _Shares:
    found: _Shares = {}
    for claim in claims:
        if claim.allocation is None:
            continue
        for result in claim.allocation.results_of(driver):
            if result.share_id is not None and not result.admin_access:
                key = (driver, result.pool, result.device)
                found.setdefault(key, []).append((claim.namespaced_name, result.consumed_capacity))
    return found


@dataclass
class _MapGpu:
    node: str
    uuid: str
    name: str = ""
    product: str = ""
    memory: int = 0
    mig_slots: int = 0
    largest_partition: int = 0  # bytes: the memory of its largest MIG partition
    holders: list[str] = field(default_factory=list)
    partitions: list[Partition] = field(default_factory=list)
    shares: list[Share] = field(default_factory=list)
    unhealthy: str | None = None
    reports: list[str] = field(default_factory=list)  # the cluster view's unhealthy devices of it

    def add(self, device: SliceDevice, pool: Pool, allocations: Allocations, shares: _Shares) -> None:
        kind = attribute(device, "type")
        self.product = self.product or str(attribute(device, "productName") or "")
        holders = allocations.holders(device.id)
        if kind == "gpu" and not device.allow_multiple_allocations:
            self.name = device.name
            self.memory = int(_capacity(device, "memory"))
            self.holders = holders
            self.unhealthy = self.unhealthy or _taint(device)
        elif kind == "gpu":
            for claim, consumed in shares.get(device.id, []):
                self.shares.append(
                    Share(
                        claim=claim,
                        memory=int(_amount(consumed.get("memory", "0"))),
                        compute=int(_amount(consumed.get("compute", "0"))),
                    )
                )
        elif kind == "mig":
            self.name = self.name or f"gpu-{attribute(device, 'parentMinor')}"
            # Without a whole-GPU device (MIG on, no reset possible), its counter set may hold its memory;
            # where it counts memory slices instead, the largest partition's memory stands for it.
            self.memory = self.memory or max(
                (int(pool.counter_sets.get(name, {}).get("memory", 0)) for name in device.counters()),
                default=0,
            )
            self.largest_partition = max(self.largest_partition, int(_capacity(device, "memory")))
            start, size = (
                int(attribute(device, "placementStart") or 0),
                int(attribute(device, "placementSize") or 0),
            )
            self.mig_slots = max(self.mig_slots, start + size)
            if holders:
                self.partitions.append(
                    Partition(
                        device=device.name,
                        profile=str(attribute(device, "profile") or ""),
                        start=start,
                        size=size,
                        claims=holders,
                    )
                )

    def report(self, bad: UnhealthyDevice) -> None:
        """Mark it with what the cluster view says of one unhealthy device of it (several: joined)."""
        if bad.slices == "left-out":
            shown = f"left out of the slices (no device taints on this release): {bad.reason}"
        else:
            shown = f"{UNHEALTHY_TAINT_KEY}={bad.reason}:{bad.effect}"
        if bad.device != self.name:
            shown = f"{bad.device}: {shown}"
        shown += f"; {bad.message}" if bad.message else ""
        self.reports.append(shown)
        self.unhealthy = " | ".join(self.reports)

    def claims(self) -> set[str]:
        return {
            *self.holders,
            *(c for p in self.partitions for c in p.claims),
            *(s.claim for s in self.shares),
        }

    def card(self, *, idle: bool, room: Mapping[tuple[str, str], str | None]) -> GpuCard:
        state: GpuState = (
            "whole" if self.holders else "mig" if self.partitions else "shared" if self.shares else "free"
        )
        return GpuCard(
            name=self.name,
            uuid=self.uuid,
            product=self.product,
            memory=self.memory or self.largest_partition,
            state=state,
            holders=self.holders,
            mig_slots=self.mig_slots,
            partitions=sorted(self.partitions, key=lambda p: p.start),
            largest_placeable=room.get((self.node, self.uuid)),
            shares=self.shares,
            idle=idle,
            unhealthy=self.unhealthy,
        )


def _taint(device: SliceDevice) -> str | None:
    for taint in device.taints:
        effect = str(taint.get("effect", ""))
        if effect in ("NoSchedule", "NoExecute"):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"{taint.get('key', '')}{value}:{effect}"
    return None


def _capacity(device: SliceDevice, name: str) -> Amount:
    try:
        return device.capacity_value(name) if name in device.capacity else 0
    except GpudraError:
        return 0


def _amount(text: str) -> Amount:
    try:
        return quantity(text, field="consumedCapacity")
    except GpudraError:
        return 0
