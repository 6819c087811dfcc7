"""The GPU map's model (gpudra.scheduling.gpu_map) and its page over WSGI
(gpudra.controller.gpu_map_page), on slices gpudra's own device model publishes for hand-built nodes
(tests/unit/scheduling/test_cluster_view.py's)."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlencode

import pytest

from gpudra.cli import status_web
from gpudra.controller.cluster import VIEW_SECONDS, ClusterWatch
from gpudra.controller.gpu_map_page import (
    CONTENT_SECURITY_POLICY,
    PAGE,
    PATHS,
    GpuMapPage,
    Served,
    SurveyCache,
)
from gpudra.controller.status_access import StatusAccess, StatusPages
from gpudra.errors import ClusterError, ConfigError
from gpudra.kube.access_review import Caller as Reviewed
from gpudra.kube.client import Forbidden
from gpudra.model.claim import read_claim
from gpudra.scheduling.gpu_map import (
    MAX_PAGE_SIZE,
    MAX_PENDING,
    GpuCard,
    GpuMap,
    MapQuery,
    QueryError,
    Survey,
    draw,
    reason,
    survey,
)
from tests.unit import inventories as inv
from tests.unit.harness.cluster import (
    CLASS_OBJECTS,
    DRIVER,
    GIB,
    GPU0_LOST,
    H100_NODE,
    MIXED,
    NOW,
    SLICES,
    claim,
    idle_entry,
    reporting,
    slices,
)

HOSTILE = '<img src=x onerror="alert(1)">'


def surveyed(*claims: dict[str, Any], slices: list[dict[str, Any]] = SLICES) -> Survey:
    return survey(
        driver=DRIVER,
        slices=slices,
        claims=[read_claim(c) for c in claims],
        classes=CLASS_OBJECTS,
        now=NOW,
        idle_after_seconds=1800,
    )


def cards(found: GpuMap, node: str) -> dict[str, GpuCard]:
    return {g.name: g for n in found.nodes if n.name == node for g in n.gpus}


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    obj["metadata"]["namespace"] = namespace
    return obj


def test_every_gpu_of_every_node_is_drawn_free_with_its_mig_slots() -> None:
    found = draw(surveyed(), MapQuery())
    assert [n.name for n in found.nodes] == ["node-h100", "node-mixed"]
    h100 = cards(found, "node-h100")
    assert list(h100) == ["gpu-0", "gpu-1"]
    assert {g.state for g in h100.values()} == {"free"}
    assert h100["gpu-0"].mig_slots == 8
    assert h100["gpu-0"].memory == 85520809984  # 79.6 GiB, as NVML reports it
    assert h100["gpu-0"].largest_placeable == "7g.80gb"
    mixed = cards(found, "node-mixed")
    assert [g.mig_slots for g in mixed.values()] == [0, 0, 0, 0]  # L4 and T4: no MIG
    assert (found.nodes_total, found.nodes_matched, found.page, found.pages) == (2, 2, 1, 1)
    assert found.products == ["NVIDIA H100 80GB HBM3", "NVIDIA L4", "Tesla T4"]


def test_holders_are_drawn_where_they_sit_whole_mig_slots_and_shares_with_sizes() -> None:
    share_a = claim("share-a", ("node-mixed", "gpu-0-shared"), share=True)
    share_a["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {
        "memory": "8Gi",
        "compute": "25",
    }
    found = draw(
        surveyed(
            claim("whole", ("node-h100", "gpu-0")),
            claim("mig-a", ("node-h100", "gpu-1-mig-3g40gb-0")),
            claim("mig-b", ("node-h100", "gpu-1-mig-1g10gb-4")),
            share_a,
            claim("share-b", ("node-mixed", "gpu-0-shared"), share=True),
        ),
        MapQuery(),
    )
    h100 = cards(found, "node-h100")
    assert (h100["gpu-0"].state, h100["gpu-0"].holders) == ("whole", ["default/whole"])
    assert h100["gpu-0"].largest_placeable is None
    mig = h100["gpu-1"]
    assert mig.state == "mig"
    assert [(p.profile, p.start, p.size, p.claims) for p in mig.partitions] == [
        ("3g.40gb", 0, 4, ["default/mig-a"]),
        ("1g.10gb", 4, 1, ["default/mig-b"]),
    ]
    l4 = cards(found, "node-mixed")["gpu-0"]
    assert l4.state == "shared"
    assert [(s.claim, s.memory, s.compute) for s in l4.shares] == [
        ("default/share-a", 8 * GIB, 25),
        ("default/share-b", 0, 0),  # asked nothing: all the memory, no SM share
    ]


def test_idle_and_unhealthy_gpus_are_marked() -> None:
    old = NOW - timedelta(hours=2)
    slices = copy.deepcopy(SLICES)
    for s in slices:
        for device in s["spec"].get("devices", []):
            if s["spec"]["nodeName"] == "node-mixed" and device["name"] == "gpu-3":
                device["taints"] = [{"key": "gpu.gpudra.io/xid", "value": "79", "effect": "NoSchedule"}]
    found = draw(
        surveyed(
            claim("sleeps", ("node-h100", "gpu-0"), usage=[idle_entry("node-h100", "gpu-0", old)]),
            claim("works", ("node-h100", "gpu-1")),
            slices=slices,
        ),
        MapQuery(),
    )
    h100 = cards(found, "node-h100")
    assert (h100["gpu-0"].idle, h100["gpu-1"].idle) == (True, False)
    mixed = cards(found, "node-mixed")
    assert mixed["gpu-3"].unhealthy == "gpu.gpudra.io/xid=79:NoSchedule"
    assert mixed["gpu-2"].unhealthy is None


def test_a_gpu_left_out_of_the_slices_is_drawn_unhealthy_with_the_nodes_words() -> None:
    left_out = reporting("node-h100", H100_NODE, GPU0_LOST, taints=False)
    h100 = cards(draw(surveyed(slices=left_out + MIXED), MapQuery()), "node-h100")
    assert sorted(h100) == ["gpu-0", "gpu-1"]
    assert h100["gpu-0"].unhealthy == (
        "left out of the slices (no device taints on this release): Xid119; "
        "gpu-0: XID 119 (GSP RPC timeout), class reset"
    )
    assert h100["gpu-1"].unhealthy is None
    tainted = reporting("node-h100", H100_NODE, GPU0_LOST, taints=True, server_minor=36)
    shown = cards(draw(surveyed(slices=tainted + MIXED), MapQuery()), "node-h100")["gpu-0"].unhealthy
    assert shown == "gpudra.io/unhealthy=Xid119:NoSchedule; gpu-0: XID 119 (GSP RPC timeout), class reset"


def test_pending_claims_carry_explains_verdict() -> None:
    fits = claim("fits", classes=("gpu.gpudra.io",))
    never = claim("never", classes=("gpu.gpudra.io",))
    never["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": 'device.attributes["gpu.gpudra.io"].productName == "NVIDIA H200"'}}
    ]
    found = surveyed(fits, never)
    assert [p.reason for p in draw(found, MapQuery()).pending] == ["", ""]  # drawing explains nothing
    assert reason(found, "default/fits").startswith("fits on node-")
    never_reason = reason(found, "default/never")
    assert never_reason.startswith("cannot fit") and "H200" in never_reason
    assert {p.name: p.reason for p in draw(found, MapQuery()).pending}["never"] == never_reason  # kept
    with pytest.raises(QueryError, match="no pending GPU claim 'default/nope'"):
        reason(found, "default/nope")


def test_filters_by_node_product_and_namespace_and_pages() -> None:
    found = surveyed(
        in_namespace(claim("a", ("node-mixed", "gpu-2")), "team-a"),
        in_namespace(claim("w", classes=("gpu.gpudra.io",)), "team-b"),
    )
    assert [n.name for n in draw(found, MapQuery(node="mixed")).nodes] == ["node-mixed"]
    t4 = draw(found, MapQuery(product="Tesla T4"))
    assert [(n.name, [g.name for g in n.gpus]) for n in t4.nodes] == [("node-mixed", ["gpu-2", "gpu-3"])]
    team_a = draw(found, MapQuery(namespace="team-a"))
    assert [n.name for n in team_a.nodes] == ["node-mixed"] and team_a.pending == []
    assert [p.name for p in draw(found, MapQuery(namespace="team-b")).pending] == ["w"]
    assert draw(found, MapQuery()).namespaces == ["team-a", "team-b"]
    second = draw(found, MapQuery(size=1, page=2))
    assert (second.pages, second.page, [n.name for n in second.nodes]) == (2, 2, ["node-mixed"])
    assert draw(found, MapQuery(size=1, page=9)).page == 2  # past the end: the last page
    assert draw(found, MapQuery(node="nothing")).nodes == []


def test_a_query_is_read_from_url_parameters_and_a_bad_one_named() -> None:
    assert MapQuery.parse(parse_qs("node=h100&page=2&size=10")) == MapQuery(node="h100", page=2, size=10)
    for text, named in [
        ("colour=red", "unknown query parameter 'colour'"),
        ("page=0", "page must be a whole number from 1 to"),
        (f"size={MAX_PAGE_SIZE + 1}", f"size must be a whole number from 1 to {MAX_PAGE_SIZE}"),
        ("size=ten", "size must be"),
        ("node=a&node=b", "node given 2 times"),
        ("namespace=" + "x" * 300, "namespace is 300 characters"),
    ]:
        with pytest.raises(QueryError, match=named):
            MapQuery.parse(parse_qs(text))


def test_a_mig_gpu_without_a_whole_gpu_device_shows_its_largest_partitions_memory() -> None:
    """A100s with MIG on publish only partitions, and count memory slices, not bytes."""
    found = draw(surveyed(slices=slices("node-a100", inv.a100_node())), MapQuery())
    memory = {g.name: g.memory for g in found.nodes[0].gpus}
    assert memory["gpu-0"] == memory["gpu-5"] and 39 * GIB <= memory["gpu-0"] < 40 * GIB  # 7g.40gb
    assert memory["gpu-6"] == 40 * GIB  # MIG off: the whole GPU's


# --- the page over WSGI --------------------------------------------------------------------------


def get(
    page: GpuMapPage, path: str, query: str = "", method: str = "GET"
) -> tuple[str, dict[str, str], bytes]:
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        answer["status"], answer["headers"] = status, dict(headers)

    body = b"".join(
        page.app({"PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": method}, start_response)
    )
    return answer["status"], answer["headers"], body


def hostile_survey() -> Callable[[], Survey]:
    bad = in_namespace(claim(HOSTILE, ("node-h100", "gpu-0")), "<b>ns</b>")
    waits = in_namespace(claim(f"{HOSTILE}-waits", classes=("gpu.gpudra.io",)), "<b>ns</b>")
    found = surveyed(bad, waits)
    return lambda: found


def test_the_page_is_one_self_contained_file_with_a_strict_policy() -> None:
    status, headers, body = get(GpuMapPage(hostile_survey()), "/")
    assert status == "200 OK" and body == PAGE
    assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "default-src 'none'" in CONTENT_SECURITY_POLICY and "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert (
        "script-src 'sha256-" in CONTENT_SECURITY_POLICY and "style-src 'sha256-" in CONTENT_SECURITY_POLICY
    )
    text = body.decode()
    for external in ("http://", "https://", "src=", "<link", "@import", "url("):
        assert external not in text, external  # nothing fetched from elsewhere: works offline
    assert ".innerHTML" not in text and "insertAdjacentHTML" not in text and "document.write" not in text


def test_the_json_carries_names_as_data_and_the_page_never_holds_them() -> None:
    page = GpuMapPage(hostile_survey())
    status, headers, body = get(page, "/gpu-map.json")
    assert status == "200 OK" and headers["X-Content-Type-Options"] == "nosniff"
    document = json.loads(body)
    gpu = document["nodes"][0]["gpus"][0]
    assert gpu["holders"] == [f"<b>ns</b>/{HOSTILE}"]
    assert document["pending"][0]["name"] == f"{HOSTILE}-waits"
    assert HOSTILE.encode() not in get(page, "/")[2]


def test_bad_queries_and_writes_are_refused_with_one_line() -> None:
    page = GpuMapPage(hostile_survey())
    status, _, body = get(page, "/gpu-map.json", "page=-1")
    assert status == "400 Bad Request" and "page must be a whole number" in json.loads(body)["error"]
    assert get(page, "/gpu-map.json", "x" * 5000)[0] == "400 Bad Request"
    assert get(page, "/", method="POST")[0] == "405 Method Not Allowed"
    assert get(page, "/elsewhere")[0] == "404 Not Found"


def test_a_cluster_that_cannot_be_read_is_answered_503_with_the_reason() -> None:
    def unreachable() -> Survey:
        raise ClusterError("listing resourceslices: connection refused")

    status, _, body = get(GpuMapPage(unreachable), "/gpu-map.json")
    assert status == "503 Service Unavailable"
    assert json.loads(body) == {"error": "listing resourceslices: connection refused"}


def test_a_pending_claims_reason_is_asked_one_at_a_time() -> None:
    page = GpuMapPage(hostile_survey())
    name = f"<b>ns</b>/{HOSTILE}-waits"
    status, _, body = get(page, "/gpu-map-explain.json", urlencode({"claim": name}))
    assert status == "200 OK"
    assert json.loads(body)["claim"] == name and json.loads(body)["reason"].startswith("fits on node-")
    assert get(page, "/gpu-map-explain.json", "claim=default/nope")[0] == "400 Bad Request"
    assert get(page, "/gpu-map-explain.json", "claim=a/b&node=x")[0] == "400 Bad Request"
    with page._explaining:  # another explanation running
        status, _, body = get(page, "/gpu-map-explain.json", urlencode({"claim": name}))
    assert status == "503 Service Unavailable" and "next refresh" in json.loads(body)["error"]


def test_the_controller_builds_a_survey_once_per_change_or_view_period() -> None:
    class NoKube:
        """Informers never started: every collection is empty."""

    now = [0.0]
    watch = ClusterWatch(
        NoKube(), driver=DRIVER, idle_after_seconds=60, clock=lambda: NOW, monotonic=lambda: now[0]
    )
    first = watch.survey().survey
    assert watch.survey().survey is first
    watch._changed()  # a watch event: served the last survey while the next is built
    assert watch.survey().survey is first
    assert watch.surveys.wait(timeout=10)
    second = watch.survey().survey
    assert second is not first and watch.survey().survey is second
    now[0] += VIEW_SECONDS  # idle times grow with the clock
    stale = watch.survey()
    assert stale.survey is second and stale.age_seconds == VIEW_SECONDS
    assert watch.surveys.wait(timeout=10)
    assert watch.survey().survey is not second


class SlowBuilds:
    """Surveys built on request: each build waits for the test to let it finish, and its rebuilds run
    on threads the test starts by hand, so the order is the test's, not the clock's."""

    def __init__(self) -> None:
        self.built: list[Survey] = []
        self.release = threading.Event()
        self.started = threading.Event()
        self.rebuilds: list[Callable[[], None]] = []
        self.version = 0
        self.now = 0.0
        self.fail: Exception | None = None

    def build(self) -> Survey:
        self.started.set()
        assert self.release.wait(timeout=10), "the test never let the build finish"
        self.release.clear()
        if self.fail is not None:
            raise self.fail
        self.built.append(surveyed())
        return self.built[-1]

    def cache(self) -> SurveyCache:
        return SurveyCache(
            self.build,
            max_age_seconds=VIEW_SECONDS,
            version=lambda: self.version,
            monotonic=lambda: self.now,
            start=self.rebuilds.append,
        )

    def run_rebuild(self) -> threading.Thread:
        thread = threading.Thread(target=self.rebuilds.pop(0))
        thread.start()
        assert self.started.wait(timeout=10)
        return thread


def test_a_page_request_waits_only_for_the_first_survey_and_never_for_a_rebuild() -> None:
    slow = SlowBuilds()
    cache = slow.cache()
    first: list[Served] = []
    waiting = threading.Thread(target=lambda: first.append(cache.get()))
    waiting.start()
    assert slow.started.wait(timeout=10)
    assert not first  # no survey yet: the first request waits for the build
    slow.started.clear()
    slow.release.set()
    waiting.join(timeout=10)
    [served] = first
    assert served.survey is slow.built[0] and not served.rebuilding and not slow.rebuilds

    slow.version += 1  # the cluster changed
    slow.now += 2.0
    served = cache.get()  # answered at once with the last survey, its age, and a rebuild queued
    assert served.survey is slow.built[0] and served.rebuilding and served.age_seconds == 2.0
    assert len(slow.rebuilds) == 1
    rebuilding = slow.run_rebuild()  # now building, held until released
    for _ in range(3):  # requests meanwhile: the old survey at once, no second rebuild
        served = cache.get()
        assert served.survey is slow.built[0] and served.rebuilding
    assert not slow.rebuilds and len(slow.built) == 1
    slow.release.set()
    rebuilding.join(timeout=10)
    assert cache.wait(timeout=10)
    served = cache.get()
    assert served.survey is slow.built[1] and not served.rebuilding and served.age_seconds == 0.0
    assert not slow.rebuilds  # up to date: nothing to rebuild

    slow.now += VIEW_SECONDS  # too old: the next request starts one rebuild
    assert cache.get().survey is slow.built[1] and len(slow.rebuilds) == 1


def test_a_failed_rebuild_leaves_the_last_survey_served_with_why() -> None:
    slow = SlowBuilds()
    cache = slow.cache()
    slow.release.set()
    kept = cache.get().survey
    slow.started.clear()
    slow.version += 1
    slow.fail = ClusterError("listing resourceslices: connection refused")
    cache.get()
    slow.release.set()
    slow.run_rebuild().join(timeout=10)
    served = cache.get()  # another rebuild queued: the next one tries again
    assert served.survey is kept and served.failed == "listing resourceslices: connection refused"
    assert len(slow.rebuilds) == 1
    status, _, body = get(GpuMapPage(lambda: served), "/gpu-map.json")
    assert status == "200 OK"
    assert json.loads(body)["notes"] == [
        "the map could not be brought up to date: listing resourceslices: connection refused"
    ]
    assert json.loads(body)["rebuilding"] is True


def test_the_first_surveys_failure_is_the_requests() -> None:
    slow = SlowBuilds()
    cache = slow.cache()
    slow.fail = ClusterError("listing resourceslices: connection refused")
    slow.release.set()
    status, _, body = get(GpuMapPage(cache.get), "/gpu-map.json")
    assert status == "503 Service Unavailable" and "connection refused" in json.loads(body)["error"]
    slow.fail = None
    slow.release.set()
    assert get(GpuMapPage(cache.get), "/gpu-map.json")[0] == "200 OK"  # tried again


def test_the_controllers_status_pages_hand_the_map_paths_to_the_page() -> None:
    page = GpuMapPage(hostile_survey())

    class Everyone:
        def authenticate(self, token: str) -> Reviewed | None:
            return Reviewed(username="admin")

        def may_list(self, caller: Reviewed, resource: str, namespace: str) -> bool:
            return True

        def namespaces(self) -> tuple[list[str], bool]:
            return [], False

    pages = StatusPages(
        StatusAccess(Everyone()),
        view=lambda: pytest.fail("the map does not build the view"),
        namespaces=lambda: (),
        map_app=page.app,
        map_paths=PATHS,
    )
    answers: list[str] = []

    def call(path: str) -> bytes:
        environ = {
            "PATH_INFO": path,
            "QUERY_STRING": "",
            "REQUEST_METHOD": "GET",
            "HTTP_AUTHORIZATION": "Bearer t",
        }
        return b"".join(pages.app(environ, lambda status, headers: answers.append(status)))

    assert call("/") == PAGE
    assert json.loads(call("/gpu-map.json"))["nodesTotal"] == 2
    assert call("/metrics").startswith(b'{"error": "no such page')
    assert answers == ["200 OK", "200 OK", "404 Not Found"]


class Caller:
    """A kubeconfig that may list slices and classes, and claims only in `allowed` (None: everywhere);
    `forbidden`: the cluster-scoped lists it may not read."""

    def __init__(self, claims: list[dict[str, Any]], allowed: str | None, forbidden: tuple[str, ...] = ()):
        self.claims = claims
        self.allowed = allowed
        self.forbidden = forbidden

    def _refuse(self, resource: str, where: str = "at the cluster scope") -> Forbidden:
        return Forbidden(f"listing {resource}: HTTP 403 Forbidden: cannot list {resource} {where}")

    def list_all_slices(self) -> list[dict[str, Any]]:
        if "resourceslices" in self.forbidden:
            raise self._refuse("resourceslices")
        return SLICES

    def list_device_classes(self) -> list[dict[str, Any]]:
        if "deviceclasses" in self.forbidden:
            raise self._refuse("deviceclasses")
        return CLASS_OBJECTS

    def list_all_claims(self) -> list[dict[str, Any]]:
        if self.allowed is not None:
            raise self._refuse("resourceclaims")
        return self.claims

    def list_claims(self, namespace: str) -> list[dict[str, Any]]:
        if namespace != self.allowed:
            raise self._refuse("resourceclaims", f"in namespace {namespace}")
        return [c for c in self.claims if c["metadata"]["namespace"] == namespace]


def web_map(caller: Caller, namespace: str | None) -> GpuMap:
    surveys = status_web._Surveys(caller, driver=DRIVER, idle_after_seconds=60, namespace=namespace)
    status, _, body = get(GpuMapPage(surveys.get), "/gpu-map.json")
    assert status == "200 OK", body
    return GpuMap.model_validate_json(body)


TWO_TEAMS = [
    in_namespace(claim("train", ("node-h100", "gpu-0")), "team-a"),
    in_namespace(claim("waits", classes=("gpu.gpudra.io",)), "team-a"),
    in_namespace(claim("other", ("node-mixed", "gpu-0")), "team-b"),
    in_namespace(claim("queued", classes=("gpu.gpudra.io",)), "team-b"),
]


def holders(drawn: GpuMap) -> set[str]:
    return {h for n in drawn.nodes for g in n.gpus for h in g.holders}


def test_status_web_shows_every_claim_to_a_caller_who_may_list_them_everywhere() -> None:
    drawn = web_map(Caller(TWO_TEAMS, allowed=None), namespace="team-a")
    assert holders(drawn) == {"team-a/train", "team-b/other"}
    assert {p.name for p in drawn.pending} == {"waits", "queued"} and drawn.notes == []


def test_status_web_shows_only_the_namespace_the_caller_may_list_claims_in_and_says_so() -> None:
    drawn = web_map(Caller(TWO_TEAMS, allowed="team-a"), namespace="team-a")
    assert holders(drawn) == {"team-a/train"}  # team-b's GPU is drawn free
    assert [(p.namespace, p.name) for p in drawn.pending] == [("team-a", "waits")]
    assert sum(len(n.gpus) for n in drawn.nodes) == 6
    [note] = drawn.notes
    assert note.startswith("only namespace team-a's claims are shown: your kubeconfig may not list")
    assert "cannot list resourceclaims at the cluster scope" in note and "drawn free" in note


def test_status_web_draws_the_gpus_without_holders_when_the_caller_may_not_list_claims() -> None:
    for namespace, named in [(None, "--namespace"), ("team-b", "nor in namespace team-b")]:
        drawn = web_map(Caller(TWO_TEAMS, allowed="team-a"), namespace=namespace)
        assert sum(len(n.gpus) for n in drawn.nodes) == 6 and holders(drawn) == set()
        assert drawn.pending == []
        [note] = drawn.notes
        assert note.startswith("the GPUs are shown without their claims") and named in note, note


def test_status_web_says_which_cluster_wide_lists_it_may_not_read_and_draws_the_rest() -> None:
    caller = Caller(TWO_TEAMS, allowed="team-a", forbidden=("resourceslices", "deviceclasses"))
    drawn = web_map(caller, namespace="team-a")
    assert drawn.nodes == [] and drawn.pending == []
    assert [n.split(":")[0] for n in drawn.notes] == [
        "no GPUs are shown",
        "no pending claims are shown",
        "only namespace team-a's claims are shown",
    ]


def test_status_web_reads_the_cluster_at_most_once_per_period() -> None:
    class Counting(Caller):
        reads = 0

        def list_all_slices(self) -> list[dict[str, Any]]:
            self.reads += 1
            return super().list_all_slices()

    caller = Counting(TWO_TEAMS, allowed=None)
    rebuilds: list[Callable[[], None]] = []
    surveys = status_web._Surveys(caller, driver=DRIVER, idle_after_seconds=60, start=rebuilds.append)
    assert surveys.get().survey is surveys.get().survey
    assert caller.reads == 1 and not rebuilds


def test_status_web_takes_host_and_port_or_names_the_option() -> None:
    assert status_web.listen_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert status_web.listen_address("[::1]:8090") == ("::1", 8090)
    for bad in ("8090", "localhost:", ":8090", "host:99999", "host:http"):
        with pytest.raises(ConfigError, match=r"--listen: .* is not HOST:PORT"):
            status_web.listen_address(bad)


def test_a_page_lists_the_oldest_pending_claims_and_counts_them_all() -> None:
    waiting = [
        claim(f"w{i:03}", classes=("gpu.gpudra.io",), created=NOW - timedelta(minutes=i))
        for i in range(MAX_PENDING + 2)
    ]
    drawn = draw(surveyed(*waiting), MapQuery())
    assert drawn.pending_total == MAX_PENDING + 2 and len(drawn.pending) == MAX_PENDING
    assert drawn.pending[0].name == f"w{MAX_PENDING + 1:03}"  # the oldest first
