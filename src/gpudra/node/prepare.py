"""Prepares and unprepares ResourceClaims on this node: the kubelet plugin's state machine.
I/O: CDI specs; the checkpoint (through the claim store) and the GPU (through the steps it is given).

Prepare, per claim: read the claim (UID, allocation, this driver's results in this node's pool) ->
resolve and validate config -> refuse a device another claim holds -> plan MIG partitions and sharing
-> checkpoint PrepareStarted (with the MIG specs and the planned sharing) -> create the MIG devices ->
checkpoint their live ids -> apply sharing -> write the CDI spec -> checkpoint PrepareCompleted.
Unprepare: checkpoint UnprepareStarted -> undo sharing -> destroy the MIG devices gpudra created ->
delete the CDI spec -> forget the claim. Every step after the first checkpoint write is idempotent, so
recovery at start-up (gpudra.node.recovery) can roll back a prepare or finish an unprepare that a crash
interrupted, whichever step it stopped at; so does a repeated prepare that finds its own earlier attempt
unfinished.

`DeviceState` only sequences. Each allocated device goes through a prepare as one `DevicePlan` that
every step fills in (the allocation, its checkpoint record as planned and then live, its CDI view),
and one rule (`_standing`) says what a claim's checkpoint entry means, for prepare and recovery alike.
Beside it, gpudra.node.claim_reader checks a claim against this node and types it; below it,
gpudra.node.claim_store keeps the checkpoint (group commit, the node lock that keeps another plugin
instance out, device locks), gpudra.node.mig makes partitions and gpudra.node.sharing applies
time-slicing and MPS; above it, gpudra.node.recovery settles what a crash left, through the methods
kept for it ("what recovery calls"), never through the store or the steps themselves.

A share of a MIG partition (`gpu-<n>-mig-<profile>-<start>-shared`, several claims on one device) holds
the partition jointly with the other shares on it: the first share prepared creates it as an exclusive
partition would be created; a later one records the same live ids (it joins the partition); unprepare
destroys it only when no other claim of the checkpoint records it, so the last share out destroys it.
The count comes from the checkpoint, never from memory alone, so a crash at any step leaves a
partition that some entry records (destroyed once the last of them goes) or none (recovery destroys it).

Claims that touch different devices prepare concurrently: a claim holds the locks of its own devices
(taken in name order, so two claims never deadlock) and the checkpoint lock only while it edits and
saves the checkpoint. Another instance of the plugin may share the node (a rolling update): every call
runs while this process holds the node lock, and taking it catches up with the checkpoint file, so each
decision is made from the checkpoint as it is on disk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import Literal

from gpudra.errors import ClaimError, GpudraError
from gpudra.model import placement
from gpudra.model.devices import Device, gpu_uuid_of, partition_of
from gpudra.model.inventory import Inventory
from gpudra.node import cdi, faults
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import ClaimRef, ClaimSource, ResolvedDevice, Sharing
from gpudra.node.claim_reader import NodeDevices, read_allocated
from gpudra.node.claim_store import ClaimStore
from gpudra.node.mig import MigPartitions

PostEvent = Callable[[Literal["Normal", "Warning"], str, str], None]
Standing = Literal["answered", "rebuilt", "unfinished"]


@dataclass(frozen=True)
class DevicePlan:
    """One allocated device on its way through prepare, each step filling in its part.

    `allocated` is the allocation resolved to this node. `record` is what the checkpoint holds of the
    device: as planned (its MIG spec, its sharing record, gpudra's CDI ID), then with the live ids of
    the MIG device created, then with the toolkit's CDI ID. `view`, once the device exists, is what its
    CDI spec is written from: the UUID CUDA sees, then the sharing's env and mounts."""

    allocated: ResolvedDevice
    record: ckpt.PreparedDevice
    view: cdi.ClaimDevice | None = None

    @property
    def creates_partition(self) -> bool:
        """A MIG device prepare creates (a share that joins another share's partition has its ids)."""
        return self.record.mig is not None and self.record.mig.live is None

    @property
    def cdi_device(self) -> cdi.ClaimDevice:
        if self.view is None:
            raise RuntimeError(f"device {self.record.device} has no CDI view before it exists")
        return self.view

    def with_live(self, mig: ckpt.MigRecord) -> DevicePlan:
        return replace(self, record=self.record.model_copy(update={"mig": mig}))

    def seen_as(self, view: cdi.ClaimDevice) -> DevicePlan:
        return replace(self, view=view)

    def with_edits(self, env: Mapping[str, str], mounts: Sequence[cdi.Mount]) -> DevicePlan:
        """The view with the sharing's env and mounts (the MPS pipe and shm)."""
        view = self.cdi_device
        return replace(self, view=replace(view, env={**view.env, **env}, mounts=(*view.mounts, *mounts)))

    def with_toolkit(self, ids: Sequence[str]) -> DevicePlan:
        """The record with the toolkit's CDI IDs after gpudra's own."""
        ids = (*self.record.cdi_device_ids, *ids)
        return replace(self, record=self.record.model_copy(update={"cdi_device_ids": ids}))


class DeviceState:
    """The prepared claims of one node, kept in a crash-safe checkpoint."""

    def __init__(
        self,
        *,
        driver: str,
        node_name: str,
        inventory: Inventory,
        devices: Mapping[str, Device],
        claims: ClaimSource,
        sharing: Sharing,
        mig: MigPartitions,
        cdi_root: Path,
        checkpoint_path: Path,
        boot_id: str,
        toolkit: cdi.ToolkitSpecs,
        dev_root: PurePath = cdi.HOST_DEV_ROOT,
        post_event: PostEvent | None = None,
    ) -> None:
        """`post_event(type, reason, message)`: an Event on the node (gpudra.kube.events.NodeEvents.post,
        which never blocks), for the advice of a config prepared (`gpudra.api.Advice`)."""
        self.driver = driver
        self.node_name = node_name
        self.dev_root = dev_root  # where the runtime finds the device nodes the specs name (--dev-root)
        self.published = NodeDevices(inventory, devices)
        self.devices = self.published.devices
        self.gpus = self.published.gpus
        self.claims = claims
        self.sharing = sharing
        self.mig = mig
        self.cdi_root = cdi_root
        self.checkpoint_path = checkpoint_path
        self.boot_id = boot_id
        self.toolkit = toolkit
        self.store = ClaimStore(checkpoint_path, boot_id=boot_id)
        self.post_event = post_event

    @property
    def refusal(self) -> str | None:
        """Why this node prepares nothing (None: it does). See gpudra.node.recovery.recover."""
        return self.store.refusal

    # --- prepare -------------------------------------------------------------------------------

    def prepared(self, ref: ClaimRef) -> tuple[ckpt.PreparedDevice, ...] | None:
        """The devices of a claim prepared already, answered from the checkpoint without the API
        server; None when the claim must be read (`prepare_from_claim`)."""
        self.store.usable()
        with self.store.exclusive():
            done = self.store.entry(ref.uid)
            if done is not None and self._standing(done) == "answered":
                return done.devices
        return None

    def prepare(self, ref: ClaimRef) -> tuple[ckpt.PreparedDevice, ...]:
        """`ref`'s devices: from the checkpoint when the claim is prepared already, else prepared now."""
        answered = self.prepared(ref)
        return answered if answered is not None else self.prepare_from_claim(ref)

    def prepare_from_claim(self, ref: ClaimRef) -> tuple[ckpt.PreparedDevice, ...]:
        """Read the claim and prepare it, for a claim `prepared` did not answer (gpudra.node.dra_service
        asks that first, before the claim waits for a turn with the API server). What the checkpoint
        holds of it is decided again under the locks: another call or instance may have prepared it,
        or left it half done, while the claim was read."""
        self.store.usable()
        # Read without the node lock: a slow API server must not hold up the other instance's calls.
        claim = self.claims.get(namespace=ref.namespace, name=ref.name, uid=ref.uid)
        allocated = read_allocated(
            claim, ref, driver=self.driver, node_name=self.node_name, devices=self.published
        )
        # The GPU's key too: a whole-GPU claim and a partition or share claim of one GPU must not both
        # pass _refuse_taken at once, and claims sharing a GPU must see each other's time-slice.
        keys = [a.device for a in allocated]
        keys += [f"GPU:{a.gpu.uuid}" for a in allocated if not a.admin_access]
        with self.store.exclusive(), self.store.locked(keys):
            done = self.store.entry(ref.uid)
            if done is not None:
                standing = self._standing(done)
                if standing == "answered":
                    return done.devices
                if standing == "rebuilt":
                    return self._complete_rebuilt(ref, done, allocated)
                # An earlier attempt stopped half way (its rollback failed, e.g. a MIG device in use)
                # or an unprepare did: finish undoing it first, so nothing is created twice.
                self.teardown(done)
            devices = self._carry_out(ref, self._plan(ref, allocated))
        self._advise(ref, allocated)
        return devices

    def _standing(self, entry: ckpt.ClaimEntry) -> Standing:
        """What the checkpoint's entry of a claim says, the one rule prepare and recovery go by:
        prepared ("answered": its devices are the answer); prepared but rebuilt from its CDI spec
        after a damaged checkpoint ("rebuilt": without request names, which the claim gives back); or
        a prepare or unprepare that stopped half way ("unfinished", a completed entry whose spec is
        gone included: see `_spec_lost`), which is torn down before anything else is done."""
        if entry.state != "PrepareCompleted" or self._spec_lost(entry):
            return "unfinished"
        return "answered" if _complete(entry) else "rebuilt"

    def _plan(self, ref: ClaimRef, allocated: Sequence[ResolvedDevice]) -> tuple[DevicePlan, ...]:
        """Each device's plan, decided before anything changes: refuses a device another claim holds, a
        config a device cannot take and a placement that is not free."""
        self._refuse_taken(ref, allocated)
        owned = self._owned_mig_uuids()
        # One list in the devices' order: the sharing planner plans a claim's devices together.
        sharing = self.sharing.plan(ref.uid, allocated, others=self.store.others(ref.uid))
        return tuple(
            DevicePlan(a, self._planned(ref, a, owned=owned, sharing=r))
            for a, r in zip(allocated, sharing, strict=True)
        )

    def _carry_out(self, ref: ClaimRef, plans: tuple[DevicePlan, ...]) -> tuple[ckpt.PreparedDevice, ...]:
        """Make the planned devices, each step recorded before the next changes anything; the devices
        as completed. Any failure before the completion is saved rolls back what was done."""
        entry = _entry(ref, "PrepareStarted", plans)
        recorded = [entry]
        try:
            # Recorded before the GPU changes, so that a rollback or recover() knows what to undo.
            # A claim that changes nothing on the GPU (a whole GPU, no sharing config) has only its
            # CDI spec to lose: a crash before PrepareCompleted leaves a spec no entry names, which
            # recover() deletes, so its one save is the completion.
            if entry.changes_gpus:
                self.store.record(entry)
            faults.reached("prepare-started")
            if any(plan.creates_partition for plan in plans):
                plans = self._create_partitions(plans)
                entry = _entry(ref, "PrepareStarted", plans)
                # The live ids, so that a rollback or recover() destroys exactly these instances.
                recorded.append(entry)
                self.store.record(entry)
            faults.reached("prepare-mig-created")
            for plan in plans:
                if plan.allocated.kind == "gpu" and not plan.allocated.admin_access:
                    self.mig.use_whole(plan.allocated.device, plan.allocated.gpu)
            plans = tuple(plan.seen_as(self._view(plan)) for plan in plans)
            visible = {plan.record.device: plan.cdi_device.uuid for plan in plans}
            self.sharing.apply(entry, visible=visible, others=self.store.others(ref.uid))
            faults.reached("prepare-applied")
            plans = tuple(plan.with_edits(*self.sharing.container_edits(plan.record)) for plan in plans)
            spec = cdi.build_claim_spec(
                driver=self.driver,
                claim_uid=ref.uid,
                devices=[plan.cdi_device for plan in plans],
                dev_root=self.dev_root,
            )
            cdi.write_spec(self.cdi_root, spec, claim_uid=ref.uid)
            faults.reached("prepare-cdi-written")
            # The toolkit's ID for the same GPU or MIG device (a MIG device created just now only has
            # its parent's) follows ours, so the runtime adds the driver libraries.
            plans = tuple(plan.with_toolkit(self.toolkit.device_ids(plan.cdi_device)) for plan in plans)
            # Inside the rollback too: a prepare that cannot save its completion (disk full) is
            # a failed prepare, and must not leave the GPU configured and the device held.
            completed = _entry(ref, "PrepareCompleted", plans)
            recorded.append(completed)
            self.store.record(completed)
        except BaseException as err:
            self._roll_back(ref.uid, recorded, err)
            raise
        faults.reached("prepare-completed")
        return completed.devices

    def _roll_back(self, uid: str, recorded: Sequence[ckpt.ClaimEntry], err: BaseException) -> None:
        """Undo a prepare that failed with `err`; a failure of the rollback is noted on `err`, and the
        entry stays for recover().

        Memory holds an entry of this attempt once a save of it replaced the file (even if the
        directory sync failed). Otherwise the first save changed nothing, or there was none and the
        spec is all there is to remove."""
        current = self.store.entry(uid)
        try:
            if current is not None and current in recorded:
                self.teardown(current)
            elif current is None:
                cdi.delete_spec(self.cdi_root, driver=self.driver, claim_uid=uid)
        except Exception as rollback:  # keep the first error
            err.add_note(f"rolling back also failed: {rollback}")

    def _advise(self, ref: ClaimRef, allocated: Sequence[ResolvedDevice]) -> None:
        """An Event for each thing the claim's configs do otherwise than they may seem to (a MIG
        device's TimeSlicing sets nothing), once per prepare that changed the node."""
        if self.post_event is None:
            return
        for device in allocated:
            for advice in device.config.advice():
                self.post_event(
                    "Warning",
                    advice.reason,
                    f"ResourceClaim {ref.namespace}/{ref.name}, device {device.device}: "
                    f"{device.config_field}.{advice.field}: {advice.message}",
                )

    def _create_partitions(self, plans: tuple[DevicePlan, ...]) -> tuple[DevicePlan, ...]:
        """Create the planned MIG devices; the plans with their live ids.

        On a failure the devices created so far are in no record yet: destroy them here (the caller's
        rollback finds the rest by their specs), then raise."""
        done: list[DevicePlan] = []
        created_here: list[tuple[str, ckpt.MigRecord]] = []
        try:
            for plan in plans:
                # A share that joins a partition another share created has its live ids already.
                mig = plan.record.mig
                if mig is None or mig.live is not None:
                    done.append(plan)
                    continue
                created = self.mig.create(plan.record.device, mig)
                done.append(plan.with_live(created))
                created_here.append((plan.record.device, created))
        except BaseException as err:
            for device, created in created_here:
                try:
                    self.mig.destroy(device, created)
                except GpudraError as cleanup:
                    err.add_note(f"destroying {device} again failed as well: {cleanup}")
            raise
        return tuple(done)

    def _complete_rebuilt(
        self, ref: ClaimRef, done: ckpt.ClaimEntry, allocated: Sequence[ResolvedDevice]
    ) -> tuple[ckpt.PreparedDevice, ...]:
        """A claim rebuilt from its CDI spec, completed from the claim: its devices keep running as
        they are (their MIG devices and specs are in use by the pod); only the request names come back."""
        requests = {cdi.device_name(a.device, a.share_id): (a.base_request,) for a in allocated}
        if set(requests) != {cdi.device_name(d.device, d.share_id) for d in done.devices}:
            named = ", ".join(sorted(cdi.device_name(d.device, d.share_id) for d in done.devices))
            raise ClaimError(
                f"ResourceClaim {done.uid} was allocated {', '.join(sorted(requests))}, but its CDI spec "
                f"(the checkpoint was rebuilt from it) names {named}"
            )
        devices = tuple(
            d.model_copy(update={"request_names": requests[cdi.device_name(d.device, d.share_id)]})
            for d in done.devices
        )
        self.store.record(
            done.model_copy(update={"namespace": ref.namespace, "name": ref.name, "devices": devices})
        )
        return devices

    # --- unprepare -----------------------------------------------------------------------------

    def unprepare(self, ref: ClaimRef) -> None:
        """Undo prepare for `ref`; a claim never prepared (or already unprepared) is fine."""
        self.store.usable()
        with self.store.exclusive():
            entry = self.store.entry(ref.uid)
            if entry is None:
                cdi.delete_spec(self.cdi_root, driver=self.driver, claim_uid=ref.uid)
                return
            with self.store.locked(d.device for d in entry.devices):
                entry = self.store.entry(ref.uid)
                if entry is None:
                    return
                self.teardown(entry)

    def teardown(self, entry: ckpt.ClaimEntry) -> None:
        """Unprepare `entry` from whatever step it reached; safe to repeat after a crash."""
        if not entry.changes_gpus:
            # Nothing on the GPU to undo: delete the spec, then forget the claim, one save. The claim
            # holds its devices until its spec is gone; a crash in between leaves an entry whose spec
            # is missing, which the kubelet's retry (or a repeated prepare, see `_spec_lost`) settles.
            faults.reached("unprepare-started")
            faults.reached("unprepare-undone")
            faults.reached("unprepare-mig-destroyed")
            cdi.delete_spec(self.cdi_root, driver=self.driver, claim_uid=entry.uid)
            faults.reached("unprepare-cdi-deleted")
            self.store.forget(entry.uid)
            return
        if entry.state != "UnprepareStarted":
            try:
                self.store.record(entry.with_state("UnprepareStarted"))
            except ckpt.CheckpointNotSaved:
                current = self.store.entry(entry.uid)
                if current is not None and current.state == "PrepareStarted":
                    # Rolling back a prepare on a full disk: the entry stays PrepareStarted on disk
                    # and in memory (recover() or the kubelet's retry settles it), but nothing may
                    # stay set up for a prepare the kubelet was told failed. (A PrepareCompleted
                    # that reached the disk stays whole: the retry answers from it.)
                    self._undo(current)
                raise
            entry = entry.with_state("UnprepareStarted")
        faults.reached("unprepare-started")
        self._undo(entry)
        self.store.forget(entry.uid)

    def _undo(self, entry: ckpt.ClaimEntry) -> None:
        """Undo the side effects of `entry`: sharing, the MIG devices it created, then its CDI spec.
        Idempotent."""
        others = self.store.others(entry.uid)
        self.sharing.undo(entry, others=others)
        faults.reached("unprepare-undone")
        # A partition that another claim records too (shares of one partition) stays for it: the last
        # share out destroys it. Read from the checkpoint, so a restart counts the same.
        held = {
            d.mig.live.uuid for e in others for d in e.devices if d.mig is not None and d.mig.live is not None
        }
        for device in entry.devices:
            if device.mig is not None and not (device.mig.live is not None and device.mig.live.uuid in held):
                self.mig.destroy(device.device, device.mig)
        faults.reached("unprepare-mig-destroyed")
        cdi.delete_spec(self.cdi_root, driver=self.driver, claim_uid=entry.uid)
        faults.reached("unprepare-cdi-deleted")

    # --- queries -------------------------------------------------------------------------------

    def prepared_claims(self) -> dict[str, ckpt.ClaimEntry]:
        return dict(self.store.latest().claims)

    def mig_room(self) -> dict[str, tuple[str, int]]:
        """Per MIG-capable GPU (device name `gpu-<minor>`), the largest MIG profile that still fits
        beside the partitions prepared here (name, GPU slices; ("", 0) when none, or while the whole GPU is
        prepared). Allocations the node has not been asked to prepare yet are not in it."""
        occupied: dict[str, list[placement.Instance]] = {}
        whole: set[str] = set()
        for entry in self.store.latest().claims.values():
            for device in entry.devices:
                if device.admin_access or not device.gpu_uuids or device.device not in self.devices:
                    continue
                parent = device.gpu_uuids[0]
                if self.published.type_of(device.device) == "gpu":
                    whole.add(parent)
                    continue
                occupied.setdefault(parent, []).append(
                    placement.Instance(*partition_of(self.devices[device.device]))
                )
        room = {}
        for gpu in self.gpus.values():
            if not gpu.mig_profiles:
                continue
            largest = (
                None if gpu.uuid in whole else placement.largest_placeable(gpu, occupied.get(gpu.uuid, ()))
            )
            room[f"gpu-{gpu.minor}"] = (largest.name, largest.slice_count) if largest else ("", 0)
        return room

    def prepared_partitions(self) -> dict[str, str]:
        """Partition device -> MIG UUID, for each MIG device a prepared claim created (health checks)."""
        created = self._created(self.store.latest())
        return {name: live.uuid for entry, name, live in created if entry.state == "PrepareCompleted"}

    # --- what recovery calls (gpudra.node.recovery) ----------------------------------------------

    def settling(self) -> AbstractContextManager[None]:
        """The node lock for recovery, which loads the checkpoint file itself instead of catching up."""
        return self.store.exclusive(catch_up=False)

    def refuse(self, reason: str | None) -> None:
        """Fail every prepare and unprepare with `reason` from now on (None: serve them again)."""
        self.store.refuse(reason)

    def restore(self, checkpoint: ckpt.Checkpoint) -> None:
        """Make `checkpoint`, as recovery loaded or rebuilt it, the one calls decide from; `resume`
        saves it."""
        self.store.load(checkpoint)

    def resume(self) -> None:
        """Save the checkpoint as recovery settled it, then serve calls again."""
        self.store.save(lambda checkpoint: checkpoint)
        self.store.refuse(None)

    def recorded(self) -> list[ckpt.ClaimEntry]:
        """The claims of the checkpoint as this process holds it: right under the node lock."""
        return list(self.store.current.claims.values())

    def unsettled(self) -> list[ckpt.ClaimEntry]:
        """The claims a crash left half prepared or half unprepared, which `teardown` finishes."""
        return [entry for entry in self.recorded() if self._standing(entry) == "unfinished"]

    def discard(self, stale: ckpt.ClaimEntry) -> None:
        """Remove what a claim of an earlier boot left on disk (its CDI spec, its sharing's files): the
        reboot reset its GPUs."""
        cdi.delete_spec(self.cdi_root, driver=self.driver, claim_uid=stale.uid)
        self.sharing.discard(stale)

    def reset_sharing(self, gpu_uuids: Sequence[str]) -> None:
        """Put the sharing settings of the GPUs back to their defaults."""
        self.sharing.reset(gpu_uuids)

    def rebuilt_device(
        self, claim_uid: str, device: str, share_id: str | None, cdi_device: cdi.CdiDevice
    ) -> ckpt.PreparedDevice:
        """The record of `device` (published here) as the CDI spec of claim `claim_uid` names it, for a
        checkpoint rebuilt from the specs: no request names (a repeated prepare reads them from the
        claim); admin access from the spec's annotation; a partition gpudra created gets its MIG spec
        from the device and its live ids from the spec's MIG UUID where that MIG device still exists;
        sharing as far as the spec tells (a whole GPU alone gets no time-slice record)."""
        gpu = self.published.gpu_of(device)
        kind = self.published.type_of(device)
        mig = None
        if kind == "mig" and not cdi_device.admin_access and self.published.published_uuid(device) is None:
            mig = self.mig.rebuilt(device, self.published[device], gpu, cdi.visible_uuid(cdi_device))
        sharing = self.sharing.rebuild(cdi_device, whole_alone=kind == "gpu" and share_id is None)
        return ckpt.PreparedDevice(
            request_names=(),
            pool=self.node_name,
            device=device,
            cdi_device_ids=(self._own_id(claim_uid, device, share_id),),
            gpu_uuids=(gpu.uuid,),
            mig=mig,
            sharing=sharing,
            admin_access=cdi_device.admin_access,
            share_id=share_id,
        )

    def runs_process(self, entry: ckpt.ClaimEntry) -> bool:
        """Whether a prepared claim's sharing runs a process that can die while it runs (an MPS daemon)."""
        return entry.state == "PrepareCompleted" and self.sharing.runs_process(entry)

    def answers(self, entry: ckpt.ClaimEntry) -> bool:
        """Whether every process the claim's sharing runs answers; reads only, without a lock."""
        return self.sharing.answers(entry)

    def adopt(self, entry: ckpt.ClaimEntry) -> bool:
        """Keep the claim's processes that answer and start again, from its records, those that do not
        (True: one was started). Under the node lock."""
        return self.sharing.adopt(entry, visible=self._visible(entry), others=self.store.others(entry.uid))

    def restart(self, seen: ckpt.ClaimEntry) -> bool:
        """`adopt` under the node lock and the claim's device locks, if the checkpoint still holds `seen`
        as it was; whether a process was started."""
        with self.store.exclusive(), self.store.locked(self._lock_keys(seen)):
            if self.store.entry(seen.uid) != seen:
                return False
            return self.adopt(seen)

    def stop_unrecorded(self) -> list[Path]:
        """Stop the processes (MPS daemons) no claim of the checkpoint names; their directories."""
        return self.sharing.stop_unrecorded(self.recorded())

    # --- helpers -------------------------------------------------------------------------------

    def _refuse_taken(self, ref: ClaimRef, allocated: Sequence[ResolvedDevice]) -> None:
        """Refuse a device another claim holds: the same device (unless both hold a share of it), or
        the same GPU in another form (its whole self, a share of it, a partition of it), which the
        scheduler's counters keep apart too."""
        mine = [(a.device, a.gpu.uuid, _form(a.kind, a.share_id)) for a in allocated if not a.admin_access]
        placements = {a.device: self._placement(a.device) for a in allocated if a.kind == "mig"}
        for other in self.store.current.claims.values():
            if other.uid == ref.uid:
                continue
            taken: set[str] = set()
            for held in other.devices:
                kind = self.published.known_type(held.device)
                if held.admin_access or kind is None:
                    continue
                held_form, held_gpu = _form(kind, held.share_id), held.gpu_uuids[:1]
                for device, gpu, form in mine:
                    if device == held.device and not (form == held_form in ("share", "mig-share")):
                        taken.add(device)
                    # A partition's exclusive and shared forms are two devices of one placement.
                    elif (
                        device != held.device
                        and placements.get(device) is not None
                        and placements.get(device) == self._placement(held.device)
                    ):
                        taken.add(f"{device} (its placement is prepared as {held.device})")
                    # Two devices of one GPU exclude each other unless both are MIG partitions (their
                    # placements are checked when created). Not by form alone: where the API server drops
                    # allowMultipleAllocations, the scheduler hands out a shared device without a share
                    # ID, which looks like the whole GPU's form (Kubernetes 1.34/1.35, default gates).
                    elif (
                        device != held.device
                        and held_gpu == (gpu,)
                        and not {form, held_form} <= {"mig", "mig-share"}
                    ):
                        taken.add(f"{device} (its GPU is prepared as {held.device})")
            if taken:
                holder = (
                    f"{other.namespace}/{other.name} ({other.uid})"
                    if other.name
                    else f"{other.uid} (recovered from its CDI spec after a damaged checkpoint)"
                )
                raise ClaimError(
                    f"device {', '.join(sorted(taken))} is already prepared for ResourceClaim {holder}"
                )

    def _planned(
        self, ref: ClaimRef, device: ResolvedDevice, *, owned: set[str], sharing: ckpt.SharingRecord | None
    ) -> ckpt.PreparedDevice:
        mig = None
        if device.kind == "mig" and not device.admin_access:
            # A share of a partition that another share already created joins it (same live ids).
            joins = self._live_of(device.device, besides=ref.uid) if device.share_id is not None else None
            mig = self.mig.plan(device, self.devices[device.device], owned=owned, joins=joins)
        return ckpt.PreparedDevice(
            request_names=(device.base_request,),
            pool=self.node_name,
            device=device.device,
            # The toolkit's ID follows once the device exists (see _carry_out).
            cdi_device_ids=(self._own_id(ref.uid, device.device, device.share_id),),
            gpu_uuids=(device.gpu.uuid,),
            mig=mig,
            sharing=sharing,
            admin_access=device.admin_access,
            share_id=device.share_id,
        )

    def _own_id(self, claim_uid: str, device: str, share_id: str | None) -> str:
        """The CDI ID gpudra gives a device of a claim, first in the answer."""
        return cdi.claim_device_id(
            driver=self.driver, claim_uid=claim_uid, device_name=cdi.device_name(device, share_id)
        )

    def _view(self, plan: DevicePlan) -> cdi.ClaimDevice:
        """The CDI view of a device as it exists now; for a partition, the MIG device created, or the
        one that exists already."""
        device, gpu = plan.allocated, plan.allocated.gpu
        name = cdi.device_name(device.device, device.share_id)
        if device.kind == "gpu":
            return cdi.ClaimDevice(
                name=name, gpu_minor=gpu.minor, uuid=gpu.uuid, admin_access=device.admin_access
            )
        found: ckpt.MigLive | str | None = plan.record.mig.live if plan.record.mig is not None else None
        if found is None:
            attributes = self.devices[device.device]["attributes"]
            found = (
                attributes["uuid"].get("string") if "uuid" in attributes else self._live_uuid(device.device)
            )
            if found is None:
                raise ClaimError(
                    f"device {device.device}: this MIG partition does not exist, since no claim on this node "
                    "uses it; admin access reaches partitions that another claim prepared"
                )
        uuid, access = self.mig.reach(device.device, gpu, found)
        return cdi.ClaimDevice(
            name=name, gpu_minor=gpu.minor, uuid=uuid, mig=access, admin_access=device.admin_access
        )

    def _visible(self, entry: ckpt.ClaimEntry) -> dict[str, str]:
        """The UUID CUDA sees, per device of `entry` that has one now (a partition once created)."""
        visible = {}
        for device in entry.devices:
            if device.mig is not None and device.mig.live is not None:
                visible[device.device] = device.mig.live.uuid
            elif device.device in self.devices and (uuid := self.published.published_uuid(device.device)):
                visible[device.device] = uuid
        return visible

    def _created(
        self, checkpoint: ckpt.Checkpoint | None = None
    ) -> Iterator[tuple[ckpt.ClaimEntry, str, ckpt.MigLive]]:
        """(entry, partition device, live ids) for every MIG device the checkpoint (memory's, unless
        given) says gpudra created."""
        for entry in (self.store.current if checkpoint is None else checkpoint).claims.values():
            for d in entry.devices:
                if d.mig is not None and d.mig.live is not None:
                    yield entry, d.device, d.mig.live

    def _live_of(self, device: str, *, besides: str) -> ckpt.MigLive | None:
        """The live ids of partition `device` as another claim than `besides` records them."""
        return next(
            (live for entry, name, live in self._created() if name == device and entry.uid != besides), None
        )

    def _placement(self, device: str) -> tuple[str, int] | None:
        """The parent GPU and placement start of a published partition (None: not one, or gone)."""
        published = self.devices.get(device)
        if published is None or "parentUUID" not in published["attributes"]:
            return None
        return (gpu_uuid_of(published), partition_of(published)[1].start)

    def _live_uuid(self, device: str) -> str | None:
        """The MIG UUID of partition `device` as a prepared claim created it, if one did."""
        return next((live.uuid for _, name, live in self._created() if name == device), None)

    def _owned_mig_uuids(self) -> set[str]:
        """The MIG devices the checkpoint says gpudra created (and may therefore destroy)."""
        return {live.uuid for _, _, live in self._created()}

    def _spec_lost(self, entry: ckpt.ClaimEntry) -> bool:
        """A completed entry without its CDI spec: an unprepare stopped between deleting the spec and
        forgetting the claim (only a claim that changes no GPU skips UnprepareStarted). Preparing the
        claim again tears it down first, then starts over."""
        return (
            not entry.changes_gpus
            and not cdi.spec_path(self.cdi_root, driver=self.driver, claim_uid=entry.uid).exists()
        )

    def _lock_keys(self, entry: ckpt.ClaimEntry) -> list[str]:
        """The locks a call that changes `entry`'s GPUs holds: its devices', and its GPUs' (see prepare)."""
        keys = [d.device for d in entry.devices]
        return keys + [f"GPU:{d.gpu_uuids[0]}" for d in entry.devices if d.gpu_uuids and not d.admin_access]


def _entry(ref: ClaimRef, state: ckpt.ClaimState, plans: Sequence[DevicePlan]) -> ckpt.ClaimEntry:
    return ckpt.ClaimEntry(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        state=state,
        devices=tuple(plan.record for plan in plans),
    )


def _complete(entry: ckpt.ClaimEntry) -> bool:
    """False for an entry rebuilt from a CDI spec (see gpudra.node.recovery)."""
    return all(device.request_names for device in entry.devices) and bool(entry.devices)


def _form(kind: str, share_id: str | None) -> str:
    """How a claim holds a GPU: whole, one share of it, a partition, or one share of a partition."""
    if kind == "mig":
        return "mig-share" if share_id is not None else "mig"
    return "share" if share_id is not None else "whole"
