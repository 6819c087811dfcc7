"""Kubernetes Events on this node's Node object, for what an operator must see without reading logs
(`kubectl describe node` and `kubectl get events` show them). I/O: the API server, via gpudra.kube.client.

Posting never blocks or fails the caller: events queue in memory and a `service.Loop` sends them,
retrying with backoff while the API server is away, so a plugin that starts during an outage (which is
when a damaged checkpoint is most likely found) still reports it once the API server answers. The queue
is bounded: under a long outage the oldest events are dropped, each drop logged.
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from gpudra.kube.client import Kube
from gpudra.runtime.service import Loop

log = logging.getLogger(__name__)

COMPONENT = "gpudra-kubelet-plugin"
# An Event's message is shown in one line of `kubectl describe`; the API server keeps at most 1 KiB
# for events.k8s.io notes, so longer messages are cut to that.
MAX_MESSAGE = 1024
MAX_QUEUED = 100


class EventPoster(Protocol):
    """What posts Events on the node: NodeEvents (queues an event on this node's Node, never blocks),
    or a test's recorder."""

    def post(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None: ...


@dataclass(frozen=True)
class NodeEvent:
    type: Literal["Normal", "Warning"]
    reason: str  # UpperCamelCase, stable: alerts match on it
    message: str
    at: datetime


class NodeEvents:
    """Queues events about one Node and sends them from its own loop."""

    def __init__(self, kube: Kube, *, node_name: str) -> None:
        self.kube = kube
        self.node_name = node_name
        self.loop = Loop("node-events", self._step)
        self._queue: collections.deque[NodeEvent] = collections.deque()
        self._lock = threading.Lock()
        self._node_uid: str | None = None
        self.sent = 0

    def post(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        event = NodeEvent(type_, reason, message[:MAX_MESSAGE], datetime.now(UTC))
        with self._lock:
            if len(self._queue) >= MAX_QUEUED:
                dropped = self._queue.popleft()
                log.warning("node event dropped: queue full", extra={"reason": dropped.reason})
            self._queue.append(event)
        self.loop.wake()

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float) -> None:
        # One last attempt for what is queued (e.g. an event posted just before SIGTERM); a failure
        # here is only logged: shutdown must not wait on an absent API server beyond its timeout.
        self.loop.stop(timeout)
        try:
            self._send_queued()
        except Exception as err:
            log.warning("node events not sent at exit", extra={"error": str(err)})

    def _step(self) -> float:
        self._send_queued()
        return 3600.0  # nothing to do until post() wakes the loop

    def _send_queued(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                event = self._queue[0]
            if self._node_uid is None:
                self._node_uid = self.kube.node_uid(self.node_name)
            stamp = event.at.strftime("%Y-%m-%dT%H:%M:%SZ")
            self.kube.create_node_event(
                node_name=self.node_name,
                node_uid=self._node_uid,
                event={
                    "type": event.type,
                    "reason": event.reason,
                    "message": event.message,
                    "firstTimestamp": stamp,
                    "lastTimestamp": stamp,
                    "count": 1,
                    "source": {"component": COMPONENT, "host": self.node_name},
                    "reportingComponent": COMPONENT,
                    "reportingInstance": self.node_name,
                },
            )
            self.sent += 1
            with self._lock:
                if self._queue and self._queue[0] is event:
                    self._queue.popleft()
