"""Node events: queued, sent from their own loop, retried while the API server is away."""

from __future__ import annotations

import time

from gpudra.kube.events import (
    MAX_MESSAGE,
    MAX_QUEUED,
    SERIES_WINDOW_SECONDS,
    SERIES_WRITE_SECONDS,
    NodeEvents,
)
from tests.unit.harness.kube import FakeEventKube


def test_an_event_is_sent_with_what_kubectl_describe_shows() -> None:
    kube = FakeEventKube()
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
    kube = FakeEventKube()
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
    kube = FakeEventKube()
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
    kube = FakeEventKube()
    events = NodeEvents(kube, node_name="n1")
    events.post("Normal", "Late", "posted before the loop ever ran")
    events.stop(1)
    assert [e["reason"] for e in kube.events] == ["Late"]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_repeats_are_one_event_whose_count_grows_written_at_most_every_few_seconds() -> None:
    """An XID storm's shape: 2,000 posts of one series in "10 s" are one Event and at most one write
    per SERIES_WRITE_SECONDS; the Event ends with every repeat counted and the latest message."""
    kube, clock = FakeEventKube(), Clock()
    events = NodeEvents(kube, node_name="n1", clock=clock)
    for i in range(2000):
        events.post("Warning", "GpuFault", f"GPU-1: XID 79, held by claim c{i}", series="GPU-1/reboot")
        clock.now += 0.005
        events._send_unsent()  # the loop's step, as often as the posts come
    events.stop(1)
    [event] = kube.events
    assert event["count"] == 2000 and event["message"] == "GPU-1: XID 79, held by claim c1999"
    assert events.posted == 2000 and events.sent == 1 + kube.patches
    assert kube.patches <= 10 / SERIES_WRITE_SECONDS + 1  # + 1: the last repeats, at stop


def test_the_same_message_aggregates_and_another_is_its_own_event() -> None:
    kube, clock = FakeEventKube(), Clock()
    events = NodeEvents(kube, node_name="n1", clock=clock)
    for message in ("a", "b", "a", "a"):
        events.post("Normal", "Reason", message)
    events._send_unsent(final=True)
    assert [(e["message"], e["count"]) for e in kube.events] == [("a", 3), ("b", 1)]


def test_a_repeat_after_the_window_or_after_the_event_expired_is_a_new_event() -> None:
    kube, clock = FakeEventKube(), Clock()
    events = NodeEvents(kube, node_name="n1", clock=clock)
    events.post("Warning", "R", "m")
    events._send_unsent()
    clock.now += SERIES_WINDOW_SECONDS
    events.post("Warning", "R", "m")
    events._send_unsent()
    assert [e["count"] for e in kube.events] == [1, 1]
    kube.events[1]["expired"] = True  # the API server's TTL removed it
    clock.now += SERIES_WRITE_SECONDS
    events.post("Warning", "R", "m")
    events._send_unsent()
    assert [e["count"] for e in kube.events if not e.get("expired")] == [1, 2]


def test_a_repeat_waits_for_its_turn_and_the_loop_says_when() -> None:
    kube, clock = FakeEventKube(), Clock()
    events = NodeEvents(kube, node_name="n1", clock=clock)
    events.post("Warning", "R", "m")
    assert events._send_unsent() == 3600.0  # written; nothing left
    clock.now += 4
    events.post("Warning", "R", "m")
    assert events._send_unsent() == SERIES_WRITE_SECONDS - 4 and kube.patches == 0
    clock.now += SERIES_WRITE_SECONDS
    events._send_unsent()
    assert kube.patches == 1 and kube.events[0]["count"] == 2
