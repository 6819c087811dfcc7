"""The write layer under faults, one at a time: what the suite's random and exhaustive runs rely on.

- a temp file a kill left in the middle of an atomic write is removed by the next write of that file,
  and a claim's by the deletion of its spec (else every kill mid-write leaves one in the CDI root);
- a directory sync that fails after the rename says so (NotDurable): the file is already replaced;
- the checkpoint and CDI errors name the file, the directory and the cause.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from gpudra import atomic_file
from gpudra.errors import GpudraError
from gpudra.node import cdi
from gpudra.node import checkpoint as ckpt
from tests.faults.inject import FileSystemFaults
from tests.faults.node import BOOT, uid
from tests.unit.claims import DRIVER

SPEC = cdi.build_claim_spec(
    driver=DRIVER, claim_uid=uid(1), devices=[cdi.ClaimDevice(name="gpu-0", gpu_minor=0, uuid="GPU-0")]
)


def test_a_write_removes_the_temp_files_a_killed_write_left(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint.json"
    left = [tmp_path / ".checkpoint.json.k1ll3d00.tmp", tmp_path / ".checkpoint.json.k1ll3d01.tmp"]
    other = tmp_path / ".other.json.k1ll3d02.tmp"  # another file's write: not this one's to remove
    for path in (*left, other):
        path.write_bytes(b"half")
    ckpt.save(target, ckpt.Checkpoint.empty(BOOT))
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, target.name]


def test_deleting_a_spec_removes_the_temp_files_of_its_killed_write(tmp_path: Path) -> None:
    path = cdi.write_spec(tmp_path, SPEC, claim_uid=uid(1))
    leftover = tmp_path / f".{path.name}.k1ll3d00.tmp"
    leftover.write_bytes(b"half")
    assert cdi.delete_spec(tmp_path, driver=DRIVER, claim_uid=uid(1))
    assert list(tmp_path.iterdir()) == []
    leftover.write_bytes(b"half")  # a kill during the first write of a spec: no spec yet
    assert not cdi.delete_spec(tmp_path, driver=DRIVER, claim_uid=uid(1))
    assert list(tmp_path.iterdir()) == []


def test_a_failed_directory_sync_says_the_file_was_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "file.json"
    target.write_bytes(b"old")
    faults = FileSystemFaults([tmp_path], monkeypatch)
    faults.arm(5, errno=errno.EIO, persistent=False)  # create, write, fsync, rename, then the sync
    with pytest.raises(atomic_file.NotDurable) as raised:
        atomic_file.write_atomically(target, b"new", mode=0o600)
    assert faults.failed == [f"fsync {tmp_path}"]
    assert raised.value.errno == errno.EIO
    assert target.read_bytes() == b"new"

    checkpoint = ckpt.Checkpoint.empty(BOOT)
    faults.arm(5, errno=errno.EIO, persistent=False)
    with pytest.raises(ckpt.CheckpointNotDurable, match=f"checkpoint {target} was replaced, but syncing"):
        ckpt.save(target, checkpoint)
    assert ckpt.load(target, boot_id=BOOT).checkpoint == checkpoint


def test_write_errors_name_the_file_and_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    faults = FileSystemFaults([tmp_path], monkeypatch, unlink=True)
    faults.arm(1, errno=errno.ENOSPC, persistent=True)
    target = tmp_path / "checkpoint.json"
    with pytest.raises(ckpt.CheckpointNotSaved, match=f"cannot save the checkpoint {target}: No space left"):
        ckpt.save(target, ckpt.Checkpoint.empty(BOOT))
    assert not target.exists()

    cdi_root = tmp_path / "cdi"
    with pytest.raises(GpudraError) as raised:
        cdi.write_spec(cdi_root, SPEC, claim_uid=uid(1))  # creating the root fails first
    assert str(raised.value) == (
        f"cannot write the CDI spec {DRIVER}-claim_{uid(1)}.json in the CDI root {cdi_root}: "
        "No space left on device (the CDI root must be a writable directory with free space)"
    )
    faults.disarm()
    cdi.write_spec(cdi_root, SPEC, claim_uid=uid(1))
    faults.arm(1, errno=errno.EROFS, persistent=True)
    with pytest.raises(
        GpudraError, match=f"cannot delete the CDI spec .* in the CDI root {cdi_root}: Read-only"
    ):
        cdi.delete_spec(cdi_root, driver=DRIVER, claim_uid=uid(1))
    faults.disarm()
    assert cdi.delete_spec(cdi_root, driver=DRIVER, claim_uid=uid(1))
