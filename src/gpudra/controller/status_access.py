"""`/status` and the GPU map behind the cluster's authentication and RBAC, as kube-rbac-proxy puts a
workload behind them: each request carries a bearer token; a TokenReview says whose it is, and
SubjectAccessReviews whether that user may `list resourceclaims` cluster-wide (the whole view) or in
which namespaces (the view cut down to those namespaces' claims). I/O: the reviews (an `Reviews`,
gpudra.kube.access_review.AccessReviews in the controller); the rest is pure.

The candidate namespaces of a caller without the cluster-wide right are the namespaces of the claims in
the cluster picture (`namespaces()`): only those can have anything to show, so a request costs one
review per such namespace at most, and none while the answers are cached. Answers are kept TTL seconds,
keyed by the token's SHA-256 (the token itself is never kept); a token the API server refused is
remembered as refused for the same time, so a client retrying a bad token costs one review per TTL.

The GPU map draws every namespace's claims on one page: it is served only to callers with the
cluster-wide right. Nodes, GPU counts, MIG room and unhealthy devices name no claim and are in every
caller's view.

Answers: 401 without a token or with one the API server does not accept (with `WWW-Authenticate:
Bearer`), 403 when the user may list claims in none of the candidate namespaces, 503 when the reviews
cannot be made (the API server is away): the caller is told, never shown more than it may see.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from gpudra.errors import GpudraError
from gpudra.kube.access_review import Caller
from gpudra.scheduling.cluster_view import ClusterView

log = logging.getLogger(__name__)

STATUS_PATH = "/status"
TTL_SECONDS = 30.0
# Cached answers at most; past it the cache starts afresh (a flood of made-up tokens costs reviews,
# never memory).
MAX_CACHED = 4096

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Reviews(Protocol):
    def authenticate(self, token: str) -> Caller | None: ...

    def may_list_claims(self, caller: Caller, namespace: str) -> bool: ...


@dataclass(frozen=True)
class Scope:
    """What a caller may see: `everything`, else the claims of `namespaces` (empty: nothing)."""

    everything: bool
    namespaces: frozenset[str] = frozenset()


class Unauthenticated(Exception):
    """No token, or one the API server does not accept."""


class StatusAccess:
    """Decides a token's `Scope`, caching each review's answer `ttl` seconds."""

    def __init__(
        self,
        reviews: Reviews,
        *,
        ttl: float = TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reviews = reviews
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str | None], tuple[float, Any]] = {}

    def scope(self, token: str, candidates: Callable[[], Iterable[str]]) -> Scope:
        """The scope of `token`'s user; Unauthenticated when the API server does not accept it;
        GpudraError when a review cannot be made."""
        key = hashlib.sha256(token.encode()).hexdigest()
        caller = self._cached((key, None), lambda: self.reviews.authenticate(token))
        if caller is None:
            raise Unauthenticated
        if self._may_list(key, caller, ""):
            return Scope(everything=True)
        allowed = {n for n in set(candidates()) if n and self._may_list(key, caller, n)}
        return Scope(everything=False, namespaces=frozenset(allowed))

    def _may_list(self, key: str, caller: Caller, namespace: str) -> bool:
        return bool(self._cached((key, namespace), lambda: self.reviews.may_list_claims(caller, namespace)))

    def _cached(self, key: tuple[str, str | None], review: Callable[[], Any]) -> Any:
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        answer = review()  # outside the lock: a slow API server holds up no other caller
        with self._lock:
            if len(self._cache) >= MAX_CACHED:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                if len(self._cache) >= MAX_CACHED:
                    self._cache.clear()
            self._cache[key] = (now + self.ttl, answer)
        return answer


def visible(view: ClusterView, scope: Scope) -> ClusterView:
    """`view` with only the claims `scope` may see. Pure."""
    if scope.everything:
        return view
    return view.model_copy(
        update={
            "pending": [c for c in view.pending if c.namespace in scope.namespaces],
            "idle": [d for d in view.idle if d.namespace in scope.namespaces],
        }
    )


class StatusPages:
    """The WSGI application of `/status` and the GPU map's paths (`map_app`, None when the map is off)
    behind `access`. `view()` is the cluster picture; `namespaces()` those of the claims in it."""

    def __init__(
        self,
        access: StatusAccess,
        *,
        view: Callable[[], ClusterView],
        namespaces: Callable[[], Iterable[str]],
        map_app: WsgiApp | None = None,
        map_paths: Iterable[str] = (),
    ) -> None:
        self.access = access
        self.view = view
        self.namespaces = namespaces
        self.map_app = map_app
        self.map_paths = frozenset(map_paths) if map_app is not None else frozenset()

    def paths(self) -> frozenset[str]:
        return frozenset({STATUS_PATH}) | self.map_paths

    def app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path not in self.paths():
            return _text(start_response, "404 Not Found", f"no such page; {STATUS_PATH} is the view")
        token = _bearer(environ.get("HTTP_AUTHORIZATION", ""))
        if token is None:
            return _unauthorized(start_response, "a bearer token is required (Authorization: Bearer ...)")
        try:
            scope = self.access.scope(token, self.namespaces)
        except Unauthenticated:
            return _unauthorized(start_response, "the token is not valid (the API server's TokenReview)")
        except GpudraError as err:
            log.warning("cannot review a /status caller", extra={"error": str(err)})
            return _text(start_response, "503 Service Unavailable", "cannot check the token now; try again")
        if path in self.map_paths:
            if not scope.everything:
                return _text(
                    start_response,
                    "403 Forbidden",
                    "the GPU map shows every namespace's claims: it needs list resourceclaims cluster-wide",
                )
            assert self.map_app is not None
            return self.map_app(environ, start_response)
        if not scope.everything and not scope.namespaces:
            return _text(
                start_response,
                "403 Forbidden",
                "may list resourceclaims neither cluster-wide nor in any namespace with claims",
            )
        body = visible(self.view(), scope).model_dump_json(by_alias=True).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Cache-Control", "no-store")])
        return [body]


def _bearer(header: str) -> str | None:
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _unauthorized(start_response: Callable[..., Any], message: str) -> list[bytes]:
    return _text(start_response, "401 Unauthorized", message, [("WWW-Authenticate", 'Bearer realm="gpudra"')])


def _text(
    start_response: Callable[..., Any],
    status: str,
    message: str,
    headers: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    start_response(
        status,
        [("Content-Type", "application/json"), ("Cache-Control", "no-store"), *(headers or [])],
    )
    return [json.dumps({"error": message}).encode()]
