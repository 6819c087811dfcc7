"""The cluster's GPU picture, from what the API server holds: what `gpudra status` shows and the controller
exports as metrics. Pure.

Counted per physical GPU, whichever of its devices a claim took (the whole GPU `gpu-N`, a share of it
`gpu-N-shared`, or MIG partitions `gpu-N-mig-...`), grouped by node and product:

- `gpus`: GPUs published;
- `allocated`: GPUs that any claim holds a device of (admin-access results hold nothing, as for the
  scheduler);
- `shared`: allocated GPUs that more than one workload uses: held by several claims (shares of the
  GPU, MIG partitions of different claims) or by one claim that several pods reserve;
- `free`: GPUs no claim holds anything of;
- `idle`: allocated GPUs on which every claim's device has reported no activity for `idle_after`
  (the node plugin writes an `Idle` condition into the claim's `status.devices`: see
  `gpudra.model.claim_usage`).

Per MIG-capable GPU, the largest MIG partition the scheduler could still place: the unallocated
partition with the most memory whose counters (memory slices, engines) fit in what the allocated devices
left. A GPU held whole has none left.

Pending GPU claims: claims without an allocation with a request for one of this driver's DeviceClasses,
which are the classes whose selectors name the driver (gpudra's own say `device.driver == "<driver>"`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from gpudra.model import health_report
from gpudra.model.claim import Claim
from gpudra.model.claim_usage import idle_since
from gpudra.model.cluster_objects import DeviceClass
from gpudra.model.devices import UNHEALTHY_TAINT_KEY
from gpudra.model.health_report import ReportedDevice
from gpudra.model.kube_api import OUTPUT_API_VERSION
from gpudra.quantity import Amount
from gpudra.scheduling.allocator import counters_left, lookup_attribute
from gpudra.scheduling.claims import Allocations
from gpudra.scheduling.pools import ClusterInventory, Pool, SliceDevice


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class NodeProducts(_Model):
    """The GPUs of one product on one node."""

    node: str
    product: str
    gpus: int
    allocated: int
    shared: int
    free: int
    idle: int


class MigRoom(_Model):
    """What is left of a MIG-capable GPU: the largest partition still placeable, if any."""

    node: str
    gpu: str  # the whole-GPU device's name, e.g. gpu-3
    uuid: str
    product: str
    partitions_allocated: int
    largest_placeable: str | None  # a MIG profile, e.g. 3g.40gb
    largest_placeable_memory: int  # bytes; 0 when none


class PendingClaim(_Model):
    namespace: str
    name: str
    age_seconds: float
    device_classes: list[str]


class IdleDevice(_Model):
    """A device of an allocated claim that has reported no activity for at least `idle_after`."""

    namespace: str
    claim: str
    pods: list[str]
    node: str
    device: str
    idle_seconds: float


class UnhealthyDevice(_Model):
    """A GPU, or one MIG partition of it, that its node found unhealthy (docs/health.md): published with
    gpudra's unhealthy taint, which keeps claims that do not tolerate it off, or left out of the slices
    where the API server drops device taints, as the node's health report says
    (gpudra.model.health_report)."""

    node: str
    device: str  # the whole GPU's device name, or the partition's when only it is unhealthy
    uuid: str  # the GPU's
    product: str
    reason: str  # the taint's value: Xid79, DoubleBitEcc, RowRemapPending, NVMLError_GpuIsLost, ...
    effect: str  # NoSchedule or NoExecute
    # How the slices show it: tainted; left out (no device taints on this release); or untainted: the
    # node reported it tainted but the slice the server stored has no such taint (a claim can get it).
    slices: Literal["tainted", "left-out", "untainted"] = "tainted"
    message: str = ""  # the node's words: the fault, its class and what lifts it


class ClusterView(_Model):
    """The cluster's GPU picture: `gpudra status -o json` and the controller's /status. Its kind is
    ClusterStatus, not Status, which Kubernetes clients read as an API error (meta/v1 Status)."""

    api_version: str = OUTPUT_API_VERSION
    kind: Literal["ClusterStatus"] = "ClusterStatus"
    generated: datetime
    driver: str
    idle_after_seconds: float
    nodes: list[NodeProducts]
    mig: list[MigRoom]
    pending: list[PendingClaim]
    idle: list[IdleDevice]
    unhealthy: list[UnhealthyDevice] = []


@dataclass
class _Gpu:
    node: str
    uuid: str
    product: str
    name: str = ""  # the whole-GPU device, when published
    pool: Pool | None = None
    mig_capable: bool = False
    holders: frozenset[str] = frozenset()
    partitions_allocated: int = 0


def driver_classes(classes: Iterable[Mapping[str, Any]], *, driver: str) -> set[str]:
    """The DeviceClasses whose selectors name `driver`: the classes a GPU claim asks for."""
    quoted = {f'"{driver}"', f"'{driver}'"}
    found = set()
    for read in map(DeviceClass.from_raw, classes):
        text = " ".join(read.selectors)
        if any(q in text for q in quoted):
            found.add(read.name)
    return found


def build(
    *,
    driver: str,
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Claim],
    classes: Iterable[Mapping[str, Any]],
    now: datetime,
    idle_after_seconds: float,
) -> ClusterView:
    """The view of `driver`'s GPUs at `now`. Slices and classes as the API server serves them; claims read
    by `gpudra.model.claim.read_claim`."""
    claims = list(claims)
    inventory = ClusterInventory([s for s in slices if (s.get("spec") or {}).get("driver") == driver])
    allocations = Allocations.from_claims(claims)
    gpus = _gpus(inventory, allocations)
    pods = {c.namespaced_name: list(c.pods) for c in claims}
    idle = _idle_devices(claims, driver=driver, now=now, idle_after=idle_after_seconds, pods=pods)
    idle_by_gpu = idle_gpus(inventory, idle, claims, driver=driver)
    return ClusterView(
        generated=now,
        driver=driver,
        idle_after_seconds=idle_after_seconds,
        nodes=_node_products(gpus, pods, idle_by_gpu),
        mig=[_mig_room(gpu, inventory, allocations) for gpu in _sorted(gpus) if gpu.mig_capable],
        pending=_pending(claims, driver_classes(classes, driver=driver), now),
        idle=idle,
        unhealthy=_unhealthy(inventory),
    )


def health_reports(pool: Pool) -> tuple[dict[str, ReportedDevice], list[str]]:
    """Device -> its entry in the health report of `pool` (on its first slice at the newest generation;
    gpudra.model.health_report), and the lines that say why a report was refused."""
    found: dict[str, ReportedDevice] = {}
    problems: list[str] = []
    for slice_ in pool.slices:
        metadata = slice_.get("metadata") or {}
        text = (metadata.get("annotations") or {}).get(health_report.ANNOTATION)
        if not isinstance(text, str):
            continue
        report, problem = health_report.read(text, where=f"ResourceSlice {metadata.get('name', '')}")
        problems += [problem] if problem else []
        found.update((entry.device, entry) for entry in report.devices)
    return found, problems


def _unhealthy(inventory: ClusterInventory) -> list[UnhealthyDevice]:
    """The unhealthy GPUs (whole-GPU device tainted: its shared device and partitions follow it, listed
    once), and the unhealthy partitions of GPUs that are not: from the taints, with the words of the
    node's health report, and from the report alone for what it says the slices left out."""
    whole: dict[tuple[str, str], UnhealthyDevice] = {}
    parts: list[UnhealthyDevice] = []
    for pool in inventory.pools.values():
        reported, _ = health_reports(pool)
        published: set[str] = set()
        for device in pool.devices:
            published.add(device.name)
            taint = next((t for t in device.taints if t.get("key") == UNHEALTHY_TAINT_KEY), None)
            uuid, kind = gpu_uuid(device), attribute(device, "type")
            entry = reported.get(device.name)
            if not uuid or (taint is None and (entry is None or entry.slices != "tainted")):
                continue
            found = UnhealthyDevice(
                node=device.node or pool.name,
                device=device.name,
                uuid=uuid,
                product=str(attribute(device, "productName") or ""),
                reason=str(taint.get("value") or "") if taint else (entry.reason if entry else ""),
                effect=str(taint.get("effect") or "") if taint else (entry.effect if entry else ""),
                slices="tainted" if taint is not None else "untainted",
                message=entry.message if entry else "",
            )
            if kind == "gpu" and not device.allow_multiple_allocations:
                whole[(found.node, uuid)] = found
            elif kind == "mig":
                parts.append(found)
        for name, entry in reported.items():
            if name in published or entry.slices != "left-out":
                continue
            node = pool.name
            found = UnhealthyDevice(
                node=node,
                device=name,
                uuid=entry.uuid,
                product=entry.product,
                reason=entry.reason,
                effect=entry.effect,
                slices="left-out",
                message=entry.message,
            )
            if entry.kind == "gpu":
                whole.setdefault((node, entry.uuid), found)
            else:
                parts.append(found)
    listed = list(whole.values()) + [p for p in parts if (p.node, p.uuid) not in whole]
    return sorted(listed, key=lambda d: (d.node, d.device))


def _gpus(inventory: ClusterInventory, allocations: Allocations) -> dict[str, _Gpu]:
    """Physical GPUs by UUID, with the claims holding any of their devices."""
    gpus: dict[str, _Gpu] = {}
    for pool in inventory.pools.values():
        for device in pool.devices:
            kind, uuid = attribute(device, "type"), gpu_uuid(device)
            if not uuid:
                continue
            gpu = gpus.setdefault(
                uuid, _Gpu(device.node or pool.name, uuid, attribute(device, "productName"))
            )
            if kind == "gpu" and not device.allow_multiple_allocations:
                gpu.name, gpu.pool = device.name, pool
                gpu.mig_capable = gpu.mig_capable or attribute(device, "migCapable") is True
            if kind == "mig":
                gpu.mig_capable, gpu.pool = True, gpu.pool or pool
                # With MIG on and partitions made up front (static), no whole-GPU device names it.
                gpu.name = gpu.name or f"gpu-{attribute(device, 'parentMinor')}"
            holders = allocations.holders(device.id)
            if holders:
                gpu.holders |= frozenset(holders)
                gpu.partitions_allocated += kind == "mig"
    return gpus


def _node_products(
    gpus: Mapping[str, _Gpu], pods: Mapping[str, list[str]], idle_gpus: set[str]
) -> list[NodeProducts]:
    rows: dict[tuple[str, str], dict[str, int]] = {}
    for gpu in gpus.values():
        row = rows.setdefault(
            (gpu.node, gpu.product), {"gpus": 0, "allocated": 0, "shared": 0, "free": 0, "idle": 0}
        )
        row["gpus"] += 1
        if not gpu.holders:
            row["free"] += 1
            continue
        row["allocated"] += 1
        users = len(gpu.holders) if len(gpu.holders) > 1 else len(pods.get(next(iter(gpu.holders)), []))
        row["shared"] += users > 1
        row["idle"] += gpu.uuid in idle_gpus
    return [NodeProducts(node=n, product=p, **counts) for (n, p), counts in sorted(rows.items())]


def _mig_room(gpu: _Gpu, inventory: ClusterInventory, allocations: Allocations) -> MigRoom:
    best: tuple[Amount, str] | None = None
    if gpu.pool is not None:
        left = counters_left(gpu.pool, allocations)
        for device in gpu.pool.devices:
            if attribute(device, "type") != "mig" or attribute(device, "parentUUID") != gpu.uuid:
                continue
            if allocations.is_allocated(device.id) or not _fits(device, left):
                continue
            memory = device.capacity_value("memory") if "memory" in device.capacity else 0
            profile = str(attribute(device, "profile") or device.name)
            if best is None or (memory, profile) > best:
                best = (memory, profile)
    return MigRoom(
        node=gpu.node,
        gpu=gpu.name,
        uuid=gpu.uuid,
        product=gpu.product,
        partitions_allocated=gpu.partitions_allocated,
        largest_placeable=best[1] if best else None,
        largest_placeable_memory=int(best[0]) if best else 0,
    )


def _fits(device: SliceDevice, left: Mapping[str, Mapping[str, Amount]]) -> bool:
    return all(
        left.get(set_name, {}).get(name, 0) >= amount
        for set_name, counters in device.counters().items()
        for name, amount in counters.items()
    )


def _pending(claims: Iterable[Claim], classes: set[str], now: datetime) -> list[PendingClaim]:
    pending = []
    for claim in claims:
        if claim.allocation is not None:
            continue
        wanted = sorted(claim.spec.device_classes & classes)
        if wanted:
            created = claim.created
            pending.append(
                PendingClaim(
                    namespace=claim.namespace,
                    name=claim.name,
                    age_seconds=max(0.0, (now - created).total_seconds()) if created else 0.0,
                    device_classes=wanted,
                )
            )
    return sorted(pending, key=lambda p: (p.namespace, p.name))


def _idle_devices(
    claims: Iterable[Claim],
    *,
    driver: str,
    now: datetime,
    idle_after: float,
    pods: Mapping[str, list[str]],
) -> list[IdleDevice]:
    idle = []
    for claim in claims:
        if claim.allocation is None:
            continue
        for (pool, device), since in idle_since(claim, driver=driver).items():
            seconds = (now - since).total_seconds()
            if seconds >= idle_after:
                idle.append(
                    IdleDevice(
                        namespace=claim.namespace,
                        claim=claim.name,
                        pods=pods.get(claim.namespaced_name, []),
                        node=pool,
                        device=device,
                        idle_seconds=seconds,
                    )
                )
    return sorted(idle, key=lambda d: (d.namespace, d.claim, d.node, d.device))


def idle_gpus(
    inventory: ClusterInventory, idle: list[IdleDevice], claims: Iterable[Claim], *, driver: str
) -> set[str]:
    """GPUs whose every allocated device, in every claim holding one, is reported idle long enough."""
    idle_keys = {(f"{d.namespace}/{d.claim}", d.node, d.device) for d in idle}
    by_id = {device.id: device for pool in inventory.pools.values() for device in pool.devices}
    verdict: dict[str, bool] = {}
    for claim in claims:
        if claim.allocation is None:
            continue
        for result in claim.allocation.results_of(driver):
            if result.admin_access:
                continue
            device = by_id.get((driver, result.pool, result.device))
            uuid = gpu_uuid(device) if device is not None else None
            if uuid:
                key = (claim.namespaced_name, result.pool, result.device)
                verdict[uuid] = verdict.get(uuid, True) and key in idle_keys
    return {uuid for uuid, all_idle in verdict.items() if all_idle}


def _sorted(gpus: Mapping[str, _Gpu]) -> list[_Gpu]:
    return sorted(gpus.values(), key=lambda g: (g.node, gpu_minor(g.name), g.uuid))


def gpu_minor(name: str) -> int:
    """The minor in a whole-GPU device's name (gpu-3: 3), -1 when there is none: GPUs sort by it."""
    digits = name.removeprefix("gpu-")
    return int(digits) if digits.isdigit() else -1


def attribute(device: SliceDevice, name: str) -> Any:
    found = lookup_attribute(device, name)
    return found[1] if found else None


def gpu_uuid(device: SliceDevice) -> str | None:
    """The physical GPU a device is (or is a partition of)."""
    kind = attribute(device, "type")
    value = attribute(device, "uuid" if kind == "gpu" else "parentUUID" if kind == "mig" else "")
    return str(value) if value else None
