"""File-system failures injected into this process's writes under some directories. I/O: patches `os`.

`FileSystemFaults` wraps the calls through which gpudra writes files (`os.open` for writing, `os.fdopen`
for the data written, `os.fsync`, `os.replace`, `os.rename`, `os.mkdir`, and with `unlink=True`
`os.unlink`) and counts those whose path lies under one of its directories: the *write points*.
Armed at k, the k-th point and, when `persistent`, every later one raise `OSError(errno)` as the
kernel would (ENOSPC for a full disk, EROFS for a read-only mount) until `disarm()`. Calls on other
paths (the simulated GPUs' state file, pytest's own files) are never touched.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import pytest

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class FileSystemFaults:
    def __init__(
        self, directories: Sequence[Path], monkeypatch: pytest.MonkeyPatch, *, unlink: bool = False
    ) -> None:
        self.prefixes = tuple(f"{directory.resolve()}/" for directory in directories)
        self.seen = 0  # write points passed since the last arm()
        self.failed: list[str] = []  # the points that failed since the last arm(), as "call path"
        self._fail_at: int | None = None
        self._persistent = False
        self._errno = 0
        real = {
            name: getattr(os, name)
            for name in ("open", "fdopen", "fsync", "replace", "rename", "mkdir", "unlink")
        }

        def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if flags & _WRITE_FLAGS:
                self._point("open", path)
            return int(real["open"](path, flags, *args, **kwargs))

        def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
            file = real["fdopen"](fd, *args, **kwargs)
            path = _fd_path(fd)
            if not path.startswith(self.prefixes):
                return file
            return _CheckedFile(file, lambda: self._point("write", path))

        def fsync(fd: int) -> None:
            self._point("fsync", _fd_path(fd))
            real["fsync"](fd)

        def replace(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
            self._point("rename", target)
            real["replace"](source, target, *args, **kwargs)

        def rename(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
            self._point("rename", target)
            real["rename"](source, target, *args, **kwargs)

        def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
            if not os.path.lexists(path):  # the kernel answers EEXIST before it looks for room
                self._point("mkdir", path)
            real["mkdir"](path, *args, **kwargs)

        def unlink_(path: Any, *args: Any, **kwargs: Any) -> None:
            self._point("unlink", path)
            real["unlink"](path, *args, **kwargs)

        for name, function in (
            ("open", open_),
            ("fdopen", fdopen),
            ("fsync", fsync),
            ("replace", replace),
            ("rename", rename),
            ("mkdir", mkdir),
        ):
            monkeypatch.setattr(os, name, function)
        if unlink:
            monkeypatch.setattr(os, "unlink", unlink_)

    def arm(self, at: int, *, errno: int, persistent: bool) -> None:
        """Fail the `at`-th write point from now (1 is the next one), and every later one if `persistent`."""
        self.seen, self.failed = 0, []
        self._fail_at, self._errno, self._persistent = at, errno, persistent

    def disarm(self) -> None:
        self._fail_at = None

    def _point(self, call: str, path: Any) -> None:
        path = os.path.abspath(os.fspath(path))
        if not f"{path}/".startswith(self.prefixes):  # the directories themselves count (fsync)
            return
        self.seen += 1
        if self._fail_at is not None and (
            self.seen == self._fail_at or (self._persistent and self.seen > self._fail_at)
        ):
            self.failed.append(f"{call} {path}")
            raise OSError(self._errno, os.strerror(self._errno), path)


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


class _CheckedFile:
    """A file whose writes are write points (what `write_atomically` does with `os.fdopen`)."""

    def __init__(self, file: IO[Any], check: Callable[[], None]) -> None:
        self._file = file
        self._check = check

    def write(self, data: Any) -> int:
        self._check()
        return self._file.write(data)

    def flush(self) -> None:
        self._file.flush()

    def fileno(self) -> int:
        return self._file.fileno()

    def __enter__(self) -> _CheckedFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._file.close()
