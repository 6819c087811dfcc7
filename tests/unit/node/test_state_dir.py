"""The state directory's check at start (gpudra.node.state_dir)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpudra.errors import ConfigError
from gpudra.node import state_dir


def test_a_new_state_directory_is_made_private_and_an_existing_fit_one_is_kept(tmp_path: Path) -> None:
    made = tmp_path / "var" / "lib" / "gpudra"
    state_dir.ensure(made)
    assert made.stat().st_mode & 0o777 == 0o700
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    os.chmod(existing, 0o755)
    state_dir.ensure(existing)
    assert existing.stat().st_mode & 0o777 == 0o755  # readable by others is fine; nothing is changed


def _directory(mode: int = 0o700, owner: int | None = None) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.mkdir()
        os.chmod(path, mode)
        if owner is not None:
            os.chown(path, owner, 0)

    return make


def _file(path: Path) -> None:
    path.write_text("x")


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (_directory(0o777), "has mode 0777: writable by group or others"),
        (_directory(0o775), "has mode 0775: writable by group or others"),
        (_directory(owner=4242), "is owned by uid 4242, not by the plugin's user"),
        (_file, "is not a directory"),
    ],
)
def test_a_state_directory_someone_else_could_write_is_refused_with_the_fix(
    tmp_path: Path, make: Callable[[Path], None], problem: str
) -> None:
    path = tmp_path / "state"
    make(path)
    with pytest.raises(ConfigError) as refused:
        state_dir.ensure(path)
    assert refused.value.field == "--state-dir"
    assert problem in str(refused.value)
    assert f"chown {os.geteuid()} {path} && chmod go-w {path}" in str(refused.value)


def test_a_symlinked_state_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "state"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="is a symlink"):
        state_dir.ensure(link)
