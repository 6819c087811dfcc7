"""Crash-safe replacement of small files, and a lock between processes. I/O: the file system.

A reader sees either the old file or the new one, never a partly written one, and after a return the
new file survives a power cut: write a temp file in the same directory, fsync it, rename it over the
target, fsync the directory. The temp name starts with a dot and ends in `.tmp`, so a file left
behind by a crash is invisible to readers that look for `*.json` / `*.yaml` (the CDI registries and
gpudra's own readers). Such a leftover is removed by the next write of the same file, or by
`remove_leftovers` when the file is deleted instead, so crashes do not pile them up.

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


class NotDurable(OSError):
    """`write_atomically` replaced the file, then syncing its directory failed: every reader already
    sees the new content, but a power cut may bring the old one back. Callers that keep the file's
    content in memory must treat the new content as written (a restart reads it), and still report
    the error."""


def write_atomically(path: Path, content: bytes, *, mode: int, durable: bool = True) -> None:
    """Replace `path` with `content` (permission bits `mode`); the directory must exist.

    Raises OSError with `path` unchanged, or NotDurable (an OSError) with `path` replaced. With
    `durable=False` nothing is synced: the replacement is still atomic for every reader and survives the
    writer's crash (the page cache holds it), only a power cut may lose it. That is for files whose loss
    in a power cut costs nothing, because the reboot makes them stale anyway (see gpudra.node.cdi).

    Writers of one file must not overlap (each caller holds a lock): a write removes the temp files
    of earlier writes of `path`, which only a crash leaves behind."""
    remove_leftovers(path)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as temp:
            os.fchmod(temp.fileno(), mode)
            temp.write(content)
            temp.flush()
            if durable:
                os.fsync(temp.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    if not durable:
        return
    try:
        fsync_directory(path.parent)
    except OSError as err:
        raise NotDurable(err.errno, err.strerror, str(path.parent)) from err


def remove_leftovers(path: Path) -> None:
    """Remove the temp files that a crash inside `write_atomically(path)` left behind."""
    prefix = f".{path.name}."
    # A scan with plain string tests: a glob pattern per file name costs a regex compile on every write.
    with os.scandir(path.parent) as entries:
        leftovers = [e.path for e in entries if e.name.startswith(prefix) and e.name.endswith(".tmp")]
    for leftover in leftovers:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(leftover)


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
