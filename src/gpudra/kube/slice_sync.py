"""Keeps this node's ResourceSlices equal to the device model. I/O: the API server, via gpudra.kube.client.

What is compared is the published content itself, a slice's spec, owner references and health report
annotation (`content`), never a mark gpudra leaves on the object: a mark survives someone else's edit of
the spec. The API
server fills in defaults and normalizes quantities, so what it stores is not what was sent; the
controller therefore remembers, per slice, what it sent and the content the API server returned for
that write (`Published`). A slice is unchanged when its content equals that stored form and what gpudra
wants is still what it sent.

What the pool holds now comes from the watch below, informer-style: a LIST when a watch starts from
nothing, then its events. A sync reads that picture while it is current (the watch runs and has
delivered the echo of every write gpudra made), else it LISTs. So an unchanged pool costs no request at
all per resync, and a watch that broke costs one LIST.

After a restart nothing is remembered. Each slice of ours that is not remembered (after a restart: every
one; else one whose create timed out after it happened) is checked with a dry-run update to what gpudra
wants at the slice's generation (the API server's own defaulting; nothing is stored): a slice that update
would leave as it is gets remembered as published. So a restart writes nothing when the model is
unchanged, and only the slices that changed while gpudra was away are written.

`plan_sync` (pure) turns the LIST into writes:
- Every slice of the pool (this driver and node) that is not one of the slices wanted is deleted,
  whatever its generation: the scheduler trusts only a pool's newest generation, so a stranger at a
  higher one would hide ours.
- The pool keeps its generation (the one generation of the slices gpudra remembers) when at most one
  existing slice must change. One update is atomic, so the scheduler never sees a pool half old and half
  new at one generation (a device in two slices, or in none); a missing slice is created at it, which
  only adds what the pool lacks. So the steady state writes nothing, a slice someone else edited or
  deleted is restored alone, and so is one that changed while gpudra was away (restart).
- Otherwise (more than one slice changes, or nothing is remembered or adopted) every slice is rewritten
  at the next pool generation, counted from our own slices only, never from a stranger's. The generation
  is an int64: at its maximum there is no next, so the pool starts again at 1. That is safe because
  every slice is rewritten and every other one deleted: no slice of the old numbering is left to outrank
  the new ones, and meanwhile the scheduler sees an incomplete pool, as during any rewrite.
Writes go deletes first (a stranger stops hiding the pool soonest), then updates, then creates.

Two `service.Loop`s, each in its own thread, never die of an error and retry with backoff:
- `slice-sync` reconciles at once, every `resync_seconds`, and whenever woken (`trigger()`, the watch).
- `slice-watch` WATCHes the pool (resuming from the last version seen, with bookmarks, each watch at most
  WATCH_SECONDS; after any error it starts again from a LIST) and wakes `slice-sync` on every change
  gpudra did not make: a slice it does not know, content other than what it stored, a deletion of a
  slice it wants. A slice edited or deleted behind its back is restored within a second; the resync
  is only the backstop. A write and the record of its result happen under one lock, so the watch never
  takes the echo of gpudra's own write for someone else's change.
Neither loop holds anything that prepare waits on.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudra.kube.client import Kube, Obj, Watch
from gpudra.model import health_report
from gpudra.model import slices as slice_builder
from gpudra.model.devices import DeviceModel
from gpudra.model.slices import ResourceSlice
from gpudra.runtime.service import Loop

MAX_GENERATION = 2**63 - 1  # spec.pool.generation is an int64
# Each watch ends after this long and the next resumes where it ended (client-go's reflectors: 5-10 min).
WATCH_SECONDS = 300
# Between two watches. No change is missed meanwhile (the next watch starts from the last version seen),
# and a server that ends every watch at once cannot turn the loop into a stream of requests.
WATCH_PAUSE_SECONDS = 0.5
log = logging.getLogger(__name__)

Build = Callable[[int], list[ResourceSlice]]


@dataclass(frozen=True)
class SyncPlan:
    """The writes that bring the API server's slices to the desired state."""

    generation: int
    create: list[ResourceSlice] = field(default_factory=list)
    update: list[ResourceSlice] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)

    @property
    def writes(self) -> int:
        return len(self.create) + len(self.update) + len(self.delete)


@dataclass(frozen=True)
class Published:
    """One slice as gpudra last wrote it: the content it sent and the content the API server stored."""

    sent: Obj
    stored: Obj

    @property
    def generation(self) -> int:
        return int(self.sent["spec"]["pool"]["generation"])


def content(piece: Mapping[str, Any]) -> Obj:
    """What gpudra publishes in a slice: its spec, owner references and its own annotation (the health
    report, gpudra.model.health_report). The rest of the metadata (labels, other annotations, versions,
    managedFields) is the API server's or other clients' business."""
    report = (piece["metadata"].get("annotations") or {}).get(health_report.ANNOTATION)
    return copy.deepcopy(
        {"ownerReferences": piece["metadata"].get("ownerReferences"), "report": report, "spec": piece["spec"]}
    )


def plan_sync(build: Build, existing: Sequence[Obj], published: Mapping[str, Published]) -> SyncPlan:
    """The writes that turn `existing` (the pool's slices as listed) into the slices `build` makes for a
    pool generation, knowing what earlier writes `published`. Pure; the rules are in the module doc."""
    current = {s["metadata"]["name"]: s for s in existing}
    names = [s["metadata"]["name"] for s in build(0)]
    strangers = sorted(set(current) - set(names))
    generations = {p.generation for p in published.values()}
    if len(generations) == 1:
        plan = SyncPlan(generation=generations.pop(), delete=strangers)
        for piece in build(plan.generation):
            name = piece["metadata"]["name"]
            if name not in current:
                plan.create.append(piece)
            elif not _unchanged(piece, current[name], published.get(name)):
                plan.update.append(_replacing(piece, current[name]))
        # One update is atomic; two or more would show the scheduler a half-changed pool at one generation.
        if len(plan.update) <= 1:
            return plan
    ours = max((_generation(current[name]) for name in names if name in current), default=0)
    plan = SyncPlan(generation=ours + 1 if ours < MAX_GENERATION else 1, delete=strangers)
    for piece in build(plan.generation):
        name = piece["metadata"]["name"]
        if name in current:
            plan.update.append(_replacing(piece, current[name]))
        else:
            plan.create.append(piece)
    return plan


def _unchanged(piece: ResourceSlice, current: Obj, remembered: Published | None) -> bool:
    """Whether `current` is what gpudra stored when it last wrote `piece`'s content."""
    return (
        remembered is not None and remembered.sent == content(piece) and content(current) == remembered.stored
    )


def _generation(piece: Obj) -> int:
    return int(piece["spec"]["pool"].get("generation", 0))


def _replacing(piece: ResourceSlice, current: Obj) -> ResourceSlice:
    """`piece` as an update of `current` (the API server refuses an update without its resourceVersion)."""
    piece["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    return piece


class SliceController:
    """Publishes one node's pool and keeps it published."""

    def __init__(
        self,
        kube: Kube,
        *,
        driver: str,
        node_name: str,
        model: Callable[[], DeviceModel],
        resync_seconds: float = 30.0,
        on_publish: Callable[[str], None] = lambda op: None,
        on_server_minor: Callable[[int], None] = lambda minor: None,
    ) -> None:
        """`on_server_minor` is told the API server's minor version each time it is (re)read."""
        self.kube = kube
        self.on_server_minor = on_server_minor
        self.driver = driver
        self.node_name = node_name
        self.model = model
        self.resync_seconds = resync_seconds
        self.on_publish = on_publish
        self.loop = Loop("slice-sync", self._step, on_error=self._forget_cluster_facts)
        self.watch_loop = Loop("slice-watch", self._watch_step, on_error=self._forget_watch_position)
        self._server_minor: int | None = None
        self._node_uid: str | None = None
        self._published: dict[str, Published] = {}
        self._writing = threading.Lock()  # a write and its record in _published, as one to the watch
        self._watch_from: str | None = None  # the resourceVersion the next watch resumes from
        # The pool as the watch last saw it (None: unknown), and the writes whose echo it has not seen yet:
        # (slice name, resourceVersion the write stored; None for a deletion). Both under _writing.
        self._seen: dict[str, Obj] | None = None
        self._echoes: set[tuple[str, str | None]] = set()
        self._watch: Watch | None = None
        self._watch_guard = threading.Lock()  # _watch, against stop() closing it
        self.synced = threading.Event()  # set after the first successful sync

    @property
    def loops(self) -> list[Loop]:
        return [self.loop, self.watch_loop]

    @property
    def published(self) -> dict[str, Published]:
        with self._writing:
            return dict(self._published)

    def sync_once(self) -> SyncPlan:
        """One reconcile: LIST this pool's slices, write what differs."""
        if self._server_minor is None:
            self._server_minor = self.kube.server_minor()
            self.on_server_minor(self._server_minor)
        if self._node_uid is None:
            self._node_uid = self.kube.node_uid(self.node_name)
        model = self.model()
        minor, uid = self._server_minor, self._node_uid

        def build(generation: int) -> list[ResourceSlice]:
            return slice_builder.build_slices(
                model,
                driver=self.driver,
                node_name=self.node_name,
                generation=generation,
                server_minor=minor,
                node_uid=uid,
            )

        existing = self._seen_pool()
        if existing is None:
            existing, _ = self.kube.list_slices(driver=self.driver, node_name=self.node_name)
        self._adopt(build, existing)
        plan = plan_sync(build, existing, self.published)
        for name in plan.delete:
            with self._writing:
                self._published.pop(name, None)
                self.kube.delete_slice(name)
                self._echoes.add((name, None))
            self.on_publish("delete")
        for piece in plan.update:
            self._write(piece, self.kube.replace_slice, "update")
        for piece in plan.create:
            self._write(piece, self.kube.create_slice, "create")
        if plan.writes:
            log.info(
                "published ResourceSlices",
                extra={
                    "generation": plan.generation,
                    "slices_created": len(plan.create),
                    "slices_updated": len(plan.update),
                    "slices_deleted": len(plan.delete),
                },
            )
        return plan

    def trigger(self) -> None:
        """Ask for a sync soon (e.g. after the device model changed)."""
        self.loop.wake()

    def start(self) -> None:
        self.loop.start()
        self.watch_loop.start()

    def stop(self, timeout: float) -> None:
        # Stopping first: a watch opened from now on closes itself (see _watch_step).
        self.watch_loop.stopping.set()
        with self._watch_guard:
            if self._watch is not None:
                self._watch.close()
        self.watch_loop.stop(timeout)
        self.loop.stop(timeout)

    def _write(self, piece: ResourceSlice, call: Callable[[Obj], Obj], operation: str) -> None:
        with self._writing:
            stored = call(dict(piece))
            name = piece["metadata"]["name"]
            self._published[name] = Published(content(piece), content(stored))
            self._echoes.add((name, stored["metadata"].get("resourceVersion")))
        self.on_publish(operation)

    def _seen_pool(self) -> list[Obj] | None:
        """The pool's slices as the watch has them, while that is current; else None (LIST instead)."""
        with self._writing:
            if self._seen is None or self._echoes:
                return None
            return copy.deepcopy(list(self._seen.values()))

    def _adopt(self, build: Build, existing: Sequence[Obj]) -> None:
        """Remember each slice of ours that is not remembered (after a restart: every one; else one whose
        create timed out after it happened) if writing what is wanted would leave it as it is."""
        remembered = self.published
        unknown = [s for s in existing if s["metadata"]["name"] not in remembered]
        names = {s["metadata"]["name"] for s in build(0)} if unknown else set()
        wanted: dict[int, dict[str, ResourceSlice]] = {}
        for current in unknown:
            name, generation = current["metadata"]["name"], _generation(current)
            if name not in names:
                continue  # a stranger: the plan deletes it
            if generation not in wanted:
                wanted[generation] = {s["metadata"]["name"]: s for s in build(generation)}
            piece = wanted[generation][name]
            would_store = self.kube.replace_slice(dict(_replacing(piece, current)), dry_run=True)
            if content(would_store) == content(current):
                with self._writing:
                    self._published[name] = Published(content(piece), content(current))

    def _step(self) -> float:
        self.sync_once()
        self.synced.set()
        return self.resync_seconds

    def _forget_cluster_facts(self, err: BaseException) -> None:
        """After a failure the node or the API server may have been replaced."""
        self._server_minor = self._node_uid = None

    def _watch_step(self) -> float:
        if self._watch_from is None:
            # A LIST gives the version to watch from, and shows what changed while no watch ran: a
            # deletion then leaves nothing that a later watch could report.
            with self._writing:
                before = set(self._echoes)
            existing, self._watch_from = self.kube.list_slices(driver=self.driver, node_name=self.node_name)
            with self._writing:
                self._seen = {s["metadata"]["name"]: s for s in existing}
                # The LIST holds every write finished before it began. A write that finished while it
                # ran may be in it or not (the LIST is not under the lock, to keep writes unblocked):
                # its echo stays pending unless the LIST shows exactly that write, so the picture is not
                # used until the watch (which starts from the LIST's version) brings it.
                listed = {name: s["metadata"].get("resourceVersion") for name, s in self._seen.items()}
                self._echoes = {
                    (name, version)
                    for name, version in self._echoes - before
                    if (name in listed if version is None else listed.get(name) != version)
                }
            if not self._matches(existing):
                self.loop.wake()
            return 0.0
        watch = self.kube.watch_slices(
            driver=self.driver,
            node_name=self.node_name,
            resource_version=self._watch_from,
            timeout_seconds=WATCH_SECONDS,
        )
        with self._watch_guard:
            self._watch = watch
            if self.watch_loop.stopping.is_set():
                watch.close()
        try:
            for event in watch:
                kind, piece = event["type"], event["object"]
                self._watch_from = piece["metadata"]["resourceVersion"]
                if kind != "BOOKMARK" and not self._record(kind, piece):
                    log.info(
                        "ResourceSlice changed by someone else; syncing",
                        extra={"resourceslice": piece["metadata"].get("name"), "change": kind},
                    )
                    self.loop.wake()
        finally:
            with self._watch_guard:
                self._watch = None
        return WATCH_PAUSE_SECONDS

    def _forget_watch_position(self, err: BaseException) -> None:
        """The version may be too old to resume from (HTTP 410), and events may have been missed."""
        self._watch_from = None
        with self._writing:
            self._seen = None

    def _record(self, kind: str, piece: Obj) -> bool:
        """Apply one watch event to the picture of the pool; whether gpudra made that change (the echo of
        its own write, or the deletion of a slice it does not want)."""
        name = piece["metadata"]["name"]
        with self._writing:
            if self._seen is not None:
                if kind == "DELETED":
                    self._seen.pop(name, None)
                else:
                    self._seen[name] = piece
            version = None if kind == "DELETED" else piece["metadata"].get("resourceVersion")
            self._echoes.discard((name, version))
            remembered = self._published.get(name)
        if kind == "DELETED":
            return remembered is None
        return remembered is not None and content(piece) == remembered.stored

    def _matches(self, existing: Sequence[Obj]) -> bool:
        published = self.published
        return {s["metadata"]["name"] for s in existing} == set(published) and all(
            content(s) == published[s["metadata"]["name"]].stored for s in existing
        )
