"""The fault suite's auditor: reads a node's files and lists every broken invariant. Reads only.

What it reads: the checkpoint file, the CDI root, and the simulator's state of the GPUs. What must
hold at every instant, even right after a SIGKILL, because prepare writes the checkpoint entry before
each side effect and unprepare removes it only after the last one is undone:

 1. the checkpoint loads (envelope, checksum, schema, this gpudra's version, this boot);
 2. every claim spec in the CDI root belongs to a checkpoint entry and names exactly that entry's
    devices, and every PrepareCompleted entry has its spec. A claim that changes no GPU has one save
    per call (see gpudra.node.prepare), so right after a kill (not settled) its spec may have no entry
    yet (a prepare) or its PrepareCompleted entry no spec any more (an unprepare, or the rollback of a
    prepare that could not save);
 3. no device and no GPU is held by two claims (admin access shares by design);
 4. every GPU's time-slice is what the checkpoint says: the recorded interval under a PrepareCompleted
    entry, Default where no claim holds the GPU, either of the two under an entry that is being
    prepared or unprepared. An entry rebuilt from its CDI spec after a damaged checkpoint (no request
    names) does not know the interval its claim asked for: any is accepted there. The compute mode is
    EXCLUSIVE_PROCESS under a PrepareCompleted entry with MPS on a whole GPU, either that or Default
    under one being prepared or unprepared, Default everywhere else;
 6. every MPS daemon that runs is the one a checkpoint entry records: in that entry's directory and
    carrying its token (the mark the plugin put in its environment), one per directory; none runs for
    a claim that is not recorded, and every PrepareCompleted entry's daemon runs;
 5. every GPU instance on the card is one a checkpoint entry records (profile and placement, and its
    MIG UUID where the live ids were saved; under an entry being prepared or unprepared it may also
    be a GPU instance without its compute instance, caught between the two steps), and every MIG
    device a PrepareCompleted entry records exists with its UUID: no orphan instance, none forgotten;

`settled=True` adds what recover() and a completed call promise: no entry is left half prepared or
half unprepared, the card holds exactly the MIG devices the checkpoint records, and no temporary
file of an atomic write (which a kill in the middle of one leaves) is left in the CDI root or the
state directory.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from gpudra.api.v1beta1 import TIMESLICE
from gpudra.errors import GpudraError
from gpudra.node import cdi
from gpudra.node import checkpoint as ckpt
from gpudra.node.sharing.mps_processes import TOKEN_VARIABLE
from gpudra.sim import state as sim_state
from tests.faults.node import BOOT, SimNode
from tests.unit.claims import DRIVER

_EXCLUSIVE_PROCESS = 3  # NVML's compute mode


def audit(node: SimNode, *, settled: bool, boot: str = BOOT) -> list[str]:
    """Every broken invariant, one line each; [] when the node is consistent (in the boot `boot`)."""
    try:
        loaded = ckpt.load(node.checkpoint_path, boot_id=boot)
    except (GpudraError, OSError) as err:
        return [f"the checkpoint does not load: {err}"]
    findings = [f"claim {uid} recorded under another boot" for uid in loaded.stale_claims]
    entries = loaded.checkpoint.claims
    findings += _specs(node, entries, settled=settled)
    findings += _exclusive(entries)
    findings += _gpus(node, entries)
    findings += _mig(node, entries, settled=settled)
    findings += _mps(node, entries)
    if settled:
        findings += [f"temporary file left behind: {path}" for path in leftover_temp_files(node)]
        findings += [
            f"claim {entry.uid} left {entry.state}"
            for entry in entries.values()
            if entry.state != "PrepareCompleted"
        ]
    return findings


def leftover_temp_files(node: SimNode) -> list[str]:
    return sorted(
        str(path) for directory in (node.cdi_root, node.state_dir) for path in directory.glob(".*.tmp")
    )


def _specs(node: SimNode, entries: dict[str, ckpt.ClaimEntry], *, settled: bool) -> list[str]:
    findings = []
    specs = cdi.list_claim_specs(node.cdi_root, driver=DRIVER)
    for uid, path in sorted(specs.items()):
        entry = entries.get(uid)
        if entry is None:
            if settled:
                findings.append(f"CDI spec of claim {uid} has no checkpoint entry (leaked)")
            continue
        try:
            names = set(cdi.read_spec(path).device_names())
        except GpudraError as err:
            findings.append(str(err))
            continue
        expected = {f"{uid}-{cdi.device_name(device.device, device.share_id)}" for device in entry.devices}
        if names != expected:
            findings.append(f"CDI spec of claim {uid} names {sorted(names)}, its entry {sorted(expected)}")
    for uid, entry in sorted(entries.items()):
        if entry.state == "PrepareCompleted" and uid not in specs and (settled or entry.changes_gpus):
            findings.append(f"claim {uid} is PrepareCompleted but has no CDI spec")
    return findings


def _exclusive(entries: dict[str, ckpt.ClaimEntry]) -> list[str]:
    holders: dict[str, set[str]] = defaultdict(set)
    partitioned: dict[str, set[str]] = defaultdict(set)  # GPU -> claims holding partitions of it
    for entry in entries.values():
        for device in entry.devices:
            if not device.admin_access:
                holders[f"device {device.device}"].add(entry.uid)
                for gpu in device.gpu_uuids:
                    if "-mig-" in device.device:  # partitions of one GPU may serve several claims
                        partitioned[gpu].add(entry.uid)
                    else:
                        holders[f"GPU {gpu}"].add(entry.uid)
    findings = [
        f"{what} held by {len(uids)} claims: {sorted(uids)}"
        for what, uids in holders.items()
        if len(uids) > 1
    ]
    for gpu, uids in partitioned.items():
        whole = holders.get(f"GPU {gpu}", set())
        if whole and (uids | whole) != whole:
            findings.append(f"GPU {gpu} held whole by {sorted(whole)} and in partitions by {sorted(uids)}")
    return findings


def _mig(node: SimNode, entries: dict[str, ckpt.ClaimEntry], *, settled: bool) -> list[str]:
    recorded: dict[
        tuple[str, int, int], tuple[str | None, str]
    ] = {}  # (GPU, start, profile) -> (UUID, state)
    for entry in entries.values():
        for device in entry.devices:
            if device.mig is not None:
                spec, live = device.mig.spec, device.mig.live
                key = (spec.gpu_uuid, spec.placement_start, spec.profile_id)
                recorded[key] = (live.uuid if live else None, entry.state)
    machine = sim_state.StateFile(node.state_file).read()
    on_card: dict[tuple[str, int, int], str] = {
        (gpu.uuid, gi.start, gi.profile_id): ",".join(ci.uuid for ci in gi.compute_instances)
        for gpu in machine.gpus
        for gi in gpu.gpu_instances
    }
    findings = []
    for key, uuid in sorted(on_card.items()):
        if key not in recorded:
            findings.append(f"GPU instance {key} on the card is in no checkpoint entry (orphan)")
        elif uuid == "" and recorded[key][1] != "PrepareCompleted":
            continue  # a GPU instance between its compute instance and itself, being created or destroyed
        elif recorded[key][0] is not None and recorded[key][0] != uuid:
            findings.append(f"GPU instance {key} has MIG device {uuid!r}, the checkpoint {recorded[key][0]}")
    for key, (uuid, state) in sorted(recorded.items()):
        if key not in on_card and (state == "PrepareCompleted" or settled):
            findings.append(f"MIG device {key} of a {state} entry ({uuid}) is not on the card")
    return findings


def _gpus(node: SimNode, entries: dict[str, ckpt.ClaimEntry]) -> list[str]:
    allowed: dict[str, set[int]] = {}  # GPU UUID -> acceptable time-slice levels
    for entry in entries.values():
        rebuilt = not all(device.request_names for device in entry.devices)
        for device in entry.devices:
            if device.admin_access or not isinstance(device.sharing, ckpt.TimeSlicingRecord):
                continue
            recorded = TIMESLICE[device.sharing.interval]
            levels = {recorded} if entry.state == "PrepareCompleted" else {recorded, TIMESLICE["Default"]}
            for uuid in device.gpu_uuids:
                allowed[uuid] = set(TIMESLICE.values()) if rebuilt else levels
    exclusive: dict[str, set[int]] = {}  # GPU UUID -> acceptable compute modes
    for entry in entries.values():
        for device in entry.devices:
            if isinstance(device.sharing, ckpt.MpsRecord) and device.sharing.restore_compute_mode is not None:
                modes = {_EXCLUSIVE_PROCESS} if entry.state == "PrepareCompleted" else {0, _EXCLUSIVE_PROCESS}
                exclusive.update((uuid, modes) for uuid in device.gpu_uuids)
    machine = sim_state.StateFile(node.state_file).read()
    findings = []
    for gpu in machine.gpus:
        levels = allowed.get(gpu.uuid, {TIMESLICE["Default"]})
        if gpu.timeslice not in levels:
            findings.append(
                f"GPU {gpu.uuid} has time-slice {gpu.timeslice}, the checkpoint says {sorted(levels)}"
            )
        modes = exclusive.get(gpu.uuid, {0})
        if gpu.compute_mode not in modes:
            findings.append(
                f"GPU {gpu.uuid} has compute mode {gpu.compute_mode}, the checkpoint says {modes}"
            )
    return findings


def _mps(node: SimNode, entries: dict[str, ckpt.ClaimEntry]) -> list[str]:
    recorded: dict[Path, tuple[str | None, ckpt.ClaimEntry]] = {}  # daemon directory -> token, entry
    for entry in entries.values():
        for device in entry.devices:
            if isinstance(device.sharing, ckpt.MpsRecord):
                recorded[device.sharing.root] = (device.sharing.token, entry)
    running: dict[Path, list[int]] = defaultdict(list)
    findings = []
    for daemon in sim_state.StateFile(node.state_file).read().mps_daemons:
        environment = _environment(daemon.pid)
        if environment is None:
            continue  # exited (a daemon killed by signal stays in the card's list)
        root = Path(daemon.pipe_directory).parent
        running[root].append(daemon.pid)
        if root not in recorded:
            findings.append(f"an MPS daemon runs in {root}, which no checkpoint entry records (orphan)")
        elif environment.get(TOKEN_VARIABLE) != recorded[root][0]:
            findings.append(f"the MPS daemon in {root} does not carry its entry's token")
    findings += [
        f"{len(pids)} MPS daemons run in {root}: {pids}" for root, pids in running.items() if len(pids) > 1
    ]
    findings += [
        f"claim {entry.uid} is PrepareCompleted but its MPS daemon in {root} does not run"
        for root, (_, entry) in sorted(recorded.items())
        if entry.state == "PrepareCompleted" and root not in running
    ]
    return findings


def _environment(pid: int) -> dict[str, str] | None:
    """The environment process `pid` was started with; None when it does not run (or is a zombie)."""
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
            return None
        pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return dict(os.fsdecode(pair).partition("=")[::2] for pair in pairs if pair)
