"""`/status` behind TokenReview and SubjectAccessReview (gpudra.controller.status_access), with the
reviews faked: who gets 401, 403 and which claims, what is cached and for how long, the GPU map only
for the cluster-wide right, and the webhook's HTTPS port answering GETs with it."""

from __future__ import annotations

import hashlib
import http.client
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pytest

from gpudra.cli import status
from gpudra.controller import status_access
from gpudra.controller.status_access import (
    NEW_TOKENS_BURST,
    NEW_TOKENS_PER_SECOND,
    NEW_TOKENS_TOTAL_PER_SECOND,
    TTL_SECONDS,
    Scope,
    StatusAccess,
    StatusPages,
    TooManyNewTokens,
    Unauthenticated,
    _warning,
    visible,
)
from gpudra.controller.webhook import WebhookServer
from gpudra.errors import ClusterError, GpudraError
from gpudra.kube.access_review import Caller
from gpudra.scheduling.cluster_view import (
    ClusterView,
    IdleDevice,
    MigRoom,
    NodeProducts,
    PendingClaim,
    UnhealthyDevice,
)
from tests.unit.harness.tls import HERE, client_context, material_for

# token -> (user, namespaces it may list claims in ("" is cluster-wide), may list resourceslices)
TOKENS = {
    "admin-token": ("admin", {""}, True),
    "team-a-token": ("alice", {"team-a"}, False),
    "viewer-token": ("vera", {"team-a"}, True),
    "team-d-token": ("dave", {"team-d"}, False),
    "ci-token": ("system:serviceaccount:team-e:ci", {"team-e"}, False),
    "slices-token": ("sam", set(), True),
    "nobody-token": ("bob", set(), False),
}
# The cluster's namespaces: claims are in team-a and team-b only.
CLUSTER = ["default", "kube-system", "team-a", "team-b", "team-c", "team-d", "team-e"]


class FakeReviews:
    def __init__(self, namespaces: list[str] = CLUSTER, more: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.down = False
        self.listing: GpudraError | None = None
        self.cluster = (namespaces, more)

    def authenticate(self, token: str) -> Caller | None:
        self.calls.append(("token", token))
        if self.down:
            raise ClusterError("reviewing a bearer token: the API server is away")
        user = TOKENS.get(token)
        return None if user is None else Caller(username=user[0], groups=("system:authenticated",))

    def may_list(self, caller: Caller, resource: str, namespace: str) -> bool:
        self.calls.append((caller.username, namespace if resource == "resourceclaims" else resource))
        claims, slices = next((c, s) for name, c, s in TOKENS.values() if name == caller.username)
        if resource == "resourceslices":
            return slices
        return "" in claims or namespace in claims

    def namespaces(self) -> tuple[list[str], bool]:
        self.calls.append(("list", "namespaces"))
        if self.listing is not None:
            raise self.listing
        return self.cluster


def view() -> ClusterView:
    return ClusterView(
        generated=datetime(2026, 1, 1, tzinfo=UTC),
        driver="gpu.gpudra.io",
        idle_after_seconds=1800,
        nodes=[NodeProducts(node="n", product="H100", gpus=8, allocated=2, shared=0, free=6, idle=1)],
        mig=[
            MigRoom(
                node="n",
                gpu="gpu-0",
                uuid="GPU-0",
                product="H100",
                partitions_allocated=0,
                largest_placeable="7g.80gb",
                largest_placeable_memory=80 << 30,
            )
        ],
        pending=[
            PendingClaim(namespace=ns, name=f"{ns}-pending", age_seconds=5, device_classes=["gpu.gpudra.io"])
            for ns in ("team-a", "team-b")
        ],
        idle=[
            IdleDevice(
                namespace=ns, claim=f"{ns}-idle", pods=["p"], node="n", device="gpu-0", idle_seconds=3600
            )
            for ns in ("team-a", "team-b")
        ],
        unhealthy=[
            UnhealthyDevice(
                node="n", device="gpu-7", uuid="GPU-7", product="H100", reason="Xid79", effect="NoExecute"
            )
        ],
    )


NAMESPACES = ("team-a", "team-b")  # those of the claims in view()


def test_a_tokens_scope_is_cluster_wide_its_namespaces_or_nothing() -> None:
    reviews = FakeReviews()
    access = StatusAccess(reviews)
    everything = Scope(everything=True, inventory=True, somewhere=True)
    assert access.scope("admin-token", lambda: NAMESPACES) == everything
    assert access.scope("team-a-token", lambda: NAMESPACES) == Scope(
        False, frozenset({"team-a"}), somewhere=True
    )
    assert access.scope("viewer-token", lambda: NAMESPACES) == Scope(
        False, frozenset({"team-a"}), inventory=True, somewhere=True
    )
    assert access.scope("slices-token", lambda: NAMESPACES) == Scope(False, inventory=True)
    assert access.scope("nobody-token", lambda: NAMESPACES) == Scope(False)
    assert not access.scope("nobody-token", lambda: NAMESPACES).sees_anything
    with pytest.raises(Unauthenticated):
        access.scope("made-up", lambda: NAMESPACES)


def test_a_user_whose_namespaces_have_no_claims_may_still_see_that_they_have_none() -> None:
    """Rights only where there are no claims: asked about the cluster's other namespaces until one
    allows it (a ServiceAccount's own first); the claims' namespaces are not asked twice."""
    reviews = FakeReviews()
    access = StatusAccess(reviews)
    assert access.scope("team-d-token", lambda: NAMESPACES) == Scope(False, somewhere=True)
    asked = [ns for user, ns in reviews.calls if user == "dave"]
    assert asked == ["", "resourceslices", "team-a", "team-b", "default", "kube-system", "team-c", "team-d"]
    reviews.calls.clear()
    assert access.scope("ci-token", lambda: NAMESPACES) == Scope(False, somewhere=True)
    asked = [ns for user, ns in reviews.calls if user.endswith(":ci")]
    assert asked == ["", "resourceslices", "team-a", "team-b", "team-e"]  # its own namespace first
    reviews.calls.clear()
    # Nobody's: every namespace once, the list of namespaces once for everyone within the TTL.
    assert access.scope("nobody-token", lambda: NAMESPACES) == Scope(False)
    assert sorted(ns for user, ns in reviews.calls if user == "bob") == sorted(
        ["", "resourceslices", *CLUSTER]
    )
    assert ("list", "namespaces") not in reviews.calls


def test_reviews_per_request_are_bounded_the_rest_counted_not_allowed_and_said() -> None:
    """1000 namespaces, none with claims allowed: at most `reviews_per_request` reviews a request; the
    answers cached, each request goes on where the last stopped."""
    cluster = [f"ns-{i:04}" for i in range(999)] + ["team-d"]
    reviews = FakeReviews(cluster, more=True)
    access = StatusAccess(reviews, reviews_per_request=300)
    for _ in range(3):
        scope = access.scope("team-d-token", lambda: NAMESPACES)
        assert scope == Scope(False, note=scope.note) and "not yet checked" in scope.note
        assert "only the first 1000 namespaces" in scope.note
    scope = access.scope("team-d-token", lambda: NAMESPACES)
    assert scope == Scope(False, somewhere=True, note="")
    asked = [ns for user, ns in reviews.calls if user == "dave"]
    assert len(asked) == 2 + 1002 and len(set(asked)) == len(asked)  # each once, claims' namespaces too


def test_namespaces_that_cannot_be_listed_leave_the_claims_namespaces_answered() -> None:
    reviews = FakeReviews()
    reviews.listing = ClusterError("listing namespaces: forbidden")
    scope = StatusAccess(reviews).scope("team-d-token", lambda: NAMESPACES)
    assert not scope.sees_anything and "cannot list them" in scope.note and "forbidden" in scope.note
    assert StatusAccess(reviews).scope("team-a-token", lambda: NAMESPACES).namespaces == {"team-a"}


def test_answers_are_cached_by_the_tokens_hash_for_the_ttl_refusals_too() -> None:
    reviews, now = FakeReviews(), [0.0]
    access = StatusAccess(reviews, clock=lambda: now[0])
    for _ in range(3):
        access.scope("team-a-token", lambda: NAMESPACES)
        with pytest.raises(Unauthenticated):
            access.scope("made-up", lambda: NAMESPACES)
    assert sorted(reviews.calls) == sorted(  # each review once, whatever the namespaces' order
        [
            ("token", "team-a-token"),
            ("alice", ""),
            ("alice", "resourceslices"),
            *(("alice", ns) for ns in NAMESPACES),
            ("token", "made-up"),
        ]
    )
    assert all("team-a-token" not in str(key) for key in access._cache)  # the hash, never the token
    assert (hashlib.sha256(b"team-a-token").hexdigest(), None) in access._cache
    now[0] += TTL_SECONDS + 1
    reviews.calls.clear()
    access.scope("admin-token", lambda: ())
    assert reviews.calls == [("token", "admin-token"), ("admin", "")]


def test_a_view_is_cut_to_the_scopes_namespaces_and_its_inventory_to_the_slices_right() -> None:
    full = view()
    assert visible(full, Scope(everything=True)) == full
    cut = visible(full, Scope(False, frozenset({"team-a"}), somewhere=True))
    assert [c.namespace for c in cut.pending] == ["team-a"] and [d.namespace for d in cut.idle] == ["team-a"]
    assert (cut.nodes, cut.mig, cut.unhealthy) == (
        [],
        [],
        [],
    )  # the cluster's hardware: not a namespace's to read
    with_inventory = visible(full, Scope(False, frozenset({"team-a"}), inventory=True, somewhere=True))
    assert (with_inventory.nodes, with_inventory.mig, with_inventory.unhealthy) == (
        full.nodes,
        full.mig,
        full.unhealthy,
    )
    empty = visible(full, Scope(False, somewhere=True))
    assert empty.model_dump(exclude={"generated"}) == {
        **full.model_dump(exclude={"generated"}),
        **{k: [] for k in ("nodes", "mig", "pending", "idle", "unhealthy")},
    }


def map_app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/html")])
    return [b"<html>map</html>"]


def pages(reviews: FakeReviews) -> StatusPages:
    return StatusPages(
        StatusAccess(reviews), view=view, namespaces=lambda: NAMESPACES, map_app=map_app, map_paths=("/",)
    )


def call(
    app: StatusPages, path: str, token: str | None, client: str = "10.0.0.1"
) -> tuple[str, dict[str, str], bytes]:
    environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "QUERY_STRING": "", "REMOTE_ADDR": client}
    if token is not None:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    answer: dict[str, Any] = {}
    body = b"".join(app.app(environ, lambda status, headers: answer.update(status=status, headers=headers)))
    return answer["status"], dict(answer["headers"]), body


def claims_in(body: bytes) -> set[str]:
    document = json.loads(body)
    return {c["name"] for c in document["pending"]} | {d["claim"] for d in document["idle"]}


def test_status_answers_each_caller_what_rbac_lets_it_list() -> None:
    reviews = FakeReviews()
    app = pages(reviews)
    status, headers, body = call(app, "/status", None)
    assert status == "401 Unauthorized" and headers["WWW-Authenticate"].startswith("Bearer")
    assert json.loads(body) == {"error": "a bearer token is required (Authorization: Bearer ...)"}
    status, _, body = call(app, "/status", "made-up")
    assert status == "401 Unauthorized" and b"not valid" in body
    status, _, body = call(app, "/status", "nobody-token")
    assert status == "403 Forbidden"
    assert json.loads(body) == {"error": "may list resourceclaims in no namespace, nor resourceslices"}
    status, headers, body = call(app, "/status", "team-a-token")
    assert status == "200 OK" and claims_in(body) == {"team-a-pending", "team-a-idle"}
    assert json.loads(body)["nodes"] == [] and json.loads(body)["unhealthy"] == []
    assert (
        headers["Warning"] == '299 - "nodes, GPUs and MIG room are left out: they need list resourceslices"'
    )
    status, headers, body = call(app, "/status", "viewer-token")
    assert status == "200 OK" and claims_in(body) == {"team-a-pending", "team-a-idle"}
    assert [n["node"] for n in json.loads(body)["nodes"]] == ["n"] and "Warning" not in headers
    # Rights only in a namespace without claims: an empty view, and why it is empty.
    status, headers, body = call(app, "/status", "team-d-token")
    assert status == "200 OK" and claims_in(body) == set() and json.loads(body)["mig"] == []
    assert "none of the namespaces where you may list resourceclaims has a claim" in str(headers)
    status, headers, body = call(app, "/status", "slices-token")
    assert status == "200 OK" and claims_in(body) == set() and json.loads(body)["nodes"]
    assert (
        headers["Warning"] == '299 - "claims are left out: they need list resourceclaims in their namespace"'
    )
    status, headers, body = call(app, "/status", "admin-token")
    assert status == "200 OK" and claims_in(body) == {
        f"{ns}-{w}" for ns in ("team-a", "team-b") for w in ("pending", "idle")
    }
    assert json.loads(body) == json.loads(view().model_dump_json(by_alias=True)) and "Warning" not in headers


def test_a_partial_answer_says_so_in_a_warning_or_in_the_refusal() -> None:
    reviews = FakeReviews([f"ns-{i}" for i in range(50)] + ["team-d"], more=True)
    app = StatusPages(StatusAccess(reviews, reviews_per_request=10), view=view, namespaces=lambda: NAMESPACES)
    code, _, body = call(app, "/status", "team-d-token")
    assert code == "403 Forbidden"
    error = json.loads(body)["error"]
    assert error.startswith("may list resourceclaims in no namespace, nor resourceslices (access not yet")
    # 2 of the 10 reviews for the claims' namespaces, 8 of the 51 others
    assert (
        "checked in 43 namespaces (at most 10 reviews a request), counted as not allowed: ask again; "
        in error
    )
    assert error.endswith("; only the first 51 namespaces were considered)")
    # the answers cached, each request asks about 10 more: the 43 left take 5
    answers = [call(app, "/status", "team-d-token")[0] for _ in range(5)]
    assert answers == ["403 Forbidden"] * 4 + ["200 OK"]
    # a note goes into a quoted header value: nothing in it may end or escape the quotes
    header = _warning('a "quoted" note\\\n')
    assert header == '299 - "a ?quoted? note??"'
    assert status._warning_text(header) == "a ?quoted? note??"


def test_the_gpu_map_needs_the_cluster_wide_right() -> None:
    app = pages(FakeReviews())
    assert call(app, "/", "admin-token")[::2] == ("200 OK", b"<html>map</html>")
    status, _, body = call(app, "/", "team-a-token")
    assert status == "403 Forbidden" and b"cluster-wide" in body
    assert call(app, "/", None)[0] == "401 Unauthorized"
    assert call(app, "/metrics", "admin-token")[0] == "404 Not Found"


def test_reviews_that_cannot_be_made_are_a_503_not_a_view() -> None:
    reviews = FakeReviews()
    reviews.down = True
    status, _, body = call(pages(reviews), "/status", "admin-token")
    assert status == "503 Service Unavailable" and b"cannot check the token" in body


def test_the_webhook_port_serves_the_pages_over_https() -> None:
    material = material_for()
    server = WebhookServer(
        "127.0.0.1", 0, "gpu.gpudra.io", warnings=lambda obj: [], pages=pages(FakeReviews()).app
    )
    server.start()
    server.use(material)
    try:

        def get(path: str, token: str | None) -> tuple[int, bytes, str | None]:
            connection = http.client.HTTPSConnection(
                "127.0.0.1", server.port, context=client_context(material), timeout=5
            )
            try:
                connection.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
                response = connection.getresponse()
                return response.status, response.read(), response.getheader("WWW-Authenticate")
            finally:
                connection.close()

        status, body, challenge = get("/status", None)
        assert status == 401 and challenge == 'Bearer realm="gpudra"'
        status, body, _ = get("/status", "team-a-token")
        assert status == 200 and claims_in(body) == {"team-a-pending", "team-a-idle"}
        assert get("/status", "nobody-token")[0] == 403
        assert get("/", "admin-token")[:2] == (200, b"<html>map</html>")
    finally:
        server.stop(5)


def test_gpudra_status_sends_the_token_verifies_the_server_and_says_what_went_wrong(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    material = material_for()  # names the certificate carries: test_webhook.HERE
    ca = tmp_path / "ca.crt"
    ca.write_bytes(material.ca_crt)
    server = WebhookServer(
        "127.0.0.1", 0, "gpu.gpudra.io", warnings=lambda obj: [], pages=pages(FakeReviews()).app
    )
    server.start()
    server.use(material)
    url = f"https://127.0.0.1:{server.port}"

    def fetch(token: str, **kwargs: Any) -> ClusterView:
        options = {"certificate_authority": str(ca), "tls_server_name": HERE[0], **kwargs}
        return status.fetch(
            kubeconfig=None,
            driver="gpu.gpudra.io",
            idle_after_seconds=1800,
            controller_url=url,
            token=token,
            **options,
        )

    try:
        seen = fetch("team-a-token")
        assert {c.name for c in seen.pending} == {"team-a-pending"}
        left_out = (
            "gpudra status: warning: nodes, GPUs and MIG room are left out: they need list resourceslices"
        )
        assert capsys.readouterr().err.splitlines() == [left_out]
        assert fetch("team-d-token").pending == []
        assert (
            "none of the namespaces where you may list resourceclaims has a claim" in capsys.readouterr().err
        )
        with pytest.raises(ClusterError, match=r"did not accept the token \(401"):
            fetch("made-up")
        with pytest.raises(ClusterError, match=r"may list resourceclaims in no namespace.*\(403"):
            fetch("nobody-token")
        with pytest.raises(ClusterError, match="CERTIFICATE_VERIFY_FAILED"):
            fetch("team-a-token", tls_server_name="someone-else.example")
        with pytest.raises(ClusterError, match="CERTIFICATE_VERIFY_FAILED"):
            fetch("team-a-token", certificate_authority=None)  # the system's CAs never signed it
    finally:
        server.stop(5)


def test_new_tokens_are_bounded_per_client_and_a_flood_neither_blocks_nor_evicts_valid_users() -> None:
    """Issue 44's flood: 1,000 made-up tokens from one pod within 3 s. The burst and the refill are
    reviewed (15 TokenReviews), the rest answered 429 with Retry-After at no cost to the API server;
    meanwhile a user whose token is cached is answered without a review, and another client's new token
    is reviewed."""
    reviews, now = FakeReviews(), [0.0]
    app = StatusPages(StatusAccess(reviews, clock=lambda: now[0]), view=view, namespaces=lambda: NAMESPACES)
    assert call(app, "/status", "team-a-token", client="10.0.0.2")[0] == "200 OK"
    reviews.calls.clear()
    answers = []
    for i in range(1000):
        now[0] = i * 0.003
        answers.append(call(app, "/status", f"made-up-{i}", client="10.0.0.66"))
    statuses = [status for status, _, _ in answers]
    reviewed = NEW_TOKENS_BURST + int(now[0] * NEW_TOKENS_PER_SECOND)  # 10 at once, then 2 a second
    assert reviewed == 15
    assert statuses.count("401 Unauthorized") == reviewed
    assert statuses.count("429 Too Many Requests") == 1000 - reviewed
    assert answers[-1][1]["Retry-After"] == "1"
    assert len([c for c in reviews.calls if c[0] == "token"]) == reviewed
    reviews.calls.clear()
    assert call(app, "/status", "team-a-token", client="10.0.0.2")[0] == "200 OK" and reviews.calls == []
    assert call(app, "/status", "viewer-token", client="10.0.0.3")[0] == "200 OK"
    now[0] += 1 / NEW_TOKENS_PER_SECOND  # the flooding client's allowance refills at its rate
    assert call(app, "/status", "made-up-x", client="10.0.0.66")[0] == "401 Unauthorized"
    assert call(app, "/status", "made-up-y", client="10.0.0.66")[0] == "429 Too Many Requests"


def test_every_client_together_is_bounded_too() -> None:
    reviews, now = FakeReviews(), [0.0]
    access = StatusAccess(reviews, clock=lambda: now[0])
    refused = 0
    for i in range(200):  # a pod per token: each client's own burst is not reached
        try:
            access.scope(f"made-up-{i}", lambda: NAMESPACES, client=f"10.1.{i // 250}.{i % 250}")
        except Unauthenticated:
            pass
        except TooManyNewTokens:
            refused += 1
    assert 200 - refused == 2 * NEW_TOKENS_TOTAL_PER_SECOND


def test_a_full_cache_evicts_the_least_recently_used_answer_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_access, "MAX_CACHED", 8)
    monkeypatch.setattr(status_access, "NEW_TOKENS_BURST", 1000)
    reviews = FakeReviews()
    access = StatusAccess(reviews)
    access.scope("admin-token", lambda: ())  # two answers: the token's and its cluster-wide right
    for i in range(20):
        with pytest.raises(Unauthenticated):
            access.scope(f"made-up-{i}", lambda: ())
        access.scope("admin-token", lambda: ())  # used again: never the least recent
    assert len(access._cache) == 8
    reviews.calls.clear()
    access.scope("admin-token", lambda: ())
    assert reviews.calls == []
