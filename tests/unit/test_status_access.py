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
from gpudra.controller.status_access import (
    TTL_SECONDS,
    Scope,
    StatusAccess,
    StatusPages,
    Unauthenticated,
    visible,
)
from gpudra.controller.webhook import WebhookServer
from gpudra.errors import ClusterError
from gpudra.kube.access_review import Caller
from gpudra.scheduling.cluster_view import ClusterView, IdleDevice, PendingClaim

from .test_webhook import HERE, client_context, material_for

# token -> (user, namespaces it may list claims in; "" is cluster-wide)
TOKENS = {
    "admin-token": ("admin", {""}),
    "team-a-token": ("alice", {"team-a"}),
    "nobody-token": ("bob", set()),
}


class FakeReviews:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.down = False

    def authenticate(self, token: str) -> Caller | None:
        self.calls.append(("token", token))
        if self.down:
            raise ClusterError("reviewing a bearer token: the API server is away")
        user = TOKENS.get(token)
        return None if user is None else Caller(username=user[0], groups=("system:authenticated",))

    def may_list_claims(self, caller: Caller, namespace: str) -> bool:
        self.calls.append((caller.username, namespace))
        allowed = next(spaces for name, spaces in TOKENS.values() if name == caller.username)
        return "" in allowed or namespace in allowed


def view() -> ClusterView:
    return ClusterView(
        generated=datetime(2026, 1, 1, tzinfo=UTC),
        driver="gpu.gpudra.io",
        idle_after_seconds=1800,
        nodes=[],
        mig=[],
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
    )


NAMESPACES = ("team-a", "team-b", "team-c")


def test_a_tokens_scope_is_cluster_wide_its_namespaces_or_nothing() -> None:
    reviews = FakeReviews()
    access = StatusAccess(reviews)
    assert access.scope("admin-token", lambda: NAMESPACES) == Scope(everything=True)
    assert access.scope("team-a-token", lambda: NAMESPACES) == Scope(False, frozenset({"team-a"}))
    assert access.scope("nobody-token", lambda: NAMESPACES) == Scope(False, frozenset())
    with pytest.raises(Unauthenticated):
        access.scope("made-up", lambda: NAMESPACES)


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
            *(("alice", ns) for ns in NAMESPACES),
            ("token", "made-up"),
        ]
    )
    assert all("team-a-token" not in str(key) for key in access._cache)  # the hash, never the token
    assert (hashlib.sha256(b"team-a-token").hexdigest(), None) in access._cache
    now[0] += TTL_SECONDS + 1
    reviews.calls.clear()
    access.scope("team-a-token", lambda: ())
    assert reviews.calls == [("token", "team-a-token"), ("alice", "")]


def test_a_view_is_cut_to_the_scopes_namespaces() -> None:
    full = view()
    assert visible(full, Scope(everything=True)) == full
    cut = visible(full, Scope(False, frozenset({"team-a"})))
    assert [c.namespace for c in cut.pending] == ["team-a"] and [d.namespace for d in cut.idle] == ["team-a"]
    assert cut.nodes == full.nodes


def map_app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/html")])
    return [b"<html>map</html>"]


def pages(reviews: FakeReviews) -> StatusPages:
    return StatusPages(
        StatusAccess(reviews), view=view, namespaces=lambda: NAMESPACES, map_app=map_app, map_paths=("/",)
    )


def call(app: StatusPages, path: str, token: str | None) -> tuple[str, dict[str, str], bytes]:
    environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "QUERY_STRING": ""}
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
    assert status == "403 Forbidden" and b"may list resourceclaims neither" in body
    status, _, body = call(app, "/status", "team-a-token")
    assert status == "200 OK" and claims_in(body) == {"team-a-pending", "team-a-idle"}
    status, _, body = call(app, "/status", "admin-token")
    assert status == "200 OK" and claims_in(body) == {
        f"{ns}-{w}" for ns in ("team-a", "team-b") for w in ("pending", "idle")
    }


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


def test_gpudra_status_sends_the_token_verifies_the_server_and_says_what_went_wrong(tmp_path: Any) -> None:
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
        with pytest.raises(ClusterError, match=r"did not accept the token \(401"):
            fetch("made-up")
        with pytest.raises(ClusterError, match=r"may not list resourceclaims.*\(403"):
            fetch("nobody-token")
        with pytest.raises(ClusterError, match="CERTIFICATE_VERIFY_FAILED"):
            fetch("team-a-token", tls_server_name="someone-else.example")
        with pytest.raises(ClusterError, match="CERTIFICATE_VERIFY_FAILED"):
            fetch("team-a-token", certificate_authority=None)  # the system's CAs never signed it
    finally:
        server.stop(5)
