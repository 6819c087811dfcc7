"""`/status` and the GPU map behind the cluster's authentication and RBAC, as kube-rbac-proxy puts a
workload behind them: each request carries a bearer token; a TokenReview says whose it is, and
SubjectAccessReviews what that user may list. I/O: the reviews (an `Reviews`,
gpudra.kube.access_review.AccessReviews in the controller); the rest is pure.

What a caller sees is what the same user would see with kubectl:
- `list resourceclaims` cluster-wide: the whole view, and the GPU map (it draws every namespace's claims
  on one page, so it is served to this right only).
- Otherwise the claims (pending, idle) of the namespaces where the user may list ResourceClaims.
- The inventory, nodes with their GPU counts, MIG room and unhealthy GPUs, only with `list
  resourceslices` (cluster-scoped: no RoleBinding grants it). It names no claim, namespace or pod, but
  it is the cluster's hardware and where it stands, which RBAC does not show a namespace's user: a
  team bound to `view` in its namespace sees its own claims and nothing about the nodes.
- 403 when the user may see none of it: list claims in no namespace and slices not at all. A user who
  may list claims in a namespace that has none gets 200 and an empty view: it has the right, there is
  nothing to show; the answer then says no more than `kubectl get resourceclaims` would. The user
  without any right keeps the 403, as kubectl gets one, so that "no claims" and "no access" are told
  apart (an empty 200 would leak nothing either, but would let a missing RoleBinding pass for an empty
  namespace).

Whose claims: the candidate namespaces are first those of the claims in the cluster picture
(`namespaces()`), the only ones with anything to show. Only when the user may list claims in none of
them, and not the slices, are the cluster's other namespaces asked about (the API server has no review
of "may list in some namespace" for another user), the user's own first (a ServiceAccount's), until one
allows it. Bounds: the namespaces considered are at most gpudra.kube.access_review.MAX_NAMESPACES (one
LIST, kept TTL seconds for every caller); a request makes at most REVIEWS_PER_REQUEST reviews it has no
answer for, the namespaces beyond counted as not allowed this time, and the answer says so (a `Warning`
header on 200, the text of a 403); the next request, with the answers cached, goes on from there.
Answers are kept TTL seconds, keyed by the token's SHA-256 (the token itself is never kept); a token the
API server refused is remembered as refused for the same time, so a client retrying a bad token costs
one review per TTL. At most MAX_CACHED answers are kept, the least recently used evicted first.

A token the cache has no answer for costs a TokenReview, so those are bounded: per client address,
NEW_TOKENS_BURST at once and NEW_TOKENS_PER_SECOND after; every client together,
NEW_TOKENS_TOTAL_PER_SECOND (many pods flooding at once). A request beyond them gets 429 with
`Retry-After`, costing the API server nothing; a caller whose token is cached is answered as before, so
a flood of made-up tokens neither slows the valid users down nor evicts their answers (a flood can add
at most some NEW_TOKENS_TOTAL_PER_SECOND x TTL answers while theirs are fresh).

Answers: 401 without a token or with one the API server does not accept (with `WWW-Authenticate:
Bearer`), 403 as above, 429 past the bounds on new tokens, 503 when the reviews cannot be made (the API
server is away): the caller is told, never shown more than it may see.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import math
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
# Cached answers at most, every token's together; past it the least recently used goes (a flood of
# made-up tokens costs reviews, never memory). A user without rights anywhere holds one answer per
# namespace asked about (up to 1000): a few hundred bytes each, some 5 MB when full.
MAX_CACHED = 16384
# TokenReviews of tokens the cache does not answer: per client address, a burst and a rate; every
# client together, a rate (and twice it as a burst). Client addresses remembered at most: the oldest
# forgotten (and so refilled) first.
NEW_TOKENS_BURST = 10
NEW_TOKENS_PER_SECOND = 2.0
NEW_TOKENS_TOTAL_PER_SECOND = 20.0
MAX_CLIENTS = 4096
# Reviews a request makes that the cache does not answer, beyond the token's: a user without rights in
# a cluster of 1000 namespaces costs the API server at most this many SubjectAccessReviews per request
# (each an in-memory RBAC check, no storage read), and the request a fraction of a second.
REVIEWS_PER_REQUEST = 100

CLAIMS, SLICES = "resourceclaims", "resourceslices"
_SERVICE_ACCOUNT = "system:serviceaccount:"
# The cluster's namespaces, every caller's: no token hashes to "".
_NAMESPACE_LIST: tuple[str, str | None] = ("", None)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Reviews(Protocol):
    def authenticate(self, token: str) -> Caller | None: ...

    def may_list(self, caller: Caller, resource: str, namespace: str) -> bool: ...

    def namespaces(self) -> tuple[list[str], bool]: ...


@dataclass(frozen=True)
class Scope:
    """What a caller may see: `everything`; else the claims of `namespaces` (those with claims it may
    list), the inventory when `inventory`. `somewhere`: it may list claims in some namespace, with
    claims or not. `note`: what was left unasked (the review budget, the namespace list's bound)."""

    everything: bool
    namespaces: frozenset[str] = frozenset()
    inventory: bool = False
    somewhere: bool = False
    note: str = ""

    @property
    def sees_anything(self) -> bool:
        return self.everything or self.inventory or self.somewhere


class Unauthenticated(Exception):
    """No token, or one the API server does not accept."""


class TooManyNewTokens(Exception):
    """The client (or every client together) asked about more new tokens than the bounds allow."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"too many new tokens; retry after {retry_after:.0f} s")
        self.retry_after = retry_after


class _Bucket:
    """A token bucket: `burst` at once, refilled at `rate` per second."""

    def __init__(self, *, burst: float, rate: float, now: float) -> None:
        self.burst, self.rate = burst, rate
        self.level, self.at = burst, now

    def take(self, now: float) -> float:
        """0 when one was taken; else the seconds until one will be there."""
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level >= 1:
            self.level -= 1
            return 0.0
        return (1 - self.level) / self.rate


class _Budget:
    """The reviews one request may still make that the cache does not answer."""

    def __init__(self, reviews: int) -> None:
        self.left = reviews
        self.skipped = 0


class StatusAccess:
    """Decides a token's `Scope`, caching each review's answer `ttl` seconds."""

    def __init__(
        self,
        reviews: Reviews,
        *,
        ttl: float = TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        reviews_per_request: int = REVIEWS_PER_REQUEST,
    ) -> None:
        self.reviews = reviews
        self.ttl = ttl
        self.clock = clock
        self.reviews_per_request = reviews_per_request
        self._lock = threading.Lock()
        # Least recently used first.
        self._cache: collections.OrderedDict[tuple[str, str | None], tuple[float, Any]] = (
            collections.OrderedDict()
        )
        self._clients: collections.OrderedDict[str, _Bucket] = collections.OrderedDict()
        self._everyone = _Bucket(
            burst=2 * NEW_TOKENS_TOTAL_PER_SECOND, rate=NEW_TOKENS_TOTAL_PER_SECOND, now=clock()
        )

    def scope(self, token: str, candidates: Callable[[], Iterable[str]], *, client: str = "") -> Scope:
        """The scope of `token`'s user; Unauthenticated when the API server does not accept it;
        TooManyNewTokens when `client` (its address) has asked about too many tokens the cache does
        not answer; GpudraError when a review cannot be made."""
        key = hashlib.sha256(token.encode()).hexdigest()
        if not self._fresh((key, None)):
            self._admit_new_token(client)
        caller = self._cached((key, None), lambda: self.reviews.authenticate(token))
        if caller is None:
            raise Unauthenticated
        if self._may_list(key, caller, CLAIMS, ""):
            return Scope(everything=True, inventory=True, somewhere=True)
        inventory = self._may_list(key, caller, SLICES, "")
        budget = _Budget(self.reviews_per_request)
        with_claims = sorted({n for n in candidates() if n})
        allowed = frozenset(n for n in with_claims if self._may_list(key, caller, CLAIMS, n, budget))
        note = ""
        somewhere = bool(allowed)
        if not somewhere and not inventory:
            somewhere, note = self._anywhere_else(key, caller, set(with_claims), budget)
        if budget.skipped:
            unchecked = (
                f"access not yet checked in {budget.skipped} namespaces (at most "
                f"{self.reviews_per_request} reviews a request), counted as not allowed: ask again"
            )
            note = f"{unchecked}; {note}" if note else unchecked
        return Scope(
            everything=False, namespaces=allowed, inventory=inventory, somewhere=somewhere, note=note
        )

    def _anywhere_else(self, key: str, caller: Caller, asked: set[str], budget: _Budget) -> tuple[bool, str]:
        """Whether `caller` may list claims in a namespace other than `asked` (those with claims), the
        caller's own first (a ServiceAccount's), stopping at the first that allows it; and a note when
        not every namespace could be considered."""
        try:
            names, more = self._cached(_NAMESPACE_LIST, self.reviews.namespaces)
        except GpudraError as err:  # the claims' namespaces were answered: say what is missing
            log.warning("cannot list namespaces for a /status caller", extra={"error": str(err)})
            return False, f"namespaces without claims were not considered (cannot list them: {err})"
        own = caller.username.removeprefix(_SERVICE_ACCOUNT).partition(":")[0]
        order = [own] if caller.username.startswith(_SERVICE_ACCOUNT) and own else []
        order += [n for n in names if n != own]
        for namespace in order:
            if namespace not in asked and self._may_list(key, caller, CLAIMS, namespace, budget):
                return True, ""
        return False, f"only the first {len(names)} namespaces were considered" if more else ""

    def _may_list(
        self, key: str, caller: Caller, resource: str, namespace: str, budget: _Budget | None = None
    ) -> bool:
        entry = (key, namespace if resource == CLAIMS else f"{resource}/{namespace}")
        if budget is not None and not self._fresh(entry):
            if budget.left <= 0:
                budget.skipped += 1
                return False
            budget.left -= 1
        return bool(self._cached(entry, lambda: self.reviews.may_list(caller, resource, namespace)))

    def _admit_new_token(self, client: str) -> None:
        now = self.clock()
        with self._lock:
            bucket = self._clients.get(client)
            if bucket is None:
                bucket = self._clients[client] = _Bucket(
                    burst=NEW_TOKENS_BURST, rate=NEW_TOKENS_PER_SECOND, now=now
                )
                if len(self._clients) > MAX_CLIENTS:
                    self._clients.popitem(last=False)
            self._clients.move_to_end(client)
            wait = bucket.take(now)
            if wait == 0:
                wait = self._everyone.take(now)
                if wait:
                    bucket.level += 1  # not this client's doing: its own allowance is given back
        if wait:
            raise TooManyNewTokens(wait)

    def _fresh(self, key: tuple[str, str | None]) -> bool:
        with self._lock:
            hit = self._cache.get(key)
        return hit is not None and hit[0] > self.clock()

    def _cached(self, key: tuple[str, str | None], review: Callable[[], Any]) -> Any:
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                self._cache.move_to_end(key)
                return hit[1]
        answer = review()  # outside the lock: a slow API server holds up no other caller
        with self._lock:
            self._cache[key] = (now + self.ttl, answer)
            self._cache.move_to_end(key)
            while len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
        return answer


def visible(view: ClusterView, scope: Scope) -> ClusterView:
    """`view` with only the claims `scope` may see, and the inventory only when it may. Pure."""
    if scope.everything:
        return view
    inventory: dict[str, Any] = {} if scope.inventory else {"nodes": [], "mig": [], "unhealthy": []}
    return view.model_copy(
        update={
            "pending": [c for c in view.pending if c.namespace in scope.namespaces],
            "idle": [d for d in view.idle if d.namespace in scope.namespaces],
            **inventory,
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
            scope = self.access.scope(token, self.namespaces, client=environ.get("REMOTE_ADDR", ""))
        except TooManyNewTokens as err:
            return _text(
                start_response,
                "429 Too Many Requests",
                "too many tokens not seen before from this address (or from every client together); "
                "retry later",
                [("Retry-After", str(max(1, math.ceil(err.retry_after))))],
            )
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
        if not scope.sees_anything:
            refusal = "may list resourceclaims in no namespace, nor resourceslices"
            return _text(
                start_response, "403 Forbidden", f"{refusal} ({scope.note})" if scope.note else refusal
            )
        body = visible(self.view(), scope).model_dump_json(by_alias=True).encode()
        warnings = [("Warning", _warning(note)) for note in _notes(scope)]
        start_response(
            "200 OK", [("Content-Type", "application/json"), ("Cache-Control", "no-store"), *warnings]
        )
        return [body]


def _notes(scope: Scope) -> list[str]:
    """What a cut view leaves out, for the caller (its own rights: nothing another's)."""
    if scope.everything:
        return []
    notes = (
        [] if scope.inventory else ["nodes, GPUs and MIG room are left out: they need list resourceslices"]
    )
    if not scope.somewhere:
        notes.append("claims are left out: they need list resourceclaims in their namespace")
    elif not scope.namespaces:
        notes.append("none of the namespaces where you may list resourceclaims has a claim")
    return [*notes, *([scope.note] if scope.note else [])]


def _warning(text: str) -> str:
    """An HTTP Warning header's value as the API server writes one (299, "miscellaneous persistent
    warning"): printable ASCII, no quotes or backslashes, which would end or escape the quoted text."""
    clean = "".join(c if " " <= c <= "~" and c not in '"\\' else "?" for c in text)
    return f'299 - "{clean}"'


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
