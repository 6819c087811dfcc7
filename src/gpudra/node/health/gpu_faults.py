"""GPU faults from NVML events: XIDs and double-bit ECC errors become marks that taint devices until a
rule lifts them. I/O: NVML (its own session, from its own thread), the health file in the state
directory, the Node's annotation (through the reader it is given).

The rules (which XID does what, and what lifts a mark) are gpudra.model.gpu_health's; this module
feeds them:
- the `gpu-events` loop waits on an NVML event set (`Nvml.watch_events`, at most `WAIT_SECONDS` per
  step, so that stop is prompt) and records each fault: a tainting one is logged, posted as a
  `GpuFault` Warning event on the Node naming the GPU (or partition), the XID and the claims holding
  it, and the health monitor is woken to republish; every XID is counted
  (`gpudra_gpu_xid_errors_total{gpu,xid}`). Single-bit ECC and MIG configuration change events are
  counted only (`gpudra_gpu_events_total{gpu,type}`); a MIG configuration change also tells those
  who `subscribe_mig_change` (gpudra.node.health.foreign_mig checks for instances made outside gpudra). A
  fault naming a GPU instance marks that partition: the published device at the instance's profile
  and placement;
- GPUs that offer no XID or double-bit ECC events (NOT_SUPPORTED: some VMs and vGPU guests) are said
  once in the log and as a `GpuEventsUnsupported` Node event; the health monitor's poll still finds a
  lost GPU on them, and reads their uncorrected ECC count (`observe_probe`) so that a double-bit
  error is found there too, a poll later;
- the health monitor's poll hands over which GPUs answered (`observe_probe`), which lifts reset marks
  of GPUs seen unreachable and back (not reboot marks: those wait for a new boot ID), and expires
  recoverable marks and those of an earlier boot;
- the poll also hands over each answering GPU's conditions (`GpuConditions`: memory repairs waiting
  for a reset, a failed row remapping, NVLinks down): a condition that appears is recorded as a fault
  of its own reason, one that is read gone lifts the mark it made (`gpu_health.observe_cleared`), and
  `gpudra_gpu_condition{gpu,condition}` shows each. The links up at the first reading of a boot are
  the ones expected up (a board may leave links unused);
- the `health-clear` loop reads the Node's `gpudra.io/clear-health` annotation every
  `ANNOTATION_SECONDS` while a mark exists (no request otherwise; a new fault wakes it).

Marks are kept in `health.json` in the state directory, written on every change, so a plugin restart
(or upgrade) never lifts a taint: only the rules do. A repeat of a mark (the same GPU or partition and
class: an XID storm) changes only when it was last seen, which is written at most every
LAST_SEEN_SAVE_SECONDS; its `GpuFault` Events are one Event per GPU (or partition) and class whose
count grows (gpudra.kube.events), and every XID is still counted in the metrics. A damaged file is
logged and ignored.

One writer per node. During a rolling update (gpudra.node.instances) two plugin pods run on the node,
both offered the same NVML events: both would post each fault's Node event and count it, and both
would write `health.json` from their own memory (the old pod's write undoing a lift or a mark the new
one made, and two writers of one file removing each other's temporary file). So an instance made with
`writing=False` only follows the file (reads it again when it changes, at most every
`FOLLOW_SECONDS` and at each poll: its kubelet health stream shows the same marks) until its `turn`
service is started, which the plugin runs in its publisher turn: the instance that publishes the
slices (and their taints) is the one that watches events, posts, counts and writes. Starting the turn
reads the file once more, as the previous writer left it; stopping it waits for a fault being
recorded, and records nothing after, before the turn passes on. An event is posted at most once: a
writer killed between saving a fault and posting it loses the event, never the mark. XIDs raised
between the old writer's exit and the new one's first wait (about half a second) are not seen, as
across a plugin restart.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpudra.atomic_file import write_atomically
from gpudra.errors import GpudraError
from gpudra.model import gpu_health
from gpudra.model.devices import SHARED_ATTRIBUTE, UNHEALTHY_TAINT_KEY, Device, gpu_uuid_of, partition_of
from gpudra.model.gpu_health import Classification, Fault, GpuConditions, Lifted, Mark, Marks, XidClass
from gpudra.model.inventory import MigDevice
from gpudra.node import faults as crash
from gpudra.runtime.service import Loop

if TYPE_CHECKING:  # types only
    from gpudra.kube.events import EventPoster

log = logging.getLogger(__name__)

DOUBLE_BIT_ECC_EVENT = "double_bit_ecc"  # gpudra.gpu.nvml.DOUBLE_BIT_ECC: the kind of event that is a fault
MIG_CONFIG_CHANGE_EVENT = "mig_config_change"  # gpudra.gpu.nvml.MIG_CONFIG_CHANGE
WAIT_SECONDS = 1.0  # one wait on the event set: how long a stop may wait for the loop
ANNOTATION_SECONDS = 10.0
RETRY_SECONDS = 60.0  # GPUs whose registration failed (lost at the time) are tried again this often
IDLE_SECONDS = 3600.0
FOLLOW_SECONDS = 0.5  # how often an instance that does not write reads the health file again
FILE_VERSION = 1
# A mark's repeats (its last_seen, its annotation baseline) reach health.json at most this often; any
# other change at once.
LAST_SEEN_SAVE_SECONDS = 10.0


class FaultEventWatch(Protocol):
    """gpudra.gpu.nvml.EventWatch."""

    xid_events: frozenset[str]
    ecc_events: frozenset[str]
    failed: dict[str, str]

    def wait(self, timeout: float) -> Any: ...  # gpudra.gpu.nvml.GpuEvent | None

    def close(self) -> None: ...


class EventSession(Protocol):
    """An open NVML session: gpudra.gpu.nvml.Nvml."""

    def watch_events(self, gpu_uuids: Iterable[str]) -> FaultEventWatch: ...

    def mig_devices(self, *, gpu_uuid: str) -> tuple[MigDevice, ...]: ...

    def close(self) -> None: ...


class FaultMetrics(Protocol):
    """gpudra.node.metrics.PluginMetrics."""

    def count_xid(self, gpu: str, xid: int) -> None: ...

    def count_double_bit_ecc(self, gpu: str) -> None: ...

    def set_events_monitored(self, gpu: str, monitored: bool) -> None: ...

    def set_condition(self, gpu: str, condition: str, present: bool) -> None: ...

    def count_event(self, gpu: str, kind: str) -> None: ...

    def set_clock_slowdowns(self, gpu: str, reasons: frozenset[str]) -> None: ...


class GpuFaults:
    """The node's fault marks, fed by NVML events, the health monitor's probes and the Node annotation."""

    def __init__(
        self,
        *,
        devices: Sequence[Device],
        open_nvml: Callable[[], EventSession],
        classification: Classification,
        clean_seconds: float,
        reset_effect: str,
        state_file: Path,
        boot_id: str,
        events: EventPoster,
        metrics: FaultMetrics,
        holders: Callable[[str, str | None], list[str]] = lambda gpu, device: [],
        read_annotation: Callable[[], str] | None = None,
        taints_kept: Callable[[], bool] = lambda: True,
        annotation_interval: float = ANNOTATION_SECONDS,
        clock: Callable[[], float] = time.time,
        writing: bool = True,
    ) -> None:
        self.classification = classification
        self.clean_seconds = clean_seconds
        self.reset_effect = reset_effect
        self._taints_kept = taints_kept  # whether the API server keeps device taints (the served model)
        self._device_gpus = {d["name"]: gpu_uuid_of(d) for d in devices}
        self._gpus = tuple(dict.fromkeys(self._device_gpus.values()))
        self._names = {  # GPU UUID -> its whole-GPU device's name, for metrics and messages
            gpu_uuid_of(d): d["name"]
            for d in devices
            if "parentUUID" not in d["attributes"] and SHARED_ATTRIBUTE not in d["attributes"]
        }
        # A placement's exclusive form names it; the mark taints its shared form too (device_taints).
        self._partitions = {
            (gpu_uuid_of(d), *partition_of(d)): d["name"]
            for d in devices
            if "parentUUID" in d["attributes"] and SHARED_ATTRIBUTE not in d["attributes"]
        }
        self._open_nvml = open_nvml
        self._file = state_file
        self._boot_id = boot_id
        self._events = events
        self._metrics = metrics
        self._holders = holders
        self._read_annotation = read_annotation
        self._annotation_interval = annotation_interval
        self._clock = clock
        self._mig_watchers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        # Held while a fault or a rule is applied (re-entrant: a condition found by a poll is recorded
        # inside it); the turn takes it to change `writing`, so no write starts or runs after a stop.
        self._writer = threading.RLock()
        self._writing = writing
        self._read_stat: tuple[int, int, int] | None = None
        self._saved_at = float("-inf")  # when health.json was last written (the clock's time)
        self._marks, self._ecc_counts, self._conditions, self._links = self._load()
        self._subscribers: list[Callable[[], None]] = []
        self._session: EventSession | None = None
        self._watch: FaultEventWatch | None = None
        self._opened_at = 0.0
        self._ecc_watched: frozenset[str] = frozenset()
        self._told_unsupported = False
        self.loop = Loop("gpu-events", self._step, on_error=lambda err: self._close_watch())
        self.clear_loop = Loop("health-clear", self._read_clearance)
        self.loops = (self.loop,) + ((self.clear_loop,) if read_annotation is not None else ())
        self.turn = _WriterTurn(self)

    # --- what others read ----------------------------------------------------------------------

    def marks(self) -> tuple[Mark, ...]:
        with self._lock:
            return tuple(self._marks.values())

    @property
    def writing(self) -> bool:
        """Whether this instance watches events and writes (else it follows the file)."""
        return self._writing

    def ecc_polled(self) -> tuple[str, ...]:
        """GPUs whose double-bit ECC errors no event reports once the watch is open: the poll reads
        their counts."""
        with self._lock:
            opened = self._watch is not None
            return tuple(g for g in self._gpus if opened and g not in self._ecc_watched)

    def subscribe(self, changed: Callable[[], None]) -> None:
        """`changed()` runs (it must not block) after a fault or a rule changed the marks."""
        self._subscribers.append(changed)

    def subscribe_mig_change(self, changed: Callable[[], None]) -> None:
        """`changed()` runs (it must not block) after an NVML MIG configuration change event."""
        self._mig_watchers.append(changed)

    # --- service -------------------------------------------------------------------------------

    def start(self) -> None:
        for loop in self.loops:
            loop.start()

    def stop(self, timeout: float) -> None:
        for loop in self.loops:
            loop.stop(timeout)
        if not self.loop.alive:  # else a hung wait still holds the session
            self._close_watch()

    # --- inputs --------------------------------------------------------------------------------

    def record(self, fault: Fault) -> None:
        """One fault: counted, and marked unless it is an application error; nothing while this
        instance does not write (the writer records it)."""
        with self._writer:
            if self._writing:
                self._record(fault)

    def _record(self, fault: Fault) -> None:
        gpu = self._names.get(fault.gpu_uuid, fault.gpu_uuid)
        if fault.xid is not None:
            self._metrics.count_xid(gpu, fault.xid)
        elif fault.condition is None:
            self._metrics.count_double_bit_ecc(gpu)
        target = gpu_health.target(fault.gpu_uuid, fault.device)
        if fault.xid_class == XidClass.IGNORE:
            log.info("application error on a GPU", extra={"gpu": fault.gpu_uuid, "xid": fault.xid})
            return
        with self._lock:
            before = self._marks
            self._marks = gpu_health.record(before, fault, now=self._clock(), boot_id=self._boot_id)
            news = not gpu_health.same_in_substance(before, self._marks)
            saved = self._save_change(news=news)
        if saved:
            crash.reached("health-saved")
        held = self._holders(fault.gpu_uuid, fault.device)
        effect = gpu_health.taint_effect(fault.xid_class, self.reset_effect)
        until = gpu_health.lifted_when(
            fault.xid_class, gpu_uuid=fault.gpu_uuid, clean_seconds=self.clean_seconds
        )
        published = (
            f"tainted {UNHEALTHY_TAINT_KEY}={fault.reason}:{effect}"
            if self._taints_kept()
            else "left out of the slices (no device taints on this release)"
        )
        # A repeat (an XID storm) is counted in the metrics and the Event's count, not logged each time.
        (log.warning if news else log.debug)(
            "GPU fault",
            extra={
                "gpu": fault.gpu_uuid,
                "device": fault.device,
                "fault": fault.reason,
                "class": fault.xid_class,
            },
        )
        self._events.post(
            "Warning",
            "GpuFault",
            f"{target} ({gpu}): {fault.what}, class {fault.xid_class}; {published} until {until}; "
            + (f"held by claim {', '.join(held)}" if held else "no claim holds it"),
            series=f"{target}/{fault.xid_class}",  # one Event per GPU (or partition) and class, counting
        )
        if news:
            self._changed()
            self.clear_loop.wake()

    def observe_probe(
        self,
        reachable: Mapping[str, bool],
        ecc_counts: Mapping[str, int],
        conditions: Mapping[str, GpuConditions] | None = None,
    ) -> None:
        """After a health poll: which GPUs answered (absent: could not be probed), the uncorrected
        ECC counts of the GPUs in `ecc_polled()` that report one (a count above the last one read is a
        double-bit error no event reported), and the conditions read on the GPUs that answered. Then
        marks of an earlier boot, quiet recoverable ones and those of conditions gone are lifted. An
        instance that does not write reads the file again instead."""
        with self._writer:
            if not self._writing:
                self.follow()
                return
            self._observe_probe(reachable, ecc_counts, conditions or {})

    def _observe_probe(
        self,
        reachable: Mapping[str, bool],
        ecc_counts: Mapping[str, int],
        conditions: Mapping[str, GpuConditions],
    ) -> None:
        cleared = self._observe_conditions(conditions)
        for gpu, count in ecc_counts.items():
            with self._lock:
                before = self._ecc_counts.get(gpu)
                self._ecc_counts[gpu] = count
                if before != count:
                    self._save()
            if before is not None and count > before:
                self._record(gpu_health.double_bit_ecc(gpu_uuid=gpu, device=None))
        now = self._clock()

        def rule(marks: Marks) -> tuple[Marks, list[Lifted]]:
            kept, gone = gpu_health.observe_cleared(marks, cleared)
            kept, reset = gpu_health.observe_reachable(kept, reachable)
            kept, expired = gpu_health.expire(
                kept, now=now, boot_id=self._boot_id, clean_seconds=self.clean_seconds
            )
            return kept, gone + reset + expired

        self._apply(rule)

    def _observe_conditions(self, conditions: Mapping[str, GpuConditions]) -> dict[str, set[str]]:
        """Records each condition that appeared as a fault; the conditions read gone, per GPU."""
        cleared: dict[str, set[str]] = {}
        for gpu, reading in conditions.items():
            with self._lock:
                known = self._links.get(gpu)
                if reading.nvlinks_up is not None:  # links that trained later are expected from then on
                    self._links[gpu] = sorted(set(known or ()) | reading.nvlinks_up)
                present = reading.present(self._links.get(gpu, ()))
                reported = reading.reported()
                before = set(self._conditions.get(gpu, ()))
                now = (before - reported) | set(present)
                self._conditions[gpu] = sorted(now)
                if now != before or self._links.get(gpu) != known:
                    self._save()
            name = self._names.get(gpu, gpu)
            if reading.clock_slowdowns is not None:
                self._metrics.set_clock_slowdowns(name, reading.clock_slowdowns)
            for condition in sorted(reported):
                self._metrics.set_condition(name, condition, condition in now)
            for condition in sorted(set(present) - before):
                self._record(
                    gpu_health.condition_fault(gpu_uuid=gpu, condition=condition, what=present[condition])
                )
            if gone := (before & reported) - now:
                cleared[gpu] = gone
        return cleared

    # --- the event loop ------------------------------------------------------------------------

    def follow(self) -> None:
        """Read the health file again if another instance changed it since (not while this one
        writes), and tell the subscribers when the marks changed."""
        with self._writer:
            if self._writing or self._stat() == self._read_stat:
                return
            loaded = self._load()
            with self._lock:
                changed = loaded[0] != self._marks
                self._marks, self._ecc_counts, self._conditions, self._links = loaded
        if changed:
            self._changed()

    def _step(self) -> float:
        if not self._writing:
            self._close_watch()
            self.follow()
            return FOLLOW_SECONDS
        watch = self._watch
        if watch is None or (watch.failed and self._clock() - self._opened_at >= RETRY_SECONDS):
            watch = self._open_watch()
        if not (watch.xid_events or watch.ecc_events or watch.failed):
            return IDLE_SECONDS  # nothing offers events: the poll does it all
        event = watch.wait(WAIT_SECONDS)
        if event is None:
            return 0
        if event.xid is not None or event.kind == DOUBLE_BIT_ECC_EVENT:
            with self._writer:  # not once the turn has passed on
                if self._writing:
                    self._record(self._fault(event))
        else:  # a corrected ECC error, a MIG configuration change (gpudra's own too): counted only
            self._metrics.count_event(self._names.get(event.gpu_uuid, event.gpu_uuid), event.kind)
            log.debug("GPU event", extra={"gpu": event.gpu_uuid, "event": event.kind})
            if event.kind == MIG_CONFIG_CHANGE_EVENT:
                for watcher in self._mig_watchers:
                    watcher()
        return 0

    def _open_watch(self) -> FaultEventWatch:
        self._close_watch()
        self._session = self._open_nvml()
        watch = self._session.watch_events(self._gpus)
        with self._lock:
            self._watch, self._opened_at, self._ecc_watched = watch, self._clock(), watch.ecc_events
        for gpu in self._gpus:
            self._metrics.set_events_monitored(self._names.get(gpu, gpu), gpu in watch.xid_events)
        for gpu, why in watch.failed.items():
            log.warning("cannot watch GPU events; trying again later", extra={"gpu": gpu, "error": why})
        unsupported = [g for g in self._gpus if g not in watch.xid_events and g not in watch.failed]
        if unsupported and not self._told_unsupported:
            self._told_unsupported = True
            names = ", ".join(f"{self._names.get(g, g)} ({g})" for g in unsupported)
            log.warning("GPUs without NVML XID events: polled instead", extra={"gpus": names})
            self._events.post(
                "Warning",
                "GpuEventsUnsupported",
                f"GPUs {names} offer no NVML XID events (NOT_SUPPORTED): their XIDs are not seen; gpudra "
                "polls them for a lost GPU and for double-bit ECC errors at each health check instead",
            )
        return watch

    def _close_watch(self) -> None:
        watch, session = self._watch, self._session
        self._watch = self._session = None
        for part in (watch, session):
            if part is None:
                continue
            try:
                part.close()
            except GpudraError as err:
                log.warning("closing the GPU event watch failed", extra={"error": str(err)})

    def _fault(self, event: Any) -> Fault:
        device = (
            None if event.gpu_instance_id is None else self._partition(event.gpu_uuid, event.gpu_instance_id)
        )
        if event.xid is None:
            return gpu_health.double_bit_ecc(gpu_uuid=event.gpu_uuid, device=device)
        return gpu_health.classify_xid(
            self.classification, gpu_uuid=event.gpu_uuid, device=device, xid=event.xid
        )

    def _partition(self, gpu_uuid: str, gpu_instance_id: int) -> str | None:
        """The published partition device of this GPU instance; None (the fault then marks the whole
        GPU) when it cannot be told: the instance is gone, or not published here."""
        session = self._session
        try:
            existing = session.mig_devices(gpu_uuid=gpu_uuid) if session is not None else ()
        except GpudraError as err:
            log.warning("cannot list MIG devices for a fault", extra={"gpu": gpu_uuid, "error": str(err)})
            existing = ()
        for mig in existing:
            if mig.gpu_instance_id == gpu_instance_id:
                name = self._partitions.get((gpu_uuid, mig.profile_name, mig.placement))
                if name is not None:
                    return name
        log.warning(
            "a fault of a GPU instance that is not a published partition marks its GPU",
            extra={"gpu": gpu_uuid, "gpu_instance": gpu_instance_id},
        )
        return None

    # --- the annotation loop -------------------------------------------------------------------

    def _read_clearance(self) -> float:
        if self._read_annotation is None or not self._writing or not self.marks():
            return IDLE_SECONDS  # woken by the next fault, or by the turn
        value = self._read_annotation()
        with self._writer:
            if self._writing:
                self._apply(lambda marks: gpu_health.observe_annotation(marks, value))
        return self._annotation_interval

    # --- helpers -------------------------------------------------------------------------------

    def _apply(self, rule: Callable[[Marks], tuple[Marks, list[Lifted]]]) -> None:
        """Apply a lifting rule to the marks as they are now (under the lock: a fault recorded meanwhile
        is never lost), keep the result, and report what was lifted."""
        with self._lock:
            marks, lifted = rule(self._marks)
            before, self._marks = self._marks, marks
            if marks != before:
                # A baseline read for the first time is saved at once too: it is what the operator's
                # annotation is judged against, and it says the annotation was read after the fault
                # (a restart that found it unsaved would read the annotation again, and take an
                # operator's value written meanwhile as the baseline, so that it lifted nothing).
                # At most once per fault and read (every ANNOTATION_SECONDS while marks exist).
                self._save_change(
                    news=not gpu_health.same_in_substance(before, marks)
                    or gpu_health.baseline_read(before, marks)
                )
        for done in lifted:
            log.info(
                "GPU fault cleared",
                extra={"gpu": done.mark.gpu_uuid, "device": done.mark.device, "why": done.why},
            )
            self._events.post(
                "Normal",
                "GpuFaultCleared",
                f"{done.mark.target}: taint {UNHEALTHY_TAINT_KEY}={done.mark.reason} lifted: {done.why}",
            )
        if lifted:
            self._changed()

    def _changed(self) -> None:
        for subscriber in self._subscribers:
            subscriber()

    def _load(self) -> tuple[Marks, dict[str, int], dict[str, list[str]], dict[str, list[int]]]:
        """The marks; per boot, the ECC counts, the conditions present and the links expected up."""
        self._read_stat = self._stat()
        try:
            data = json.loads(self._file.read_text())
            if data.get("version") != FILE_VERSION:
                raise ValueError(f"version {data.get('version')!r}, not {FILE_VERSION}")
            marks = [Mark(**{**m, "xid_class": _class_of(m)}) for m in data["marks"]]
            counts = {str(k): int(v) for k, v in data.get("ecc_counts", {}).items()}
            conditions = {
                str(k): [str(c) for c in v if c in gpu_health.CONDITIONS]
                for k, v in data.get("conditions", {}).items()
            }
            links = {str(k): sorted(int(n) for n in v) for k, v in data.get("nvlinks_expected", {}).items()}
            if data.get("boot_id") != self._boot_id:
                # The driver's volatile counts start again at every boot, links train again, and a
                # condition still there is found again by the first poll.
                counts, conditions, links = {}, {}, {}
        except FileNotFoundError:
            return {}, {}, {}, {}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
            log.error(
                "GPU health file unreadable; starting without faults",
                extra={"path": str(self._file), "error": str(err)},
            )
            return {}, {}, {}, {}
        return {m.key: m for m in marks}, counts, conditions, links

    def _stat(self) -> tuple[int, int, int] | None:
        """What tells one version of the health file from another (each write replaces the file)."""
        try:
            stat = os.stat(self._file)
        except OSError:
            return None
        return stat.st_ino, stat.st_mtime_ns, stat.st_size

    def take_turn(self) -> None:
        """Become the node's writer, from the file as the previous one left it (`turn` calls it)."""
        with self._writer:
            self._read_stat = None  # read it whatever its stat: the last writer's state
            self.follow()
            self._writing = True
        self.loop.wake()
        self.clear_loop.wake()

    def give_turn_up(self) -> None:
        """Stop writing, once a fault being recorded is (`turn` calls it)."""
        with self._writer:  # waits for a fault being recorded; none is after
            self._writing = False
        self.loop.wake()  # closes the event watch

    def _save_change(self, *, news: bool) -> bool:
        """Called under the lock after the marks changed: saved at once when `news` (a mark made,
        lifted, or changed in substance), else (what each repeat of a fault refreshes: last_seen, the
        annotation's baseline) at most every LAST_SEEN_SAVE_SECONDS, so that a storm of XIDs is not a
        storm of fsyncs; a restart then reads a last_seen at most that old (a recoverable mark's lift
        comes that much sooner). Whether it saved."""
        if news or self._clock() - self._saved_at >= LAST_SEEN_SAVE_SECONDS:
            self._save()
            return True
        return False

    def _save(self) -> None:
        """Called under the lock; a failed write is logged: the marks in memory still hold."""
        content = {
            "version": FILE_VERSION,
            "boot_id": self._boot_id,
            "marks": [dataclasses.asdict(m) for m in self._marks.values()],
            "ecc_counts": self._ecc_counts,
            "conditions": self._conditions,
            "nvlinks_expected": self._links,
        }
        self._saved_at = self._clock()
        try:
            write_atomically(self._file, json.dumps(content, indent=1).encode(), mode=0o644)
        except OSError as err:
            log.warning("cannot save the GPU health file", extra={"path": str(self._file), "error": str(err)})


def _class_of(mark: dict[str, Any]) -> XidClass:
    """A saved mark's class. A failed row remapping was saved as `reset` before the `reboot` class
    existed, with the rules that class has now."""
    if mark["reason"] == gpu_health.ROW_REMAP_FAILURE:
        return XidClass.REBOOT
    return XidClass(mark["xid_class"])


class _WriterTurn:
    """The `service.Service` that makes its GpuFaults the node's writer while it runs (see the module
    docstring); the plugin runs it in its publisher turn (gpudra.node.instances.PublisherTurn)."""

    def __init__(self, faults: GpuFaults) -> None:
        self._faults = faults

    def start(self) -> None:
        self._faults.take_turn()

    def stop(self, timeout: float) -> None:
        self._faults.give_turn_up()
