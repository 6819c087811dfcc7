"""Leader election for `gpudra controller`: of the replicas that run, one leads, and only the leader
writes. I/O: a `service.Loop` thread, and the API server through the injected `LeaseStore`.

The semantics are client-go's leaderelection over a `coordination.k8s.io/v1` Lease. Every retry
period each replica reads the Lease. A candidate takes it when it is absent, held by nobody, or not
renewed for its `leaseDurationSeconds`, measured on the candidate's own monotonic clock from the moment
it first saw the record as it is now: the holder's `renewTime` is never compared with the local wall
clock, since the two machines' clocks may disagree by any amount. The leader renews it every retry
period. Every write carries the `resourceVersion` it was read at, so of two replicas that race, one
gets `Conflict` and stays (or becomes) a follower. A leader that has not renewed within the renew
deadline stops leading, well before a candidate may take over. As in client-go, an absent Lease is
taken at once: deleting the Lease by hand while a leader holds it can give two leaders until the old
one's next read (one retry period).

`Election` is the decision logic, pure (record read + now -> record to write); `LeaderElector` runs it
on a loop, serializes it with `is_leader()`, and tells callbacks when leadership changes.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from gpudra.errors import ClusterError, ConfigError
from gpudra.kube.client import Conflict, NotFound
from gpudra.kube.lease import LeaseRecord
from gpudra.runtime.service import Loop

log = logging.getLogger(__name__)


class LeaseStore(Protocol):
    """Reads and writes Leases: gpudra.kube.lease.Leases, or an in-memory store in tests. Failures raise
    `ClusterError`; a write that lost a race (the name exists, the resourceVersion is stale) `Conflict`."""

    def get(self, namespace: str, name: str) -> LeaseRecord | None: ...

    def create(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord: ...

    def replace(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord: ...


@dataclass(frozen=True)
class Timing:
    """client-go's defaults (lease 15 s, renew deadline 10 s, retry period 2 s), scaled from the lease.

    The renew deadline is 2/3 of the lease: a leader that cannot renew stops leading a third of the
    lease (5 s by default) before any candidate may take over. That margin absorbs clocks that run at
    slightly different rates and the time a write, checked with `is_leader()` just before it, takes to
    reach the API server. The retry period is 1/7.5 of the lease, so a leader gets five tries before its
    deadline (10 s / 2 s) and one or two failed requests do not cost it the lead.
    """

    lease: float
    renew_deadline: float
    retry_period: float

    @classmethod
    def for_lease(cls, lease_seconds: float) -> Timing:
        return cls(lease_seconds, lease_seconds * 2 / 3, lease_seconds / 7.5)

    @property
    def lease_field(self) -> int:
        """`leaseDurationSeconds` as written: whole seconds, rounded up so that candidates never wait
        less than this replica's own lease."""
        return math.ceil(self.lease)


class Election:
    """One replica's decisions about one Lease. Pure: the caller reads the Lease, asks `next_write` what
    to write, writes it and reports the outcome (`wrote`, `conflicted`). `now` is the caller's monotonic
    clock in seconds; `wall` (a datetime) only goes into the record's times, for people to read."""

    def __init__(self, *, identity: str, timing: Timing) -> None:
        self.identity = identity
        self.timing = timing
        self.observed: LeaseRecord | None = None
        # When `observed` was first seen as it is (resourceVersion included: every write changes it):
        # the only measure a candidate has of how long the holder has been silent.
        self.observed_at = -math.inf
        # Leading until then: the moment our last successful write was *sent* plus the renew deadline.
        # The write reached the API server after it was sent, and a candidate saw it after that, so a
        # candidate's lease duration starts no earlier than this deadline's.
        self.leading_until = -math.inf
        self.resigned = False

    def is_leader(self, now: float) -> bool:
        return now < self.leading_until

    def observe(self, record: LeaseRecord | None, now: float) -> None:
        if record != self.observed:
            self.observed, self.observed_at = record, now
        if record is None or record.holder != self.identity:
            self.leading_until = -math.inf

    def next_write(self, record: LeaseRecord | None, *, now: float, wall: datetime) -> LeaseRecord | None:
        """Observes `record` (the Lease as just read, None when absent) and returns the record to write
        (create when its resource_version is "", else replace), or None to leave the Lease alone."""
        self.observe(record, now)
        if self.resigned:
            return None
        seconds = self.timing.lease_field
        if record is None:
            return LeaseRecord(self.identity, seconds, wall, wall, transitions=0)
        if record.holder == self.identity:
            return replace(record, lease_seconds=seconds, renew_time=wall)
        if record.holder and now < self.observed_at + record.lease_seconds:
            return None
        return replace(
            record,
            holder=self.identity,
            lease_seconds=seconds,
            acquire_time=wall,
            renew_time=wall,
            transitions=record.transitions + 1,
        )

    def wrote(self, stored: LeaseRecord, *, sent_at: float, now: float) -> None:
        """A write sent at `sent_at` succeeded; `stored` is the Lease the API server returned."""
        self.observe(stored, now)
        if stored.holder == self.identity and not self.resigned:
            self.leading_until = sent_at + self.timing.renew_deadline

    def conflicted(self) -> None:
        """A write failed with Conflict (or NotFound): someone else wrote (or deleted) the Lease since it
        was read."""
        self.leading_until = -math.inf

    def resign(self) -> None:
        """Stop leading now and never again (the replica is shutting down)."""
        self.resigned = True
        self.leading_until = -math.inf

    def release(self, *, wall: datetime) -> LeaseRecord | None:
        """After `resign`: the record that hands the Lease on at once (no holder, one second), or None
        when the last record seen is not ours."""
        if self.observed is None or self.observed.holder != self.identity:
            return None
        return replace(self.observed, holder="", lease_seconds=1, acquire_time=wall, renew_time=wall)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class LeaderElector:
    """Runs an `Election` for `identity` on the Lease `namespace/name` (a `service.Service`).

    `is_leader()` is the guard a writer checks right before each write: it turns false the instant the
    renew deadline passes without a renewal, even while the loop is stuck in a call to an API server
    that does not answer. `on_change` callbacks run on the loop's thread (and on `stop()`'s) when the
    loop notices a change, which for a loss can be as late as that stuck call returns. `stop()` hands a
    held Lease on, so that on a graceful shutdown the other replica takes over at its next retry rather
    than a lease duration later. `monotonic` and `wall_clock` are for tests.
    """

    def __init__(
        self,
        store: LeaseStore,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float = 15.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        if not identity:
            raise ConfigError(
                "must not be empty: an empty holder means nobody holds the Lease", field="identity"
            )
        if not lease_seconds >= 1:  # also refuses NaN
            raise ConfigError(f"must be at least 1 second, not {lease_seconds}", field="lease_seconds")
        self.store = store
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = Timing.for_lease(lease_seconds)
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self._election = Election(identity=identity, timing=self.timing)
        self._lock = threading.Lock()  # the election's state: the loop writes it, writers read it
        self._announce_lock = threading.Lock()  # callbacks see the changes one at a time, in order
        self._announced = False
        self._callbacks: list[Callable[[bool], None]] = []
        self._holder_logged: str | None = None
        self.failures = 0  # Lease calls that failed (Conflict aside: losing a race is no failure)
        # A failed step waits the retry period too, never Loop's longer backoff: a leader must retry
        # before its renew deadline.
        retry = self.timing.retry_period
        self.loop = Loop("leader-election", self.step, min_backoff=retry, max_backoff=retry)

    @property
    def _lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    def on_change(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(leading)` on each acquisition (True) and loss (False). It must return quickly
        and not call `stop()`: it runs on the election's thread."""
        with self._announce_lock:
            self._callbacks.append(callback)

    def is_leader(self) -> bool:
        with self._lock:
            return self._election.is_leader(self._monotonic())

    def holder(self) -> str | None:
        """The holder in the Lease as last read or written; None when nobody holds it or it was not read."""
        with self._lock:
            observed = self._election.observed
        return (observed.holder or None) if observed else None

    @property
    def transitions(self) -> int:
        """`leaseTransitions` as last seen: how many times the Lease changed hands."""
        with self._lock:
            observed = self._election.observed
        return observed.transitions if observed else 0

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float) -> None:
        """Stop leading at once, let the loop's round in flight end, and hand the Lease on if it is ours."""
        with self._lock:
            self._election.resign()
        self._announce()
        self.loop.stop(timeout)
        with self._lock:
            release = self._election.release(wall=self._wall_clock())
        if release is None:
            return
        try:
            self.store.replace(self.namespace, self.name, release)
        except (Conflict, NotFound):
            log.info("Lease changed since last read; nothing to release", extra={"lease": self._lease})
        except ClusterError as err:
            log.warning(
                "could not release the Lease; another replica takes over once it expires",
                extra={"lease": self._lease, "identity": self.identity, "error": str(err)},
            )
        else:
            log.info("released the Lease", extra={"lease": self._lease, "identity": self.identity})

    def step(self) -> float:
        """One round, the loop's step: read the Lease, write what the election decides, announce a
        change. Returns the seconds until the next round: the retry period, or less when the renew
        deadline comes sooner (so a loss is announced on time)."""
        self._announce()  # the deadline may have passed while the loop waited
        try:
            self._round()
        except (Conflict, NotFound):  # NotFound: a renewal of a Lease someone deleted
            with self._lock:
                self._election.conflicted()
            log.debug("another replica wrote the Lease first", extra={"lease": self._lease})
        except ClusterError as err:
            self.failures += 1
            self.loop.step_failed(err)  # counted as the loop's failure; the wait stays the election's
            log.warning(
                "Lease call failed; retrying",
                extra={"lease": self._lease, "identity": self.identity, "error": str(err)},
            )
        self._log_holder()
        self._announce()
        with self._lock:
            now = self._monotonic()
            if self._election.is_leader(now):
                return min(self.timing.retry_period, self._election.leading_until - now)
        return self.timing.retry_period

    def _round(self) -> None:
        record = self.store.get(self.namespace, self.name)
        with self._lock:
            write = self._election.next_write(record, now=self._monotonic(), wall=self._wall_clock())
        if write is None:
            return
        sent_at = self._monotonic()
        if write.resource_version:
            stored = self.store.replace(self.namespace, self.name, write)
        else:
            stored = self.store.create(self.namespace, self.name, write)
        with self._lock:
            self._election.wrote(stored, sent_at=sent_at, now=self._monotonic())

    def _log_holder(self) -> None:
        holder = self.holder()
        if holder != self._holder_logged and holder not in {None, self.identity}:
            log.info("another replica leads", extra={"lease": self._lease, "holder": holder})
        self._holder_logged = holder

    def _announce(self) -> None:
        with self._announce_lock:
            leading = self.is_leader()
            if leading == self._announced:
                return
            self._announced = leading
            context = {"lease": self._lease, "identity": self.identity, "transitions": self.transitions}
            if leading:
                log.info("acquired the Lease: leading", extra=context)
            else:
                reason = self._loss_reason()
                level = logging.INFO if reason == "stopping" else logging.WARNING
                log.log(level, "stopped leading", extra=context | {"reason": reason})
            for callback in self._callbacks:
                try:
                    callback(leading)
                except Exception:
                    log.exception("leadership callback failed", extra={"lease": self._lease})

    def _loss_reason(self) -> str:
        with self._lock:
            election = self._election
            if election.resigned:
                return "stopping"
            if election.observed is None or election.observed.holder != self.identity:
                return "the Lease is not ours any more"
            return "not renewed within the renew deadline"
