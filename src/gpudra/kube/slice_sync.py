"""Keeps this node's ResourceSlices equal to the device model. I/O: the API server, via gpudra.kube.client.

Each slice carries a hash of what gpudra meant to publish (annotation `gpudra.io/spec-hash`), so an
unchanged model costs one LIST and no writes, whatever defaults the API server filled in. When anything
changed, every slice of the pool is rewritten with the next pool generation (the scheduler only trusts
slices of a pool's newest generation) and slices that are no longer wanted are deleted.

The controller runs in a `service.Loop` (its own thread, retried with backoff while the API server
is away) and never holds anything that prepare waits on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudra.kube.client import Kube, Obj
from gpudra.model import slices as slice_builder
from gpudra.model.devices import DeviceModel
from gpudra.model.slices import ResourceSlice
from gpudra.service import Loop

SPEC_HASH = "gpudra.io/spec-hash"
log = logging.getLogger(__name__)


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


def spec_hash(piece: ResourceSlice) -> str:
    """Hash of a slice's content, leaving out the pool generation (it changes on every rewrite)."""
    content: dict[str, Any] = json.loads(json.dumps(piece))
    content["spec"]["pool"].pop("generation", None)
    content["metadata"].get("annotations", {}).pop(SPEC_HASH, None)
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:32]


def _with_hash(piece: ResourceSlice) -> ResourceSlice:
    piece["metadata"].setdefault("annotations", {})[SPEC_HASH] = spec_hash(piece)
    return piece


def plan_sync(build: Callable[[int], list[ResourceSlice]], existing: Sequence[Obj]) -> SyncPlan:
    """Compare desired slices (built for a pool generation) with the existing ones. Pure."""
    generation = max((int(s["spec"]["pool"].get("generation", 0)) for s in existing), default=0)
    current = {s["metadata"]["name"]: s for s in existing}
    wanted = [_with_hash(s) for s in build(generation)]
    unchanged = {s["metadata"]["name"] for s in wanted} == set(current) and all(
        current[name]["metadata"].get("annotations", {}).get(SPEC_HASH)
        == s["metadata"]["annotations"][SPEC_HASH]
        and int(current[name]["spec"]["pool"].get("generation", -1)) == generation
        for s in wanted
        for name in [s["metadata"]["name"]]
    )
    if unchanged:
        return SyncPlan(generation=generation)
    generation += 1
    plan = SyncPlan(generation=generation)
    for piece in (_with_hash(s) for s in build(generation)):
        name = piece["metadata"]["name"]
        if name in current:
            piece["metadata"]["resourceVersion"] = current[name]["metadata"]["resourceVersion"]
            plan.update.append(piece)
        else:
            plan.create.append(piece)
    wanted_names = {s["metadata"]["name"] for s in plan.create + plan.update}
    plan.delete.extend(sorted(set(current) - wanted_names))
    return plan


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
    ) -> None:
        self.kube = kube
        self.driver = driver
        self.node_name = node_name
        self.model = model
        self.resync_seconds = resync_seconds
        self.on_publish = on_publish
        self.loop = Loop("slice-sync", self._step, on_error=self._forget_cluster_facts)
        self._server_minor: int | None = None
        self._node_uid: str | None = None
        self.synced = threading.Event()  # set after the first successful sync

    def sync_once(self) -> SyncPlan:
        """One reconcile: LIST this pool's slices, write what differs."""
        if self._server_minor is None:
            self._server_minor = self.kube.server_minor()
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

        plan = plan_sync(build, self.kube.list_slices(driver=self.driver, node_name=self.node_name))
        for piece in plan.create:
            self.kube.create_slice(dict(piece))
            self.on_publish("create")
        for piece in plan.update:
            self.kube.replace_slice(dict(piece))
            self.on_publish("update")
        for name in plan.delete:
            self.kube.delete_slice(name)
            self.on_publish("delete")
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

    def stop(self, timeout: float) -> None:
        self.loop.stop(timeout)

    def _step(self) -> float:
        self.sync_once()
        self.synced.set()
        return self.resync_seconds

    def _forget_cluster_facts(self, err: BaseException) -> None:
        """After a failure the node or the API server may have been replaced."""
        self._server_minor = self._node_uid = None
