"""Node events: queued, sent from their own loop, retried while the API server is away."""

from __future__ import annotations

import threading
import time
from typing import Any

from gpudra.errors import ClusterError
from gpudra.kube.events import MAX_MESSAGE, MAX_QUEUED, NodeEvents


class FakeKube:
    """Records events; fails while `down` is set."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.events: list[dict[str, Any]] = []
        self.sent = threading.Condition()

    def node_uid(self, name: str) -> str:
        if self.down.is_set():
            raise ClusterError("reading node n1: cannot reach the API server (MaxRetryError)")
        return "uid-1"

    def create_node_event(self, *, node_name: str, node_uid: str, event: dict[str, Any]) -> None:
        if self.down.is_set():
            raise ClusterError("creating an Event: cannot reach the API server (MaxRetryError)")
        with self.sent:
            self.events.append({"node": node_name, "uid": node_uid, **event})
            self.sent.notify_all()

    def wait_for(self, count: int, timeout: float = 10) -> list[dict[str, Any]]:
        with self.sent:
            assert self.sent.wait_for(lambda: len(self.events) >= count, timeout), self.events
            return list(self.events)


def test_an_event_is_sent_with_what_kubectl_describe_shows() -> None:
    kube = FakeKube()
    events = NodeEvents(kube, node_name="n1")
    events.start()
    try:
        events.post("Warning", "CheckpointRefused", "x" * (MAX_MESSAGE + 10))
        [sent] = kube.wait_for(1)
    finally:
        events.stop(5)
    assert sent["node"] == "n1" and sent["uid"] == "uid-1"
    assert sent["type"] == "Warning" and sent["reason"] == "CheckpointRefused"
    assert len(sent["message"]) == MAX_MESSAGE
    assert sent["source"] == {"component": "gpudra-kubelet-plugin", "host": "n1"}
    assert sent["firstTimestamp"] == sent["lastTimestamp"] and sent["count"] == 1


def test_events_posted_during_an_outage_are_sent_after_it_in_order() -> None:
    kube = FakeKube()
    kube.down.set()
    events = NodeEvents(kube, node_name="n1")
    events.start()
    try:
        events.post("Warning", "First", "one")
        events.post("Normal", "Second", "two")
        deadline = time.monotonic() + 10
        while events.loop.failures < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert events.loop.failures >= 2 and kube.events == []
        kube.down.clear()
        sent = kube.wait_for(2)
    finally:
        events.stop(5)
    assert [e["reason"] for e in sent] == ["First", "Second"]
    assert events.sent == 2


def test_the_queue_is_bounded_and_drops_the_oldest() -> None:
    kube = FakeKube()
    events = NodeEvents(kube, node_name="n1")
    for i in range(MAX_QUEUED + 5):
        events.post("Normal", f"R{i}", "m")  # not started: everything queues
    events.start()
    try:
        sent = kube.wait_for(MAX_QUEUED)
    finally:
        events.stop(5)
    assert [e["reason"] for e in sent] == [f"R{i}" for i in range(5, MAX_QUEUED + 5)]


def test_what_is_queued_at_stop_gets_one_last_attempt() -> None:
    kube = FakeKube()
    events = NodeEvents(kube, node_name="n1")
    events.post("Normal", "Late", "posted before the loop ever ran")
    events.stop(1)
    assert [e["reason"] for e in kube.events] == ["Late"]
