"""Settling what a crash, a reboot or a dead MPS daemon left, around the state machine. I/O: CDI specs,
the checkpoint file; the claim store and GPU tools through DeviceState.

`recover` runs at start-up (and again while the checkpoint is refused): it loads the checkpoint, rolls
back a prepare or finishes an unprepare that a crash interrupted, whichever step it stopped at (each
step of gpudra.node.prepare is idempotent), adopts the processes prepared claims run, and removes what
no claim names. A damaged or missing checkpoint is rebuilt from the CDI specs on disk.

`restart_stopped_daemons` runs from a loop (gpudra.node.mps_keeper) while claims run: a sharing process
that no longer answers is started again with the limits its claim's records hold.

Both sit above `DeviceState` and call only the methods it keeps for them (its section "what recovery
calls", and `teardown`), not its claim store, sharing or MIG partitions; DeviceState never calls them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpudra.errors import GpudraError
from gpudra.node import cdi
from gpudra.node import checkpoint as ckpt
from gpudra.node.prepare import DeviceState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recovery:
    """What `recover()` found."""

    refused: str | None = None  # the checkpoint cannot be used: why (nothing was changed)
    damage: str | None = None  # the checkpoint was damaged: how
    copied_to: Path | None = None  # the copy kept of a damaged checkpoint (None: none could be made)
    rebuilt: int = 0  # claims rebuilt from their CDI specs after damage


@dataclass(frozen=True)
class DaemonCheck:
    """What `restart_stopped_daemons()` did."""

    restarted: tuple[ckpt.ClaimEntry, ...] = ()  # claims whose daemon was started again
    failed: tuple[tuple[ckpt.ClaimEntry, str], ...] = ()  # claims whose daemon could not be: why


def recover(state: DeviceState) -> Recovery:
    """Load the checkpoint and settle whatever a crash or reboot left half done.

    A damaged checkpoint is copied aside and replaced by one rebuilt from the CDI specs on disk, so the
    claims that still have a spec keep it and keep their GPUs. So is a missing checkpoint while claim
    specs exist (someone deleted it): nothing that might belong to a running claim is deleted. One
    written by a newer gpudra (CheckpointTooNew) or one that cannot be read (CheckpointUnreadable) leaves
    everything as it is; so does a state that cannot be saved (a full or read-only disk). Then the state
    refuses: every prepare and unprepare fails with the reason (the kubelet retries them) until a later
    `recover()` succeeds, after the operator acted. `recover()` is idempotent: a crash or a failure
    anywhere in it is settled by the next.

    It runs under the node lock: a call another instance has in flight finishes first, so no entry
    recovery settles, and no spec or MPS daemon it removes, belongs to a call still running.
    """
    try:
        with state.settling():
            return _recover(state)
    except (ckpt.CheckpointTooNew, ckpt.CheckpointUnreadable, ckpt.CheckpointNotSaved) as err:
        # A newer gpudra's file may record GPU state this one cannot undo, and an unreadable one may be
        # fine: touching either (or the CDI specs of the claims it holds) could break running pods.
        # Refuse, and say why, instead of guessing.
        state.refuse(str(err))
        return Recovery(refused=str(err))
    except (GpudraError, OSError) as err:
        state.refuse(f"cannot settle the checkpoint {state.checkpoint_path}: {err}")
        return Recovery(refused=state.refusal)


def _recover(state: DeviceState) -> Recovery:
    path, boot_id, driver, cdi_root = state.checkpoint_path, state.boot_id, state.driver, state.cdi_root
    specs = cdi.list_claim_specs(cdi_root, driver=driver)
    try:
        if not path.exists() and specs:
            raise ckpt.CheckpointCorrupt(
                f"checkpoint {path} is missing but {len(specs)} claim spec(s) of {driver} are in {cdi_root}"
            )
        loaded = ckpt.load(path, boot_id=boot_id)
    except ckpt.CheckpointCorrupt as err:
        # Keep a copy for diagnosis (best effort: a full disk must not stop the rebuild), then rebuild
        # from the CDI specs which claims hold which devices; the save below replaces the damaged file,
        # so a crash before it finds the same damage and does this again.
        copy = ckpt.keep_copy(path) if path.exists() else None
        rebuilt = _rebuild_from_cdi_specs(state, specs)
        log.error(
            "checkpoint damaged; prepared claims rebuilt from their CDI specs",
            extra={"error": str(err), "copied_to": str(copy), "claims_rebuilt": len(rebuilt)},
        )
        loaded = ckpt.LoadedCheckpoint(ckpt.Checkpoint.empty(boot_id).with_claims(rebuilt), {})
        recovery = Recovery(damage=str(err), copied_to=copy, rebuilt=len(rebuilt))
        _reset_rebuilt_gpus(state, rebuilt)
    else:
        recovery = Recovery()
    state.restore(loaded.checkpoint)
    for stale in loaded.stale_claims.values():  # the reboot reset the GPUs; only files remain
        state.discard(stale)
    # An unprepare may have deleted a completed claim's spec already: it is finished as well.
    for entry in state.unsettled():
        log.info("settling interrupted %s", entry.state, extra={"claim": entry.uid})
        try:
            state.teardown(entry)
        except GpudraError as err:
            # One broken GPU must not keep the plugin from serving the others; the entry stays
            # (UnprepareStarted, holding its devices) for the kubelet's retry to finish.
            log.error("cannot settle claim", extra={"claim": entry.uid, "error": str(err)})
    _adopt_processes(state)
    # A spec no entry names was left by a prepare this checkpoint already forgot, or by one that changes
    # no GPU and was killed before its one save: nothing uses it. Nor a half-written one.
    cdi.remove_spec_leftovers(cdi_root, driver=driver)
    known = {entry.uid for entry in state.recorded()}
    for uid in cdi.list_claim_specs(cdi_root, driver=driver).keys() - known:
        cdi.delete_spec(cdi_root, driver=driver, claim_uid=uid)
    state.resume()
    return recovery


def _reset_rebuilt_gpus(state: DeviceState, rebuilt: Sequence[ckpt.ClaimEntry]) -> None:
    """A spec does not say which time-slice a claim's GPU was given, and a rebuilt entry has no record of
    one: put those GPUs back to their defaults, so that they run with what the records say."""
    uuids = sorted(
        {
            d.gpu_uuids[0]
            for e in rebuilt
            for d in e.devices
            if not d.admin_access and d.gpu_uuids and state.published.known_type(d.device) == "gpu"
        }
    )
    try:
        state.reset_sharing(uuids)
    except GpudraError as err:  # a time-slice is no reason to refuse every claim
        log.error("cannot reset the sharing settings of rebuilt claims", extra={"error": str(err)})


def _adopt_processes(state: DeviceState) -> None:
    """Keep the processes (MPS daemons) of prepared claims (they outlived the plugin, their clients are
    running), start again one that died, and stop any no claim of the checkpoint names."""
    for entry in state.recorded():
        if not state.runs_process(entry):
            continue
        try:
            if state.adopt(entry):
                log.warning("sharing process had stopped; started again", extra={"claim": entry.uid})
        except GpudraError as err:
            log.error("cannot adopt the sharing process", extra={"claim": entry.uid, "error": str(err)})
    try:
        stopped = state.stop_unrecorded()
    except GpudraError as err:  # a stray daemon must not keep the plugin from serving claims
        log.error("cannot stop the sharing processes no prepared claim uses", extra={"error": str(err)})
        stopped = []
    for root in stopped:
        log.warning("stopped a sharing process no prepared claim uses", extra={"directory": str(root)})


# --- a damaged checkpoint, rebuilt from the CDI specs -----------------------------------------------


def _rebuild_from_cdi_specs(state: DeviceState, specs: Mapping[str, Path]) -> list[ckpt.ClaimEntry]:
    """A PrepareCompleted entry per claim spec (claim UID -> path), with the devices it names that this
    node publishes (`DeviceState.rebuilt_device`).

    Request names, namespace and name are not in a spec: such an entry holds its devices until the
    kubelet unprepares the claim (a repeated prepare reads the claim again). Admin access is (an
    annotation on the device). A whole GPU gets no time-slice record (recover() puts its GPU back to
    Default instead); undo stops an MPS daemon the spec's pipe mount names and destroys a partition
    gpudra created."""
    entries = []
    for uid, path in specs.items():
        prefix = f"{uid}-"
        try:
            spec = cdi.read_spec(path)
        except GpudraError as err:
            log.error("CDI spec unreadable; left in place", extra={"claim": uid, "error": str(err)})
            continue
        devices = tuple(
            state.rebuilt_device(uid, name, share_id, cdi_device)
            for cdi_device in spec.devices
            for name, share_id in [cdi.split_device_name(cdi_device.name.removeprefix(prefix))]
            if cdi_device.name.startswith(prefix) and name in state.published
        )
        entries.append(
            ckpt.ClaimEntry(uid=uid, namespace="", name="", state="PrepareCompleted", devices=devices)
        )
    return entries


# --- processes while claims run ----------------------------------------------------------------------


def restart_stopped_daemons(state: DeviceState) -> DaemonCheck:
    """Start again, with its recorded limits, the MPS daemon of each prepared claim that no longer
    answers: it died, or it lived in the container of a plugin pod that is gone (a rolling update: the
    new pod adopted it, then the old pod's processes died with its container).

    Only claims whose sharing runs a process are checked (for MPS: whether the daemon its record names
    still runs, read in /proc, no tool run and nothing the claim's containers can write); with none,
    nothing is read and no lock is taken. The check only reads, so it runs without the node lock. A
    restart runs under the node lock and the claim's own device locks (those of this process's calls),
    from the checkpoint as it is then: a claim that either instance unprepared meanwhile, one being
    prepared or unprepared, or one whose entry changed is left alone (a changed one is looked at again
    next time). A claim that fails does not keep the others from being started."""
    if state.refusal is not None:
        return DaemonCheck()  # the checkpoint loop settles the state first
    candidates = [e for e in state.prepared_claims().values() if state.runs_process(e)]
    restarted: list[ckpt.ClaimEntry] = []
    failed: list[tuple[ckpt.ClaimEntry, str]] = []
    for candidate in candidates:
        if state.answers(candidate):
            continue
        try:
            if state.restart(candidate):
                restarted.append(candidate)
        except (GpudraError, OSError) as err:
            failed.append((candidate, str(err)))
    return DaemonCheck(restarted=tuple(restarted), failed=tuple(failed))
