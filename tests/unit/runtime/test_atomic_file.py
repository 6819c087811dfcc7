"""write_atomically: durable and not, and the cleanup of a crashed write's temp files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudra import atomic_file


@pytest.mark.parametrize(("durable", "syncs"), [(True, 2), (False, 0)], ids=["durable", "not-durable"])
def test_a_write_syncs_the_file_and_its_directory_only_when_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool, syncs: int
) -> None:
    synced: list[int] = []
    real = os.fsync

    def counted(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    target = tmp_path / "spec.json"
    atomic_file.write_atomically(target, b"{}", mode=0o644, durable=durable)
    assert target.read_bytes() == b"{}" and oct(target.stat().st_mode & 0o777) == "0o644"
    assert len(synced) == syncs
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]  # no temp file left either way


def test_a_write_removes_the_temp_files_of_earlier_crashed_writes_of_that_file_only(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    mine = tmp_path / ".a.json.x1y2.tmp"
    other = tmp_path / ".ab.json.x1y2.tmp"  # another file's: its prefix is not ".a.json."
    for leftover in (mine, other):
        leftover.write_text("{")
    atomic_file.write_atomically(target, b"1", mode=0o600)
    assert not mine.exists() and other.exists()
