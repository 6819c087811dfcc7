"""The kubelet plugin's record of what it did to each claim. I/O: the checkpoint file.

The plugin writes a claim's entry *before* its first side effect and again when prepare completes,
so that after a crash at any step the entry says what may exist on the node and can be rolled back
or completed:

    PrepareStarted    written before any side effect. `devices` holds what is being prepared; a MIG
                      record holds only its `spec` (gpu_uuid, profile_id, placement_start), the only
                      identity known before the instance exists, by which recovery finds it. Its
                      `live` part (GPU and compute instance IDs, MIG UUID) is None until the
                      instance has been created.
    PrepareCompleted  every device is configured and the CDI spec is written; a repeated
                      NodePrepareResources returns the recorded CDI IDs.
    UnprepareStarted  teardown has begun; recovery finishes it. The entry is removed when done.

File format: `{"checksum": "<sha256 hex>", "data": {...}}` where the checksum covers the canonical
JSON (sorted keys, no whitespace) of `data` *as it is in the file*, not of the model re-serialised.
So a later gpudra that adds a field with a default still reads older files, and a file is only
called corrupt when its bytes really changed (NVIDIA's driver checksums the re-marshalled struct
and crash-looped on upgrade, issue #1080). This gpudra writes `data` in that canonical form (older
ones indented it; a reader parses the file, so both read alike).

Compatibility. `data.version` is the number of the format of `data`; the envelope (the two keys
`checksum` and `data`, the checksum rule) is the same in every version. This gpudra writes VERSION.

 1. A reader reads every version up to its own. An older version is read with that version's
    reader (`_READERS`), which converts it in memory to the current models; the next `save` writes
    it in the current version.
 2. Within a version, fields are only added, never removed, renamed or given another meaning, and
    only when an older reader of that version may drop them without losing hardware state: the
    field has a default (so files written before it still load), and nothing it records has to be
    undone on the node. Anything an older reader would need to undo means a new version, so that
    such a reader refuses the file instead of forgetting the state:
      - version 1: whole GPUs, time-slice records. No `mig` record, no MPS `sharing` record (its
        reader calls a file holding one corrupt: no version-1 writer made one);
      - version 2: adds `mig` records (MIG devices gpudra created and must destroy). No MPS record
        (its reader calls a file holding one corrupt);
      - version 3: adds MPS `sharing` records (control daemons, their directories and the compute mode
        to restore) and `share_id` (one allocation of a device that several claims share). Later added
        within it: an MPS record's `token` (an older reader of version 3, which would drop it, finds the
        daemon by its pipe directory instead).
 3. A reader that finds a newer version, or a file of a version it reads with fields it does not
    know (pydantic's `extra_forbidden`, at any depth, even alongside other schema errors), refuses
    it: `load` raises CheckpointTooNew, naming the file, the version found, the version this gpudra
    reads, and what the operator can do (upgrade gpudra back to the release that wrote it, or clean
    up the node by hand and move the file aside). Such a file is never copied aside nor overwritten;
    the plugin refuses every claim until it is gone. (A reader cannot check that an unknown field
    obeys rule 2, so it does not drop it.)
 4. A damaged file (not JSON, not the envelope, checksum mismatch, a missing or non-integer
    version, or a schema violation other than unknown fields) is corrupt: `load` raises
    CheckpointCorrupt, and the caller may rebuild the state and replace it (`keep_copy` first).

Boot ID: GPU and compute instances, MPS daemons, compute modes and time-slices do not survive a
reboot, so entries written under another boot describe nothing that still exists on the GPUs.
`load` hands them back apart, as `stale_claims`, with an empty checkpoint for this boot: the caller
deletes their leftovers that do survive (CDI spec files, MPS directories) and then saves.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpudra.atomic_file import NotDurable, write_atomically
from gpudra.errors import GpudraError

log = logging.getLogger(__name__)

VERSION: Literal[3] = 3  # the format version this gpudra writes, and the newest it reads

ClaimState = Literal["PrepareStarted", "PrepareCompleted", "UnprepareStarted"]
TimeSliceInterval = Literal["Default", "Short", "Medium", "Long"]


class CheckpointUnreadable(GpudraError):
    """The checkpoint exists but cannot be read (permissions, I/O error, a directory in its place).

    The file may be fine, so it is neither copied aside nor replaced."""


class CheckpointCorrupt(GpudraError):
    """The checkpoint is damaged (truncated, garbage, bad checksum, schema violation): the caller
    rebuilds the state from what is on disk (see `keep_copy`)."""


class CheckpointNotSaved(GpudraError):
    """The checkpoint could not be written (disk full, read-only, I/O error); the file is unchanged."""


class CheckpointNotDurable(GpudraError):
    """The checkpoint was replaced, but syncing its directory failed.

    A restart in this boot reads the new file, so the caller's memory must follow it. Only a power
    cut could bring the old file back, and that reboots the node, whose new boot ID makes `load`
    discard every entry anyway: what matters is that the error is reported."""


class CheckpointTooNew(GpudraError):
    """The checkpoint was written by a newer gpudra (a newer version, or fields this one does not know).

    The file may record state on the GPUs that this gpudra cannot undo: never replace nor
    overwrite it. The message says what the operator can do.
    """

    def __init__(self, path: Path, *, version: int, unknown_fields: Sequence[str] = ()) -> None:
        self.path = path
        self.version = version
        self.reads_version = VERSION
        self.unknown_fields = tuple(unknown_fields)
        if self.unknown_fields:
            found = (
                f"has format version {version} but fields this gpudra does not know "
                f"({', '.join(self.unknown_fields)})"
            )
        else:
            found = f"has format version {version}"
        super().__init__(
            f"checkpoint {path} {found}: it was written by a newer gpudra; this gpudra reads format "
            f"version {VERSION} and older. It may record GPU state (MIG instances, MPS daemons) that "
            "this gpudra cannot undo, so the file is left untouched and the plugin does not start. "
            "Either upgrade gpudra back to the release that wrote it (it settles its own checkpoint), "
            "or clean up by hand what the file lists for each claim (CDI specs, MIG instances, MPS "
            "daemons, time-slices) and then move the file aside."
        )


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MigSpec(_Record):
    """What identifies a MIG device before it exists; recovery finds the instance by it."""

    gpu_uuid: str = Field(min_length=1)  # the parent GPU
    profile_id: int = Field(ge=0)
    placement_start: int = Field(ge=0)


class MigLive(_Record):
    """What exists of a MIG device only once it has been created."""

    gpu_instance_id: int = Field(ge=0)
    compute_instance_id: int = Field(ge=0)
    uuid: str = Field(min_length=1)  # "MIG-…"; changes every time the instance is re-created


class MigRecord(_Record):
    """A MIG device the claim creates on demand: `live` is None until the instance exists."""

    spec: MigSpec
    live: MigLive | None = None


class TimeSlicingRecord(_Record):
    """The compute-policy time-slice set on the claim's full GPUs; unprepare resets it to Default."""

    strategy: Literal["TimeSlicing"]
    interval: TimeSliceInterval


class MpsRecord(_Record):
    """One device served by the claim's MPS control daemon, and what prepare set up for it.

    Every MPS device of a claim names the same daemon: one daemon per claim, whose directory `root`
    holds `pipe` (CUDA_MPS_PIPE_DIRECTORY), `log` and `shm`. The pipe directory is the claim's containers'
    to write, so the daemon is not found through it but by `token`, a secret the plugin puts in the
    daemon's environment (gpudra.node.sharing.mps_processes), recorded here before the daemon exists.
    A record without one (written before tokens, or rebuilt from a CDI spec) finds its daemon by the
    pipe directory named in its environment, in the plugin's mount namespace.
    """

    strategy: Literal["MPS"]
    root: Path  # <state dir>/mps/<daemon id>
    token: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    active_thread_percentage: int | None = Field(default=None, ge=1, le=100)
    pinned_memory_limit: int | None = Field(default=None, ge=2**20)  # bytes, for this device
    # Set to EXCLUSIVE_PROCESS on prepare (a whole GPU the claim has alone); put back on unprepare.
    restore_compute_mode: int | None = Field(default=None, ge=0)


SharingRecord = Annotated[TimeSlicingRecord | MpsRecord, Field(discriminator="strategy")]


class PreparedDevice(_Record):
    """One allocated device of a claim and what preparing it touches."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    gpu_uuids: tuple[str, ...]  # the physical GPUs touched (for MIG: the parent)
    mig: MigRecord | None = None
    sharing: SharingRecord | None = None
    admin_access: bool = False
    # The allocation's shareID, for a device that several claims share (allowMultipleAllocations).
    share_id: str | None = None


class ClaimEntry(_Record):
    """A claim the plugin has started to prepare (or to unprepare)."""

    uid: str = Field(min_length=1)
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...]

    @property
    def changes_gpus(self) -> bool:
        """Whether preparing the claim changes a GPU (MIG devices, sharing), which unprepare must undo.
        A claim that does not has only its CDI spec to lose, and saves the checkpoint once per call."""
        return any(d.mig is not None or d.sharing is not None for d in self.devices)

    def with_state(
        self, state: ClaimState, *, devices: tuple[PreparedDevice, ...] | None = None
    ) -> ClaimEntry:
        """This entry moved to `state`, with `devices` replaced when given."""
        return self.model_validate(
            {**self.model_dump(), "state": state, "devices": self.devices if devices is None else devices}
        )


class Checkpoint(_Record):
    """All claims this node's plugin has prepared or is preparing, keyed by claim UID."""

    version: Literal[3]
    boot_id: str = Field(min_length=1)
    claims: dict[str, ClaimEntry]

    @model_validator(mode="after")
    def _keys_are_uids(self) -> Checkpoint:
        for key, entry in self.claims.items():
            if key != entry.uid:
                raise ValueError(f"claims[{key!r}] holds the entry of claim {entry.uid!r}")
        return self

    @classmethod
    def empty(cls, boot_id: str) -> Checkpoint:
        return cls(version=VERSION, boot_id=boot_id, claims={})

    def with_claim(self, entry: ClaimEntry) -> Checkpoint:
        """A copy with `entry` added, or replacing the entry of the same claim."""
        return Checkpoint(
            version=self.version, boot_id=self.boot_id, claims={**self.claims, entry.uid: entry}
        )

    def with_claims(self, entries: Sequence[ClaimEntry]) -> Checkpoint:
        """A copy with every entry of `entries` added (or replacing the entry of the same claim)."""
        claims = {**self.claims, **{entry.uid: entry for entry in entries}}
        return Checkpoint(version=self.version, boot_id=self.boot_id, claims=claims)

    def without_claim(self, uid: str) -> Checkpoint:
        """A copy without the claim `uid` (the same claims when it is not there)."""
        claims = {key: entry for key, entry in self.claims.items() if key != uid}
        return Checkpoint(version=self.version, boot_id=self.boot_id, claims=claims)


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What `load` found: the checkpoint for this boot, and the claims recorded under an earlier boot."""

    checkpoint: Checkpoint
    stale_claims: dict[str, ClaimEntry]


def load(path: Path, *, boot_id: str) -> LoadedCheckpoint:
    """Read the checkpoint at `path`; a missing file is an empty checkpoint.

    An older format version is converted to the current models (see Compatibility in the module
    docstring). Raises CheckpointTooNew when a newer gpudra wrote the file (a newer version, or
    fields this one does not know): never copy aside or overwrite it. Raises CheckpointCorrupt naming
    the file when it is damaged (bad JSON, checksum mismatch, missing version, schema violation); the
    caller decides whether to rebuild and replace it. Errors reading the file (permissions, I/O, a
    directory at `path`) raise CheckpointUnreadable: the file may be fine.
    """
    return parse(read(path), source=path, boot_id=boot_id)


def read(path: Path) -> bytes | None:
    """The checkpoint file's bytes, None when there is none; CheckpointUnreadable as `load` says."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CheckpointUnreadable(
            f"cannot read the checkpoint {path}: {err.strerror}; nothing was changed. Fix the path or "
            "its permissions and restart the plugin"
        ) from err


def parse(content: bytes | None, *, source: Path, boot_id: str) -> LoadedCheckpoint:
    """`load` for the bytes `read` returned from `source`."""
    if content is None:
        return LoadedCheckpoint(Checkpoint.empty(boot_id), {})
    checkpoint = _decode(content, source=source)
    if checkpoint.boot_id != boot_id:
        return LoadedCheckpoint(Checkpoint.empty(boot_id), checkpoint.claims)
    return LoadedCheckpoint(checkpoint, {})


def encode(checkpoint: Checkpoint) -> bytes:
    """The file's bytes for `checkpoint` (the same checkpoint always gives the same bytes).

    `data` is written in its canonical form, the very text the checksum covers: one JSON encoding per
    save, by the json module's C encoder (an indented one runs the pure-Python encoder, four times the
    CPU of the whole encoding on every save). Readers parse the file, so its layout is free."""
    canonical = _canonical(checkpoint.model_dump(mode="json"))
    return f'{{"checksum": "{_digest(canonical)}", "data": {canonical}}}\n'.encode()


def save(path: Path, checkpoint: Checkpoint) -> bytes:
    """Replace the checkpoint at `path` atomically and durably; the directory must exist. Returns the
    bytes written (`encode`).

    A file-system error (a full disk, a read-only state directory) raises CheckpointNotSaved, a
    GpudraError naming the file and the cause, which the kubelet shows in the pod's events; the file
    is unchanged. CheckpointNotDurable says the file was replaced but its directory not synced."""
    content = encode(checkpoint)
    try:
        write_atomically(path, content, mode=0o600)
    except NotDurable as err:
        raise CheckpointNotDurable(
            f"the checkpoint {path} was replaced, but syncing its directory failed: {err.strerror or err}"
        ) from err
    except OSError as err:
        raise CheckpointNotSaved(f"cannot save the checkpoint {path}: {err.strerror or err}") from err
    return content


def keep_copy(path: Path) -> Path | None:
    """Copy a damaged checkpoint to `<name>.corrupt-<UTC time>` for diagnosis and return the copy, or
    None when it cannot be written (a full disk must not stop the rebuild that replaces the file).

    A copy, not a move: the damaged file stays in place until the rebuilt checkpoint replaces it, so
    a crash in between finds the same damage and rebuilds again instead of finding no checkpoint."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    try:
        write_atomically(target, path.read_bytes(), mode=0o600)
    except (OSError, NotDurable) as err:
        log.error("damaged checkpoint not copied aside", extra={"error": str(err), "copy": str(target)})
        return None
    return target


def current_boot_id(proc_root: Path = Path("/proc")) -> str:
    """The kernel's boot ID, which changes at every boot."""
    source = proc_root / "sys/kernel/random/boot_id"
    try:
        boot_id = source.read_text().strip()
    except OSError as e:
        raise GpudraError(f"cannot read the boot ID from {source}: {e.strerror}") from e
    if not boot_id:
        raise GpudraError(f"the boot ID in {source} is empty")
    return boot_id


def _checksum(data: Any) -> str:
    return _digest(_canonical(data))


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()


# How to read each format version this gpudra reads, from 1 to VERSION. The reader of VERSION
# validates against the models above. When VERSION goes up, the models of the old version are kept
# (renamed `_V<n>…`, never changed again) and its reader validates against them and converts the
# result to the current models, so that the next `save` writes the file in the current version.
def _read_older(version: int) -> Callable[[dict[str, Any]], Checkpoint]:
    """Versions 1 and 2 are version 3 without MPS records and share ids (and 1 also without MIG
    records): the same models, then the current version. No writer of those versions made such a
    record, so one in the file means it was changed by hand or damaged."""

    def read(data: dict[str, Any]) -> Checkpoint:
        try:
            checkpoint = Checkpoint.model_validate({**data, "version": VERSION})
        except ValidationError as err:
            # Unknown fields mean a newer gpudra (rule 3), even beside an impossible record; unknown
            # fields inside an MPS record are that record's, which no writer of the version made.
            if any(e["type"] == "extra_forbidden" and "sharing" not in e["loc"] for e in err.errors()):
                raise
            _refuse_impossible_records(data, version)
            raise
        _refuse_impossible_records(data, version)
        return checkpoint

    return read


def _refuse_impossible_records(data: dict[str, Any], version: int) -> None:
    claims = data.get("claims")
    for uid, entry in (claims if isinstance(claims, dict) else {}).items():
        devices = entry.get("devices") if isinstance(entry, dict) else None
        for index, device in enumerate(devices if isinstance(devices, list) else []):
            if not isinstance(device, dict):
                continue
            sharing = device.get("sharing")
            mps = isinstance(sharing, dict) and sharing.get("strategy") == "MPS"
            if mps or "share_id" in device or (version < 2 and device.get("mig") is not None):
                held = "MIG or MPS record" if version < 2 else "MPS record or share id"
                if version < 2 and "share_id" in device and not mps and device.get("mig") is None:
                    held = "share id"
                raise CheckpointCorrupt(
                    f"claims.{uid}.devices.{index}: a version {version} checkpoint holds no {held}"
                )


_READERS: dict[int, Callable[[dict[str, Any]], Checkpoint]] = {
    1: _read_older(1),
    2: _read_older(2),
    3: Checkpoint.model_validate,
}


def _decode(content: bytes, *, source: Path) -> Checkpoint:
    def corrupt(what: str) -> CheckpointCorrupt:
        return CheckpointCorrupt(f"checkpoint {source} is corrupt: {what}")

    try:
        document = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise corrupt(f"not valid JSON ({e})") from e
    if not isinstance(document, dict) or set(document) != {"checksum", "data"}:
        raise corrupt('expected a JSON object with exactly the keys "checksum" and "data"')
    data = document["data"]
    if document["checksum"] != _checksum(data):
        raise corrupt("checksum mismatch (the file was changed or truncated after it was written)")
    if not isinstance(data, dict):
        raise corrupt("data is not a JSON object")
    version = data.get("version")
    if type(version) is not int or version < 1:  # bool is an int subclass: true is no version
        raise corrupt(f"version {version!r} is not a format version; this gpudra reads 1 to {VERSION}")
    if version > VERSION:
        raise CheckpointTooNew(source, version=version)
    try:
        return _READERS[version](data)
    except CheckpointCorrupt as e:  # a reader's own check, which does not know the file's name
        raise corrupt(str(e)) from e
    except ValidationError as e:
        errors = e.errors()
        unknown = [_dotted(error["loc"]) for error in errors if error["type"] == "extra_forbidden"]
        if unknown:
            raise CheckpointTooNew(source, version=version, unknown_fields=unknown) from e
        problems = "; ".join(f"{_dotted(error['loc'])}: {error['msg']}" for error in errors)
        raise corrupt(f"does not match the schema ({problems})") from e


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)
