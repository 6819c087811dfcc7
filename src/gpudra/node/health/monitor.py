"""Device health for the kubelet: polls each published device's GPU and hands the result to subscribers.
I/O: NVML, through the session opener it is given, from its own thread.

Whole GPUs and MIG partitions take their GPU's health: a partition fails with its GPU. A partition a
claim prepared is also Unhealthy once its MIG device is gone (destroyed by hand, or by a GPU reset)
while its GPU is fine: the pod using it has lost its GPU. Every poll probes each GPU once
(`Nvml.gpu_health`, plus a listing of its MIG devices where a prepared partition lives on it) and
yields a complete snapshot of every device, changed or not,
because the kubelet turns a device Unknown when its health is not refreshed within the timeout sent
along. A GPU that cannot be probed (no NVML, an unexpected error) is Unknown, with the error as message.
The monitor keeps its own NVML session in its own thread, so a slow or hanging GPU never holds up
prepare; subscribers wait on a condition for the next snapshot.

With `faults` (gpudra.node.health.gpu_faults: XIDs and ECC errors from NVML events), a device whose GPU or
partition carries a fault mark is Unhealthy too, with the fault as message; each poll tells the faults
which GPUs answered (a reset observed lifts a mark) and the uncorrected ECC counts of the GPUs that
report no ECC events, and a new fault wakes the poll, so that it reaches the kubelet and the slices
at once.

The scheduler learns of it too: `taints` is what the slice controller publishes (the unhealthy taint
on each device of a lost GPU and on each marked device, gpudra.model.gpu_health.device_taints), with
`messages`, the words of each fault, for the health report the cluster view reads
(gpudra.model.health_report); `on_change` fires whenever either changes, so the slices are republished
at once rather than at the next resync.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpudra.errors import GpudraError
from gpudra.model.devices import SHARED_SUFFIX, Device, DeviceTaint, gpu_uuid_of
from gpudra.model.gpu_health import GpuConditions, Mark, device_taints, lifted_when, needs
from gpudra.model.inventory import MigDevice
from gpudra.node.health.gpu_faults import GpuFaults
from gpudra.runtime.service import Loop

log = logging.getLogger(__name__)

# The kubelet's own timeout when a driver sends none (KEP-4680); ours is never shorter.
KUBELET_DEFAULT_TIMEOUT_SECONDS = 30
# A probe of a failing GPU can hang inside NVML; shutdown leaves the (daemon) thread behind after this.
_STOP_WAIT_SECONDS = 5.0


class Health(enum.StrEnum):
    """The kubelet's ResourceHealthStatus values."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class GpuHealth:
    health: Health
    message: str  # why it is not healthy; empty when it is
    reason: str = ""  # an unhealthy GPU's NVML error class: the value of its devices' taint


@dataclass(frozen=True)
class DeviceHealth:
    pool: str
    device: str
    health: Health
    message: str


@dataclass(frozen=True)
class Snapshot:
    """One poll's result: every published device, in publishing order."""

    generation: int  # polls so far, from 1
    checked_at: float  # Unix seconds when the poll finished
    devices: tuple[DeviceHealth, ...]


class GpuProbe(Protocol):
    """An open NVML session: gpudra.gpu.nvml.Nvml."""

    def gpu_health(self, *, gpu_uuid: str) -> tuple[bool, str]: ...

    def mig_devices(self, *, gpu_uuid: str) -> tuple[MigDevice, ...]: ...

    def uncorrected_ecc_errors(self, *, gpu_uuid: str) -> int | None: ...

    def gpu_conditions(self, *, gpu_uuid: str) -> GpuConditions: ...

    def close(self) -> None: ...


# --- pure helpers ---------------------------------------------------------------------------------


def device_gpus(devices: Iterable[Device]) -> dict[str, str]:
    """Device name -> UUID of the GPU that the device is, or is a MIG partition of."""
    return {device["name"]: gpu_uuid_of(device) for device in devices}


def gpu_health(*, gpu_uuid: str, healthy: bool, reason: str) -> GpuHealth:
    """A probe's answer as the kubelet is told it."""
    if healthy:
        return GpuHealth(Health.HEALTHY, "")
    return GpuHealth(Health.UNHEALTHY, f"GPU {gpu_uuid}: {reason}", reason)


def tainted_gpus(previous: Mapping[str, str], gpus: Mapping[str, GpuHealth]) -> dict[str, str]:
    """GPU UUID -> reason for each GPU whose devices get the unhealthy taint, after a poll found `gpus`.

    Unhealthy taints, Healthy lifts the taint, and Unknown changes nothing. Unknown means the probe
    itself failed (no NVML, no permission, a timeout), which says nothing about the GPU: tainting on it
    would make every GPU of a node unschedulable over one driver hiccup, and lifting on it would free a
    GPU known to be lost. (An informational taint with effect None was left out: a 1.34 API server
    refuses that effect, and the pod's allocatedResourcesStatus already shows Unknown.)
    """
    return {
        uuid: now.reason if now.health == Health.UNHEALTHY else previous[uuid]
        for uuid, now in gpus.items()
        if now.health == Health.UNHEALTHY or (now.health == Health.UNKNOWN and uuid in previous)
    }


def devices_health(
    *,
    pool: str,
    device_gpus: Mapping[str, str],
    gpus: Mapping[str, GpuHealth],
    vanished: Mapping[str, str] | None = None,
    marks: Iterable[Mark] = (),
) -> tuple[DeviceHealth, ...]:
    """Every device with its GPU's health. On a healthy GPU, a device with a fault mark (its GPU's, else
    its own) is Unhealthy with the fault as message, and so is a partition in `vanished` (device ->
    why)."""
    vanished = vanished or {}
    by_key = {mark.key: mark for mark in marks}

    def health(name: str, uuid: str) -> DeviceHealth:
        if gpus[uuid].health == Health.HEALTHY:
            mark = by_key.get((uuid, None)) or by_key.get((uuid, name))
            if mark is not None:
                return DeviceHealth(
                    pool=pool, device=name, health=Health.UNHEALTHY, message=fault_message(mark)
                )
            if name in vanished:
                return DeviceHealth(pool=pool, device=name, health=Health.UNHEALTHY, message=vanished[name])
        return DeviceHealth(pool=pool, device=name, health=gpus[uuid].health, message=gpus[uuid].message)

    return tuple(health(name, uuid) for name, uuid in device_gpus.items())


def fault_message(mark: Mark) -> str:
    """ "GPU GPU-…: XID 79 (GPU has fallen off the bus); needs a node reboot"."""
    return f"{mark.target}: {mark.what}; {needs(mark.xid_class)}"


def report_words(
    *,
    device_gpus: Mapping[str, str],
    taints: Mapping[str, DeviceTaint],
    gpus: Mapping[str, GpuHealth],
    marks: Iterable[Mark] = (),
    clean_seconds: float = 0.0,
    previous: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Device -> what the health report (gpudra.model.health_report) says of each tainted device: its
    fault mark's (its GPU's, else its own), with the class and what lifts it; else its GPU's NVML error,
    as `previous` said it while the GPU cannot be probed (a failed probe says nothing of the GPU, and
    keeps its taint: `tainted_gpus`).
    "GPU GPU-…: XID 119 (GSP RPC timeout), class reset; lifted when a GPU reset is observed, ..."."""
    previous = previous or {}
    by_key = {mark.key: mark for mark in marks}
    words: dict[str, str] = {}
    for name in taints:
        uuid = device_gpus.get(name)
        if uuid is None:
            continue
        now = gpus.get(uuid, GpuHealth(Health.HEALTHY, ""))
        mark = (
            by_key.get((uuid, None))
            or by_key.get((uuid, name))
            or by_key.get((uuid, name.removesuffix(SHARED_SUFFIX)))
        )
        if mark is None:
            kept = previous.get(name) if now.health == Health.UNKNOWN else None
            words[name] = kept or now.message or f"GPU {uuid}: {taints[name].get('value', '')}"
            continue
        lifted = lifted_when(mark.xid_class, gpu_uuid=uuid, clean_seconds=clean_seconds)
        text = f"{mark.target}: {mark.what}, class {mark.xid_class}; lifted when {lifted}"
        words[name] = text + (f"; NVML: {now.reason}" if now.health == Health.UNHEALTHY else "")
    return words


def vanished_partitions(
    partitions: Mapping[str, str], device_gpus: Mapping[str, str], existing: Mapping[str, frozenset[str]]
) -> dict[str, str]:
    """Prepared partition -> why it is unhealthy, for each whose MIG device (`partitions`: device -> MIG
    UUID) is missing from its GPU's `existing` MIG UUIDs (GPUs that could not be listed are absent)."""
    return {
        name: f"MIG device {mig_uuid} of GPU {device_gpus[name]} no longer exists"
        for name, mig_uuid in partitions.items()
        if device_gpus.get(name) in existing and mig_uuid not in existing[device_gpus[name]]
    }


def kubelet_timeout_seconds(interval: float) -> int:
    """How long the kubelet should trust a report: three polls, never less than its own default."""
    return max(KUBELET_DEFAULT_TIMEOUT_SECONDS, math.ceil(3 * interval))


# --- the polling thread ---------------------------------------------------------------------------


class HealthMonitor:
    """Polls every `interval` seconds from its own thread; `wait` gives subscribers each new snapshot.

    `on_change()` is called from the polling thread after a poll changed `unhealthy_gpus()`; it must
    not block (the daemon passes the slice controller's `trigger`).
    """

    def __init__(
        self,
        *,
        pool: str,
        devices: Sequence[Device],
        open_nvml: Callable[[], GpuProbe],
        interval: float,
        on_change: Callable[[], None] = lambda: None,
        partitions: Callable[[], Mapping[str, str]] = dict,
        faults: GpuFaults | None = None,
        interrupted: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        self.pool = pool
        self.interval = interval
        self.timeout_seconds = kubelet_timeout_seconds(interval)
        self._device_gpus = device_gpus(devices)
        self._gpus = tuple(dict.fromkeys(self._device_gpus.values()))
        self._open_nvml = open_nvml
        self._changed = threading.Condition()
        self._snapshot: Snapshot | None = None
        self._last: dict[str, GpuHealth] = {}
        self._tainted: dict[str, str] = {}
        self._taints: dict[str, DeviceTaint] = {}
        self._messages: dict[str, str] = {}
        self._on_change = on_change
        self._partitions = partitions  # prepared partition -> its MIG UUID, read at every poll
        # device -> why, for a device of one claim whose MPS daemon ended under its clients and was
        # started again (gpudra.node.mps_keeper): Unhealthy until the claim is unprepared.
        self._interrupted = interrupted
        self._vanished_before: dict[str, str] = {}
        self._session: GpuProbe | None = None
        self.loop = Loop("health", self._poll)
        self._faults = faults
        self.loops = (self.loop, *(faults.loops if faults is not None else ()))
        if faults is not None:
            faults.subscribe(self.loop.wake)

    def start(self) -> None:
        self.loop.start()
        if self._faults is not None:
            self._faults.start()

    def stop(self, timeout: float = _STOP_WAIT_SECONDS) -> None:
        if self._faults is not None:
            self._faults.stop(timeout)
        self.loop.stop(timeout)
        if not self.loop.alive and self._session is not None:  # else a hung probe still holds it
            _close(self._session)
            self._session = None

    def wait(self, *, after: int, timeout: float) -> Snapshot | None:
        """The newest snapshot once one newer than generation `after` exists; None after `timeout` s."""
        with self._changed:
            self._changed.wait_for(lambda: self._newer_than(after), timeout)
            return self._snapshot if self._newer_than(after) else None

    def unhealthy_gpus(self) -> dict[str, str]:
        """GPU UUID -> reason for each GPU the probe found unhealthy (see `tainted_gpus`)."""
        with self._changed:
            return dict(self._tainted)

    def taints(self) -> dict[str, DeviceTaint]:
        """Device name -> the taint to publish it with: its GPU lost, or a fault mark on it or its GPU."""
        with self._changed:
            return dict(self._taints)

    def messages(self) -> dict[str, str]:
        """Device name -> the words of its fault, for each device in `taints()` (`report_words`)."""
        with self._changed:
            return dict(self._messages)

    def _newer_than(self, generation: int) -> bool:
        return self._snapshot is not None and self._snapshot.generation > generation

    def _poll(self) -> float:
        self._session, gpus = self._probe_all(self._session)
        vanished = self._vanished(self._session, gpus) if self._session is not None else {}
        if self._faults is not None and not self._faults.writing:
            self._faults.follow()  # another instance on the node reads and records (gpu_faults)
        elif self._faults is not None:
            reachable = {
                uuid: now.health == Health.HEALTHY
                for uuid, now in gpus.items()
                if now.health != Health.UNKNOWN
            }
            counts = self._ecc_counts(self._session, self._faults.ecc_polled(), reachable)
            self._faults.observe_probe(reachable, counts, self._conditions(self._session, reachable))
        self._publish(gpus, vanished)
        return self.interval

    def _ecc_counts(
        self, session: GpuProbe | None, polled: Iterable[str], reachable: Mapping[str, bool]
    ) -> dict[str, int]:
        """The uncorrected ECC counts of the GPUs no ECC event covers (those that answered)."""
        counts: dict[str, int] = {}
        for gpu_uuid in polled:
            if session is None or not reachable.get(gpu_uuid):
                continue
            try:
                count = session.uncorrected_ecc_errors(gpu_uuid=gpu_uuid)
            except Exception as err:
                _log_failure("reading ECC errors for health checks failed", err, gpu=gpu_uuid)
                continue
            if count is not None:
                counts[gpu_uuid] = count
        return counts

    def _conditions(
        self, session: GpuProbe | None, reachable: Mapping[str, bool]
    ) -> dict[str, GpuConditions]:
        """The memory-repair and NVLink conditions of the GPUs that answered."""
        found: dict[str, GpuConditions] = {}
        for gpu_uuid, answered in reachable.items():
            if session is None or not answered:
                continue
            try:
                found[gpu_uuid] = session.gpu_conditions(gpu_uuid=gpu_uuid)
            except Exception as err:
                _log_failure("reading GPU conditions for health checks failed", err, gpu=gpu_uuid)
        return found

    def _vanished(self, session: GpuProbe, gpus: Mapping[str, GpuHealth]) -> dict[str, str]:
        partitions = {n: u for n, u in self._partitions().items() if n in self._device_gpus}
        existing: dict[str, frozenset[str]] = {}
        for gpu_uuid in {self._device_gpus[name] for name in partitions}:
            if gpus[gpu_uuid].health != Health.HEALTHY:
                continue  # the GPU's own state already says it all
            try:
                existing[gpu_uuid] = frozenset(d.uuid for d in session.mig_devices(gpu_uuid=gpu_uuid))
            except Exception as err:
                _log_failure("listing MIG devices for health checks failed", err, gpu=gpu_uuid)
        return vanished_partitions(partitions, self._device_gpus, existing)

    def _probe_all(self, session: GpuProbe | None) -> tuple[GpuProbe | None, dict[str, GpuHealth]]:
        if session is None:
            try:
                session = self._open_nvml()
            except Exception as err:
                _log_failure("cannot open NVML for health checks", err)
                return None, dict.fromkeys(self._gpus, GpuHealth(Health.UNKNOWN, f"NVML unavailable: {err}"))
        return session, {uuid: _probe(session, uuid) for uuid in self._gpus}

    def _publish(self, gpus: dict[str, GpuHealth], vanished: Mapping[str, str]) -> None:
        for uuid, now in gpus.items():
            if now != self._last.get(uuid, GpuHealth(Health.HEALTHY, "")):
                if now.health == Health.HEALTHY:
                    log.info("GPU healthy", extra={"gpu": uuid})
                else:
                    log.warning(f"GPU {now.health.lower()}", extra={"gpu": uuid, "error": now.message})
        self._last = gpus
        for name, why in vanished.items():
            if name not in self._vanished_before:
                log.warning("prepared MIG partition lost", extra={"device": name, "error": why})
        self._vanished_before = dict(vanished)
        marks = self._faults.marks() if self._faults is not None else ()
        devices = devices_health(
            pool=self.pool,
            device_gpus=self._device_gpus,
            gpus=gpus,
            vanished={**self._interrupted(), **vanished},
            marks=marks,
        )
        tainted = tainted_gpus(self._tainted, gpus)
        taints = device_taints(
            device_gpus=self._device_gpus,
            lost=tainted,
            marks=marks,
            reset_effect=self._faults.reset_effect if self._faults is not None else "NoSchedule",
        )
        messages = report_words(
            device_gpus=self._device_gpus,
            taints=taints,
            gpus=gpus,
            marks=marks,
            clean_seconds=self._faults.clean_seconds if self._faults is not None else 0.0,
            previous=self._messages,
        )
        with self._changed:
            changed = taints != self._taints or messages != self._messages
            self._tainted, self._taints, self._messages = tainted, taints, messages
            generation = self._snapshot.generation + 1 if self._snapshot else 1
            self._snapshot = Snapshot(generation=generation, checked_at=time.time(), devices=devices)
            self._changed.notify_all()
        if changed:
            self._on_change()


def _probe(session: GpuProbe, gpu_uuid: str) -> GpuHealth:
    try:
        healthy, reason = session.gpu_health(gpu_uuid=gpu_uuid)
    except Exception as err:
        _log_failure("GPU health probe failed", err, gpu=gpu_uuid)
        return GpuHealth(Health.UNKNOWN, f"GPU {gpu_uuid} could not be probed: {err}")
    return gpu_health(gpu_uuid=gpu_uuid, healthy=healthy, reason=reason)


def _log_failure(message: str, err: Exception, **context: str) -> None:
    """A gpudra error is the hardware's answer; anything else is a bug and gets its traceback."""
    if isinstance(err, GpudraError):
        log.warning(message, extra={**context, "error": str(err)})
    else:
        log.exception(f"{message} unexpectedly", extra=context)


def _close(session: GpuProbe) -> None:
    try:
        session.close()
    except GpudraError as err:
        log.warning("closing NVML after health checks failed", extra={"error": str(err)})
