"""Whether each prepared claim's devices are in use: samples NVML, reports idleness on the claim and in
the metrics. I/O: NVML (through the session it is given) and the API server (through
gpudra.kube.claim_status), from its own thread.

Every interval, each device of each prepared claim is sampled: a whole GPU's utilization and memory
used, a MIG device's memory used and compute processes (NVML reports no utilization for MIG devices).
Activity is a utilization above 0 or, where NVML reports none, a compute process. A GPU shared by
several claims (time-slicing, MPS) gives each of them the whole GPU's figures: NVML counts utilization
and memory per GPU, and telling the claims apart would take per-process accounting, which gpudra does
not turn on.

The device's Idle condition (the format is `gpudra.model.claim_usage`) goes into the claim's
`status.devices`, written only when it changes, the first sample included; the start of an idle
streak is the condition's lastTransitionTime. When the sampler first sees a claim it reads it once: for
the pods that reserve it (a metric label) and for the conditions this node wrote before, so that a
restarted plugin keeps an idle streak's start and does not write again what the claim already says
(activity while the plugin was down is not seen).

Not reported: claims not completely prepared; claims rebuilt from their CDI spec after a damaged
checkpoint (their name is unknown until the kubelet prepares them again); devices prepared with admin
access (they watch a device that another claim holds). Claims are forgotten once unprepared. Nothing
runs while no claim is prepared, so an idle node makes no API requests for this.

Failures: a device NVML cannot measure is Unknown (NotMeasurable), not a failure. A failed claim
read or status write fails the step: the loop logs and counts it and tries again with its backoff; an
unwritten change stays pending until a write succeeds. A claim that is gone, or another claim under
the same name now (404, or 409 on the UID precondition), is written no more; the kubelet unprepares it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from gpudra.errors import ClusterError, GpudraError
from gpudra.gpu.nvml import DeviceUsage
from gpudra.kube.client import Conflict, NotFound
from gpudra.model import claim_usage
from gpudra.model.claim import Claim
from gpudra.model.claim_usage import DeviceKey, Idleness
from gpudra.model.devices import Device
from gpudra.node import checkpoint as ckpt
from gpudra.node.metrics import ClaimDeviceUsage
from gpudra.runtime.service import Loop

log = logging.getLogger(__name__)


class UsageProbe(Protocol):
    """An open NVML session: gpudra.gpu.nvml.Nvml."""

    def device_usage(self, *, uuid: str) -> DeviceUsage: ...


class ClaimApi(Protocol):
    """Claim reads and a node's status writes: gpudra.kube.claim_status.ClaimStatus."""

    def get(self, namespace: str, name: str) -> Claim: ...

    def apply_node_devices(
        self, *, node_name: str, namespace: str, name: str, uid: str, devices: Sequence[dict[str, Any]]
    ) -> None: ...


@dataclass
class _Device:
    name: str
    uuid: str | None  # what NVML is asked about; None when gpudra does not know it
    mig: bool
    idleness: Idleness | None = None  # None until sampled
    usage: DeviceUsage | None = None  # the latest sample; None when it failed


@dataclass
class _Claim:
    namespace: str
    name: str
    uid: str
    pods: tuple[str, ...]
    devices: dict[DeviceKey, _Device]
    written: dict[DeviceKey, Idleness] = field(default_factory=dict)  # what the claim says now
    stale: bool = False  # gone, or another claim under its name now: written no more


class ClaimUsage:
    """Samples the prepared claims' devices every `interval` seconds; a `service.Service`."""

    def __init__(
        self,
        *,
        driver: str,
        node_name: str,
        claims: Callable[[], Mapping[str, ckpt.ClaimEntry]],
        devices: Mapping[str, Device],
        probe: UsageProbe,
        api: ClaimApi,
        interval: float,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.driver = driver
        self.node_name = node_name
        self._prepared = claims
        self._devices = devices
        self._probe = probe
        self._api = api
        self._interval = interval
        self._clock = clock
        self._claims: dict[str, _Claim] = {}  # by UID; changed by the loop's thread only
        self._lock = threading.Lock()  # _claims' membership, against `readings` from a scrape
        self.loop = Loop("claim-usage", self.step)

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float) -> None:
        self.loop.stop(timeout)

    def step(self) -> float:
        """One round: sample every reported device, write the claims whose conditions changed."""
        prepared = {
            uid: entry
            for uid, entry in self._prepared().items()
            if entry.state == "PrepareCompleted" and entry.name and _keys(entry)
        }
        with self._lock:
            for uid, claim in list(self._claims.items()):
                entry = prepared.get(uid)
                if entry is None or _keys(entry) != claim.devices.keys():
                    del self._claims[uid]  # unprepared (or unprepared and prepared again elsewhere)
        problems = []
        for uid, entry in prepared.items():
            if uid not in self._claims:
                try:
                    seen = self._first_sight(entry)
                except GpudraError as err:
                    problems.append(str(err))
                    continue
                with self._lock:
                    self._claims[uid] = seen
            claim = self._claims[uid]
            self._sample(claim)
            if not claim.stale and any(claim.written.get(k) != d.idleness for k, d in claim.devices.items()):
                try:
                    self._write(claim)
                except (NotFound, Conflict) as err:
                    claim.stale = True
                    log.warning(
                        "claim gone or replaced; its usage is no longer written",
                        extra={"claim": f"{claim.namespace}/{claim.name}", "error": str(err)},
                    )
                except GpudraError as err:
                    problems.append(str(err))
        if problems:
            raise ClusterError("; ".join(problems))
        return self._interval

    def readings(self) -> list[ClaimDeviceUsage]:
        """The latest sample of every reported device (for the metrics); one row per claim and device."""
        now = self._clock()
        with self._lock:
            claims = list(self._claims.values())
        rows: dict[tuple[str, str, str], ClaimDeviceUsage] = {}
        for claim in claims:
            for device in claim.devices.values():
                idleness, usage = device.idleness, device.usage
                if idleness is None:
                    continue
                idle = {
                    "True": max(0.0, (now - idleness.since).total_seconds()),
                    "False": 0.0,
                    "Unknown": None,
                }[idleness.status]
                # Shares of one device within a claim read the same device: one row for them.
                rows.setdefault(
                    (claim.namespace, claim.name, device.name),
                    ClaimDeviceUsage(
                        namespace=claim.namespace,
                        claim=claim.name,
                        pods=claim.pods,
                        device=device.name,
                        gpu_uuid=device.uuid or "",
                        utilization=usage.utilization if usage else None,
                        memory_used=usage.memory_used if usage else None,
                        idle_seconds=idle,
                    ),
                )
        return list(rows.values())

    def _first_sight(self, entry: ckpt.ClaimEntry) -> _Claim:
        """The claim to track for `entry`, with its reserving pods and the conditions it carries."""
        devices = {_key(d): self._device(d) for d in entry.devices if not d.admin_access}
        claim = _Claim(entry.namespace, entry.name, entry.uid, (), devices)
        try:
            found = self._api.get(entry.namespace, entry.name)
        except NotFound:
            claim.stale = True
            return claim
        if found.uid != entry.uid:
            claim.stale = True
            return claim
        claim.pods = found.pods
        claim.written = {
            k: idleness
            for k, idleness in claim_usage.device_idleness(found, driver=self.driver).items()
            if k in devices
        }
        for key, device in devices.items():
            device.idleness = claim.written.get(key)
        return claim

    def _device(self, prepared: ckpt.PreparedDevice) -> _Device:
        published = self._devices.get(prepared.device)
        attributes: Mapping[str, Any] = published["attributes"] if published else {}
        mig = prepared.mig is not None or attributes.get("type", {}).get("string") == "mig"
        if prepared.mig is not None and prepared.mig.live is not None:
            uuid = prepared.mig.live.uuid
        else:
            uuid = attributes.get("uuid", {}).get("string")
        return _Device(prepared.device, uuid, mig)

    def _sample(self, claim: _Claim) -> None:
        now = self._clock()
        for device in claim.devices.values():
            try:
                if device.uuid is None:
                    raise GpudraError(f"gpudra does not know the UUID of device {device.name}")
                usage = self._probe.device_usage(uuid=device.uuid)
            except GpudraError as err:
                device.usage = None
                observed = claim_usage.not_measurable(now, str(err))
            else:
                device.usage = usage
                busy = usage.utilization > 0 if usage.utilization is not None else bool(usage.processes)
                observed = (claim_usage.active if busy else claim_usage.no_activity)(now, mig=device.mig)
            # An unchanged status keeps its condition: its lastTransitionTime is the streak's start.
            if device.idleness is None or device.idleness.status != observed.status:
                device.idleness = observed

    def _write(self, claim: _Claim) -> None:
        current = {k: d.idleness for k, d in claim.devices.items() if d.idleness is not None}
        self._api.apply_node_devices(
            node_name=self.node_name,
            namespace=claim.namespace,
            name=claim.name,
            uid=claim.uid,
            devices=[
                claim_usage.device_entry(driver=self.driver, key=k, idleness=i) for k, i in current.items()
            ],
        )
        claim.written = current
        log.info(
            "claim device status written",
            extra={
                "claim": f"{claim.namespace}/{claim.name}",
                "idle": {d.name: d.idleness.status for d in claim.devices.values() if d.idleness},
            },
        )


def _key(device: ckpt.PreparedDevice) -> DeviceKey:
    return (device.pool, device.device, device.share_id)


def _keys(entry: ckpt.ClaimEntry) -> set[DeviceKey]:
    return {_key(d) for d in entry.devices if not d.admin_access}
