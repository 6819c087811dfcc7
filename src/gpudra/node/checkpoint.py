"""The kubelet plugin's record of what it did to each claim. I/O: the checkpoint file.

The plugin writes a claim's entry *before* its first side effect and again when prepare completes,
so that after a crash at any step the entry says what may exist on the node and can be rolled back
or completed:

    PrepareStarted    written before any side effect. `devices` holds what is being prepared; a MIG
                      record's `gpu_instance_id`, `compute_instance_id` and `uuid` stay None until
                      the instance exists, so recovery finds it by (gpu_uuid, profile_id,
                      placement_start), the only identity that is known beforehand.
    PrepareCompleted  every device is configured and the CDI spec is written; a repeated
                      NodePrepareResources returns the recorded CDI IDs.
    UnprepareStarted  teardown has begun; recovery finishes it. The entry is removed when done.

File format: `{"checksum": "<sha256 hex>", "data": {...}}` where the checksum covers the canonical
JSON (sorted keys, no whitespace) of `data` *as it is in the file*, not of the model re-serialised.
So a later gpudra that adds a field with a default still reads older files, and a file is only
called corrupt when its bytes really changed (NVIDIA's driver checksums the re-marshalled struct
and crash-looped on upgrade, issue #1080).

Boot ID: GPU and compute instances, MPS daemons, compute modes and time-slices do not survive a
reboot, so entries written under another boot describe nothing that still exists on the GPUs.
`load` hands them back apart, as `stale_claims`, with an empty checkpoint for this boot: the caller
deletes their leftovers that do survive (CDI spec files, MPS directories) and then saves.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpudra.atomic_file import fsync_directory, write_atomically
from gpudra.errors import GpudraError

VERSION: Literal[1] = 1

ClaimState = Literal["PrepareStarted", "PrepareCompleted", "UnprepareStarted"]
TimeSliceInterval = Literal["Default", "Short", "Medium", "Long"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MigRecord(_Record):
    """A MIG device the claim creates on demand."""

    gpu_uuid: str  # the parent GPU
    profile_id: int = Field(ge=0)
    placement_start: int = Field(ge=0)
    gpu_instance_id: int | None = Field(default=None, ge=0)
    compute_instance_id: int | None = Field(default=None, ge=0)
    uuid: str | None = None  # "MIG-…"; changes every time the instance is re-created


class TimeSlicingRecord(_Record):
    """The compute-policy time-slice set on the claim's full GPUs; unprepare resets it to Default."""

    strategy: Literal["TimeSlicing"]
    interval: TimeSliceInterval


class MpsRecord(_Record):
    """The MPS control daemon serving the claim's devices, and the limits it was started with."""

    strategy: Literal["MPS"]
    daemon_id: str = Field(min_length=1)
    pipe_dir: Path  # host path of CUDA_MPS_PIPE_DIRECTORY
    active_thread_percentage: int | None = Field(default=None, ge=1, le=100)
    pinned_memory_limits: dict[str, int] = Field(default_factory=dict)  # GPU or MIG UUID -> bytes

    @model_validator(mode="after")
    def _limits_are_sizes(self) -> MpsRecord:
        negative = sorted(uuid for uuid, limit in self.pinned_memory_limits.items() if limit < 0)
        if negative:
            raise ValueError(f"pinned_memory_limits must be >= 0 bytes; negative for {', '.join(negative)}")
        return self


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


class ClaimEntry(_Record):
    """A claim the plugin has started to prepare (or to unprepare)."""

    uid: str = Field(min_length=1)
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...]

    def with_state(
        self, state: ClaimState, *, devices: tuple[PreparedDevice, ...] | None = None
    ) -> ClaimEntry:
        """This entry moved to `state`, with `devices` replaced when given."""
        return self.model_validate(
            {**self.model_dump(), "state": state, "devices": self.devices if devices is None else devices}
        )


class Checkpoint(_Record):
    """All claims this node's plugin has prepared or is preparing, keyed by claim UID."""

    version: Literal[1]
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

    Raises GpudraError naming the file when it is not what `save` writes (bad JSON, checksum
    mismatch, unknown version, schema violation); the caller decides whether to `quarantine` it.
    Errors reading the file (permissions, I/O) propagate as OSError: the file may be fine.
    """
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return LoadedCheckpoint(Checkpoint.empty(boot_id), {})
    checkpoint = _decode(content, source=path)
    if checkpoint.boot_id != boot_id:
        return LoadedCheckpoint(Checkpoint.empty(boot_id), checkpoint.claims)
    return LoadedCheckpoint(checkpoint, {})


def save(path: Path, checkpoint: Checkpoint) -> None:
    """Replace the checkpoint at `path` atomically and durably; the directory must exist."""
    data = checkpoint.model_dump(mode="json")
    document = {"checksum": _checksum(data), "data": data}
    write_atomically(path, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode(), mode=0o600)


def quarantine(path: Path) -> Path:
    """Move a corrupt checkpoint aside to `<name>.corrupt-<UTC time>` (kept for diagnosis); return it."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    os.rename(path, target)
    fsync_directory(path.parent)
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
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _decode(content: bytes, *, source: Path) -> Checkpoint:
    def corrupt(what: str) -> GpudraError:
        return GpudraError(f"checkpoint {source} is corrupt: {what}")

    try:
        document = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise corrupt(f"not valid JSON ({e})") from e
    if not isinstance(document, dict) or set(document) != {"checksum", "data"}:
        raise corrupt('expected a JSON object with exactly the keys "checksum" and "data"')
    data = document["data"]
    if document["checksum"] != _checksum(data):
        raise corrupt("checksum mismatch (the file was changed or truncated after it was written)")
    if not isinstance(data, dict) or data.get("version") != VERSION:
        found = data.get("version") if isinstance(data, dict) else None
        raise GpudraError(f"checkpoint {source} has version {found!r}; this gpudra reads version {VERSION}")
    try:
        return Checkpoint.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in e.errors()
        )
        raise corrupt(f"does not match the schema ({problems})") from e
