"""The prepared claims of one node as the checkpoint file holds them. I/O: the checkpoint file, lock files.

`ClaimStore` sits below the state machine (gpudra.node.prepare) and owns everything about keeping the
checkpoint right between threads and processes, so that the state machine only sequences steps:

- memory follows the file: a save that fails changes nothing (`save`), one whose directory sync failed
  is followed (the file was replaced), and edits of threads saving at once share one write (group
  commit);
- the node lock (gpudra.node.instances.NodeLock) keeps another instance of the plugin out while a call
  runs; taking it catches memory up with a file that instance saved meanwhile (`exclusive`);
- device locks keep the calls of this process that touch the same devices apart (`locked`);
- readers outside the calls (metrics, health, claim usage) get the newest file without the lock
  (`latest`);
- while the checkpoint cannot be used (`refuse`), every call fails with the reason (`usable`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpudra.errors import ClaimError, GpudraError
from gpudra.node import checkpoint as ckpt
from gpudra.node.instances import NodeLock

log = logging.getLogger(__name__)


class ClaimStore:
    """The checkpoint of one node: in memory, on disk, and the locks that keep the two the same."""

    def __init__(self, path: Path, *, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id
        self._checkpoint = ckpt.Checkpoint.empty(boot_id)
        # Guards the memory of the checkpoint, the changes waiting for a save, and the device locks' map;
        # the save lock makes one thread at a time the writer of the file (see `save`).
        self._checkpoint_lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._waiting: list[_Change] = []
        self._device_locks: dict[str, threading.Lock] = {}
        self._refusal: str | None = "the checkpoint has not been loaded yet"
        # Beside the checkpoint, in the directory every instance on the node shares.
        self._node = NodeLock(path.with_name(f"{path.name}.lock"))
        # The file's bytes as this instance last wrote or read them (None: no file yet), and the last
        # file another instance saved, as `latest` parsed it.
        self._on_disk: bytes | None = None
        self._read_by_readers: tuple[bytes, ckpt.Checkpoint] | None = None

    # --- what calls decide from ------------------------------------------------------------------

    @property
    def current(self) -> ckpt.Checkpoint:
        """The checkpoint as this process knows it: right while it holds the node lock (`exclusive`)."""
        return self._checkpoint

    def entry(self, uid: str) -> ckpt.ClaimEntry | None:
        return self._checkpoint.claims.get(uid)

    def others(self, uid: str) -> list[ckpt.ClaimEntry]:
        """Every claim of the checkpoint but `uid`: those that share its GPUs' settings."""
        return [e for e in self._checkpoint.claims.values() if e.uid != uid]

    def load(self, checkpoint: ckpt.Checkpoint) -> None:
        """Make `checkpoint` (as recovery loaded or rebuilt it) memory's; the next `save` writes it."""
        self._checkpoint = checkpoint

    # --- refusing --------------------------------------------------------------------------------

    @property
    def refusal(self) -> str | None:
        """Why this node prepares nothing (None: it does)."""
        return self._refusal

    def refuse(self, reason: str | None) -> None:
        """Fail every call with `reason` from now on (None: serve them again)."""
        self._refusal = reason

    def usable(self) -> None:
        """ClaimError while the checkpoint cannot be used (see `refuse`)."""
        if self._refusal is not None:
            raise ClaimError(f"gpudra is not preparing or unpreparing claims on this node: {self._refusal}")

    # --- locks -----------------------------------------------------------------------------------

    def exclusive(self, *, catch_up: bool = True) -> AbstractContextManager[None]:
        """The node lock for a call; the checkpoint file is caught up with as this process takes it
        (recovery, which loads the file itself, skips that)."""
        return self._node.held(self._catch_up if catch_up else lambda: None)

    @contextmanager
    def locked(self, devices: Iterable[str]) -> Iterator[None]:
        """The locks of `devices`, taken in name order so that two calls never deadlock."""
        names = sorted(set(devices))
        with self._checkpoint_lock:
            locks = [self._device_locks.setdefault(name, threading.Lock()) for name in names]
        with ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            yield

    # --- saving ----------------------------------------------------------------------------------

    def queued_edits(self) -> int:
        """How many edits wait for the save in progress (group commit: they go in the next write)."""
        with self._checkpoint_lock:
            return len(self._waiting)

    def record(self, entry: ckpt.ClaimEntry) -> None:
        self.save(lambda checkpoint: checkpoint.with_claim(entry))

    def forget(self, uid: str) -> None:
        self.save(lambda checkpoint: checkpoint.without_claim(uid))

    def save(self, edit: Callable[[ckpt.Checkpoint], ckpt.Checkpoint]) -> None:
        """Make the checkpoint with `edit` applied durable, then current: a failed save (disk full)
        changes nothing, so memory never claims a state the file does not hold.

        Group commit: while one thread writes and syncs the file, the edits of the others (the claims
        of one call, calls in parallel) wait, and the next writer saves them all at once. A caller
        returns only once a save that holds its edit is durable, and raises that save's error, so each
        gets what a save of its own would give, at one write and two fsyncs per batch, not per claim."""
        change = _Change(edit)
        with self._checkpoint_lock:
            self._waiting.append(change)
        with self._save_lock:
            if not change.done:
                self._save_waiting()
                if change.failure is not None:
                    raise change.failure
        if change.failure is not None:
            # Saved by another thread: an exception of its own for each caller, as they raise at once.
            raise type(change.failure)(str(change.failure)) from change.failure

    def _save_waiting(self) -> None:
        """Save every waiting edit in one write; call with the save lock held."""
        with self._checkpoint_lock:
            batch, self._waiting = self._waiting, []
        checkpoint = self._checkpoint  # only the holder of the save lock changes it, besides _catch_up
        for change in batch:
            checkpoint = change.edit(checkpoint)
        failure: ckpt.CheckpointNotSaved | ckpt.CheckpointNotDurable | None = None
        try:
            content = ckpt.save(self.path, checkpoint)
        except ckpt.CheckpointNotDurable as err:
            # The file was replaced, only its directory sync failed: a restart reads the new file,
            # so memory follows it (else a rollback would skip what the file says was recorded).
            content, failure = ckpt.encode(checkpoint), err
        except ckpt.CheckpointNotSaved as err:
            failure = err
        except BaseException as err:
            failure = ckpt.CheckpointNotSaved(f"cannot save the checkpoint {self.path}: {err!r}")
            raise
        finally:
            for change in batch:
                change.failure, change.done = failure, True
        if not isinstance(failure, ckpt.CheckpointNotSaved):
            with self._checkpoint_lock:
                self._checkpoint, self._on_disk = checkpoint, content

    # --- another instance's saves ------------------------------------------------------------------

    def _catch_up(self) -> None:
        """Load the checkpoint again if another instance saved it since this one last read or wrote it.

        Runs as this process takes the node lock: none of its calls is in flight, and no other
        instance can save until it gives the lock up, so memory is then right for every call in
        between. The file's bytes are compared, not its inode, size and mtime: a file replaced by a
        rename may get the inode number just freed, the same size and the same clock tick, and the
        few kilobytes cost one read. A file that cannot be used fails the call (the kubelet retries):
        nothing is decided from a memory that may be stale."""
        content = ckpt.read(self.path)
        if content == self._on_disk:
            return
        self._checkpoint, self._on_disk = self._saved_elsewhere(content), content
        log.info(
            "checkpoint saved by another instance of the plugin; loaded again",
            extra={"prepared_claims": len(self._checkpoint.claims)},
        )

    def _saved_elsewhere(self, content: bytes | None) -> ckpt.Checkpoint:
        """The checkpoint in `content`, which another process saved; ClaimError when it is unusable."""

        def unusable(problem: str) -> ClaimError:
            return ClaimError(
                f"the checkpoint {self.path} changed behind this plugin instance and cannot be used: "
                f"{problem}"
            )

        rebuild = "restart the plugin to rebuild it from the CDI specs"
        if content is None:
            raise unusable(f"it was deleted; {rebuild}")
        try:
            loaded = ckpt.parse(content, source=self.path, boot_id=self.boot_id)
        except ckpt.CheckpointCorrupt as err:
            raise unusable(f"{err}; {rebuild}") from err
        except ckpt.CheckpointTooNew as err:  # a newer gpudra's instance took the node over
            raise unusable(str(err)) from err
        if loaded.stale_claims:
            raise unusable(f"it was written under another boot; {rebuild}")
        return loaded.checkpoint

    def latest(self) -> ckpt.Checkpoint:
        """The checkpoint for readers outside the calls (metrics, health checks, claim usage): the file
        when another instance saved it since this one last did (read without the node lock: a save
        replaces it atomically), else memory. A file that cannot be used leaves memory the answer."""
        try:
            content = ckpt.read(self.path)
        except ckpt.CheckpointUnreadable:
            return self._checkpoint
        if content is None or content == self._on_disk:
            return self._checkpoint
        known = self._read_by_readers
        if known is None or known[0] != content:
            try:
                loaded = ckpt.parse(content, source=self.path, boot_id=self.boot_id)
            except GpudraError:
                return self._checkpoint
            if loaded.stale_claims:
                return self._checkpoint
            known = self._read_by_readers = (content, loaded.checkpoint)
        return known[1]


@dataclass
class _Change:
    """An edit of the checkpoint waiting for its save (`ClaimStore.save`), and how that went."""

    edit: Callable[[ckpt.Checkpoint], ckpt.Checkpoint]
    done: bool = False
    failure: ckpt.CheckpointNotSaved | ckpt.CheckpointNotDurable | None = None
