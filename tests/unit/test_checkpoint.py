from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpudra.errors import GpudraError
from gpudra.node import checkpoint
from gpudra.node.checkpoint import (
    Checkpoint,
    ClaimEntry,
    MigRecord,
    MpsRecord,
    PreparedDevice,
    TimeSlicingRecord,
)

BOOT = "3f0b4e2a-6d1c-4c55-9d0e-1b2a3c4d5e6f"
OTHER_BOOT = "8a7b6c5d-4e3f-4a1b-8c9d-0e1f2a3b4c5d"
GPU0 = "GPU-11111111-2222-3333-4444-555555555555"
GPU1 = "GPU-66666666-7777-8888-9999-000000000000"


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
            gpu_uuid=GPU0,
            profile_id=19,
            placement_start=0,
            gpu_instance_id=7,
            compute_instance_id=0,
            uuid="MIG-0a0b0c0d-1111-2222-3333-444455556666",
        ),
    )
    mps = whole_gpu(uid_mps, device="gpu-1", uuid=GPU1).model_copy(
        update={
            "sharing": MpsRecord(
                strategy="MPS",
                daemon_id=f"{uid_mps}-1a2b3",
                pipe_dir=Path("/var/lib/kubelet/plugins/gpu.gpudra.io/mps/b2-mps-1a2b3/pipe"),
                active_thread_percentage=50,
                pinned_memory_limits={GPU1: 10 * 2**30},
            )
        }
    )
    ts = whole_gpu(uid_ts).model_copy(
        update={"sharing": TimeSlicingRecord(strategy="TimeSlicing", interval="Long"), "admin_access": True}
    )
    return (
        Checkpoint.empty(BOOT)
        .with_claim(entry(uid_mig, devices=(mig,)))
        .with_claim(entry(uid_mps, devices=(mps,)))
        .with_claim(entry(uid_ts, state="PrepareStarted", devices=(ts,)))
    )


def write_document(path: Path, data: Any, *, checksum: str | None = None) -> None:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest() if checksum is None else checksum
    path.write_text(json.dumps({"checksum": digest, "data": data}))


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
    assert document["data"]["version"] == 1
    assert document["data"]["boot_id"] == BOOT


def test_missing_file_is_an_empty_checkpoint(tmp_path: Path) -> None:
    loaded = checkpoint.load(tmp_path / "checkpoint.json", boot_id=BOOT)
    assert loaded.checkpoint == Checkpoint(version=1, boot_id=BOOT, claims={})
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
    write_document(path, {"version": 1, "boot_id": BOOT, "claims": {"u1": claim}})
    loaded = checkpoint.load(path, boot_id=BOOT).checkpoint
    assert loaded.claims["u1"].devices[0].mig is None
    assert loaded.claims["u1"].devices[0].admin_access is False


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
        (lambda d: d["claims"]["u1"].update(colour="red"), r"claims\.u1\.colour: Extra inputs"),
        (lambda d: d["claims"]["u1"]["devices"][0].update(gpu=1), r"devices\.0\.gpu: Extra inputs"),
        (lambda d: d["claims"]["u1"].update(state="Prepared"), r"claims\.u1\.state"),
        (lambda d: d.update(claims={"u2": d["claims"]["u1"]}), "holds the entry of claim 'u1'"),
        (lambda d: d.update(boot_id=""), "boot_id"),
    ],
    ids=["unknown-claim-field", "unknown-device-field", "unknown-state", "key-is-not-uid", "empty-boot-id"],
)
def test_schema_violation_in_file_is_reported(tmp_path: Path, edit: Any, message: str) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, Checkpoint.empty(BOOT).with_claim(entry("u1")))
    data = json.loads(path.read_text())["data"]
    edit(data)
    write_document(path, data)  # a correct checksum: only the schema is wrong
    with pytest.raises(GpudraError, match="does not match the schema") as raised:
        checkpoint.load(path, boot_id=BOOT)
    assert raised.match(message)
    assert str(path) in str(raised.value)


@pytest.mark.parametrize("version", [2, 0, None], ids=["newer", "zero", "missing"])
def test_unknown_version_is_reported(tmp_path: Path, version: int | None) -> None:
    path = tmp_path / "checkpoint.json"
    data: dict[str, Any] = {"boot_id": BOOT, "claims": {}}
    if version is not None:
        data["version"] = version
    write_document(path, data)
    with pytest.raises(GpudraError, match=f"has version {version!r}; this gpudra reads version 1"):
        checkpoint.load(path, boot_id=BOOT)


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
        lambda: MigRecord(gpu_uuid=GPU0, profile_id=-1, placement_start=0),
        lambda: TimeSlicingRecord.model_validate({"strategy": "TimeSlicing", "interval": "Sometimes"}),
        lambda: TimeSlicingRecord.model_validate(
            {"strategy": "TimeSlicing", "interval": "Long", "daemon_id": "x"}
        ),
        lambda: MpsRecord(strategy="MPS", daemon_id="d", pipe_dir=Path("/p"), active_thread_percentage=0),
        lambda: MpsRecord(strategy="MPS", daemon_id="d", pipe_dir=Path("/p"), active_thread_percentage=101),
        lambda: MpsRecord(
            strategy="MPS", daemon_id="d", pipe_dir=Path("/p"), pinned_memory_limits={GPU0: -1}
        ),
        lambda: MpsRecord(strategy="MPS", daemon_id="", pipe_dir=Path("/p")),
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
        "negative-memory-limit",
        "empty-daemon-id",
        "time-slicing-field-on-mps",
        "unknown-strategy",
    ],
)
def test_models_are_strict(build: Any) -> None:
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
        mig=MigRecord(gpu_uuid=GPU0, profile_id=19, placement_start=0),
    )
    started = entry(uid, state="PrepareStarted", devices=(planned,))
    created = planned.model_copy(
        update={
            "cdi_device_ids": (f"gpu.gpudra.io/claim={uid}-gpu-0-mig-1g10gb-19-0",),
            "mig": MigRecord(
                gpu_uuid=GPU0,
                profile_id=19,
                placement_start=0,
                gpu_instance_id=7,
                compute_instance_id=0,
                uuid="MIG-1",
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
        started.with_state("Done")  # type: ignore[arg-type]


def test_quarantine_moves_the_file_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text("{broken")
    moved = checkpoint.quarantine(path)
    assert moved.parent == tmp_path
    assert moved.name.startswith("checkpoint.json.corrupt-")
    assert moved.read_text() == "{broken"
    assert not path.exists()
    assert checkpoint.load(path, boot_id=BOOT).checkpoint == Checkpoint.empty(BOOT)


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
