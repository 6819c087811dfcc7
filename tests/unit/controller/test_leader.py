"""Leader election: the pure decisions, the elector against an in-memory Lease store with the API server's
resourceVersion rules and a fake clock, the Lease wire format, and the property that matters: at no
instant do two replicas both believe they lead."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudra.controller.leader import Election, LeaderElector, Timing
from gpudra.errors import ClusterError, ConfigError
from gpudra.kube.client import Conflict, NotFound
from gpudra.kube.lease import LeaseRecord, Leases, format_micro_time
from tests.unit.harness.kube import FakeRequestKube
from tests.unit.harness.leases import NAME, NS, MemoryLeases

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self, offset: timedelta = timedelta()) -> Callable[[], datetime]:
        """A wall clock `offset` away from true time (a machine whose clock is wrong)."""
        return lambda: EPOCH + timedelta(seconds=self.now) + offset

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> MemoryLeases:
    return MemoryLeases()


def elector(
    store: MemoryLeases,
    clock: FakeClock,
    identity: str,
    *,
    lease_seconds: float = 15,
    skew: timedelta = timedelta(),
) -> LeaderElector:
    return LeaderElector(
        store,
        namespace=NS,
        name=NAME,
        identity=identity,
        lease_seconds=lease_seconds,
        monotonic=clock.monotonic,
        wall_clock=clock.wall(skew),
    )


def changes(candidate: LeaderElector) -> list[bool]:
    seen: list[bool] = []
    candidate.on_change(seen.append)
    return seen


# --- the timing ----------------------------------------------------------------------------------


def test_the_timing_is_client_gos_scaled_from_the_lease() -> None:
    assert Timing.for_lease(15) == Timing(15, 10, 2)
    timing = Timing.for_lease(4.5)
    assert timing.lease > timing.renew_deadline > 1.2 * timing.retry_period  # client-go's own check
    assert timing.lease_field == 5  # whole seconds on the wire, never shorter than the replica's own


@pytest.mark.parametrize(
    ("identity", "lease_seconds", "field_name"),
    [("", 15, "identity"), ("a", 0.5, "lease_seconds"), ("a", float("nan"), "lease_seconds")],
)
def test_an_unusable_identity_or_lease_is_refused(
    store: MemoryLeases, identity: str, lease_seconds: float, field_name: str
) -> None:
    with pytest.raises(ConfigError) as err:
        LeaderElector(store, namespace=NS, name=NAME, identity=identity, lease_seconds=lease_seconds)
    assert err.value.field == field_name


# --- the pure decisions --------------------------------------------------------------------------

WALL = EPOCH + timedelta(hours=1)


def held(holder: str, *, version: str = "7", seconds: int = 15, transitions: int = 3) -> LeaseRecord:
    return LeaseRecord(holder, seconds, EPOCH, EPOCH, transitions, resource_version=version)


def election(identity: str = "a") -> Election:
    return Election(identity=identity, timing=Timing.for_lease(15))


def test_an_absent_lease_is_created_for_this_replica() -> None:
    assert election().next_write(None, now=0, wall=WALL) == LeaseRecord("a", 15, WALL, WALL, 0)


def test_a_held_lease_is_renewed_keeping_its_acquire_time_and_transitions() -> None:
    write = election().next_write(held("a"), now=0, wall=WALL)
    assert write == LeaseRecord("a", 15, EPOCH, WALL, 3, resource_version="7")


@pytest.mark.parametrize("record", [held(""), held("b", seconds=0)], ids=["released", "zero-duration"])
def test_a_lease_held_by_nobody_or_already_expired_is_taken_at_once(record: LeaseRecord) -> None:
    write = election().next_write(record, now=0, wall=WALL)
    assert write == LeaseRecord("a", 15, WALL, WALL, 4, resource_version="7")


def test_another_holders_lease_expires_after_its_duration_since_this_replica_first_saw_it() -> None:
    e = election()
    assert e.next_write(held("b", seconds=20), now=100, wall=WALL) is None
    assert e.next_write(held("b", seconds=20), now=119.9, wall=WALL) is None
    # a renewal (any new resourceVersion) restarts the count, whatever its times say
    assert e.next_write(held("b", seconds=20, version="8"), now=119.9, wall=WALL) is None
    assert e.next_write(held("b", seconds=20, version="8"), now=139.8, wall=WALL) is None
    write = e.next_write(held("b", seconds=20, version="8"), now=139.9, wall=WALL)
    assert write is not None and write.holder == "a" and write.resource_version == "8"


def test_leadership_lasts_the_renew_deadline_from_when_the_write_was_sent() -> None:
    e = election()
    write = e.next_write(None, now=0, wall=WALL)
    assert write is not None and not e.is_leader(0)
    e.wrote(replace(write, resource_version="1"), sent_at=0, now=4)  # the reply took 4 s
    assert e.is_leader(9.99) and not e.is_leader(10)


@pytest.mark.parametrize("lost", ["conflict", "other holder", "deleted"])
def test_leadership_ends_at_once_when_the_lease_is_not_ours(lost: str) -> None:
    e = election()
    e.wrote(held("a", version="1"), sent_at=0, now=0)
    assert e.is_leader(1)
    if lost == "conflict":
        e.conflicted()
    else:
        e.observe(held("b", version="2") if lost == "other holder" else None, now=1)
    assert not e.is_leader(1)


def test_a_resigned_replica_writes_nothing_but_the_release() -> None:
    e = election()
    e.wrote(held("a", version="1"), sent_at=0, now=0)
    e.resign()
    assert not e.is_leader(0)
    assert e.next_write(held("a", version="1"), now=1, wall=WALL) is None
    e.wrote(held("a", version="2"), sent_at=1, now=1)  # a renewal that was in flight
    assert not e.is_leader(1)
    assert e.release(wall=WALL) == LeaseRecord("", 1, WALL, WALL, 3, resource_version="2")
    e.observe(held("b", version="3"), now=2)
    assert e.release(wall=WALL) is None


# --- the elector against the in-memory store ----------------------------------------------------


def test_an_absent_lease_is_acquired(
    store: MemoryLeases, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    a = elector(store, clock, "a")
    seen = changes(a)
    with caplog.at_level(logging.INFO, logger="gpudra.controller.leader"):
        assert a.step() == pytest.approx(2)
    assert a.is_leader() and seen == [True]
    assert a.holder() == "a" and a.transitions == 0
    wall = clock.wall()()
    assert store.lease() == LeaseRecord("a", 15, wall, wall, 0, resource_version="1")
    [record] = [r for r in caplog.records if r.getMessage() == "acquired the Lease: leading"]
    assert record.__dict__["identity"] == "a" and record.__dict__["lease"] == f"{NS}/{NAME}"


def test_the_leader_renews_every_retry_period_and_a_candidate_never_takes_a_live_lease(
    store: MemoryLeases, clock: FakeClock
) -> None:
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    seen = changes(b)
    a.step()
    for _ in range(60):
        clock.advance(2)
        a.step()
        b.step()
        assert a.is_leader() and not b.is_leader()
    assert b.holder() == "a" and seen == []
    assert store.lease().renew_time == clock.wall()() and store.lease().acquire_time == EPOCH + timedelta(
        seconds=1000
    )


@pytest.mark.parametrize("skew", [timedelta(hours=-7), timedelta(hours=7)], ids=["behind", "ahead"])
def test_a_silent_holder_is_replaced_after_the_lease_duration_as_the_candidate_measures_it(
    store: MemoryLeases, clock: FakeClock, skew: timedelta
) -> None:
    # The holder's wall clock is hours off: its renewTime looks ancient (or in the future) to the
    # candidate, which must neither take over at once nor wait for that time.
    a = elector(store, clock, "a", skew=skew)
    b = elector(store, clock, "b")
    a.step()
    clock.advance(1)
    b.step()  # first sight of a's record: the count starts here
    first_seen = clock.now
    while clock.now + 2 < first_seen + 15:
        clock.advance(2)
        b.step()
        assert not b.is_leader()
    clock.now = first_seen + 14.99
    b.step()
    assert not b.is_leader()
    clock.now = first_seen + 15
    b.step()
    assert b.is_leader() and not a.is_leader()
    assert store.lease().holder == "b" and store.lease().transitions == 1 and b.transitions == 1


def test_a_leader_that_cannot_renew_stops_leading_at_the_renew_deadline(
    store: MemoryLeases, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    a = elector(store, clock, "a")
    seen = changes(a)
    start = clock.now
    wait = a.step()
    store.down = True
    with caplog.at_level(logging.WARNING, logger="gpudra.controller.leader"):
        while a.is_leader():
            clock.advance(wait)  # the loop's waits, as the step returns them
            wait = a.step()
    assert clock.now == pytest.approx(start + 10)  # the step-down comes no later than the deadline
    assert seen == [True, False] and a.failures == 5
    [record] = [r for r in caplog.records if r.getMessage() == "stopped leading"]
    assert record.__dict__["reason"] == "not renewed within the renew deadline"
    # once the API server answers again the Lease, still ours, is renewed: leading again
    store.down = False
    a.step()
    assert a.is_leader() and seen == [True, False, True] and store.lease().transitions == 0


def test_is_leader_turns_false_at_the_deadline_even_while_the_loop_is_stuck(
    store: MemoryLeases, clock: FakeClock
) -> None:
    a = elector(store, clock, "a")
    start = clock.now
    a.step()
    clock.advance(2)
    # the renewal lands, then its reply takes 3 s: the deadline counts from when it was sent
    store.after = lambda verb: clock.advance(3) if verb == "replace" else None
    a.step()
    assert clock.now == start + 5
    clock.now = start + 2 + 9.99
    assert a.is_leader()
    clock.now = start + 2 + 10  # no step ran since: the loop is stuck
    assert not a.is_leader()


def test_a_graceful_stop_releases_and_the_other_replica_acquires_at_its_next_retry(
    store: MemoryLeases, clock: FakeClock
) -> None:
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    a_seen, b_seen = changes(a), changes(b)
    a.step()
    b.step()
    clock.advance(1)
    a.stop(1)
    assert not a.is_leader() and a_seen == [True, False]
    assert store.lease() == LeaseRecord("", 1, clock.wall()(), clock.wall()(), 0, resource_version="2")
    clock.advance(1)
    b.step()
    assert b.is_leader() and b_seen == [True] and store.lease().transitions == 1
    assert a.step() == pytest.approx(2) and not a.is_leader()  # a stopped replica takes nothing


def test_stop_does_not_release_a_lease_that_is_not_ours(store: MemoryLeases, clock: FakeClock) -> None:
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    a.step()
    b.step()
    writes = store.writes
    b.stop(1)
    assert store.writes == writes and store.lease().holder == "a"


def test_transitions_count_each_change_of_holder(store: MemoryLeases, clock: FakeClock) -> None:
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    a.step()
    a.step()  # a renewal is no transition
    assert store.lease().transitions == 0
    a.stop(1)
    b.step()
    assert store.lease().transitions == 1
    c = elector(store, clock, "c")
    c.step()
    clock.advance(15)
    c.step()  # b went silent a lease ago
    assert store.lease().holder == "c" and store.lease().transitions == 2 and c.transitions == 2


def test_of_two_candidates_racing_for_an_absent_lease_exactly_one_wins(
    store: MemoryLeases, clock: FakeClock
) -> None:
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    reads = 0

    def b_steps_after_a_read(verb: str) -> None:
        nonlocal reads
        reads += verb == "get"
        if verb == "create" and reads == 1:  # a read the Lease as absent and is about to create it
            b.step()

    store.before = b_steps_after_a_read
    a.step()
    assert b.is_leader() and not a.is_leader()
    assert a.failures == 0  # losing a race is no failure
    a.step()
    assert a.holder() == "b" and not a.is_leader()


def test_a_renewal_of_a_deleted_lease_ends_leadership(store: MemoryLeases, clock: FakeClock) -> None:
    a = elector(store, clock, "a")
    a.step()
    store.before = lambda verb: store.leases.clear() if verb == "replace" else None
    a.step()
    assert not a.is_leader() and a.failures == 0


def test_a_failing_callback_is_logged_and_the_others_still_run(
    store: MemoryLeases, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    a = elector(store, clock, "a")

    def broken(leading: bool) -> None:
        raise RuntimeError("a bug in the caller")

    a.on_change(broken)
    seen = changes(a)
    with caplog.at_level(logging.ERROR, logger="gpudra.controller.leader"):
        a.step()
    assert seen == [True] and any(r.getMessage() == "leadership callback failed" for r in caplog.records)


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_two_threaded_electors_hand_over_on_stop() -> None:
    """The thin threaded part, on the real clocks: a 15 s lease (a retry every 2 s)."""
    store = MemoryLeases()
    a = LeaderElector(store, namespace=NS, name=NAME, identity="a", lease_seconds=15)
    b = LeaderElector(store, namespace=NS, name=NAME, identity="b", lease_seconds=15)
    a.start()
    try:
        wait_for(a.is_leader)
        b.start()
        try:
            wait_for(lambda: b.holder() == "a")
            assert not b.is_leader()
            a.stop(5)
            stopped = time.monotonic()
            wait_for(b.is_leader, timeout=8)
            # At b's next retry (2 s), not once the lease ran out (up to 15 s after a's last renewal).
            assert time.monotonic() - stopped < 8
        finally:
            b.stop(5)
    finally:
        a.stop(5)
    assert not a.loop.alive and not b.loop.alive and store.lease().holder == ""


# --- the property: never two leaders -------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One round of elector `who`. `nested` runs during one of its Lease calls: `at` "get" or "write",
    `when` "before" (the call has not acted yet: a race) or "in_flight" (it acted, its reply is on the
    way). `failure` (what, call) makes one call fail: "refuse" before it acts, "lose" its reply after."""

    who: int
    at: str = "get"
    when: str = "before"
    nested: tuple[Op, ...] = ()
    failure: tuple[str, str] | None = None


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Restart:
    """A graceful stop, then a new process under the same name."""

    who: int


Op = Step | Advance | Restart


@dataclass
class Frame:
    """What the step being run still has to do to its own Lease calls."""

    step: Step | None
    nested_done: bool = False
    failure_done: bool = False


@dataclass
class World:
    """2-3 electors on one store and one clock, driven by a program of operations."""

    clock: FakeClock
    store: MemoryLeases
    electors: list[LeaderElector]
    leases: list[int]
    skews: list[timedelta]
    frames: list[Frame] = field(default_factory=list)
    stopped: list[LeaderElector] = field(default_factory=list)  # a stop can return with a call in flight
    ever_led: set[str] = field(default_factory=set)

    def check(self) -> None:
        leaders = [e.identity for e in self.electors + self.stopped if e.is_leader()]
        assert len(leaders) <= 1, f"two leaders at {self.clock.now}: {leaders}"
        self.ever_led.update(leaders)

    def hook(self, verb: str, when: str) -> None:
        self.check()
        frame = self.frames[-1]  # calls run synchronously: the innermost step is the caller
        step, call = frame.step, "get" if verb == "get" else "write"
        if step is None:
            return
        if not frame.nested_done and (step.at, step.when) == (call, when):
            frame.nested_done = True
            for op in step.nested:
                self.run(op)
        # A refused call fails before it reaches the store; a lost reply fails after the write happened.
        failing = step.failure in {("refuse", call), ("lose", call)}
        if failing and not frame.failure_done and (step.failure[0] == "refuse") == (when == "before"):
            frame.failure_done = True
            raise ClusterError(f"{verb} Lease: timed out (ReadTimeoutError)")

    def run(self, op: Op) -> None:
        if isinstance(op, Advance):
            self.clock.advance(op.seconds)
        else:
            i = op.who % len(self.electors)
            self.frames.append(Frame(op if isinstance(op, Step) else None))
            try:
                if isinstance(op, Step):
                    self.electors[i].step()
                else:
                    old = self.electors[i]
                    old.stop(0)
                    self.stopped.append(old)
                    self.electors[i] = elector(
                        self.store, self.clock, old.identity, lease_seconds=self.leases[i], skew=self.skews[i]
                    )
            finally:
                self.frames.pop()
        self.check()


def world(leases: list[int], skew_hours: list[int]) -> World:
    clock, store = FakeClock(), MemoryLeases()
    skews = [timedelta(hours=h) for h in skew_hours]
    electors = [
        elector(store, clock, f"r{i}", lease_seconds=seconds, skew=skews[i])
        for i, seconds in enumerate(leases)
    ]
    result = World(clock, store, electors, leases, skews)
    store.before = lambda verb: result.hook(verb, "before")
    store.after = lambda verb: result.hook(verb, "in_flight")
    return result


who = st.integers(0, 2)
# Seconds around the timings (retry 0.13-2 s, deadlines 0.67-10 s, leases 1-15 s), and any in between.
advances = st.builds(
    Advance, st.sampled_from([0.1, 0.5, 1.0, 2.0, 3.0, 10.0, 15.0, 16.0]) | st.floats(0, 20, allow_nan=False)
)
# Most calls succeed, as in a real run: a failure on every other step would rarely let anyone lead.
failures = st.sampled_from(
    [None] * 24 + [(what, call) for what in ("refuse", "lose") for call in ("get", "write")]
)
steps = st.builds(Step, who, failure=failures)
plain = st.one_of(steps, steps, steps, advances, advances, st.builds(Restart, who))
operations = st.one_of(
    plain,
    plain,
    st.builds(
        Step,
        who,
        at=st.sampled_from(["get", "write"]),
        when=st.sampled_from(["before", "in_flight"]),
        nested=st.lists(plain, min_size=1, max_size=4).map(tuple),
        failure=failures,
    ),
)


@settings(max_examples=500, deadline=None)
@given(
    leases=st.lists(st.sampled_from([1, 3, 15]), min_size=2, max_size=3),
    skew_hours=st.lists(st.integers(-48, 48), min_size=3, max_size=3),
    program=st.lists(operations, min_size=10, max_size=50),
)
def test_never_two_leaders(leases: list[int], skew_hours: list[int], program: list[Op]) -> None:
    """Whatever the interleaving, failures and clock advances, at no instant (between any two Lease
    calls) do two electors' is_leader() both hold."""
    w = world(leases, skew_hours)
    for op in program:
        w.run(op)


def test_the_property_test_reaches_takeovers_and_races() -> None:
    """A guard on the generator's vocabulary: the schedule that a deadline counted from the reply
    (rather than from the send) would turn into two leaders, run on the real code: r0's renewal lands,
    r1 sees it and takes over a lease later, then r0's reply arrives."""
    w = world([15, 15], [0, 0, 0])
    for op in [Step(0), Step(0, at="write", when="in_flight", nested=(Step(1), Advance(16), Step(1)))]:
        w.run(op)
    assert w.ever_led == {"r0", "r1"} and w.electors[1].is_leader() and not w.electors[0].is_leader()


# --- the Lease on the wire -----------------------------------------------------------------------


LEASE_JSON: dict[str, Any] = {
    "apiVersion": "coordination.k8s.io/v1",
    "kind": "Lease",
    "metadata": {"name": NAME, "namespace": NS, "resourceVersion": "42"},
    "spec": {
        "holderIdentity": "gpudra-controller-7d9f-abcde",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-01T00:00:00.000000Z",
        "renewTime": "2026-01-01T00:01:02.345678Z",
        "leaseTransitions": 4,
    },
}


def test_a_lease_is_read_from_its_namespaced_path() -> None:
    kube = FakeRequestKube(LEASE_JSON, NotFound("reading Lease: HTTP 404 Not Found"))
    leases = Leases(kube)
    record = leases.get(NS, NAME)
    assert record == LeaseRecord(
        "gpudra-controller-7d9f-abcde",
        15,
        EPOCH,
        EPOCH + timedelta(minutes=1, seconds=2, microseconds=345678),
        4,
        resource_version="42",
    )
    assert leases.get(NS, NAME) is None
    assert kube.requests[0].method == "GET"
    assert kube.requests[0].path == f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{NAME}"
    assert kube.counts == [("get", "leases")] * 2


def test_a_released_lease_reads_as_held_by_nobody() -> None:
    released = {"metadata": {"resourceVersion": "9"}, "spec": {"leaseDurationSeconds": 1}}
    assert Leases(FakeRequestKube(released)).get(NS, NAME) == LeaseRecord(
        "", 1, None, None, 0, resource_version="9"
    )


def test_writes_send_micro_times_and_the_resource_version_precondition() -> None:
    kube = FakeRequestKube(LEASE_JSON, LEASE_JSON, Conflict("updating Lease: HTTP 409 Conflict"))
    leases = Leases(kube)
    at = datetime(2026, 3, 4, 5, 6, 7, 890, tzinfo=UTC)
    new = LeaseRecord("a", 15, at, at, 0)
    assert leases.create(NS, NAME, new).resource_version == "42"
    leases.replace(NS, NAME, replace(new, resource_version="41"))
    with pytest.raises(Conflict):
        leases.replace(NS, NAME, replace(new, resource_version="41"))
    create, update = kube.requests[0], kube.requests[1]
    assert create.method == "POST" and create.path.endswith(f"/namespaces/{NS}/leases")
    assert create.kwargs["body"] == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "leaseTransitions": 0,
            "acquireTime": "2026-03-04T05:06:07.000890Z",
            "renewTime": "2026-03-04T05:06:07.000890Z",
        },
    }
    assert update.method == "PUT" and update.path.endswith(f"/leases/{NAME}")
    assert update.kwargs["body"]["metadata"]["resourceVersion"] == "41"
    assert kube.counts == [("create", "leases"), ("update", "leases"), ("update", "leases")]


def test_micro_time_is_utc_with_six_digits() -> None:
    east = datetime(2026, 1, 1, 9, 0, tzinfo=UTC).astimezone(tz=None)
    assert format_micro_time(east) == "2026-01-01T09:00:00.000000Z"
