"""The plugin's state directory, checked at start: what it holds (the checkpoint, MPS daemons' records,
the health marks) decides which GPUs are held and which processes are signalled, so only this process's
user may have written it. I/O: one lstat.

A directory owned by another user, writable by group or others, or reached through a symlink could
hold a checkpoint someone else wrote; the plugin then refuses to start with one line naming the path,
what is wrong and the fix, instead of trusting it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from gpudra.errors import ConfigError


def problem(found: os.stat_result, *, euid: int) -> str | None:
    """What makes a directory's lstat unfit to hold the plugin's state; None when it is fit. Pure."""
    if stat.S_ISLNK(found.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(found.st_mode):
        return "is not a directory"
    if found.st_uid != euid:
        return f"is owned by uid {found.st_uid}, not by the plugin's user (uid {euid})"
    if found.st_mode & 0o022:
        return f"has mode {stat.S_IMODE(found.st_mode):04o}: writable by group or others"
    return None


def ensure(path: Path) -> None:
    """Creates the state directory (mode 0700 when new) or checks the one that is there; ConfigError
    naming the path, the problem and the fix when it is not fit."""
    with contextlib.suppress(FileExistsError):  # a file in its place: said below
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = problem(os.lstat(path), euid=os.geteuid())
    if found is not None:
        raise ConfigError(
            f"{path} {found}; it must be a directory owned by uid {os.geteuid()} and writable by it "
            f"alone (chown {os.geteuid()} {path} && chmod go-w {path})",
            field="--state-dir",
        )
