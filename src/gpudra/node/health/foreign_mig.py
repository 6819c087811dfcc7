"""MIG instances made or destroyed outside gpudra, on the GPUs it publishes: noticed, reported once, and
kept out of what the scheduler is offered. I/O: NVML listings through the hardware it is given (never a
change: gpudra never destroys or adopts what it did not create), Node events, a metric.

A GPU instance is gpudra's when the checkpoint names it: every MIG device in it is a recorded one, or it
sits at the profile and placement a claim recorded before creating it (a prepare in progress). Any
other GPU instance is foreign:

- partitionable mode: the placements it overlaps cannot be created, and the whole GPU (and its shared
  device) cannot be handed out beside it. Those devices are left out of the slices (`withheld`) while
  it exists, so the scheduler offers none of them, where before a claim got one and failed at prepare;
- static mode: the MIG devices that existed at the plugin's start are the ones published. An instance
  made since is reported, and offered once the plugin restarts (its inventory is read at start); a
  published MIG device destroyed since is withheld unless a claim holds it (the health monitor then
  marks that claim's device Unhealthy).

Each check lists the GPU instances of every MIG-capable GPU, at `interval` and when an NVML MIG
configuration change event wakes it. An instance is acted on when two checks in a row found it
foreign, the second `CONFIRM_SECONDS` after the first: a prepare or unprepare between the listing and
the checkpoint read must not look foreign. Each foreign instance is said once while it exists (log,
`ForeignMigInstance` Warning Node event naming the GPU, the instance and the devices withheld), its
going too (`ForeignMigInstanceGone`), and `gpudra_mig_foreign_instances{gpu}` counts them. Only the
instance that publishes the node's slices runs it (gpudra.node.instances).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpudra.errors import GpudraError
from gpudra.model.devices import Device, gpu_uuid_of, partition_of
from gpudra.model.inventory import Gpu, GpuInstance
from gpudra.model.publishing import MigMode
from gpudra.node import checkpoint as ckpt
from gpudra.runtime.service import Loop

if TYPE_CHECKING:  # types only
    from gpudra.kube.events import EventPoster

log = logging.getLogger(__name__)

CONFIRM_SECONDS = 1.0


class MigListing(Protocol):
    """gpudra.gpu.nvml.Nvml."""

    def gpu_instances(self, *, gpu_uuid: str) -> tuple[GpuInstance, ...]: ...


class ForeignMetrics(Protocol):
    """gpudra.node.metrics.PluginMetrics."""

    def set_foreign_mig(self, gpu: str, count: int) -> None: ...


@dataclass(frozen=True)
class Foreign:
    """A GPU instance gpudra did not make, on a GPU it publishes."""

    gpu_uuid: str
    instance: GpuInstance

    @property
    def key(self) -> tuple[str, int, int, int]:
        return self.gpu_uuid, self.instance.id, self.instance.profile_id, self.instance.placement.start

    def named(self) -> str:
        i = self.instance
        without = "" if i.mig_devices else ", without a compute instance"
        return f"GPU instance {i.id} ({i.profile_name} at {i.placement.start}{without})"


# --- which instances, and which devices (pure) -------------------------------------------------------


def owned(claims: Mapping[str, ckpt.ClaimEntry]) -> tuple[set[str], set[tuple[str, int, int]]]:
    """The MIG UUIDs the checkpoint records, and the (GPU, profile, placement start) of every MIG
    device a claim records, created or about to be."""
    uuids, specs = set(), set()
    for entry in claims.values():
        for device in entry.devices:
            if device.mig is None:
                continue
            spec = device.mig.spec
            specs.add((spec.gpu_uuid, spec.profile_id, spec.placement_start))
            if device.mig.live is not None:
                uuids.add(device.mig.live.uuid)
    return uuids, specs


def foreign_instances(
    gpu_uuid: str,
    instances: Sequence[GpuInstance],
    *,
    mig_mode: MigMode,
    uuids: set[str],
    specs: set[tuple[str, int, int]],
    at_start: set[str],
) -> list[Foreign]:
    """The instances of `gpu_uuid` gpudra did not make: in static mode, those that hold a MIG device
    not published at start (`at_start`) or none; else those the checkpoint does not name."""
    found = []
    for instance in instances:
        held = set(instance.mig_devices)
        if mig_mode == "static":
            mine = bool(held) and held <= at_start
        else:
            recorded = (gpu_uuid, instance.profile_id, instance.placement.start) in specs
            mine = (bool(held) and held <= uuids) or recorded
        if not mine:
            found.append(Foreign(gpu_uuid, instance))
    return found


def withheld_devices(
    devices: Sequence[Device],
    foreign: Sequence[Foreign],
    *,
    mig_mode: MigMode,
    existing: Mapping[str, set[str]],
    held: set[str],
) -> dict[str, str]:
    """Published device -> why it is left out of the slices. Partitionable mode: the whole GPU, its
    shared device and the partitions whose placement a foreign instance overlaps. Static mode: a
    published MIG device gone from its GPU (`existing`: GPU -> MIG UUIDs, for the GPUs listed) that no
    claim holds (`held`)."""
    withheld: dict[str, str] = {}
    for device in devices:
        attributes, gpu = device["attributes"], gpu_uuid_of(device)
        if mig_mode == "static":
            uuid = attributes.get("uuid", {}).get("string") if "parentUUID" in attributes else None
            if uuid and gpu in existing and uuid not in existing[gpu] and device["name"] not in held:
                withheld[device["name"]] = f"MIG device {uuid} no longer exists"
            continue
        on_gpu = [f for f in foreign if f.gpu_uuid == gpu]
        if not on_gpu:
            continue
        if "parentUUID" not in attributes:  # the whole GPU, or its shared device
            withheld[device["name"]] = f"{on_gpu[0].named()} is on its GPU"
            continue
        # a partition, exclusive or shared (a shareable profile): only where the instance overlaps it
        slices = set(partition_of(device)[1].slices)
        for f in on_gpu:
            if slices & set(f.instance.placement.slices):
                withheld[device["name"]] = f"{f.named()} takes its placement"
                break
    return withheld


# --- the check ---------------------------------------------------------------------------------------


class ForeignMig:
    """The periodic check; a `service.Service`. `withheld()` is what the slices leave out."""

    def __init__(
        self,
        *,
        devices: Sequence[Device],
        gpus: Sequence[Gpu],
        hardware: MigListing,
        claims: Callable[[], Mapping[str, ckpt.ClaimEntry]],
        mig_mode: MigMode,
        interval: float,
        events: EventPoster,
        metrics: ForeignMetrics,
    ) -> None:
        self._devices = list(devices)
        self._gpus = [gpu for gpu in gpus if gpu.mig_profiles]
        self._names = {  # GPU UUID -> its whole-GPU device name, for people and the metric
            gpu.uuid: f"gpu-{gpu.minor}" for gpu in gpus
        }
        self._at_start = {d.uuid for gpu in gpus for d in gpu.mig_devices}
        self._hardware = hardware
        self._claims = claims
        self._mig_mode = mig_mode
        self._interval = interval
        self._events = events
        self._metrics = metrics
        self._lock = threading.Lock()
        self._withheld: dict[str, str] = {}
        self._seen: dict[tuple[str, int, int, int], Foreign] = {}  # foreign at the last check
        self._acted: dict[tuple[str, int, int, int], Foreign] = {}  # confirmed, and said
        self._subscribers: list[Callable[[], None]] = []
        self.loop = Loop("mig-foreign", self._step)

    def withheld(self) -> dict[str, str]:
        with self._lock:
            return dict(self._withheld)

    def subscribe(self, changed: Callable[[], None]) -> None:
        """`changed()` runs (it must not block) when the devices withheld change."""
        self._subscribers.append(changed)

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float) -> None:
        self.loop.stop(timeout)

    def _step(self) -> float:
        found: list[Foreign] = []
        existing: dict[str, set[str]] = {}
        listed = []
        for gpu in self._gpus:  # listed before the checkpoint is read: see the module docstring
            try:
                listed.append((gpu.uuid, self._hardware.gpu_instances(gpu_uuid=gpu.uuid)))
            except GpudraError as err:
                log.warning("cannot list MIG instances", extra={"gpu": gpu.uuid, "error": str(err)})
        claims = self._claims()
        uuids, specs = owned(claims)
        held = {d.device for entry in claims.values() for d in entry.devices}
        for gpu_uuid, instances in listed:
            existing[gpu_uuid] = {uuid for i in instances for uuid in i.mig_devices}
            found += foreign_instances(
                gpu_uuid,
                instances,
                mig_mode=self._mig_mode,
                uuids=uuids,
                specs=specs,
                at_start=self._at_start,
            )
        now = {f.key: f for f in found}
        confirmed = {key: f for key, f in now.items() if key in self._seen}
        unlisted = {gpu.uuid for gpu in self._gpus} - existing.keys()
        # A GPU that could not be listed keeps what was acted on there.
        confirmed |= {key: f for key, f in self._acted.items() if f.gpu_uuid in unlisted}
        self._seen = now
        withheld = withheld_devices(
            self._devices, list(confirmed.values()), mig_mode=self._mig_mode, existing=existing, held=held
        )
        self._report(confirmed, withheld)
        with self._lock:
            changed, self._withheld = withheld != self._withheld, withheld
        if changed:
            for subscriber in self._subscribers:
                subscriber()
        return CONFIRM_SECONDS if now.keys() - confirmed.keys() else self._interval

    def _report(self, confirmed: dict[tuple[str, int, int, int], Foreign], withheld: dict[str, str]) -> None:
        before, self._acted = self._acted, confirmed
        if self._mig_mode == "static":  # a published MIG device destroyed by hand
            for device in sorted(withheld.keys() - self.withheld().keys()):
                log.warning("a published MIG device is gone", extra={"device": device})
                self._events.post(
                    "Warning",
                    "ForeignMigInstance",
                    f"device {device}: {withheld[device]} (destroyed outside gpudra); it is not offered",
                )
        for key in sorted(confirmed.keys() - before.keys()):
            f = confirmed[key]
            name = self._names.get(f.gpu_uuid, f.gpu_uuid)
            left_out = sorted(d for d in withheld if _device_gpu(self._devices, d) == f.gpu_uuid)
            if self._mig_mode == "static":
                offered = (
                    "it is offered once the plugin restarts (the MIG devices it publishes are read at start)"
                )
            else:
                offered = (
                    f"the devices it excludes are not offered while it exists: {', '.join(left_out)}"
                    if left_out
                    else "it excludes no published device"
                )
            log.warning(
                "a MIG instance gpudra did not create",
                extra={"gpu": f.gpu_uuid, "gpu_instance": f.instance.id, "profile": f.instance.profile_name},
            )
            self._events.post(
                "Warning",
                "ForeignMigInstance",
                f"GPU {f.gpu_uuid} ({name}): {f.named()} was made outside gpudra; gpudra never destroys or "
                f"adopts it; {offered}",
            )
        for key in sorted(before.keys() - confirmed.keys()):
            f = before[key]
            log.info("a MIG instance gpudra did not create is gone", extra={"gpu": f.gpu_uuid})
            self._events.post(
                "Normal",
                "ForeignMigInstanceGone",
                f"GPU {f.gpu_uuid} ({self._names.get(f.gpu_uuid, f.gpu_uuid)}): {f.named()}, made outside "
                "gpudra, is gone",
            )
        for gpu in self._gpus:
            count = sum(1 for f in confirmed.values() if f.gpu_uuid == gpu.uuid)
            self._metrics.set_foreign_mig(self._names[gpu.uuid], count)


def _device_gpu(devices: Sequence[Device], name: str) -> str | None:
    return next((gpu_uuid_of(d) for d in devices if d["name"] == name), None)
