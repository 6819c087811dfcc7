"""Directories removed outside the node lock: moved into a trash directory at once, emptied by a thread.
I/O: renames and unlinks under the plugin's state directory, one thread per trash.

A claim's MPS directory holds its pipe directory, which the claim's containers mount read-write: a tenant
can fill it with millions of files (unlinking a million took 11 s on two cores). Unprepare runs under
the node lock, which every prepare and unprepare on the node waits for, so it only renames the directory
into the trash (`put`: one rename within one filesystem, whatever the directory holds) and leaves the
rest to the trash's worker thread (`empty_later`), which holds no lock of the plugin's and so never
blocks a prepare or an unprepare, and runs at the lowest CPU priority so that it slows them little. A
process killed before its worker finished leaves the rest in the trash: the next process that opens
that trash (the plugin's start, mps-host's start) empties it.

Nothing in the trash is followed or opened for reading: its entries are what a tenant wrote (symlinks to
/etc, FIFOs, sockets, directories nested as deep as it liked). Each directory is listed through a
descriptor opened with O_NOFOLLOW, its other entries are unlinked as the listing streams, and each
directory in it is renamed up into the trash to be emptied in a later pass instead of being descended
into: the worker holds one directory open at a time, needs no recursion and no memory for a listing,
however deep or wide the tree is. Whatever cannot be removed (a file made immutable on the host) stays
and is logged; the next `empty_later` or start-up tries again.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Trash:
    def __init__(self, directory: Path) -> None:
        """The trash in `directory`, which must be on the filesystem of what is put in it. Anything a
        process killed earlier left there is removed in the background from now on."""
        self.directory = directory
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._worker: threading.Thread | None = None
        if _holds_anything(directory):
            self.empty_later()

    def put(self, path: Path) -> None:
        """Move `path` (a directory or any other entry) into the trash; nothing when it is not there. The
        caller then calls `empty_later`. A `path` on another filesystem is removed where it is instead
        (what the trash is for is then lost: logged)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.rename(path, self.directory / f"{path.name}.{secrets.token_hex(4)}")
        except FileNotFoundError:
            return
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
            log.warning(
                "not on the trash's filesystem; removed in place",
                extra={"path": str(path), "trash": str(self.directory)},
            )
            shutil.rmtree(path, ignore_errors=True)  # its fd-based walk follows no symlink

    def empty_later(self) -> None:
        """Have the worker thread remove what the trash holds; returns at once."""
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="trash", daemon=True)
                self._worker.start()
        self._wake.set()

    def _work(self) -> None:
        # The lowest CPU priority, for this thread alone (on Linux a nice value is a thread's): the
        # prepares and unprepares that run meanwhile come first.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                self._sweep()
            except OSError as err:  # the trash itself could not be read: the next wake tries again
                log.warning("cannot empty the trash", extra={"trash": str(self.directory), "error": str(err)})

    def _sweep(self) -> None:
        """Empty the trash, pass after pass, until a pass finds nothing or removes nothing."""
        while True:
            try:
                trash = os.open(self.directory, _DIRECTORY_FLAGS)
            except FileNotFoundError:
                return
            try:
                found, removed = _pass(trash)
            finally:
                os.close(trash)
            if not found:
                return
            if not removed:
                log.warning(
                    "entries left in the trash", extra={"trash": str(self.directory), "entries": found}
                )
                return


def _pass(trash: int) -> tuple[int, int]:
    """One pass over the trash: each directory emptied (its subdirectories renamed up into the trash) and
    removed, each other entry unlinked. How many entries the pass found, and how many it removed or
    moved (progress: a pass that moved a subdirectory up made some)."""
    found = removed = 0
    for name in _names(trash):
        found += 1
        try:
            os.unlink(name, dir_fd=trash)
            removed += 1
            continue
        except FileNotFoundError:  # another process emptying the same trash took it
            continue
        except IsADirectoryError:
            pass
        except OSError as err:
            if err.errno != errno.EPERM:  # unlink(2) on a directory says EISDIR or EPERM
                log.warning("cannot remove from the trash", extra={"entry": name, "error": str(err)})
                continue
        removed += _empty_directory(trash, name)
    return found, removed


def _empty_directory(trash: int, name: str) -> int:
    """Unlink what directory `name` of the trash holds, rename its subdirectories up into the trash, and
    remove it once it is empty; how many entries that removed or moved."""
    try:
        directory = os.open(name, _DIRECTORY_FLAGS, dir_fd=trash)
    except (FileNotFoundError, NotADirectoryError):  # gone, or replaced since it was listed
        return 0
    done = 0
    try:
        for entry in _names(directory):
            try:
                os.unlink(entry, dir_fd=directory)
            except (IsADirectoryError, PermissionError):
                try:
                    os.rename(entry, secrets.token_hex(8), src_dir_fd=directory, dst_dir_fd=trash)
                except OSError as err:
                    log.warning("cannot move a directory up in the trash", extra={"error": str(err)})
                    continue
            except FileNotFoundError:
                continue
            except OSError as err:
                log.warning("cannot remove from the trash", extra={"entry": entry, "error": str(err)})
                continue
            done += 1
    finally:
        os.close(directory)
    try:
        os.rmdir(name, dir_fd=trash)
    except FileNotFoundError:
        pass
    except OSError as err:
        if err.errno != errno.ENOTEMPTY:  # not empty: entries the listing missed; the next pass
            log.warning("cannot remove from the trash", extra={"entry": name, "error": str(err)})
        return done
    return done + 1


def _names(directory: int) -> Iterator[str]:
    """The names in the open `directory`, streamed (a listing of millions is never held)."""
    with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
        for entry in entries:
            yield entry.name


def _holds_anything(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return next(entries, None) is not None
    except (FileNotFoundError, NotADirectoryError):
        return False
