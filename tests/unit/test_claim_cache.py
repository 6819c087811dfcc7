"""ClaimCache: which claims the watch keeps, and when get() falls back to a GET."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

import pytest

from gpudra.errors import ClaimError, ClusterError
from gpudra.kube.claim_cache import ClaimCache, allocated_here
from gpudra.kube.client import NotFound, Obj
from tests.unit.claims import DRIVER, NODE, resource_claim, result, whole_gpus


class FakeKube:
    """The claim half of gpudra.kube.client.Kube: GETs from `objects`, watch events from a queue."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Obj] = {}
        self.gets: list[tuple[str, str]] = []
        self.events: queue.Queue[tuple[str, Obj]] = queue.Queue()
        self.watch_failures: list[Exception] = []
        self.watches = 0

    def get_claim(self, namespace: str, name: str) -> Obj:
        self.gets.append((namespace, name))
        try:
            return self.objects[(namespace, name)]
        except KeyError:
            raise NotFound(f"reading ResourceClaim {namespace}/{name}: HTTP 404 Not Found") from None

    def watch_claims(self, on_event: Callable[[str, Obj], None], *, stop: threading.Event) -> None:
        self.watches += 1
        if self.watch_failures:
            raise self.watch_failures.pop(0)
        on_event("RESYNC", {})
        while not stop.is_set():
            try:
                kind, claim = self.events.get(timeout=0.02)
            except queue.Empty:
                continue
            on_event(kind, claim)
            self.events.task_done()


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def cache(kube: FakeKube) -> Iterator[ClaimCache]:
    running = ClaimCache(kube, driver=DRIVER, pool=NODE)  # type: ignore[arg-type]
    running.start()
    yield running
    running.stop()


def feed(kube: FakeKube, *events: tuple[str, Obj]) -> None:
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
    unstarted = ClaimCache(kube, driver=DRIVER, pool=NODE)  # type: ignore[arg-type]
    kube.objects[("default", "here")] = HERE
    assert get(unstarted, HERE) is HERE
    assert kube.gets == [("default", "here")]


def test_other_api_errors_pass_through(kube: FakeKube) -> None:
    class Refusing(FakeKube):
        def get_claim(self, namespace: str, name: str) -> Obj:
            raise ClusterError("reading ResourceClaim default/here: HTTP 503 Service Unavailable")

    unstarted = ClaimCache(Refusing(), driver=DRIVER, pool=NODE)  # type: ignore[arg-type]
    with pytest.raises(ClusterError, match="HTTP 503"):
        get(unstarted, HERE)


def test_a_failed_watch_is_retried(kube: FakeKube) -> None:
    kube.watch_failures = [ClusterError("listing ResourceClaims: connection refused")]
    cache = ClaimCache(kube, driver=DRIVER, pool=NODE)  # type: ignore[arg-type]
    cache.start()
    try:
        feed(kube, ("ADDED", HERE))  # returns once the second watch has taken the event
        assert kube.watches == 2
        assert get(cache, HERE) is HERE
        assert kube.gets == []
    finally:
        cache.stop()


def test_stop_ends_the_watch(kube: FakeKube) -> None:
    cache = ClaimCache(kube, driver=DRIVER, pool=NODE)  # type: ignore[arg-type]
    cache.start()
    feed(kube, ("ADDED", HERE))
    cache.stop()
    assert cache._thread is not None
    cache._thread.join(2)
    assert not cache._thread.is_alive()


def test_relist_drops_claims_deleted_while_the_watch_was_down(kube: FakeKube, cache: ClaimCache) -> None:
    meta = HERE["metadata"]
    kube.objects[(meta["namespace"], meta["name"])] = HERE
    feed(kube, ("ADDED", HERE), ("RESYNC", {}))  # a relist that replayed the claim keeps it
    get(cache, HERE)
    assert kube.gets == []
    feed(kube, ("RESYNC", {}))  # a relist without it: deleted while nobody watched
    get(cache, HERE)
    assert kube.gets == [(meta["namespace"], meta["name"])]
