"""Kubernetes Events on this node's Node object, for what an operator must see without reading logs
(`kubectl describe node` and `kubectl get events` show them). I/O: the API server, via gpudra.kube.client.

Posting never blocks or fails the caller: events are kept in memory and a `service.Loop` sends them,
retrying with backoff while the API server is away, so a plugin that starts during an outage (which is
when a damaged checkpoint is most likely found) still reports it once the API server answers.

Repeats aggregate, as the Kubernetes event recorder's do: events of one series (the same type and
reason, and the same `series` key, by default the same message) within SERIES_WINDOW_SECONDS of the
series' first are one Event whose `count` and `lastTimestamp` grow, and whose message is the latest.
Each series is written (created, then patched) at most once every SERIES_WRITE_SECONDS, repeats in
between only counted, so a GPU in an XID storm costs its Node a handful of writes a minute, not one per
XID. What waits is bounded: past MAX_QUEUED series with something unsent, the oldest is dropped (each
drop logged), and at most MAX_SERIES series are remembered.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from gpudra.kube.client import Kube, NotFound
from gpudra.runtime.service import Loop

log = logging.getLogger(__name__)

COMPONENT = "gpudra-kubelet-plugin"
# An Event's message is shown in one line of `kubectl describe`; the API server keeps at most 1 KiB
# for events.k8s.io notes, so longer messages are cut to that.
MAX_MESSAGE = 1024
MAX_QUEUED = 100
MAX_SERIES = 1000
# The Kubernetes event correlator's window: a repeat within it counts in the same Event.
SERIES_WINDOW_SECONDS = 600.0
# At most one write per series per this: 6 a minute for a series that repeats without pause.
SERIES_WRITE_SECONDS = 10.0
_IDLE_SECONDS = 3600.0  # nothing to send: until post() wakes the loop

Kind = Literal["Normal", "Warning"]
SeriesKey = tuple[str, str, str]  # type, reason, series


class EventPoster(Protocol):
    """What posts Events on the node: NodeEvents (never blocks), or a test's recorder. Events with the
    same type, reason and `series` (None: the same message) aggregate into one Event."""

    def post(self, type_: Kind, reason: str, message: str, *, series: str | None = None) -> None: ...


@dataclass
class _Series:
    """One aggregated Event: what it says now, and what the API server has of it."""

    type: Kind
    reason: str
    message: str
    first: datetime
    last: datetime
    count: int
    opened: float  # monotonic: when the series started (its window)
    name: str | None = None  # the Event's, once created
    written: int = 0  # the count the API server has
    written_at: float | None = None  # monotonic


class NodeEvents:
    """Aggregates events about one Node and sends them from its own loop."""

    def __init__(self, kube: Kube, *, node_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.node_name = node_name
        self.loop = Loop("node-events", self._step)
        self._clock = clock
        self._series: dict[SeriesKey, _Series] = {}  # insertion order: the oldest first
        self._unsent: collections.deque[SeriesKey] = collections.deque()  # in the order they came
        self._lock = threading.Lock()
        self._node_uid: str | None = None
        self.sent = 0  # API writes: creates and patches
        self.posted = 0  # events posted, repeats included

    def post(self, type_: Kind, reason: str, message: str, *, series: str | None = None) -> None:
        message = message[:MAX_MESSAGE]
        key = (type_, reason, message if series is None else series)
        now, at = self._clock(), datetime.now(UTC)
        with self._lock:
            self.posted += 1
            known = self._series.get(key)
            if known is None or now - known.opened >= SERIES_WINDOW_SECONDS:
                self._series.pop(key, None)
                self._series[key] = _Series(type_, reason, message, at, at, 1, opened=now)
                self._forget_oldest()
            else:
                known.count += 1
                known.last, known.message = at, message
            if key not in self._unsent:
                if len(self._unsent) >= MAX_QUEUED:
                    dropped = self._unsent.popleft()
                    self._series.pop(dropped, None)
                    log.warning("node event dropped: queue full", extra={"reason": dropped[1]})
                self._unsent.append(key)
        self.loop.wake()

    def _forget_oldest(self) -> None:
        """Called under the lock: the oldest series with nothing unsent go past MAX_SERIES."""
        for key in list(self._series):
            if len(self._series) <= MAX_SERIES:
                return
            if key not in self._unsent:
                del self._series[key]

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float) -> None:
        # One last attempt for what is unsent (e.g. an event posted just before SIGTERM), repeats not
        # yet due included; a failure here is only logged: shutdown must not wait on an absent API
        # server beyond its timeout.
        self.loop.stop(timeout)
        try:
            self._send_unsent(final=True)
        except Exception as err:
            log.warning("node events not sent at exit", extra={"error": str(err)})

    def _step(self) -> float:
        return self._send_unsent()

    def _send_unsent(self, *, final: bool = False) -> float:
        """Write each series that is due (`final`: each unsent one), in the order they came; seconds
        until the next is due."""
        writes = 0
        while True:
            with self._lock:
                now = self._clock()
                due = next((k for k in self._unsent if final or self._due(self._series[k], now)), None)
                if final and writes > MAX_QUEUED:
                    due = None  # posts that keep coming while the plugin stops do not hold it up
                if due is None:
                    waits = [self._wait(self._series[k], now) for k in self._unsent]
                    return min(waits, default=_IDLE_SECONDS)
                entry = self._series[due]
                sending = dataclasses.replace(entry)  # what this write says, as of now
            created = self._write(sending)
            writes += 1
            with self._lock:
                entry.name, entry.written, entry.written_at = created, sending.count, self._clock()
                current = self._series.get(due) is entry  # else a new window began meanwhile
                if current and entry.count == entry.written and due in self._unsent:
                    self._unsent.remove(due)

    @staticmethod
    def _due(entry: _Series, now: float) -> bool:
        return entry.written_at is None or now - entry.written_at >= SERIES_WRITE_SECONDS

    @staticmethod
    def _wait(entry: _Series, now: float) -> float:
        return 0.0 if entry.written_at is None else max(0.0, entry.written_at + SERIES_WRITE_SECONDS - now)

    def _write(self, entry: _Series) -> str | None:
        """Create the series' Event, or patch the one it has; its name (None: the reply named none,
        and the next repeat makes another)."""
        stamp = entry.last.strftime("%Y-%m-%dT%H:%M:%SZ")
        if entry.name is not None:
            patch = {"count": entry.count, "lastTimestamp": stamp, "message": entry.message}
            try:
                self.kube.patch_node_event(entry.name, patch)
                self.sent += 1
                return entry.name
            except NotFound:
                pass  # the API server let it expire: a new one, counting on
        if self._node_uid is None:
            self._node_uid = self.kube.node_uid(self.node_name)
        created = self.kube.create_node_event(
            node_name=self.node_name,
            node_uid=self._node_uid,
            event={
                "type": entry.type,
                "reason": entry.reason,
                "message": entry.message,
                "firstTimestamp": entry.first.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "lastTimestamp": stamp,
                "count": entry.count,
                "source": {"component": COMPONENT, "host": self.node_name},
                "reportingComponent": COMPONENT,
                "reportingInstance": self.node_name,
            },
        )
        self.sent += 1
        return created or None
