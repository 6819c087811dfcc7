"""A tenant's claim that nests too deeply to decode (any namespace user can create one, of any driver)
costs the controller nothing but that claim: `Kube` leaves it out of LIST pages and watch events (logged
once, counted once), the informers mirror everything else, a restarted controller lists and turns
ready, and readiness says when a watch has been failing past STALE_AFTER_SECONDS. Everything here runs
the real decoding (`Kube` over a scripted API client), the real informers and loops."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpudra.controller.cluster import STALE_AFTER_SECONDS, ClusterWatch
from gpudra.controller.metrics import ControllerMetrics
from gpudra.errors import ClusterError
from gpudra.kube.client import Kube
from gpudra.model.kube_api import GROUP, VERSION
from tests.unit.harness.api_client import FakeApiClient

BASE = f"/apis/{GROUP}/{VERSION}"
CLAIMS = f"{BASE}/resourceclaims"
DEEP = "[" * 3000 + "]" * 3000
TOO_DEEP = "nests too deeply to decode (more than 100 levels)"


def claim(name: str, version: str, parameters: str = "{}", *, namespace: str = "team-a") -> str:
    """A claim of another driver as the API server sends it, its opaque parameters as raw JSON."""
    metadata = json.dumps({"name": name, "namespace": namespace, "resourceVersion": version})
    config = f'[{{"opaque": {{"driver": "other.example.com", "parameters": {parameters}}}}}]'
    return f'{{"metadata": {metadata}, "spec": {{"devices": {{"config": {config}}}}}}}'


def page(version: str, *items: str) -> bytes:
    metadata = json.dumps({"resourceVersion": version})
    head = f'"kind": "ResourceClaimList", "apiVersion": "{GROUP}/{VERSION}", "metadata": {metadata}'
    return f'{{{head}, "items": [{", ".join(items)}]}}'.encode()


def event(kind: str, obj: str) -> bytes:
    return f'{{"type": "{kind}", "object": {obj}}}\n'.encode()


def scripted() -> FakeApiClient:
    """The API client `Kube` runs on here: LISTs of slices and classes answer an empty page; the claims'
    LISTs, WATCH chunks and GETs are what each test scripts."""
    api = FakeApiClient()
    api.lists.update({f"{BASE}/{r}": page("1") for r in ("resourceslices", "deviceclasses")})
    return api


def watch_for(kube: Kube, **kwargs: Any) -> ClusterWatch:
    return ClusterWatch(kube, driver="gpu.gpudra.io", idle_after_seconds=60, **kwargs)


def names(cluster: ClusterWatch) -> set[str]:
    return {o["metadata"]["name"] for o in cluster.claims.objects()}


def left_out(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("left out")]


def wait_until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_poisoned_claim_is_left_out_of_the_list_logged_and_counted_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = scripted()
    api.lists[CLAIMS] = page("10", claim("a", "5"), claim("deep", "6", DEEP), claim("b", "7"))
    kube = Kube(api)
    cluster = watch_for(kube)
    caplog.set_level(logging.WARNING)
    for informer in cluster.informers:
        informer._step()  # the first LIST of each
    assert cluster.current() is None  # ready, the poisoned claim existing
    assert names(cluster) == {"a", "b"}
    assert left_out(caplog) == [f"left out resourceclaims team-a/deep: the object {TOO_DEEP}"]
    record = next(r for r in caplog.records if r.getMessage().startswith("left out"))
    assert (record.resource, record.object, record.reason) == ("resourceclaims", "team-a/deep", "too-deep")  # type: ignore[attr-defined]

    cluster.claims._forget_position(ClusterError("watch broke"))
    cluster.claims._step()  # the same page again: nothing new to report
    assert names(cluster) == {"a", "b"} and len(left_out(caplog)) == 1
    assert kube.skipped.counts() == {("resourceclaims", "too-deep"): 1}

    metrics = ControllerMetrics()
    metrics.track_skipped_objects(kube.skipped.counts)
    sample = metrics.registry.get_sample_value(
        "gpudra_skipped_objects_total", {"resource": "resourceclaims", "reason": "too-deep"}
    )
    assert sample == 1


def test_a_poisoned_watch_event_drops_the_object_and_the_watch_goes_on() -> None:
    api = scripted()
    api.lists[CLAIMS] = page("10", claim("a", "5"), claim("b", "6"))
    api.events[CLAIMS] = [
        [
            event("MODIFIED", claim("a", "11", DEEP)),
            event("ADDED", claim("c", "12")),
            event("ADDED", claim("d", "13", DEEP)),
        ],
        [event("MODIFIED", claim("a", "14"))],  # the tenant fixed it
    ]
    kube = Kube(api)
    cluster = watch_for(kube)
    changes: list[int] = []
    cluster.claims.on_change = lambda: changes.append(1)
    cluster.claims._step()  # LIST
    cluster.claims._step()  # the first watch, to its end
    assert names(cluster) == {"b", "c"}
    assert cluster.claims._version == "13" and cluster.claims.failing_seconds() == 0
    cluster.claims._step()  # the next watch resumes from there
    assert names(cluster) == {"a", "b", "c"}
    assert kube.skipped.counts() == {("resourceclaims", "too-deep"): 2}  # a at version 11, d
    assert len(changes) == 5


def test_reading_a_poisoned_object_alone_fails_that_call_and_counts_it() -> None:
    api = scripted()
    api.objects[f"{BASE}/namespaces/team-a/resourceclaims/deep"] = claim("deep", "6", DEEP).encode()
    kube = Kube(api)
    with pytest.raises(
        ClusterError, match=re.escape(f"reading ResourceClaim team-a/deep: the object {TOO_DEEP}")
    ):
        kube.get_claim("team-a", "deep")
    assert kube.skipped.counts() == {("resourceclaims", "too-deep"): 1}


def test_every_cli_listing_leaves_the_poisoned_object_out_and_reports_it_to_the_command() -> None:
    api = scripted()
    api.lists[CLAIMS] = page("10", claim("a", "5"), claim("deep", "6", DEEP, namespace="team-b"))
    lines: list[str] = []
    kube = Kube(api, report_skipped=lines.append)
    claims = kube.list_all_claims()
    assert [c["metadata"]["name"] for c in claims] == ["a"] and claims[0]["kind"] == "ResourceClaim"
    assert lines == [f"left out resourceclaims team-b/deep: the object {TOO_DEEP}"]


def test_readiness_calls_the_picture_stale_once_a_watch_has_failed_past_the_bound() -> None:
    api = scripted()
    api.lists[CLAIMS] = page("10", claim("deep", "6", DEEP))
    api.hold = 0.05
    now = [1000.0]
    cluster = watch_for(Kube(api), monotonic=lambda: now[0])
    assert cluster.current() == "not listed yet: resourceslices, resourceclaims, deviceclasses"
    cluster.start()
    try:
        wait_until(lambda: cluster.current() is None)
        api.down = True
        # Every watch, not only the claims': the message names each that fails (under load the slices'
        # watch saw its failure after the claims' had, and the picture named only the claims').
        wait_until(lambda: all(i.loop.failures >= 1 for i in cluster.informers))
        now[0] += STALE_AFTER_SECONDS  # at the bound: still ready
        assert cluster.current() is None
        now[0] += 1
        stale = cluster.current()
        assert stale is not None and stale.startswith(
            "the cluster picture is stale: resourceslices (failing for 61 s: "
        )
        assert "resourceclaims (failing for 61 s: " in stale and "connection broken" in stale
        api.down = False
        wait_until(lambda: cluster.current() is None)  # the next LIST makes it current
        assert all(i.failing_seconds() == 0 for i in cluster.informers)
    finally:
        cluster.stop(5)
