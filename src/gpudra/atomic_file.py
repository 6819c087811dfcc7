"""Crash-safe replacement of small files, and a lock between processes. I/O: the file system.

A reader sees either the old file or the new one, never a partly written one, and after a return the
new file survives a power cut: write a temp file in the same directory, fsync it, rename it over the
target, fsync the directory. The temp name starts with a dot and ends in `.tmp`, so a file left
behind by a crash is invisible to readers that look for `*.json` / `*.yaml` (the CDI registries and
gpudra's own readers).

A file replaced by rename cannot carry an `flock` (the lock would stay on the old inode), so
`locked()` takes the lock on a sibling `<name>.lock` file that is never replaced.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_atomically(path: Path, content: bytes, *, mode: int) -> None:
    """Replace `path` with `content` (permission bits `mode`); the directory must exist."""
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as temp:
            os.fchmod(temp.fileno(), mode)
            temp.write(content)
            temp.flush()
            os.fsync(temp.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make renames and unlinks in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold an flock for `path` (shared or exclusive) on its sibling lock file; blocks until granted."""
    with path.with_name(path.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
