"""Prepares and unprepares ResourceClaims on this node: the kubelet plugin's state machine.
I/O: the checkpoint file, CDI specs, GPU tools (through the Sharing it is given).

Prepare, per claim: read the claim (UID, allocation, this driver's results in this node's pool) ->
resolve and validate config -> refuse a device another claim holds -> plan MIG partitions and sharing
-> checkpoint PrepareStarted (with the MIG specs and the planned sharing) -> create the MIG devices ->
checkpoint their live ids -> apply sharing -> write the CDI spec -> checkpoint PrepareCompleted.
Unprepare: checkpoint UnprepareStarted -> undo sharing -> destroy the MIG devices gpudra created ->
delete the CDI spec -> forget the claim. Every step after the first checkpoint write is idempotent, so
`recover()` at start-up can roll back a prepare or finish an unprepare that a crash interrupted,
whichever step it stopped at; so does a repeated prepare that finds its own earlier attempt unfinished.

Claims that touch different devices prepare concurrently: a claim holds the locks of its own devices
(taken in name order, so two claims never deadlock) and the checkpoint lock only while it edits and
saves the checkpoint.

Another instance of the plugin may share the node (a rolling update): every prepare, unprepare and
recovery runs while this process holds the node lock (gpudra.node.instances.NodeLock), and when the
process takes that lock it first catches up with the checkpoint file, which the other instance may have
saved meanwhile. So each decision is made from the checkpoint as it is on disk, and nothing one instance
did is undone or repeated by the other.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path, PurePath
from typing import Any

from gpudra.errors import ClaimError, ConfigError, GpudraError
from gpudra.model import placement
from gpudra.model.claim_config import resolve_configs
from gpudra.model.devices import Device, partition_of
from gpudra.model.inventory import Gpu, Inventory
from gpudra.node import cdi, faults
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import Allocated, ClaimRef, ClaimSource, DeviceType, Sharing
from gpudra.node.instances import NodeLock
from gpudra.node.mig import MigPartitions
from gpudra.node.sharing.mps_daemons import CONTAINER_PIPE_DIR
from gpudra.quantity import parse_quantity

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DaemonCheck:
    """What `DeviceState.restart_stopped_mps_daemons()` did."""

    restarted: tuple[ckpt.ClaimEntry, ...] = ()  # claims whose daemon was started again
    failed: tuple[tuple[ckpt.ClaimEntry, str], ...] = ()  # claims whose daemon could not be: why


@dataclass(frozen=True)
class Recovery:
    """What `DeviceState.recover()` found."""

    refused: str | None = None  # the checkpoint cannot be used: why (nothing was changed)
    damage: str | None = None  # the checkpoint was damaged: how
    copied_to: Path | None = None  # the copy kept of a damaged checkpoint (None: none could be made)
    rebuilt: int = 0  # claims rebuilt from their CDI specs after damage


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
    ) -> None:
        self.driver = driver
        self.node_name = node_name
        self.dev_root = dev_root  # where the runtime finds the device nodes the specs name (--dev-root)
        self.devices = dict(devices)
        self.gpus = {gpu.uuid: gpu for gpu in inventory.gpus}
        self.claims = claims
        self.sharing = sharing
        self.mig = mig
        self.cdi_root = cdi_root
        self.checkpoint_path = checkpoint_path
        self.boot_id = boot_id
        self.toolkit = toolkit
        self._checkpoint = ckpt.Checkpoint.empty(boot_id)
        # Guards the memory of the checkpoint, the changes waiting for a save, and the device locks' map;
        # the save lock makes one thread at a time the writer of the file (see `_save`).
        self._checkpoint_lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._waiting: list[_Change] = []
        self._device_locks: dict[str, threading.Lock] = {}
        self._refusal: str | None = "the checkpoint has not been loaded yet"
        # Beside the checkpoint, in the directory every instance on the node shares.
        self._node = NodeLock(checkpoint_path.with_name(f"{checkpoint_path.name}.lock"))
        # The file's bytes as this instance last wrote or read them (None: no file yet), and the last
        # file another instance saved, as `_latest` parsed it.
        self._on_disk: bytes | None = None
        self._read_by_readers: tuple[bytes, ckpt.Checkpoint] | None = None

    # --- start-up --------------------------------------------------------------------------------

    def recover(self) -> Recovery:
        """Load the checkpoint and settle whatever a crash or reboot left half done.

        A damaged checkpoint is copied aside and replaced by one rebuilt from the CDI specs on disk,
        so the claims that still have a spec keep it and keep their GPUs. So is a missing checkpoint
        while claim specs exist (someone deleted it): nothing that might belong to a running claim
        is deleted. One written by a newer gpudra (CheckpointTooNew) or one that cannot be read
        (CheckpointUnreadable) leaves everything as it is; so does a state that cannot be saved (a
        full or read-only disk). Then the state refuses: every prepare and unprepare fails with the
        reason (the kubelet retries them) until a later `recover()` succeeds, after the operator
        acted. `recover()` is idempotent: a crash or a failure anywhere in it is settled by the next.

        It runs under the node lock: a call another instance has in flight finishes first, so no entry
        recovery settles, and no spec or MPS daemon it removes, belongs to a call still running.
        """
        try:
            with self._node.held():
                return self._recover()
        except (ckpt.CheckpointTooNew, ckpt.CheckpointUnreadable, ckpt.CheckpointNotSaved) as err:
            # A newer gpudra's file may record GPU state this one cannot undo, and an unreadable one
            # may be fine: touching either (or the CDI specs of the claims it holds) could break
            # running pods. Refuse, and say why, instead of guessing.
            self._refusal = str(err)
            return Recovery(refused=str(err))
        except (GpudraError, OSError) as err:
            self._refusal = f"cannot settle the checkpoint {self.checkpoint_path}: {err}"
            return Recovery(refused=self._refusal)

    def _recover(self) -> Recovery:
        specs = cdi.list_claim_specs(self.cdi_root, driver=self.driver)
        try:
            if not self.checkpoint_path.exists() and specs:
                raise ckpt.CheckpointCorrupt(
                    f"checkpoint {self.checkpoint_path} is missing but {len(specs)} claim spec(s) of "
                    f"{self.driver} are in {self.cdi_root}"
                )
            loaded = ckpt.load(self.checkpoint_path, boot_id=self.boot_id)
        except ckpt.CheckpointCorrupt as err:
            # Keep a copy for diagnosis (best effort: a full disk must not stop the rebuild), then
            # rebuild from the CDI specs which claims hold which devices; `_save` below replaces
            # the damaged file, so a crash before it finds the same damage and does this again.
            copy = ckpt.keep_copy(self.checkpoint_path) if self.checkpoint_path.exists() else None
            rebuilt = self._rebuild_from_cdi_specs(specs)
            log.error(
                "checkpoint damaged; prepared claims rebuilt from their CDI specs",
                extra={"error": str(err), "copied_to": str(copy), "claims_rebuilt": len(rebuilt)},
            )
            loaded = ckpt.LoadedCheckpoint(ckpt.Checkpoint.empty(self.boot_id).with_claims(rebuilt), {})
            recovery = Recovery(damage=str(err), copied_to=copy, rebuilt=len(rebuilt))
            self._reset_time_slices(rebuilt)
        else:
            recovery = Recovery()
        self._checkpoint = loaded.checkpoint
        for uid, stale in loaded.stale_claims.items():  # the reboot reset the GPUs; only files remain
            cdi.delete_spec(self.cdi_root, driver=self.driver, claim_uid=uid)
            for device in stale.devices:
                if isinstance(device.sharing, ckpt.MpsRecord):
                    shutil.rmtree(device.sharing.root, ignore_errors=True)
        for entry in list(self._checkpoint.claims.values()):
            # A completed claim whose spec is gone was being unprepared (see `_spec_lost`): finish it.
            if entry.state != "PrepareCompleted" or self._spec_lost(entry):
                log.info("settling interrupted %s", entry.state, extra={"claim": entry.uid})
                try:
                    self._teardown(entry)
                except GpudraError as err:
                    # One broken GPU must not keep the plugin from serving the others; the entry stays
                    # (UnprepareStarted, holding its devices) for the kubelet's retry to finish.
                    log.error("cannot settle claim", extra={"claim": entry.uid, "error": str(err)})
        self._adopt_daemons()
        # A spec no entry names was left by a prepare this checkpoint already forgot, or by one that
        # changes no GPU and was killed before its one save: nothing uses it. Nor a half-written one.
        cdi.remove_spec_leftovers(self.cdi_root, driver=self.driver)
        known = set(self._checkpoint.claims)
        for uid in cdi.list_claim_specs(self.cdi_root, driver=self.driver).keys() - known:
            cdi.delete_spec(self.cdi_root, driver=self.driver, claim_uid=uid)
        self._save(lambda checkpoint: checkpoint)
        self._refusal = None
        return recovery

    def _reset_time_slices(self, rebuilt: Sequence[ckpt.ClaimEntry]) -> None:
        """A spec does not say which time-slice a claim's GPU was given, and a rebuilt entry has no record
        of one: put those GPUs back to Default, so that they run with what the records say."""
        uuids = sorted(
            {
                d.gpu_uuids[0]
                for e in rebuilt
                for d in e.devices
                if not d.admin_access and d.gpu_uuids and self._known_type(d.device) == "gpu"
            }
        )
        try:
            self.sharing.reset_time_slices(uuids)
        except GpudraError as err:  # a time-slice is no reason to refuse every claim
            log.error("cannot reset the time-slices of rebuilt claims", extra={"error": str(err)})

    def _adopt_daemons(self) -> None:
        """Keep the MPS daemons of prepared claims (they outlived the plugin, their clients are running),
        start again one that died, and stop any daemon no claim of the checkpoint names."""
        for entry in self._checkpoint.claims.values():
            if entry.state != "PrepareCompleted" or not _has_mps(entry):
                continue
            try:
                if self.sharing.adopt(entry, visible=self._visible(entry), others=self._others(entry.uid)):
                    log.warning("MPS daemon had stopped; started again", extra={"claim": entry.uid})
            except GpudraError as err:
                log.error("cannot adopt the MPS daemon", extra={"claim": entry.uid, "error": str(err)})
        known = {
            d.sharing.root
            for e in self._checkpoint.claims.values()
            for d in e.devices
            if isinstance(d.sharing, ckpt.MpsRecord)
        }
        try:
            stopped = self.sharing.stop_others(known)
        except GpudraError as err:  # a stray daemon must not keep the plugin from serving claims
            log.error("cannot stop MPS daemons no prepared claim uses", extra={"error": str(err)})
            stopped = []
        for root in stopped:
            log.warning("stopped an MPS daemon no prepared claim uses", extra={"directory": str(root)})

    # --- MPS daemons while claims run -------------------------------------------------------------

    def restart_stopped_mps_daemons(self) -> DaemonCheck:
        """Start again, with its recorded limits, the MPS daemon of each prepared claim that no longer
        answers: it died, or it lived in the container of a plugin pod that is gone (a rolling update:
        the new pod adopted it, then the old pod's processes died with its container).

        Only claims with MPS records are checked, one tool run each; with none, no tool runs and no
        lock is taken. The check only reads, so it runs without the node lock: a tool run per claim
        must not hold up prepares. A restart runs under the node lock and the claim's own device locks
        (those of this process's calls), from the checkpoint as it is then: a claim that either
        instance unprepared meanwhile, one being prepared or unprepared, or one whose entry changed is
        left alone (a changed one is looked at again next time). A claim that fails does not keep the
        others from being started."""
        if self._refusal is not None:
            return DaemonCheck()  # the checkpoint loop settles the state first
        candidates = [
            e for e in self._latest().claims.values() if e.state == "PrepareCompleted" and _has_mps(e)
        ]
        restarted: list[ckpt.ClaimEntry] = []
        failed: list[tuple[ckpt.ClaimEntry, str]] = []
        for candidate in candidates:
            if self.sharing.answers(candidate):
                continue
            try:
                if self._restart_mps_daemon(candidate):
                    restarted.append(candidate)
            except (GpudraError, OSError) as err:
                failed.append((candidate, str(err)))
        return DaemonCheck(restarted=tuple(restarted), failed=tuple(failed))

    def _restart_mps_daemon(self, seen: ckpt.ClaimEntry) -> bool:
        """Start `seen`'s daemon again if the checkpoint still holds `seen` as it was, completed;
        whether a daemon was started."""
        keys = [d.device for d in seen.devices]
        keys += [f"GPU:{d.gpu_uuids[0]}" for d in seen.devices if d.gpu_uuids and not d.admin_access]
        with self._exclusive(), self._locked(keys):
            if self._checkpoint.claims.get(seen.uid) != seen:
                return False
            return self.sharing.adopt(seen, visible=self._visible(seen), others=self._others(seen.uid))

    @property
    def refusal(self) -> str | None:
        """Why this node prepares nothing (None: it does). See `recover()`."""
        return self._refusal

    def _usable(self) -> None:
        if self._refusal is not None:
            raise ClaimError(f"gpudra is not preparing or unpreparing claims on this node: {self._refusal}")

    # --- prepare -------------------------------------------------------------------------------

    def _rebuild_from_cdi_specs(self, specs: Mapping[str, Path]) -> list[ckpt.ClaimEntry]:
        """A PrepareCompleted entry per claim spec (claim UID -> path), with the devices it names.

        Request names, namespace and name are not in a spec: such an entry holds its devices until
        the kubelet unprepares the claim (a repeated prepare reads the claim again). Admin access is
        (an annotation on the device). A whole GPU gets no time-slice record (recover() puts its GPU
        back to Default instead); undo stops an MPS daemon the spec's pipe mount names and destroys a
        partition gpudra created: its spec comes from the device name, and its live ids from the spec's
        MIG UUID where that device still exists."""
        entries = []
        for uid, path in specs.items():
            prefix = f"{uid}-"
            try:
                spec = cdi.read_spec(path)
            except GpudraError as err:
                log.error("CDI spec unreadable; left in place", extra={"claim": uid, "error": str(err)})
                continue
            devices = tuple(
                self._rebuilt_device(uid, name, share_id, cdi_device)
                for cdi_device in spec.devices
                for name, share_id in [_split_share(cdi_device.name.removeprefix(prefix))]
                if cdi_device.name.startswith(prefix) and name in self.devices
            )
            entries.append(
                ckpt.ClaimEntry(uid=uid, namespace="", name="", state="PrepareCompleted", devices=devices)
            )
        return entries

    def _rebuilt_device(
        self, uid: str, name: str, share_id: str | None, cdi_device: cdi.CdiDevice
    ) -> ckpt.PreparedDevice:
        gpu = self._gpu_of(name)
        mig = None
        sharing: ckpt.SharingRecord | None = None
        kind = self._type(name)
        if kind == "mig" and not cdi_device.admin_access and "uuid" not in self.devices[name]["attributes"]:
            mig = self._rebuilt_mig(name, gpu, cdi.visible_uuid(cdi_device))
        pipe = next(
            (
                m.host_path
                for m in cdi_device.container_edits.mounts
                if m.container_path == CONTAINER_PIPE_DIR
            ),
            None,
        )
        if pipe is not None:
            # The daemon's directory is the pipe's parent. A whole GPU the claim had alone ran in
            # EXCLUSIVE_PROCESS; the mode it had before is not in the spec: Default, the usual one.
            restore = 0 if kind == "gpu" and share_id is None else None
            sharing = ckpt.MpsRecord(strategy="MPS", root=Path(pipe).parent, restore_compute_mode=restore)
        device_name = _cdi_name(name, share_id)
        return ckpt.PreparedDevice(
            request_names=(),
            pool=self.node_name,
            device=name,
            cdi_device_ids=(cdi.claim_device_id(driver=self.driver, claim_uid=uid, device_name=device_name),),
            gpu_uuids=(gpu.uuid,),
            mig=mig,
            sharing=sharing,
            admin_access=cdi_device.admin_access,
            share_id=share_id,
        )

    def _rebuilt_mig(self, name: str, gpu: Gpu, mig_uuid: str | None) -> ckpt.MigRecord:
        record = ckpt.MigRecord(spec=self.mig.spec_of(name, self.devices[name], gpu))
        try:
            found = self.mig.existing(name, gpu, mig_uuid) if mig_uuid else None
        except GpudraError:
            found = None  # gone already: destroy finds nothing, or a bare GPU instance, at the placement
        if found is None:
            return record
        live = ckpt.MigLive(
            gpu_instance_id=found.gpu_instance_id,
            compute_instance_id=found.compute_instance_id,
            uuid=found.uuid,
        )
        return record.model_copy(update={"live": live})

    def prepare(self, ref: ClaimRef) -> tuple[ckpt.PreparedDevice, ...]:
        self._usable()
        with self._exclusive():
            done = self._checkpoint.claims.get(ref.uid)
            # An entry rebuilt from a CDI spec has no request names: prepare it again from the claim.
            if (
                done is not None
                and done.state == "PrepareCompleted"
                and _complete(done)
                and not self._spec_lost(done)
            ):
                return done.devices
        # Read without the node lock: a slow API server must not hold up the other instance's calls.
        claim = self.claims.get(namespace=ref.namespace, name=ref.name, uid=ref.uid)
        allocated = self.allocated_devices(claim, ref)
        # The GPU's key too: a whole-GPU claim and a partition or share claim of one GPU must not both
        # pass _refuse_taken at once, and claims sharing a GPU must see each other's time-slice.
        keys = [a.device for a in allocated]
        keys += [f"GPU:{a.gpu.uuid}" for a in allocated if not a.admin_access]
        with self._exclusive(), self._locked(keys):
            done = self._checkpoint.claims.get(ref.uid)
            if done is not None and done.state == "PrepareCompleted" and not self._spec_lost(done):
                if _complete(done):
                    return done.devices
                return self._complete_rebuilt(ref, done, allocated)
            if done is not None:
                # An earlier attempt stopped half way (its rollback failed, e.g. a MIG device in use)
                # or an unprepare did: finish undoing it first, so nothing is created twice.
                self._teardown(done)
            self._refuse_taken(ref, allocated)
            owned = self._owned_mig_uuids()
            sharing = self.sharing.plan(ref.uid, allocated, others=self._others(ref.uid))
            planned = tuple(
                self._planned(ref, a, owned=owned, sharing=r) for a, r in zip(allocated, sharing, strict=True)
            )
            entry = ckpt.ClaimEntry(
                uid=ref.uid, namespace=ref.namespace, name=ref.name, state="PrepareStarted", devices=planned
            )
            recorded = [entry]
            try:
                # Recorded before the GPU changes, so that a rollback or recover() knows what to undo.
                # A claim that changes nothing on the GPU (a whole GPU, no sharing config) has only its
                # CDI spec to lose: a crash before PrepareCompleted leaves a spec no entry names, which
                # recover() deletes, so its one save is the completion.
                if entry.changes_gpus:
                    self._record(entry)
                faults.reached("prepare-started")
                if any(d.mig is not None for d in planned):
                    entry = entry.with_state("PrepareStarted", devices=self._create_partitions(planned))
                    # The live ids, so that a rollback or recover() destroys exactly these instances.
                    recorded.append(entry)
                    self._record(entry)
                faults.reached("prepare-mig-created")
                for device, wanted in zip(entry.devices, allocated, strict=True):
                    if wanted.kind == "gpu" and not wanted.admin_access:
                        self.mig.use_whole(device.device, wanted.gpu)
                claim_devices = [
                    self._claim_device(a, d) for a, d in zip(allocated, entry.devices, strict=True)
                ]
                visible = {d.device: c.uuid for c, d in zip(claim_devices, entry.devices, strict=True)}
                self.sharing.apply(entry, visible=visible, others=self._others(ref.uid))
                faults.reached("prepare-applied")
                claim_devices = [
                    self._with_sharing(c, d, ref.uid)
                    for c, d in zip(claim_devices, entry.devices, strict=True)
                ]
                spec = cdi.build_claim_spec(
                    driver=self.driver, claim_uid=ref.uid, devices=claim_devices, dev_root=self.dev_root
                )
                cdi.write_spec(self.cdi_root, spec, claim_uid=ref.uid)
                faults.reached("prepare-cdi-written")
                # The toolkit's ID for the same GPU or MIG device (a MIG device created just now only has
                # its parent's) follows ours, so the runtime adds the driver libraries.
                with_toolkit = tuple(
                    d.model_copy(update={"cdi_device_ids": (*d.cdi_device_ids, *self.toolkit.device_ids(c))})
                    for d, c in zip(entry.devices, claim_devices, strict=True)
                )
                # Inside the rollback too: a prepare that cannot save its completion (disk full) is
                # a failed prepare, and must not leave the GPU configured and the device held.
                completed = entry.with_state("PrepareCompleted", devices=with_toolkit)
                recorded.append(completed)
                self._record(completed)
            except BaseException as err:
                # Memory holds an entry of this attempt once a save of it replaced the file (even if the
                # directory sync failed). Otherwise the first save changed nothing, or there was none
                # and the spec is all there is to remove.
                current = self._checkpoint.claims.get(ref.uid)
                try:
                    if current is not None and current in recorded:
                        self._teardown(current)
                    elif current is None:
                        cdi.delete_spec(self.cdi_root, driver=self.driver, claim_uid=ref.uid)
                except Exception as rollback:  # keep the first error; the entry stays for recover()
                    err.add_note(f"rolling back also failed: {rollback}")
                raise
            faults.reached("prepare-completed")
            return completed.devices

    def _create_partitions(self, planned: Sequence[ckpt.PreparedDevice]) -> tuple[ckpt.PreparedDevice, ...]:
        """Create the planned MIG devices; the devices with their live ids.

        On a failure the devices created so far are in no record yet: destroy them here (the caller's
        rollback finds the rest by their specs), then raise."""
        done: list[ckpt.PreparedDevice] = []
        try:
            for prepared in planned:
                if prepared.mig is None:
                    done.append(prepared)
                    continue
                done.append(
                    prepared.model_copy(update={"mig": self.mig.create(prepared.device, prepared.mig)})
                )
        except BaseException as err:
            for created in done:
                if created.mig is not None and created.mig.live is not None:
                    try:
                        self.mig.destroy(created.device, created.mig)
                    except GpudraError as cleanup:
                        err.add_note(f"destroying {created.device} again failed as well: {cleanup}")
            raise
        return tuple(done)

    def _complete_rebuilt(
        self, ref: ClaimRef, done: ckpt.ClaimEntry, allocated: Sequence[Allocated]
    ) -> tuple[ckpt.PreparedDevice, ...]:
        """A claim rebuilt from its CDI spec, completed from the claim: its devices keep running as
        they are (their MIG devices and specs are in use by the pod); only the request names come back."""
        requests = {_cdi_name(a.device, a.share_id): (a.base_request,) for a in allocated}
        if set(requests) != {_cdi_name(d.device, d.share_id) for d in done.devices}:
            named = ", ".join(sorted(_cdi_name(d.device, d.share_id) for d in done.devices))
            raise ClaimError(
                f"ResourceClaim {done.uid} was allocated {', '.join(sorted(requests))}, but its CDI spec "
                f"(the checkpoint was rebuilt from it) names {named}"
            )
        devices = tuple(
            d.model_copy(update={"request_names": requests[_cdi_name(d.device, d.share_id)]})
            for d in done.devices
        )
        self._record(
            done.model_copy(update={"namespace": ref.namespace, "name": ref.name, "devices": devices})
        )
        return devices

    def allocated_devices(self, claim: Mapping[str, Any], ref: ClaimRef) -> list[Allocated]:
        """This driver's results in `claim`, checked against the kubelet's request and this node."""
        uid = claim.get("metadata", {}).get("uid")
        if uid != ref.uid:
            raise ClaimError(
                f"ResourceClaim {ref.namespace}/{ref.name} has UID {uid}, not {ref.uid} "
                "(it was deleted and created again)"
            )
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise ClaimError(f"ResourceClaim {ref} is not allocated")
        results = [
            r for r in allocation.get("devices", {}).get("results", []) if r.get("driver") == self.driver
        ]
        if not results:
            raise ClaimError(f"ResourceClaim {ref} has no devices of driver {self.driver}")
        for result in results:
            if result.get("pool") != self.node_name:
                raise ClaimError(
                    f"device {result.get('device')} of ResourceClaim {ref} is in pool {result.get('pool')}, "
                    f"not in this node's pool {self.node_name}"
                )
            if result.get("device") not in self.devices:
                raise ClaimError(f"device {result.get('device')} of ResourceClaim {ref} is not on this node")
        types = {r["device"]: self._type(r["device"]) for r in results}
        configs = resolve_configs(allocation, driver=self.driver, device_types=types)
        return [
            Allocated(
                request=c.request,
                device=c.device,
                kind=types[c.device],
                gpu=self._gpu_of(c.device),
                config=c.config,
                config_entry=c.entry,
                admin_access=bool(r.get("adminAccess")),
                share_id=r.get("shareID") or None,
                consumed=_consumed_capacity(r, ref),
                memory_bytes=self._memory_of(c.device),
                uuid=self._published_uuid(c.device),
            )
            for c, r in zip(configs, results, strict=True)
        ]

    # --- unprepare -----------------------------------------------------------------------------

    def unprepare(self, ref: ClaimRef) -> None:
        """Undo prepare for `ref`; a claim never prepared (or already unprepared) is fine."""
        self._usable()
        with self._exclusive():
            entry = self._checkpoint.claims.get(ref.uid)
            if entry is None:
                cdi.delete_spec(self.cdi_root, driver=self.driver, claim_uid=ref.uid)
                return
            with self._locked(d.device for d in entry.devices):
                entry = self._checkpoint.claims.get(ref.uid)
                if entry is None:
                    return
                self._teardown(entry)

    def _teardown(self, entry: ckpt.ClaimEntry) -> None:
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
            self._forget(entry.uid)
            return
        if entry.state != "UnprepareStarted":
            try:
                self._record(entry.with_state("UnprepareStarted"))
            except ckpt.CheckpointNotSaved:
                current = self._checkpoint.claims.get(entry.uid)
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
        self._forget(entry.uid)

    def _undo(self, entry: ckpt.ClaimEntry) -> None:
        """Undo the side effects of `entry`: sharing, the MIG devices it created, then its CDI spec.
        Idempotent."""
        self.sharing.undo(entry, others=self._others(entry.uid))
        faults.reached("unprepare-undone")
        for device in entry.devices:
            if device.mig is not None:
                self.mig.destroy(device.device, device.mig)
        faults.reached("unprepare-mig-destroyed")
        cdi.delete_spec(self.cdi_root, driver=self.driver, claim_uid=entry.uid)
        faults.reached("unprepare-cdi-deleted")

    # --- queries -------------------------------------------------------------------------------

    def prepared_claims(self) -> dict[str, ckpt.ClaimEntry]:
        return dict(self._latest().claims)

    def mig_room(self) -> dict[str, tuple[str, int]]:
        """Per MIG-capable GPU (device name `gpu-<minor>`), the largest MIG profile that still fits
        beside the partitions prepared here (name, GPU slices; ("", 0) when none, or while the whole GPU is
        prepared). Allocations the node has not been asked to prepare yet are not in it."""
        occupied: dict[str, list[placement.Instance]] = {}
        whole: set[str] = set()
        for entry in self._latest().claims.values():
            for device in entry.devices:
                if device.admin_access or not device.gpu_uuids or device.device not in self.devices:
                    continue
                parent = device.gpu_uuids[0]
                if self._type(device.device) == "gpu":
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
        created = self._created(self._latest())
        return {name: live.uuid for entry, name, live in created if entry.state == "PrepareCompleted"}

    # --- helpers -------------------------------------------------------------------------------

    def _known_type(self, device: str) -> str | None:
        """The type of a device this node publishes now; None for one it no longer does."""
        published = self.devices.get(device)
        return None if published is None else published["attributes"]["type"].get("string")

    def _type(self, device: str) -> DeviceType:
        kind = self.devices[device]["attributes"]["type"].get("string")
        if kind not in ("gpu", "mig"):
            raise ClaimError(f"device {device} has unknown type {kind!r}")
        return kind  # type: ignore[return-value]

    def _gpu_of(self, device: str) -> Gpu:
        attributes = self.devices[device]["attributes"]
        uuid = (attributes.get("parentUUID") or attributes["uuid"]).get("string", "")
        return self.gpus[uuid]

    def _refuse_taken(self, ref: ClaimRef, allocated: Sequence[Allocated]) -> None:
        """Refuse a device another claim holds: the same device (unless both hold a share of it), or
        the same GPU in another form (its whole self, a share of it, a partition of it), which the
        scheduler's counters keep apart too."""
        mine = [(a.device, a.gpu.uuid, _form(a.kind, a.share_id)) for a in allocated if not a.admin_access]
        for other in self._checkpoint.claims.values():
            if other.uid == ref.uid:
                continue
            taken: set[str] = set()
            for held in other.devices:
                kind = self._known_type(held.device)
                if held.admin_access or kind is None:
                    continue
                held_form, held_gpu = _form(kind, held.share_id), held.gpu_uuids[:1]
                for device, gpu, form in mine:
                    if device == held.device and not (form == held_form == "share"):
                        taken.add(device)
                    # Two devices of one GPU exclude each other unless both are MIG partitions (their
                    # placements are checked when created). Not by form alone: where the API server drops
                    # allowMultipleAllocations, the scheduler hands out a shared device without a share
                    # ID, which looks like the whole GPU's form (Kubernetes 1.34/1.35, default gates).
                    elif device != held.device and held_gpu == (gpu,) and not form == held_form == "mig":
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
        self, ref: ClaimRef, device: Allocated, *, owned: set[str], sharing: ckpt.SharingRecord | None
    ) -> ckpt.PreparedDevice:
        own = cdi.claim_device_id(
            driver=self.driver, claim_uid=ref.uid, device_name=_cdi_name(device.device, device.share_id)
        )
        mig = None
        if device.kind == "mig" and not device.admin_access:
            mig = self.mig.plan(device, self.devices[device.device], owned=owned)
        return ckpt.PreparedDevice(
            request_names=(device.base_request,),
            pool=self.node_name,
            device=device.device,
            cdi_device_ids=(own,),  # the toolkit's ID follows once the device exists (see prepare)
            gpu_uuids=(device.gpu.uuid,),
            mig=mig,
            sharing=sharing,
            admin_access=device.admin_access,
            share_id=device.share_id,
        )

    def _claim_device(
        self, device: Allocated, prepared: ckpt.PreparedDevice | None = None
    ) -> cdi.ClaimDevice:
        """The CDI view of `device`; for a partition, of the MIG device that exists now."""
        gpu = device.gpu
        if device.kind == "gpu":
            return cdi.ClaimDevice(
                name=_cdi_name(device.device, device.share_id),
                gpu_minor=gpu.minor,
                uuid=gpu.uuid,
                admin_access=device.admin_access,
            )
        if prepared is not None and prepared.mig is not None and prepared.mig.live is not None:
            live = prepared.mig.live
            uuid, gi, ci = live.uuid, live.gpu_instance_id, live.compute_instance_id
        else:
            attributes = self.devices[device.device]["attributes"]
            mig_uuid = (
                attributes["uuid"].get("string") if "uuid" in attributes else self._live_uuid(device.device)
            )
            if mig_uuid is None:
                raise ClaimError(
                    f"device {device.device}: this MIG partition does not exist, since no claim on this node "
                    "uses it; admin access reaches partitions that another claim prepared"
                )
            existing = self.mig.existing(device.device, gpu, mig_uuid)
            uuid, gi, ci = existing.uuid, existing.gpu_instance_id, existing.compute_instance_id
        return cdi.ClaimDevice(
            name=_cdi_name(device.device, device.share_id),
            gpu_minor=gpu.minor,
            uuid=uuid,
            mig=self.mig.access(device.device, gpu, gpu_instance_id=gi, compute_instance_id=ci),
            admin_access=device.admin_access,
        )

    def _with_sharing(
        self, claim_device: cdi.ClaimDevice, prepared: ckpt.PreparedDevice, uid: str
    ) -> cdi.ClaimDevice:
        """The CDI view of a device with its sharing's env and mounts (the MPS pipe and shm)."""
        env, mounts = self.sharing.container_edits(prepared)
        return dataclasses.replace(
            claim_device, env={**claim_device.env, **env}, mounts=(*claim_device.mounts, *mounts)
        )

    def _others(self, uid: str) -> list[ckpt.ClaimEntry]:
        """Every claim of the checkpoint but `uid`: those that share its GPUs' settings."""
        return [e for e in self._checkpoint.claims.values() if e.uid != uid]

    def _memory_of(self, device: str) -> int | None:
        memory = self.devices[device]["capacity"].get("memory")
        return int(parse_quantity(memory["value"])) if memory is not None else None

    def _published_uuid(self, device: str) -> str | None:
        uuid = self.devices[device]["attributes"].get("uuid")
        return uuid.get("string") if uuid is not None else None

    def _visible(self, entry: ckpt.ClaimEntry) -> dict[str, str]:
        """The UUID CUDA sees, per device of `entry` that has one now (a partition once created)."""
        visible = {}
        for device in entry.devices:
            if device.mig is not None and device.mig.live is not None:
                visible[device.device] = device.mig.live.uuid
            elif device.device in self.devices and (uuid := self._published_uuid(device.device)):
                visible[device.device] = uuid
        return visible

    def _created(
        self, checkpoint: ckpt.Checkpoint | None = None
    ) -> Iterator[tuple[ckpt.ClaimEntry, str, ckpt.MigLive]]:
        """(entry, partition device, live ids) for every MIG device the checkpoint (memory's, unless
        given) says gpudra created."""
        for entry in (self._checkpoint if checkpoint is None else checkpoint).claims.values():
            for d in entry.devices:
                if d.mig is not None and d.mig.live is not None:
                    yield entry, d.device, d.mig.live

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

    def _record(self, entry: ckpt.ClaimEntry) -> None:
        self._save(lambda checkpoint: checkpoint.with_claim(entry))

    def _forget(self, uid: str) -> None:
        self._save(lambda checkpoint: checkpoint.without_claim(uid))

    def _save(self, edit: Callable[[ckpt.Checkpoint], ckpt.Checkpoint]) -> None:
        """Make the checkpoint with `edit` applied durable, then current: a failed save (disk full)
        changes nothing, so memory never claims a state the file does not hold.

        Group commit: while one thread writes and syncs the file, the edits of the others (the claims
        of one call, calls in parallel) wait, and the next writer saves them all at once. A caller
        returns only once a save that holds its edit is durable, and raises that save's error, so each
        gets what a save of its own would give, at one write and two fsyncs per batch, not per claim."""
        change = _Change(edit)
        with self._checkpoint_lock:
            self._waiting.append(change)
        with self._save_lock:
            if not change.done:
                self._save_waiting()
                if change.failure is not None:
                    raise change.failure
        if change.failure is not None:
            # Saved by another thread: an exception of its own for each caller, as they raise at once.
            raise type(change.failure)(str(change.failure)) from change.failure

    def _save_waiting(self) -> None:
        """Save every waiting edit in one write; call with the save lock held."""
        with self._checkpoint_lock:
            batch, self._waiting = self._waiting, []
        checkpoint = self._checkpoint  # only the holder of the save lock changes it, besides _catch_up
        for change in batch:
            checkpoint = change.edit(checkpoint)
        failure: ckpt.CheckpointNotSaved | ckpt.CheckpointNotDurable | None = None
        try:
            content = ckpt.save(self.checkpoint_path, checkpoint)
        except ckpt.CheckpointNotDurable as err:
            # The file was replaced, only its directory sync failed: a restart reads the new file,
            # so memory follows it (else a rollback would skip what the file says was recorded).
            content, failure = ckpt.encode(checkpoint), err
        except ckpt.CheckpointNotSaved as err:
            failure = err
        except BaseException as err:
            failure = ckpt.CheckpointNotSaved(f"cannot save the checkpoint {self.checkpoint_path}: {err!r}")
            raise
        finally:
            for change in batch:
                change.failure, change.done = failure, True
        if not isinstance(failure, ckpt.CheckpointNotSaved):
            with self._checkpoint_lock:
                self._checkpoint, self._on_disk = checkpoint, content

    def _exclusive(self) -> AbstractContextManager[None]:
        """The node lock for a call; the checkpoint file is caught up with as this process takes it."""
        return self._node.held(self._catch_up)

    def _catch_up(self) -> None:
        """Load the checkpoint again if another instance saved it since this one last read or wrote it.

        Runs as this process takes the node lock: none of its calls is in flight, and no other
        instance can save until it gives the lock up, so memory is then right for every call in
        between. The file's bytes are compared, not its inode, size and mtime: a file replaced by a
        rename may get the inode number just freed, the same size and the same clock tick, and the
        few kilobytes cost one read. A file that cannot be used fails the call (the kubelet retries):
        nothing is decided from a memory that may be stale."""
        content = ckpt.read(self.checkpoint_path)
        if content == self._on_disk:
            return
        self._checkpoint, self._on_disk = self._saved_elsewhere(content), content
        log.info(
            "checkpoint saved by another instance of the plugin; loaded again",
            extra={"prepared_claims": len(self._checkpoint.claims)},
        )

    def _saved_elsewhere(self, content: bytes | None) -> ckpt.Checkpoint:
        """The checkpoint in `content`, which another process saved; ClaimError when it is unusable."""

        def unusable(problem: str) -> ClaimError:
            return ClaimError(
                f"the checkpoint {self.checkpoint_path} changed behind this plugin instance and cannot "
                f"be used: {problem}"
            )

        rebuild = "restart the plugin to rebuild it from the CDI specs"
        if content is None:
            raise unusable(f"it was deleted; {rebuild}")
        try:
            loaded = ckpt.parse(content, source=self.checkpoint_path, boot_id=self.boot_id)
        except ckpt.CheckpointCorrupt as err:
            raise unusable(f"{err}; {rebuild}") from err
        except ckpt.CheckpointTooNew as err:  # a newer gpudra's instance took the node over
            raise unusable(str(err)) from err
        if loaded.stale_claims:
            raise unusable(f"it was written under another boot; {rebuild}")
        return loaded.checkpoint

    def _latest(self) -> ckpt.Checkpoint:
        """The checkpoint for readers outside the calls (metrics, health checks, claim usage): the file
        when another instance saved it since this one last did (read without the node lock: a save
        replaces it atomically), else memory. A file that cannot be used leaves memory the answer."""
        try:
            content = ckpt.read(self.checkpoint_path)
        except ckpt.CheckpointUnreadable:
            return self._checkpoint
        if content is None or content == self._on_disk:
            return self._checkpoint
        known = self._read_by_readers
        if known is None or known[0] != content:
            try:
                loaded = ckpt.parse(content, source=self.checkpoint_path, boot_id=self.boot_id)
            except GpudraError:
                return self._checkpoint
            if loaded.stale_claims:
                return self._checkpoint
            known = self._read_by_readers = (content, loaded.checkpoint)
        return known[1]

    @contextmanager
    def _locked(self, devices: Iterable[str]) -> Iterator[None]:
        names = sorted(set(devices))
        with self._checkpoint_lock:
            locks = [self._device_locks.setdefault(name, threading.Lock()) for name in names]
        with ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            yield


@dataclass
class _Change:
    """An edit of the checkpoint waiting for its save (`DeviceState._save`), and how that went."""

    edit: Callable[[ckpt.Checkpoint], ckpt.Checkpoint]
    done: bool = False
    failure: ckpt.CheckpointNotSaved | ckpt.CheckpointNotDurable | None = None


def _complete(entry: ckpt.ClaimEntry) -> bool:
    """False for an entry rebuilt from a CDI spec (see `_rebuild_from_cdi_specs`)."""
    return all(device.request_names for device in entry.devices) and bool(entry.devices)


def _form(kind: str, share_id: str | None) -> str:
    """How a claim holds a GPU: whole, one share of it, or a partition."""
    return "mig" if kind == "mig" else ("share" if share_id is not None else "whole")


def _cdi_name(device: str, share_id: str | None) -> str:
    """A claim's CDI device name after its UID: the device, and the share's ID for a share (a claim may
    hold two shares of one device, through two requests)."""
    return device if share_id is None else f"{device}-{share_id}"


def _consumed_capacity(result: Mapping[str, Any], ref: ClaimRef) -> dict[str, Fraction]:
    """A share's consumedCapacity by unqualified name; ClaimError for an amount that is no quantity."""
    consumed = {}
    for name, amount in (result.get("consumedCapacity") or {}).items():
        try:
            consumed[str(name).rsplit("/", 1)[-1]] = parse_quantity(str(amount))
        except ConfigError as err:
            raise ClaimError(
                f"ResourceClaim {ref}: consumedCapacity {name} of device {result.get('device')}: {err.reason}"
            ) from err
    return consumed


_SHARE_SUFFIX = re.compile(r"-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")


def _split_share(name: str) -> tuple[str, str | None]:
    """A CDI device name after the claim UID, split into the device and the share's ID (or None)."""
    match = _SHARE_SUFFIX.search(name)
    return (name[: match.start()], match.group(1)) if match else (name, None)


def _has_mps(entry: ckpt.ClaimEntry) -> bool:
    return any(isinstance(d.sharing, ckpt.MpsRecord) for d in entry.devices)
