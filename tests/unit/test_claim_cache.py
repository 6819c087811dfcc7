"""ClaimCache: which claims the watch keeps, and when get() falls back to a GET."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from gpudra.errors import ClaimError, ClusterError
from gpudra.kube.claim_cache import ClaimCache, allocated_here
from gpudra.kube.client import Expired, NotFound, Obj
from tests.unit.claims import DRIVER, NODE, resource_claim, result, whole_gpus


class FakeWatch:
    """A watch stream: yields what the test puts in `events`; an exception put there is raised."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[tuple[str, Obj]]:
        while not self.closed.is_set():
            try:
                item = self.kube.events.get(timeout=0.02)
            except queue.Empty:
                continue
            try:
                if isinstance(item, BaseException):
                    raise item
                if item == END:
                    return
                yield item
            finally:
                self.kube.events.task_done()

    def close(self) -> None:
        self.closed.set()


END: tuple[str, Obj] = ("END", {})  # the server ended the watch (its timeout)


class FakeKube:
    """The claim half of gpudra.kube.client.Kube: GETs from `objects`, LISTs from `listing`,
    watch events from a queue."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Obj] = {}
        self.listing: list[Obj] = []
        self.gets: list[tuple[str, str]] = []
        self.events: queue.Queue[tuple[str, Obj] | BaseException] = queue.Queue()
        self.watch_failures: list[Exception] = []
        self.watched_from: list[str] = []
        self.lists = 0

    def get_claim(self, namespace: str, name: str) -> Obj:
        self.gets.append((namespace, name))
        try:
            return self.objects[(namespace, name)]
        except KeyError:
            raise NotFound(f"reading ResourceClaim {namespace}/{name}: HTTP 404 Not Found") from None

    def list_claims(self) -> tuple[list[Obj], str]:
        self.lists += 1
        return list(self.listing), f"list-{self.lists}"

    def watch_claims(self, resource_version: str) -> FakeWatch:
        self.watched_from.append(resource_version)
        if self.watch_failures:
            raise self.watch_failures.pop(0)
        return FakeWatch(self)


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def cache(kube: FakeKube) -> Iterator[ClaimCache]:
    running = ClaimCache(kube, driver=DRIVER, pool=NODE, min_backoff=0.01)
    running.start()
    wait_for(lambda: running.connected)
    yield running
    running.stop(2)


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def feed(kube: FakeKube, *events: tuple[str, Obj] | BaseException) -> None:
    for event in events:
        kube.events.put(event)
    kube.events.join()


def get(cache: ClaimCache, claim: Obj) -> Obj:
    meta = claim["metadata"]
    return cache.get(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


HERE = whole_gpus("u-here", "gpu-0", name="here")
OTHER = "other.example.com"
KEPT: dict[str, tuple[Obj, bool]] = {
    "allocated here": (HERE, True),
    "one result here among others": (
        resource_claim(
            "u-mixed",
            results=[result("a", "x", driver=OTHER), result("b", "gpu-1"), result("c", "gpu-0", pool="b")],
        ),
        True,
    ),
    "not allocated": (resource_claim("u-pending", results=None), False),
    "another pool": (resource_claim("u-far", results=[result("a", "gpu-0", pool="node-b")]), False),
    "another driver": (resource_claim("u-other", results=[result("a", "gpu-0", driver=OTHER)]), False),
    "no results": (resource_claim("u-empty", results=[]), False),
}  # fmt: skip


@pytest.mark.parametrize(("claim", "kept"), KEPT.values(), ids=KEPT)
def test_allocated_here(claim: Obj, kept: bool) -> None:
    assert allocated_here(claim, driver=DRIVER, pool=NODE) == kept


def test_allocated_here_tolerates_missing_parts() -> None:
    partial: list[Obj] = [
        {},
        {"status": None},
        {"status": {"allocation": None}},
        {"status": {"allocation": {}}},
    ]
    for claim in partial:
        assert not allocated_here(claim, driver=DRIVER, pool=NODE)


@pytest.mark.parametrize(("claim", "kept"), KEPT.values(), ids=KEPT)
def test_added_claims_are_kept_only_when_allocated_here(
    cache: ClaimCache, kube: FakeKube, claim: Obj, kept: bool
) -> None:
    feed(kube, ("ADDED", claim))
    kube.objects[(claim["metadata"]["namespace"], claim["metadata"]["name"])] = claim
    assert get(cache, claim) is claim
    assert kube.gets == ([] if kept else [("default", claim["metadata"]["name"])])


def test_modified_claims_replace_the_cached_copy(cache: ClaimCache, kube: FakeKube) -> None:
    pending = resource_claim("u-1", name="c", results=None)
    allocated = whole_gpus("u-1", "gpu-0", name="c")
    feed(kube, ("ADDED", pending), ("MODIFIED", allocated))
    assert get(cache, allocated) is allocated
    assert kube.gets == []


def test_a_deallocated_claim_leaves_the_cache(cache: ClaimCache, kube: FakeKube) -> None:
    allocated = whole_gpus("u-1", "gpu-0", name="c")
    released = resource_claim("u-1", name="c", results=None)
    kube.objects[("default", "c")] = released
    feed(kube, ("ADDED", allocated), ("MODIFIED", released))
    assert get(cache, allocated) is released
    assert kube.gets == [("default", "c")]


def test_a_deleted_claim_leaves_the_cache(cache: ClaimCache, kube: FakeKube) -> None:
    feed(kube, ("ADDED", HERE), ("DELETED", HERE))
    with pytest.raises(ClaimError) as raised:
        get(cache, HERE)
    assert str(raised.value) == "ResourceClaim default/here not found"
    assert isinstance(raised.value.__cause__, NotFound)


def test_a_cached_copy_with_another_uid_falls_back_to_a_get(cache: ClaimCache, kube: FakeKube) -> None:
    old = whole_gpus("u-old", "gpu-0", name="c")
    new = whole_gpus("u-new", "gpu-1", name="c")
    kube.objects[("default", "c")] = new
    feed(kube, ("ADDED", old))
    assert get(cache, new) is new
    assert kube.gets == [("default", "c")]


def test_a_miss_falls_back_to_a_get(kube: FakeKube) -> None:
    unstarted = ClaimCache(kube, driver=DRIVER, pool=NODE)
    kube.objects[("default", "here")] = HERE
    assert get(unstarted, HERE) is HERE
    assert kube.gets == [("default", "here")]


def test_other_api_errors_pass_through(kube: FakeKube) -> None:
    class Refusing(FakeKube):
        def get_claim(self, namespace: str, name: str) -> Obj:
            raise ClusterError("reading ResourceClaim default/here: HTTP 503 Service Unavailable")

    unstarted = ClaimCache(Refusing(), driver=DRIVER, pool=NODE)
    with pytest.raises(ClusterError, match="HTTP 503"):
        get(unstarted, HERE)


def with_version(claim: Obj, version: str) -> Obj:
    return {**claim, "metadata": {**claim["metadata"], "resourceVersion": version}}


def test_a_failed_watch_is_retried(kube: FakeKube) -> None:
    kube.watch_failures = [ClusterError("watching ResourceClaims: connection refused")]
    cache = ClaimCache(kube, driver=DRIVER, pool=NODE, min_backoff=0.01)
    cache.start()
    try:
        feed(kube, ("ADDED", HERE))  # returns once the second watch has taken the event
        assert len(kube.watched_from) == 2
        assert get(cache, HERE) is HERE
        assert kube.gets == []
    finally:
        cache.stop(2)


@pytest.mark.parametrize(
    "failure",
    [
        RuntimeError("urllib3 ProtocolError: Response ended prematurely"),
        RecursionError("maximum recursion depth exceeded while decoding a JSON document"),
        ValueError("not JSON"),
        ClusterError("watching ResourceClaims: connection reset (ProtocolError)"),
    ],
    ids=["foreign", "recursion", "value", "cluster"],
)
def test_any_failure_of_the_watch_is_survived_and_resumed(
    kube: FakeKube, cache: ClaimCache, failure: BaseException
) -> None:
    feed(kube, ("ADDED", with_version(HERE, "7")))
    feed(kube, failure)
    wait_for(lambda: len(kube.watched_from) == 2)
    assert kube.watched_from == ["list-1", "7"]  # resumed from the last version seen: no new LIST
    assert kube.lists == 1
    assert cache.loop.alive
    moved = with_version(whole_gpus("u-here", "gpu-1", name="here"), "8")
    feed(kube, ("MODIFIED", moved))
    assert get(cache, HERE) is moved
    assert kube.gets == []


def test_while_the_watch_is_down_reads_go_to_the_api_server(kube: FakeKube, cache: ClaimCache) -> None:
    """A claim re-allocated while nobody watched must not be prepared from the cached copy."""
    feed(kube, ("ADDED", HERE))
    reallocated = whole_gpus("u-here", "gpu-3", name="here")
    kube.objects[("default", "here")] = reallocated
    kube.watch_failures = [ClusterError("watching ResourceClaims: connection refused")] * 1000
    feed(kube, ClusterError("watching ResourceClaims: connection reset"))
    wait_for(lambda: not cache.connected)
    assert get(cache, HERE) is reallocated
    assert kube.gets == [("default", "here")]


def test_an_expired_version_costs_one_new_list(kube: FakeKube, cache: ClaimCache) -> None:
    feed(kube, ("ADDED", with_version(HERE, "7")))
    kube.listing = []  # deleted while the watch was away
    feed(kube, Expired("watching ResourceClaims: resourceVersion expired"))
    wait_for(lambda: kube.lists == 2 and cache.connected)
    assert kube.watched_from == ["list-1", "list-2"]
    kube.objects[("default", "here")] = HERE
    get(cache, HERE)
    assert kube.gets == [("default", "here")]  # the relist dropped it


def test_a_watch_ended_by_the_server_resumes_without_a_list(kube: FakeKube, cache: ClaimCache) -> None:
    feed(kube, ("ADDED", with_version(HERE, "5")), ("BOOKMARK", {"metadata": {"resourceVersion": "9"}}))
    feed(kube, END)
    wait_for(lambda: len(kube.watched_from) == 2)
    assert kube.watched_from == ["list-1", "9"]
    assert kube.lists == 1
    assert get(cache, HERE)["metadata"]["uid"] == "u-here"
    assert kube.gets == []


def test_stop_ends_a_blocked_watch_at_once(kube: FakeKube) -> None:
    cache = ClaimCache(kube, driver=DRIVER, pool=NODE)
    cache.start()
    feed(kube, ("ADDED", HERE))
    started = time.monotonic()
    cache.stop(5)
    assert not cache.loop.alive
    assert time.monotonic() - started < 1.0


def test_the_first_list_keeps_only_claims_allocated_here(kube: FakeKube) -> None:
    kube.listing = [claim for claim, _ in KEPT.values()]
    cache = ClaimCache(kube, driver=DRIVER, pool=NODE)
    cache.start()
    try:
        wait_for(lambda: cache.connected)
        for claim, kept in KEPT.values():
            meta = claim["metadata"]
            kube.objects[(meta["namespace"], meta["name"])] = claim
            kube.gets.clear()
            get(cache, claim)
            assert kube.gets == ([] if kept else [(meta["namespace"], meta["name"])])
    finally:
        cache.stop(2)
