from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpudra.errors import ClaimError, GpudraError
from gpudra.node import checkpoint
from gpudra.node.checkpoint import (
    Checkpoint,
    CheckpointTooNew,
    ClaimEntry,
    MigLive,
    MigRecord,
    MigSpec,
    MpsRecord,
    PreparedDevice,
    TimeSlicingRecord,
)
from gpudra.node.recovery import recover
from tests.unit.claims import from_claim, time_slicing, whole_gpus
from tests.unit.harness.node import Node, uid, write_checkpoint

DATA = Path(__file__).parents[1] / "data" / "checkpoint"
WRITTEN: int = checkpoint.VERSION  # widened from its Literal, so that comparing it type-checks

BOOT = "3f0b4e2a-6d1c-4c55-9d0e-1b2a3c4d5e6f"
OTHER_BOOT = "8a7b6c5d-4e3f-4a1b-8c9d-0e1f2a3b4c5d"
GPU0 = "GPU-11111111-2222-3333-4444-555555555555"
GPU1 = "GPU-66666666-7777-8888-9999-000000000000"
MPS_ROOT = Path("/var/lib/kubelet/plugins/gpu.gpudra.io/mps")
TOKEN = "9f86d081884c7d659a2feaa0c55ad015"  # an MPS daemon's token: 128 bits in lowercase hex


def whole_gpu(uid: str, device: str = "gpu-0", uuid: str = GPU0) -> PreparedDevice:
    return PreparedDevice(
        request_names=("gpu",),
        pool="node-1",
        device=device,
        cdi_device_ids=(f"gpu.gpudra.io/claim={uid}-{device}",),
        gpu_uuids=(uuid,),
    )


def entry(uid: str, state: checkpoint.ClaimState = "PrepareCompleted", **kwargs: Any) -> ClaimEntry:
    devices = kwargs.pop("devices", (whole_gpu(uid),))
    return ClaimEntry(uid=uid, namespace="default", name=f"claim-{uid[:4]}", state=state, devices=devices)


def rich_checkpoint() -> Checkpoint:
    uid_mig, uid_mps, uid_ts = "a1-mig", "b2-mps", "c3-ts"
    mig = PreparedDevice(
        request_names=("mig",),
        pool="node-1",
        device="gpu-0-mig-1g10gb-19-0",
        cdi_device_ids=(f"gpu.gpudra.io/claim={uid_mig}-gpu-0-mig-1g10gb-19-0",),
        gpu_uuids=(GPU0,),
        mig=MigRecord(
            spec=MigSpec(gpu_uuid=GPU0, profile_id=19, placement_start=0),
            live=MigLive(
                gpu_instance_id=7, compute_instance_id=0, uuid="MIG-0a0b0c0d-1111-2222-3333-444455556666"
            ),
        ),
    )
    mps = whole_gpu(uid_mps, device="gpu-1", uuid=GPU1).model_copy(
        update={
            "sharing": MpsRecord(
                strategy="MPS",
                root=MPS_ROOT / "3f2a9c1b7d4e",
                token=TOKEN,
                active_thread_percentage=50,
                pinned_memory_limit=10 * 2**30,
                restore_compute_mode=0,
            )
        }
    )
    share = whole_gpu(uid_mps, device="gpu-0-shared").model_copy(
        update={
            "share_id": "0d9c8b7a-6f5e-4d3c-8b2a-1f0e9d8c7b6a",
            "sharing": MpsRecord(
                strategy="MPS", root=MPS_ROOT / "3f2a9c1b7d4e", token=TOKEN, pinned_memory_limit=2**20
            ),
        }
    )
    ts = whole_gpu(uid_ts).model_copy(
        update={"sharing": TimeSlicingRecord(strategy="TimeSlicing", interval="Long"), "admin_access": True}
    )
    return (
        Checkpoint.empty(BOOT)
        .with_claim(entry(uid_mig, devices=(mig,)))
        .with_claim(entry(uid_mps, devices=(mps, share)))
        .with_claim(entry(uid_ts, state="PrepareStarted", devices=(ts,)))
    )


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    saved = rich_checkpoint()
    checkpoint.save(path, saved)
    loaded = checkpoint.load(path, boot_id=BOOT)
    assert loaded.checkpoint == saved
    assert loaded.stale_claims == {}


def test_file_format_is_checksum_over_canonical_data(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, rich_checkpoint())
    document = json.loads(path.read_text())
    assert set(document) == {"checksum", "data"}
    canonical = json.dumps(document["data"], sort_keys=True, separators=(",", ":"))
    assert document["checksum"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert document["data"]["version"] == checkpoint.VERSION
    assert document["data"]["boot_id"] == BOOT


def test_missing_file_is_an_empty_checkpoint(tmp_path: Path) -> None:
    loaded = checkpoint.load(tmp_path / "checkpoint.json", boot_id=BOOT)
    assert loaded.checkpoint == Checkpoint(version=checkpoint.VERSION, boot_id=BOOT, claims={})
    assert loaded.stale_claims == {}


def test_save_replaces_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, Checkpoint.empty(BOOT).with_claim(entry("old")))
    checkpoint.save(path, Checkpoint.empty(BOOT).with_claim(entry("new")))
    assert list(checkpoint.load(path, boot_id=BOOT).checkpoint.claims) == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("with_previous", [True, False], ids=["previous-file", "no-previous-file"])
def test_crash_before_rename_leaves_previous_state(tmp_path: Path, with_previous: bool) -> None:
    # What a crash between writing the temp file and renaming it leaves behind: a half-written temp file.
    path = tmp_path / "checkpoint.json"
    previous = Checkpoint.empty(BOOT).with_claim(entry("kept"))
    if with_previous:
        checkpoint.save(path, previous)
    (tmp_path / ".checkpoint.json.k3j2h1.tmp").write_text('{"checksum": "0", "da')
    expected = previous if with_previous else Checkpoint.empty(BOOT)
    assert checkpoint.load(path, boot_id=BOOT).checkpoint == expected


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (lambda text: "", "not valid JSON"),
        (lambda text: text.replace('"node-1"', '"node-2"', 1), "checksum mismatch"),
        (lambda text: text.replace('"PrepareStarted"', '"PrepareCompleted"', 1), "checksum mismatch"),
        (lambda text: "[]", "exactly the keys"),
        (lambda text: json.dumps({**json.loads(text), "extra": 1}), "exactly the keys"),
    ],
    ids=["truncated", "empty", "edited-value", "edited-state", "not-an-object", "extra-top-level-key"],
)
def test_damaged_file_is_reported(tmp_path: Path, damage: Any, message: str) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, rich_checkpoint())
    path.write_text(damage(path.read_text()))
    with pytest.raises(GpudraError, match=message) as raised:
        checkpoint.load(path, boot_id=BOOT)
    assert not isinstance(raised.value, CheckpointTooNew)
    assert str(path) in str(raised.value)


def test_non_utf8_bytes_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(GpudraError, match="not valid JSON"):
        checkpoint.load(path, boot_id=BOOT)


@settings(max_examples=60, deadline=None)
@given(position=st.integers(min_value=0), replacement=st.integers(min_value=0, max_value=255))
def test_any_single_byte_change_is_harmless_or_detected(position: int, replacement: int) -> None:
    saved = rich_checkpoint()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "checkpoint.json"
        checkpoint.save(path, saved)
        content = bytearray(path.read_bytes())
        content[position % len(content)] = replacement
        path.write_bytes(bytes(content))
        try:
            loaded = checkpoint.load(path, boot_id=BOOT)
        except CheckpointTooNew:
            raise AssertionError("a damaged file was taken for one written by a newer gpudra") from None
        except GpudraError:
            return
    assert loaded.checkpoint == saved


def test_checksum_covers_the_file_not_the_model(tmp_path: Path) -> None:
    # An older writer that left out fields which now have defaults: the file is intact and must load.
    path = tmp_path / "checkpoint.json"
    device = {
        "request_names": ["gpu"],
        "pool": "node-1",
        "device": "gpu-0",
        "cdi_device_ids": ["gpu.gpudra.io/claim=u1-gpu-0"],
        "gpu_uuids": [GPU0],
    }
    claim = {"uid": "u1", "namespace": "ns", "name": "c", "state": "PrepareCompleted", "devices": [device]}
    write_checkpoint(path, {"version": 1, "boot_id": BOOT, "claims": {"u1": claim}})
    loaded = checkpoint.load(path, boot_id=BOOT).checkpoint
    assert loaded.claims["u1"].devices[0].mig is None
    assert loaded.claims["u1"].devices[0].admin_access is False
    assert loaded.claims["u1"].devices[0].share_id is None


def test_other_boot_yields_stale_claims(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    before_reboot = rich_checkpoint()
    checkpoint.save(path, before_reboot)
    loaded = checkpoint.load(path, boot_id=OTHER_BOOT)
    assert loaded.checkpoint == Checkpoint.empty(OTHER_BOOT)
    assert loaded.stale_claims == before_reboot.claims


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["claims"]["u1"].update(state="Prepared"), r"claims\.u1\.state"),
        (lambda d: d.update(claims={"u2": d["claims"]["u1"]}), "holds the entry of claim 'u1'"),
        (lambda d: d.update(boot_id=""), "boot_id"),
        (lambda d: d["claims"]["u1"]["devices"][0].pop("pool"), r"devices\.0\.pool: Field required"),
        (lambda d: d["claims"]["u1"]["devices"][0].update(admin_access="maybe"), r"devices\.0\.admin_access"),
        (
            lambda d: d["claims"]["u1"]["devices"][0].update(sharing={"strategy": "Exclusive"}),
            r"devices\.0\.sharing",
        ),
    ],
    ids=[
        "unknown-state",
        "key-is-not-uid",
        "empty-boot-id",
        "missing-field",
        "wrong-type",
        "unknown-strategy",
    ],
)
def test_schema_violation_in_file_is_reported(tmp_path: Path, edit: Any, message: str) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, Checkpoint.empty(BOOT).with_claim(entry("u1")))
    data = json.loads(path.read_text())["data"]
    edit(data)
    write_checkpoint(path, data)  # a correct checksum: only the schema is wrong
    with pytest.raises(GpudraError, match="does not match the schema") as raised:
        checkpoint.load(path, boot_id=BOOT)
    assert not isinstance(raised.value, CheckpointTooNew)
    assert raised.match(message)
    assert str(path) in str(raised.value)


def _snapshot(directory: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under `directory`: its bytes, inode and mtime (a rewrite by rename changes the inode)."""
    return {
        str(path.relative_to(directory)): (path.read_bytes(), path.stat().st_ino, path.stat().st_mtime_ns)
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize("version", [checkpoint.VERSION + 1, checkpoint.VERSION + 2, 1000])
def test_newer_version_is_refused_as_too_new(tmp_path: Path, version: int) -> None:
    path = tmp_path / "checkpoint.json"
    data = Checkpoint.empty(BOOT).with_claim(entry("u1")).model_dump(mode="json")
    data["version"] = version
    data["claims"]["u1"]["devices"][0]["mig_v9"] = {"what": "a format this gpudra cannot read"}
    write_checkpoint(path, data)
    before = _snapshot(tmp_path)

    with pytest.raises(CheckpointTooNew) as raised:
        checkpoint.load(path, boot_id=BOOT)

    message = str(raised.value)
    assert str(path) in message
    assert f"has format version {version}:" in message
    assert f"this gpudra reads format version {checkpoint.VERSION} and older" in message
    assert "upgrade gpudra back" in message
    assert "move the file aside" in message
    assert (raised.value.path, raised.value.version, raised.value.reads_version) == (
        path,
        version,
        checkpoint.VERSION,
    )
    assert raised.value.unknown_fields == ()  # a newer version is refused before its fields are read
    assert "is corrupt" not in message
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("edit", "unknown"),
    [
        (lambda d: d.update(node="gpu-node-07"), ["node"]),
        (lambda d: d["claims"]["u1"].update(colour="red"), ["claims.u1.colour"]),
        (lambda d: d["claims"]["u1"]["devices"][0].update(gpu=1), ["claims.u1.devices.0.gpu"]),
        (
            lambda d: d["claims"]["u1"]["devices"][0]["sharing"].update(priority=3),
            ["claims.u1.devices.0.sharing.TimeSlicing.priority"],
        ),
        (
            lambda d: d["claims"]["u1"]["devices"][0].update(mig={"spec": {}, "instance": 7}),
            ["claims.u1.devices.0.mig.instance"],
        ),
        (  # the MPS record of version 2's models, never written: its fields are unknown to version 3
            lambda d: d["claims"]["u1"]["devices"][0].update(
                sharing={"strategy": "MPS", "root": "/r", "daemon_id": "d", "pipe_dir": "/r/pipe"}
            ),
            ["claims.u1.devices.0.sharing.MPS.daemon_id", "claims.u1.devices.0.sharing.MPS.pipe_dir"],
        ),
        (  # an unknown field is never taken for damage, even next to a field this gpudra rejects
            lambda d: (d.update(node="n"), d["claims"]["u1"].update(state="Paused")),
            ["node"],
        ),
        (
            lambda d: (d.update(node="n"), d["claims"]["u1"].update(colour="red")),
            ["node", "claims.u1.colour"],
        ),
    ],
    ids=[
        "top-level",
        "claim",
        "device",
        "sharing",
        "mig",
        "old-mps-fields",
        "next-to-a-bad-value",
        "two-fields",
    ],
)
def test_same_version_with_unknown_fields_is_refused_as_too_new(
    tmp_path: Path, edit: Any, unknown: list[str]
) -> None:
    path = tmp_path / "checkpoint.json"
    device = whole_gpu("u1").model_copy(
        update={"sharing": TimeSlicingRecord(strategy="TimeSlicing", interval="Long")}
    )
    data = Checkpoint.empty(BOOT).with_claim(entry("u1", devices=(device,))).model_dump(mode="json")
    edit(data)
    write_checkpoint(path, data)
    before = _snapshot(tmp_path)

    with pytest.raises(CheckpointTooNew) as raised:
        checkpoint.load(path, boot_id=BOOT)

    message = str(raised.value)
    assert sorted(raised.value.unknown_fields) == sorted(unknown)
    assert (
        f"checkpoint {path} has format version {checkpoint.VERSION} but fields this gpudra does not know ("
        in message
    )
    assert all(field in message for field in unknown)
    assert f"this gpudra reads format version {checkpoint.VERSION} and older" in message
    assert "upgrade gpudra back" in message
    assert "move the file aside" in message
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "version", [0, -1, None, "1", True, 1.0], ids=["zero", "negative", "missing", "string", "bool", "float"]
)
def test_invalid_version_is_corrupt(tmp_path: Path, version: Any) -> None:
    path = tmp_path / "checkpoint.json"
    data: dict[str, Any] = {"boot_id": BOOT, "claims": {}}
    if version is not None:
        data["version"] = version
    write_checkpoint(path, data)
    with pytest.raises(GpudraError, match=r"is corrupt: version .* is not a format version") as raised:
        checkpoint.load(path, boot_id=BOOT)
    assert not isinstance(raised.value, CheckpointTooNew)
    assert f"version {version!r}" in str(raised.value)


def test_data_that_is_not_an_object_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    write_checkpoint(path, [1])
    with pytest.raises(GpudraError, match="is corrupt: data is not a JSON object"):
        checkpoint.load(path, boot_id=BOOT)


def test_every_version_up_to_the_current_one_has_a_reader() -> None:
    assert sorted(checkpoint._READERS) == list(range(1, checkpoint.VERSION + 1))


@pytest.mark.parametrize(
    "build",
    [
        lambda: ClaimEntry.model_validate(
            {
                "uid": "u",
                "namespace": "n",
                "name": "c",
                "state": "PrepareCompleted",
                "devices": [],
                "extra": 1,
            }
        ),
        lambda: MigSpec(gpu_uuid=GPU0, profile_id=-1, placement_start=0),
        lambda: TimeSlicingRecord.model_validate({"strategy": "TimeSlicing", "interval": "Sometimes"}),
        lambda: TimeSlicingRecord.model_validate(
            {"strategy": "TimeSlicing", "interval": "Long", "daemon_id": "x"}
        ),
        lambda: MpsRecord(strategy="MPS", root=Path("/p"), active_thread_percentage=0),
        lambda: MpsRecord(strategy="MPS", root=Path("/p"), active_thread_percentage=101),
        lambda: MpsRecord(strategy="MPS", root=Path("/p"), pinned_memory_limit=2**20 - 1),
        lambda: MpsRecord(strategy="MPS", root=Path("/p"), pinned_memory_limit=-1),
        lambda: MpsRecord(strategy="MPS", root=Path("/p"), restore_compute_mode=-1),
        lambda: MpsRecord(strategy="MPS", root=Path("/p"), token=""),
        lambda: MpsRecord(strategy="MPS", root=Path("/p"), token=TOKEN[:-1]),
        lambda: MpsRecord(strategy="MPS", root=Path("/p"), token=TOKEN.upper()),
        lambda: MpsRecord.model_validate({"strategy": "MPS"}),
        lambda: MpsRecord.model_validate({"strategy": "MPS", "root": "/p", "daemon_id": "d"}),
        lambda: MpsRecord.model_validate(
            {"strategy": "MPS", "root": "/p", "pinned_memory_limits": {GPU0: 2**30}}
        ),
        lambda: PreparedDevice.model_validate(
            {**whole_gpu("u").model_dump(), "sharing": {"strategy": "MPS", "interval": "Long"}}
        ),
        lambda: PreparedDevice.model_validate(
            {**whole_gpu("u").model_dump(), "sharing": {"strategy": "Exclusive"}}
        ),
    ],
    ids=[
        "unknown-field",
        "negative-profile",
        "unknown-interval",
        "mps-field-on-time-slicing",
        "thread-percentage-0",
        "thread-percentage-101",
        "memory-limit-under-1mib",
        "negative-memory-limit",
        "negative-compute-mode",
        "empty-token",
        "short-token",
        "token-not-lowercase-hex",
        "mps-without-root",
        "old-mps-daemon-id",
        "old-mps-limits-per-uuid",
        "time-slicing-field-on-mps",
        "unknown-strategy",
    ],
)
def test_models_are_strict(build: Any) -> None:
    with pytest.raises(ValidationError):
        build()


def test_mps_record_bounds_and_defaults() -> None:
    bare = MpsRecord(strategy="MPS", root=MPS_ROOT / "3f2a9c1b7d4e")
    assert (bare.token, bare.active_thread_percentage, bare.pinned_memory_limit) == (None, None, None)
    assert bare.restore_compute_mode is None
    for threads, limit, mode in [(1, 2**20, 0), (100, 80 * 2**30, 3)]:
        record = MpsRecord(
            strategy="MPS",
            root=MPS_ROOT / "3f2a9c1b7d4e",
            active_thread_percentage=threads,
            pinned_memory_limit=limit,
            restore_compute_mode=mode,
        )
        assert MpsRecord.model_validate(record.model_dump(mode="json")) == record
    assert whole_gpu("u").share_id is None


def test_mig_record_live_is_optional() -> None:
    spec = MigSpec(gpu_uuid=GPU0, profile_id=19, placement_start=4)
    planned = MigRecord(spec=spec)
    assert planned.live is None
    live = MigLive(gpu_instance_id=0, compute_instance_id=0, uuid="MIG-0a0b0c0d-1111-2222-3333-444455556666")
    created = MigRecord.model_validate({"spec": spec.model_dump(), "live": live.model_dump()})
    assert (created.spec, created.live) == (spec, live)
    assert MigRecord.model_validate(planned.model_dump()) == planned


@pytest.mark.parametrize(
    "build",
    [
        lambda: MigSpec(gpu_uuid=GPU0, profile_id=-1, placement_start=0),
        lambda: MigSpec(gpu_uuid=GPU0, profile_id=19, placement_start=-1),
        lambda: MigSpec(gpu_uuid="", profile_id=19, placement_start=0),
        lambda: MigSpec.model_validate({"gpu_uuid": GPU0, "profile_id": 19}),
        lambda: MigLive(gpu_instance_id=-1, compute_instance_id=0, uuid="MIG-1"),
        lambda: MigLive(gpu_instance_id=1, compute_instance_id=-1, uuid="MIG-1"),
        lambda: MigLive(gpu_instance_id=1, compute_instance_id=0, uuid=""),
        lambda: MigLive.model_validate({"gpu_instance_id": 1, "compute_instance_id": 0}),
        lambda: MigLive.model_validate({"gpu_instance_id": 1, "uuid": "MIG-1"}),
        lambda: MigLive.model_validate({"gpu_instance_id": None, "compute_instance_id": 0, "uuid": "MIG-1"}),
        lambda: MigRecord.model_validate({"live": None}),
        lambda: MigRecord.model_validate(
            {"spec": {"gpu_uuid": GPU0, "profile_id": 19, "placement_start": 0}, "gpu_instance_id": 7}
        ),
    ],
    ids=[
        "negative-profile",
        "negative-placement",
        "empty-parent",
        "spec-without-placement",
        "negative-gpu-instance",
        "negative-compute-instance",
        "empty-mig-uuid",
        "live-without-uuid",
        "live-without-compute-instance",
        "live-with-null-id",
        "no-spec",
        "old-flat-field",
    ],
)
def test_mig_record_is_strict(build: Any) -> None:
    with pytest.raises(ValidationError):
        build()


def test_models_are_frozen() -> None:
    claim = entry("u1")
    with pytest.raises(ValidationError):
        claim.state = "UnprepareStarted"


def test_with_claim_and_without_claim_return_new_checkpoints() -> None:
    empty = Checkpoint.empty(BOOT)
    one = empty.with_claim(entry("u1", state="PrepareStarted"))
    replaced = one.with_claim(entry("u1", state="PrepareCompleted"))
    two = replaced.with_claim(entry("u2"))
    assert empty.claims == {}
    assert one.claims["u1"].state == "PrepareStarted"
    assert replaced.claims["u1"].state == "PrepareCompleted"
    assert list(two.claims) == ["u1", "u2"]
    assert list(two.without_claim("u1").claims) == ["u2"]
    assert list(two.claims) == ["u1", "u2"]
    assert two.without_claim("absent") == two
    assert two.boot_id == BOOT


def test_with_state_moves_an_entry_and_can_replace_devices() -> None:
    uid = "u1"
    planned = PreparedDevice(
        request_names=("mig",),
        pool="node-1",
        device="gpu-0-mig-1g10gb-19-0",
        cdi_device_ids=(),
        gpu_uuids=(GPU0,),
        mig=MigRecord(spec=MigSpec(gpu_uuid=GPU0, profile_id=19, placement_start=0)),
    )
    started = entry(uid, state="PrepareStarted", devices=(planned,))
    created = planned.model_copy(
        update={
            "cdi_device_ids": (f"gpu.gpudra.io/claim={uid}-gpu-0-mig-1g10gb-19-0",),
            "mig": MigRecord(
                spec=MigSpec(gpu_uuid=GPU0, profile_id=19, placement_start=0),
                live=MigLive(gpu_instance_id=7, compute_instance_id=0, uuid="MIG-1"),
            ),
        }
    )
    completed = started.with_state("PrepareCompleted", devices=(created,))
    unpreparing = completed.with_state("UnprepareStarted")
    assert started.state == "PrepareStarted"
    assert started.devices == (planned,)
    assert completed.state == "PrepareCompleted"
    assert completed.devices == (created,)
    assert unpreparing.devices == (created,)
    assert (unpreparing.uid, unpreparing.namespace, unpreparing.name) == (uid, "default", started.name)
    with pytest.raises(ValidationError):
        started.with_state("Done")


def test_keep_copy_copies_the_damaged_file_and_leaves_it_in_place(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text("{broken")
    copy = checkpoint.keep_copy(path)
    assert copy is not None and copy.parent == tmp_path
    assert copy.name.startswith("checkpoint.json.corrupt-")
    assert copy.read_text() == "{broken"
    assert path.read_text() == "{broken"  # replaced only by the rebuilt checkpoint's save
    with pytest.raises(checkpoint.CheckpointCorrupt):
        checkpoint.load(path, boot_id=BOOT)


def test_keep_copy_returns_none_when_no_copy_can_be_made(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text("{broken")
    (tmp_path / "sub").mkdir()
    assert checkpoint.keep_copy(tmp_path / "sub" / "absent.json") is None


def test_current_boot_id_reads_proc(tmp_path: Path) -> None:
    source = tmp_path / "sys/kernel/random/boot_id"
    source.parent.mkdir(parents=True)
    source.write_text(BOOT + "\n")
    assert checkpoint.current_boot_id(tmp_path) == BOOT


def test_current_boot_id_of_this_machine() -> None:
    assert len(checkpoint.current_boot_id()) == 36


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read the boot ID"), ("\n", "is empty")],
    ids=["missing", "empty"],
)
def test_current_boot_id_errors(tmp_path: Path, content: str | None, message: str) -> None:
    source = tmp_path / "sys/kernel/random/boot_id"
    source.parent.mkdir(parents=True)
    if content is not None:
        source.write_text(content)
    with pytest.raises(GpudraError, match=message):
        checkpoint.current_boot_id(tmp_path)


# --- the golden file of version 1 -----------------------------------------------------------------
#
# tests/unit/data/checkpoint/v1.json was written once by version 1's `save`, as a node running gpudra
# leaves it. NEVER EDIT OR REGENERATE IT: it stands for the files on nodes, which no later gpudra may
# fail to read. Every later version must keep the golden tests passing (through its reader of version 1);
# a new version adds its own golden file next to it instead, and its entry in GOLDEN (below).

GOLDEN_V1 = DATA / "v1.json"
GOLDEN_BOOT = "6c2f0d9e-3b1a-4f5e-8d7c-2a9b0e1f3c4d"
TRAIN = "5d3c1b2a-8f4e-4d6c-9b7a-0e1f2d3c4b5a"
SERVE = "a7b8c9d0-e1f2-4a3b-8c4d-5e6f7a8b9c0d"
MONITOR = "c0ffee00-1234-4abc-9def-567890abcdef"
H100_0 = "GPU-4f8a3b2c-1d6e-7f90-a1b2-c3d4e5f60718"
H100_1 = "GPU-9e7d6c5b-4a39-2817-f6e5-d4c3b2a19080"
H100_2 = "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
H100_3 = "GPU-b1c2d3e4-f5a6-4b7c-8d9e-0f1a2b3c4d5e"


def _assert_golden_v1_content(loaded: Checkpoint) -> None:
    assert loaded.version == checkpoint.VERSION
    assert loaded.boot_id == GOLDEN_BOOT
    assert list(loaded.claims) == [TRAIN, SERVE, MONITOR]

    train = loaded.claims[TRAIN]
    assert (train.uid, train.namespace, train.name, train.state) == (
        TRAIN,
        "ml-training",
        "llm-finetune-gpus-x7k2p",
        "PrepareCompleted",
    )
    expected_train = [
        ("trainer", "gpu-0", H100_0, "Long"),
        ("trainer", "gpu-1", H100_1, "Long"),
        ("evaluator", "gpu-2", H100_2, "Default"),
    ]
    assert len(train.devices) == len(expected_train)
    for device, (request, name, gpu, interval) in zip(train.devices, expected_train, strict=True):
        assert device.request_names == (request,)
        assert device.pool == "gpu-node-07"
        assert device.device == name
        assert device.cdi_device_ids == (f"gpu.gpudra.io/claim={TRAIN}-{name}", f"nvidia.com/gpu={gpu}")
        assert device.gpu_uuids == (gpu,)
        assert device.mig is None
        assert device.sharing == TimeSlicingRecord(strategy="TimeSlicing", interval=interval)
        assert device.admin_access is False
        assert device.share_id is None

    serve = loaded.claims[SERVE]
    assert (serve.uid, serve.namespace, serve.name, serve.state) == (
        SERVE,
        "inference",
        "vllm-0-gpu-q9w4z",
        "PrepareStarted",
    )
    [device] = serve.devices
    assert (device.request_names, device.pool, device.device) == (("gpu",), "gpu-node-07", "gpu-3")
    assert device.cdi_device_ids == (f"gpu.gpudra.io/claim={SERVE}-gpu-3", f"nvidia.com/gpu={H100_3}")
    assert device.gpu_uuids == (H100_3,)
    assert device.mig is None
    assert device.sharing == TimeSlicingRecord(strategy="TimeSlicing", interval="Medium")
    assert device.admin_access is False
    assert device.share_id is None

    monitor = loaded.claims[MONITOR]
    assert (monitor.uid, monitor.namespace, monitor.name, monitor.state) == (
        MONITOR,
        "monitoring",
        "dcgm-exporter-admin-m2v8n",
        "UnprepareStarted",
    )
    assert len(monitor.devices) == 2
    for device, (name, gpu) in zip(monitor.devices, [("gpu-0", H100_0), ("gpu-3", H100_3)], strict=True):
        assert (device.request_names, device.pool, device.device) == (("monitor",), "gpu-node-07", name)
        assert device.cdi_device_ids == (f"gpu.gpudra.io/claim={MONITOR}-{name}", f"nvidia.com/gpu={gpu}")
        assert device.gpu_uuids == (gpu,)
        assert device.mig is None
        assert device.sharing is None
        assert device.admin_access is True
        assert device.share_id is None


def _keeps(old: Any, new: Any, where: str = "data") -> None:
    """`new` has every key of `old` with the same value; dicts may have gained keys."""
    if isinstance(old, dict):
        assert isinstance(new, dict), where
        for key, value in old.items():
            assert key in new, f"{where}.{key} is no longer written"
            _keeps(value, new[key], f"{where}.{key}")
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), where
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            _keeps(a, b, f"{where}.{index}")
    else:
        assert new == old, f"{where} was {old!r}, is now written as {new!r}"


# --- the golden file of version 2 -----------------------------------------------------------------
#
# tests/unit/data/checkpoint/v2.json was written once by version 2's `save` (the first version with MIG
# records). NEVER EDIT OR REGENERATE IT, for the same reason as v1.json.

GOLDEN_V2 = DATA / "v2.json"
GOLDEN_V2_BOOT = "9b1e7c44-0d2a-4e6f-8a3b-5c7d9e1f2a4b"
SERVED_MIG = "7e1d2c3b-4a59-4b68-9c7d-8e9f0a1b2c3d"
EMBED_MIG = "1f2e3d4c-5b6a-4798-8a9b-0c1d2e3f4a5b"
TRAINER = "2a3b4c5d-6e7f-4a8b-9c0d-1e2f3a4b5c6d"


def _assert_golden_v2_content(loaded: Checkpoint) -> None:
    assert loaded.version == checkpoint.VERSION
    assert loaded.boot_id == GOLDEN_V2_BOOT
    assert sorted(loaded.claims) == sorted([SERVED_MIG, EMBED_MIG, TRAINER])  # saved with sorted keys

    served = loaded.claims[SERVED_MIG]
    assert (served.namespace, served.name, served.state) == (
        "inference",
        "llm-serve-mig-k3j9x",
        "PrepareCompleted",
    )
    [device] = served.devices
    assert (device.request_names, device.pool, device.device) == (
        ("mig",),
        "gpu-node-07",
        "gpu-0-mig-3g40gb-4",
    )
    assert device.cdi_device_ids == (
        f"gpu.gpudra.io/claim={SERVED_MIG}-gpu-0-mig-3g40gb-4",
        f"nvidia.com/gpu={H100_0}",
    )
    assert device.gpu_uuids == (H100_0,)
    assert device.mig == MigRecord(
        spec=MigSpec(gpu_uuid=H100_0, profile_id=9, placement_start=4),
        live=MigLive(
            gpu_instance_id=2, compute_instance_id=0, uuid="MIG-1a2b3c4d-5e6f-5a7b-8c9d-0e1f2a3b4c5d"
        ),
    )
    assert (device.sharing, device.admin_access, device.share_id) == (None, False, None)

    embed = loaded.claims[EMBED_MIG]
    assert (embed.namespace, embed.name, embed.state) == ("batch", "embed-mig-p2q7w", "PrepareStarted")
    [device] = embed.devices
    assert (device.request_names, device.pool, device.device) == (
        ("small",),
        "gpu-node-07",
        "gpu-0-mig-1g10gb-0",
    )
    assert device.cdi_device_ids == (f"gpu.gpudra.io/claim={EMBED_MIG}-gpu-0-mig-1g10gb-0",)
    assert device.gpu_uuids == (H100_0,)
    assert device.mig == MigRecord(spec=MigSpec(gpu_uuid=H100_0, profile_id=19, placement_start=0), live=None)
    assert (device.sharing, device.admin_access, device.share_id) == (None, False, None)

    trainer = loaded.claims[TRAINER]
    assert (trainer.namespace, trainer.name, trainer.state) == (
        "ml-training",
        "trainer-gpus-z8y6t",
        "UnprepareStarted",
    )
    [device] = trainer.devices
    assert (device.request_names, device.pool, device.device) == (("trainer",), "gpu-node-07", "gpu-1")
    assert device.cdi_device_ids == (f"gpu.gpudra.io/claim={TRAINER}-gpu-1",)
    assert device.gpu_uuids == (H100_1,)
    assert device.mig is None
    assert device.sharing == TimeSlicingRecord(strategy="TimeSlicing", interval="Short")
    assert (device.admin_access, device.share_id) == (False, None)


# What no writer of versions 1 and 2 made. Each edit adds it to the golden data of that version, whose
# checksum is then recomputed: the file is intact, only its content is impossible for its version.
_MPS_DICT = {"strategy": "MPS", "root": str(MPS_ROOT / "3f2a9c1b7d4e"), "pinned_memory_limit": 2**30}
_SHARE_ID = "5e0f9d2a-3b7c-4e1d-8a6f-2c9b4d7e1f30"


def _second_device(claim: dict[str, Any], **fields: Any) -> None:
    """Append a copy of the claim's first device, changed by `fields`, as its device 1."""
    claim["devices"].append({**claim["devices"][0], **fields})


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda c: c["devices"][0].update(sharing=_MPS_DICT), "devices.0"),
        (lambda c: c["devices"][0].update(share_id=_SHARE_ID), "devices.0"),
        (lambda c: c["devices"][0].update(share_id=None), "devices.0"),  # no writer wrote the key
        (lambda c: c["devices"][0].update(sharing=_MPS_DICT, share_id=_SHARE_ID), "devices.0"),
        (lambda c: _second_device(c, device="gpu-1-shared", share_id=_SHARE_ID), "devices.1"),
        (lambda c: _second_device(c, sharing={**_MPS_DICT, "pipe_dir": "/p"}), "devices.1"),
    ],
    ids=["mps-record", "share-id", "null-share-id", "mps-and-share", "second-device-share", "old-mps-shape"],
)
def test_version_2_with_an_mps_record_or_a_share_id_is_corrupt(tmp_path: Path, edit: Any, where: str) -> None:
    path = tmp_path / "checkpoint.json"
    data = json.loads(GOLDEN_V2.read_text())["data"]
    edit(data["claims"][TRAINER])
    write_checkpoint(path, data)
    assert json.loads(path.read_text())["checksum"] == checkpoint._checksum(data)
    before = _snapshot(tmp_path)

    with pytest.raises(checkpoint.CheckpointCorrupt) as raised:
        checkpoint.load(path, boot_id=GOLDEN_V2_BOOT)

    message = str(raised.value)
    assert f"checkpoint {path} is corrupt: claims.{TRAINER}.{where}: " in message
    assert "a version 2 checkpoint holds no MPS record or share id" in message
    assert _snapshot(tmp_path) == before  # load only reports: the caller decides about the file


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (
            lambda c: c["devices"][0].update(
                mig={"spec": {"gpu_uuid": H100_0, "profile_id": 19, "placement_start": 0}, "live": None}
            ),
            "devices.0",
        ),
        (lambda c: c["devices"][0].update(sharing=_MPS_DICT), "devices.0"),
        (lambda c: c["devices"][0].update(share_id=_SHARE_ID), "devices.0"),
        (
            lambda c: c["devices"][1].update(
                mig={
                    "spec": {"gpu_uuid": H100_1, "profile_id": 9, "placement_start": 4},
                    "live": {"gpu_instance_id": 2, "compute_instance_id": 0, "uuid": "MIG-1"},
                }
            ),
            "devices.1",
        ),
    ],
    ids=["mig-record", "mps-record", "share-id", "live-mig-on-second-device"],
)
def test_version_1_with_a_mig_or_mps_record_or_a_share_id_is_corrupt(
    tmp_path: Path, edit: Any, where: str
) -> None:
    path = tmp_path / "checkpoint.json"
    data = json.loads(GOLDEN_V1.read_text())["data"]
    edit(data["claims"][TRAIN])
    write_checkpoint(path, data)

    with pytest.raises(checkpoint.CheckpointCorrupt) as raised:
        checkpoint.load(path, boot_id=GOLDEN_BOOT)

    message = str(raised.value)
    assert f"checkpoint {path} is corrupt: claims.{TRAIN}.{where}: " in message
    assert "a version 1 checkpoint holds no " in message


@pytest.mark.parametrize(
    ("golden", "boot", "uid", "impossible"),
    [
        (
            GOLDEN_V1,
            GOLDEN_BOOT,
            TRAIN,
            {"mig": {"spec": {"gpu_uuid": H100_0, "profile_id": 19, "placement_start": 0}}},
        ),
        (GOLDEN_V2, GOLDEN_V2_BOOT, TRAINER, {"share_id": _SHARE_ID}),
        (GOLDEN_V2, GOLDEN_V2_BOOT, TRAINER, {"sharing": _MPS_DICT}),
    ],
    ids=["v1-mig", "v2-share-id", "v2-mps"],
)
def test_older_version_with_unknown_fields_is_too_new_even_next_to_an_impossible_record(
    tmp_path: Path, golden: Path, boot: str, uid: str, impossible: dict[str, Any]
) -> None:
    path = tmp_path / "checkpoint.json"
    data = json.loads(golden.read_text())["data"]
    data["node"] = "gpu-node-07"
    data["claims"][uid]["devices"][0].update(impossible)
    write_checkpoint(path, data)
    with pytest.raises(CheckpointTooNew) as raised:
        checkpoint.load(path, boot_id=boot)
    assert "node" in raised.value.unknown_fields


@pytest.mark.parametrize(
    ("golden", "boot"), [(GOLDEN_V1, GOLDEN_BOOT), (GOLDEN_V2, GOLDEN_V2_BOOT)], ids=["v1", "v2"]
)
def test_older_version_with_unknown_fields_is_refused_as_too_new(
    tmp_path: Path, golden: Path, boot: str
) -> None:
    # Rule 3 holds for every version this gpudra reads, not only its own.
    path = tmp_path / "checkpoint.json"
    data = json.loads(golden.read_text())["data"]
    first = next(iter(data["claims"]))
    data["claims"][first]["devices"][0]["gpu"] = 1
    write_checkpoint(path, data)
    with pytest.raises(CheckpointTooNew) as raised:
        checkpoint.load(path, boot_id=boot)
    assert raised.value.unknown_fields == (f"claims.{first}.devices.0.gpu",)
    assert f"has format version {data['version']} but fields this gpudra does not know (" in str(raised.value)


# --- the golden file of version 3 -----------------------------------------------------------------
#
# tests/unit/data/checkpoint/v3.json was written once by version 3's `save` (the first version with MPS
# records and share ids). NEVER EDIT OR REGENERATE IT, for the same reason as v1.json.

GOLDEN_V3 = DATA / "v3.json"
GOLDEN_V3_BOOT = "e2c4a6f8-1b3d-4f5a-9c7e-0d2f4a6c8e1b"
MPS_WHOLE = "4b6d8f0a-2c4e-4a6b-8d0f-1a3c5e7a9b2d"
MPS_SHARE = "8c1e3a5b-7d9f-4b2c-a4e6-0f2b4d6e8a1c"
MIG_CLAIM = "d7f9b1c3-5e2a-4c6d-9f1b-3a5c7e9d2b4f"
TIME_SLICED = "f0a2c4e6-8b1d-4f3a-a5c7-9e1b3d5f7a2c"
GOLDEN_V3_SHARE_ID = "5e0f9d2a-3b7c-4e1d-8a6f-2c9b4d7e1f30"
GOLDEN_V3_MIG_UUID = "MIG-2c4e6a8b-0d1f-5a3c-9e7b-4d6f8a0c2e1b"


def _assert_golden_v3_content(loaded: Checkpoint) -> None:
    assert loaded.version == checkpoint.VERSION
    assert loaded.boot_id == GOLDEN_V3_BOOT
    assert list(loaded.claims) == [MPS_WHOLE, MPS_SHARE, MIG_CLAIM, TIME_SLICED]  # saved with sorted keys

    whole = loaded.claims[MPS_WHOLE]
    assert (whole.uid, whole.namespace, whole.name, whole.state) == (
        MPS_WHOLE,
        "inference",
        "llm-serve-mps-h4t8r",
        "PrepareCompleted",
    )
    [device] = whole.devices
    assert (device.request_names, device.pool, device.device) == (("gpu",), "gpu-node-07", "gpu-0")
    assert device.cdi_device_ids == (f"gpu.gpudra.io/claim={MPS_WHOLE}-gpu-0", f"nvidia.com/gpu={H100_0}")
    assert device.gpu_uuids == (H100_0,)
    assert device.mig is None
    assert device.sharing == MpsRecord(
        strategy="MPS",
        root=Path("/var/lib/kubelet/plugins/gpu.gpudra.io/mps/3f2a9c1b7d4e"),
        active_thread_percentage=50,
        pinned_memory_limit=10 * 2**30,
        restore_compute_mode=0,
    )
    assert (device.admin_access, device.share_id) == (False, None)

    shared = loaded.claims[MPS_SHARE]
    assert (shared.uid, shared.namespace, shared.name, shared.state) == (
        MPS_SHARE,
        "inference",
        "embed-share-n5c2v",
        "PrepareCompleted",
    )
    [device] = shared.devices
    assert (device.request_names, device.pool, device.device) == (("share",), "gpu-node-07", "gpu-1-shared")
    assert device.cdi_device_ids == (
        f"gpu.gpudra.io/claim={MPS_SHARE}-gpu-1-shared-{GOLDEN_V3_SHARE_ID}",
        f"nvidia.com/gpu={H100_1}",
    )
    assert device.gpu_uuids == (H100_1,)
    assert device.mig is None
    assert device.sharing == MpsRecord(
        strategy="MPS",
        root=Path("/var/lib/kubelet/plugins/gpu.gpudra.io/mps/8c77d6a8a3a4"),
        active_thread_percentage=25,
        pinned_memory_limit=20 * 2**30,
        restore_compute_mode=None,
    )
    assert (device.admin_access, device.share_id) == (False, GOLDEN_V3_SHARE_ID)

    partition = loaded.claims[MIG_CLAIM]
    assert (partition.uid, partition.namespace, partition.name, partition.state) == (
        MIG_CLAIM,
        "batch",
        "notebook-mig-r6j3k",
        "PrepareCompleted",
    )
    [device] = partition.devices
    assert (device.request_names, device.pool, device.device) == (
        ("mig",),
        "gpu-node-07",
        "gpu-2-mig-2g20gb-4",
    )
    assert device.cdi_device_ids == (
        f"gpu.gpudra.io/claim={MIG_CLAIM}-gpu-2-mig-2g20gb-4",
        f"nvidia.com/gpu={GOLDEN_V3_MIG_UUID}",
    )
    assert device.gpu_uuids == (H100_2,)
    assert device.mig == MigRecord(
        spec=MigSpec(gpu_uuid=H100_2, profile_id=14, placement_start=4),
        live=MigLive(gpu_instance_id=5, compute_instance_id=0, uuid=GOLDEN_V3_MIG_UUID),
    )
    assert (device.sharing, device.admin_access, device.share_id) == (None, False, None)

    sliced = loaded.claims[TIME_SLICED]
    assert (sliced.uid, sliced.namespace, sliced.name, sliced.state) == (
        TIME_SLICED,
        "ml-training",
        "trainer-ts-w9p4m",
        "UnprepareStarted",
    )
    [device] = sliced.devices
    assert (device.request_names, device.pool, device.device) == (("trainer",), "gpu-node-07", "gpu-3")
    assert device.cdi_device_ids == (f"gpu.gpudra.io/claim={TIME_SLICED}-gpu-3", f"nvidia.com/gpu={H100_3}")
    assert device.gpu_uuids == (H100_3,)
    assert device.mig is None
    assert device.sharing == TimeSlicingRecord(strategy="TimeSlicing", interval="Medium")
    assert (device.admin_access, device.share_id) == (False, None)


# --- every golden file -----------------------------------------------------------------------------
#
# The same checks for each stored version: read field by field (as that version wrote the fields),
# after a reboot, through a save and back, and rewritten as the current version keeping every field.


@dataclasses.dataclass(frozen=True)
class Golden:
    """One golden file: the version that wrote it, the boot it was written in, and its content."""

    version: int
    path: Path
    boot: str
    assert_content: Callable[[Checkpoint], None]

    def copy(self, tmp_path: Path) -> Path:
        path = tmp_path / "checkpoint.json"
        path.write_bytes(self.path.read_bytes())
        return path


GOLDEN = {
    golden.version: golden
    for golden in (
        Golden(1, GOLDEN_V1, GOLDEN_BOOT, _assert_golden_v1_content),
        Golden(2, GOLDEN_V2, GOLDEN_V2_BOOT, _assert_golden_v2_content),
        Golden(3, GOLDEN_V3, GOLDEN_V3_BOOT, _assert_golden_v3_content),
    )
}
every_golden_file = pytest.mark.parametrize("golden", GOLDEN.values(), ids=[f"v{v}" for v in GOLDEN])


def test_every_stored_golden_file_is_checked_and_every_version_has_one() -> None:
    assert sorted(path.name for path in DATA.glob("*.json")) == sorted(g.path.name for g in GOLDEN.values())
    assert sorted(GOLDEN) == list(range(1, WRITTEN + 1))


@every_golden_file
def test_golden_file_is_read_field_by_field(tmp_path: Path, golden: Golden) -> None:
    assert json.loads(golden.path.read_text())["data"]["version"] == golden.version
    path = golden.copy(tmp_path)
    loaded = checkpoint.load(path, boot_id=golden.boot)
    assert loaded.stale_claims == {}
    golden.assert_content(loaded.checkpoint)
    assert path.read_bytes() == golden.path.read_bytes()  # reading never writes


@every_golden_file
def test_golden_file_after_a_reboot_is_all_stale(tmp_path: Path, golden: Golden) -> None:
    path = golden.copy(tmp_path)
    loaded = checkpoint.load(path, boot_id=BOOT)
    assert loaded.checkpoint == Checkpoint.empty(BOOT)
    assert loaded.stale_claims == checkpoint.load(golden.path, boot_id=golden.boot).checkpoint.claims
    assert path.read_bytes() == golden.path.read_bytes()  # reading never writes


@every_golden_file
def test_golden_file_round_trips_through_save(tmp_path: Path, golden: Golden) -> None:
    first = checkpoint.load(golden.copy(tmp_path), boot_id=golden.boot).checkpoint
    resaved = tmp_path / "resaved.json"
    checkpoint.save(resaved, first)
    again = checkpoint.load(resaved, boot_id=golden.boot).checkpoint
    assert again == first
    golden.assert_content(again)
    assert json.loads(resaved.read_text())["data"]["version"] == checkpoint.VERSION


@every_golden_file
def test_golden_file_is_rewritten_as_the_current_version_keeping_every_field(
    tmp_path: Path, golden: Golden
) -> None:
    # Rule 1: the reader of an older version converts; the next save writes every field it had, same
    # values. For the version this gpudra writes, it is rule 2 below.
    resaved = tmp_path / "resaved.json"
    checkpoint.save(resaved, checkpoint.load(golden.path, boot_id=golden.boot).checkpoint)
    old = json.loads(golden.path.read_text())["data"]
    new = json.loads(resaved.read_text())["data"]
    assert new["version"] == checkpoint.VERSION
    _keeps({**old, "version": checkpoint.VERSION}, new)


def test_the_written_version_s_writers_only_add_fields(tmp_path: Path) -> None:
    # Rule 2: within a version a field is never removed, renamed or written differently. It binds the
    # version this gpudra writes: a new version gets its own golden file, which this test then reads.
    assert WRITTEN in GOLDEN, "a new checkpoint version: write its golden file and add it to GOLDEN"
    golden = GOLDEN[WRITTEN]
    resaved = tmp_path / "resaved.json"
    checkpoint.save(resaved, checkpoint.load(golden.path, boot_id=golden.boot).checkpoint)
    _keeps(json.loads(golden.path.read_text())["data"], json.loads(resaved.read_text())["data"])


# --- recover() and a checkpoint of a newer gpudra -------------------------------------------------


@pytest.mark.parametrize("newer", ["version", "unknown-field"])
def test_recover_refuses_a_too_new_checkpoint_and_touches_nothing(tmp_path: Path, newer: str) -> None:
    node = Node(tmp_path, "dgx-h100")
    claim = node.claims.add(whole_gpus(uid(1), "gpu-0", config=[from_claim(time_slicing("Long"))]))
    node.state().prepare(claim)
    data = json.loads(node.checkpoint_path.read_text())["data"]
    if newer == "version":
        data["version"] = checkpoint.VERSION + 1
    else:
        data["claims"][uid(1)]["devices"][0]["mps_daemon"] = {"id": "d-1"}
    write_checkpoint(node.checkpoint_path, data)
    os.chmod(node.checkpoint_path, 0o600)
    stray = node.spec_path(uid(7))  # a spec recover() would delete: it belongs to no claim it knows
    stray.write_text(node.spec_path(uid(1)).read_text().replace(uid(1), uid(7)))
    before = {
        "state": _snapshot(node.checkpoint_path.parent),
        "cdi": _snapshot(node.cdi_root),
        "timeslices": node.timeslices(),
    }

    restarted = node.state(recover=False)
    refused = recover(restarted).refused

    assert refused is not None
    assert str(node.checkpoint_path) in refused
    assert "upgrade gpudra back" in refused
    with pytest.raises(ClaimError, match="upgrade gpudra back"):
        restarted.prepare(node.claims.add(whole_gpus(uid(2), "gpu-1")))
    after = {
        "state": _snapshot(node.checkpoint_path.parent),
        "cdi": _snapshot(node.cdi_root),
        "timeslices": node.timeslices(),
    }
    assert after == before
    assert not list(node.checkpoint_path.parent.glob("*.corrupt-*"))
    assert node.timeslices()[node.uuid(0)] != 0  # the claim's time-slice was not undone either
