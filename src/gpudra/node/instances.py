"""What two instances of the kubelet plugin on one node share, and how they take turns with it.
I/O: lock files in the state directory (flock), a thread.

A rolling update with `maxSurge: 1` runs the new plugin pod beside the old one until the new one is
ready: both have the node's checkpoint, CDI specs, MPS directories and GPUs in front of them, and the
kubelet may call either (new calls go to the newest registered instance; calls already sent to the old
one finish there). Two locks keep them apart:

- `NodeLock`: every prepare, unprepare and checkpoint recovery runs while its process holds an
  exclusive flock. A process takes it when the first of its calls starts and gives it up when the last
  one ends, so the claims of one instance still run side by side, kept apart by that instance's own
  thread locks (gpudra.node.prepare), while the other instance waits for a moment with none in flight.
  That is the least contention that stays correct: an instance decides from its memory of the
  checkpoint (which devices are taken, what to undo), and that memory is right only while no other
  process can change the file, i.e. from the moment it takes the lock (after catching up with the
  file) until it gives it up. A finer lock (per device) would still need the file read again at every
  decision, and would let a recovery run beside a prepare in flight. During an update the old
  instance gets no new calls, so it holds the lock only until the calls it had finish.
- `PublisherTurn`: only one instance at a time publishes to the API server (ResourceSlices, claim usage)
  and records GPU faults (their Node events, metrics and the health file: gpudra.node.health.gpu_faults). Two
  publishers would fight: each takes the other's write for someone else's edit and restores its own, and a
  pool rewrite at a new generation by one makes the other rewrite it again at the next, for as long as
  both run, even when both want the same slices. The new instance stands by, without writing, until the
  old one exits (its flock goes with its process, however it ends), then adopts the pool as the old one
  left it (dry runs; no write when its slices are the same).

flock locks belong to the open file, not to a thread, and go with the process however it ends; the lock
files are opened close-on-exec, so a child the plugin starts (an MPS control daemon that outlives it)
never inherits one and never keeps a lock after the plugin is gone.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from gpudra.errors import GpudraError
from gpudra.runtime.service import Service

log = logging.getLogger(__name__)
# How often a standing-by instance tries for its turn: how long the node goes unpublished at most
# after the old instance exits (its slices stay in place meanwhile).
TURN_POLL_SECONDS = 0.5


def _open_lock_file(path: Path) -> int:
    # Read-only: flock needs no more, and an existing lock file then opens on a read-only filesystem too
    # (the calls that need no write still work there, as they did before the lock).
    return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)


class NodeLock:
    """An exclusive flock on `path` between processes, held by this process while any of its threads is
    inside `held()`: the threads of one process share it, the processes take turns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mutex = threading.Lock()  # the holder count, and taking and giving up the flock
        self._holders = 0
        self._fd: int | None = None

    @contextmanager
    def held(self, on_acquire: Callable[[], None] = lambda: None) -> Iterator[None]:
        """Hold the lock for the body. `on_acquire` runs when this process has just taken it (no other
        thread of it is inside, no other process can be), before any thread enters; if it raises, the
        lock is given up again and the error leaves."""
        with self._mutex:
            if self._holders == 0:
                # Blocks with the mutex held: the process's other threads wait here too, as they must
                # (none is inside, so none needs the mutex to leave).
                try:
                    fd = _open_lock_file(self.path)
                except OSError as err:
                    problem = err.strerror or err
                    raise GpudraError(f"cannot open the lock file {self.path}: {problem}") from err
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    on_acquire()
                except BaseException:
                    os.close(fd)  # gives the flock up
                    raise
                self._fd = fd
            self._holders += 1
        try:
            yield
        finally:
            with self._mutex:
                self._holders -= 1
                if self._holders == 0 and self._fd is not None:
                    os.close(self._fd)
                    self._fd = None


class PublisherTurn:
    """A `service.Service` that runs `services` only while this process holds the flock on `path`.

    `start()` returns at once; a thread takes the turn as soon as it is free (at once when no other
    instance runs) and then starts the services in order. `stop()` stops them in reverse and gives the
    turn up, so a successor takes it within TURN_POLL_SECONDS."""

    def __init__(
        self, path: Path, services: Sequence[Service], *, poll_seconds: float = TURN_POLL_SECONDS
    ) -> None:
        self.path = path
        self.services = tuple(services)
        self.poll_seconds = poll_seconds
        self._stopping = threading.Event()
        self._guard = threading.Lock()  # starting the services, against stop()
        self._started: list[Service] = []
        self._fd: int | None = None
        self._thread = threading.Thread(target=self._take_turn, name="publisher-turn", daemon=True)
        self.active = threading.Event()  # set once this instance publishes

    @property
    def standing_by(self) -> bool:
        """Whether another instance on this node holds the turn (and publishes) while this one waits."""
        return self._thread.is_alive() and not self.active.is_set()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        with self._guard:
            started, self._started = self._started, []
            fd, self._fd = self._fd, None
        for service in reversed(started):
            service.stop(timeout)
        if fd is not None:
            os.close(fd)

    def _take_turn(self) -> None:
        fd = _open_lock_file(self.path)
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    log.info(
                        "another instance of the plugin on this node publishes; standing by until it exits",
                        extra={"lock": str(self.path)},
                    )
                    told = True
            if self._stopping.wait(self.poll_seconds):
                os.close(fd)
                return
        with self._guard:
            if self._stopping.is_set():
                os.close(fd)
                return
            self._fd = fd
            if told:
                log.info("the other instance is gone; publishing from this one")
            for service in self.services:
                service.start()
                self._started.append(service)
            self.active.set()
