"""ResourceClaims this node's plugin may be asked to prepare, fed by a watch. I/O: the API server.

Prepare reads the claim from here. The cache answers only while its watch is connected: when the
watch is down (API server restarting, network trouble) or has not started yet, every read goes to the
API server, so a claim re-allocated while nobody watched is never served from a stale copy. A miss,
or a cached copy with another UID or no allocation yet, also falls through to a GET (the watch may lag
the scheduler by a moment).

The watch runs in a `service.Loop`: any failure is logged and retried with backoff (0.5 s doubling
to 5 s), and a watch that ended (the server closes it every WATCH_SECONDS, or after a failure)
resumes from the last resourceVersion it saw; only an expired version (HTTP 410) costs a new LIST.
"""

from __future__ import annotations

import logging
import threading

from gpudra.errors import ClaimError
from gpudra.kube.client import Expired, Kube, NotFound, Obj, Watch
from gpudra.service import Loop

log = logging.getLogger(__name__)


def allocated_here(claim: Obj, *, driver: str, pool: str) -> bool:
    """True when some allocation result of `claim` is one of `driver`'s devices in `pool`. Pure."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    return any(r.get("driver") == driver and r.get("pool") == pool for r in results)


class ClaimCache:
    def __init__(self, kube: Kube, *, driver: str, pool: str, min_backoff: float = 0.5) -> None:
        self.kube = kube
        self.driver = driver
        self.pool = pool
        self._claims: dict[tuple[str, str], Obj] = {}
        self._lock = threading.Lock()
        self._version: str | None = None  # resourceVersion to resume the watch from; None: LIST first
        self._watch: Watch | None = None
        self._connected = threading.Event()  # set while a watch stream is open and healthy
        # Retries are capped at 5 s, not 30: while the watch is down every prepare costs a GET, so
        # coming back soon after the API server does is worth one connection attempt per 5 s.
        self.loop = Loop(
            "claim-cache", self._step, on_error=self._on_error, min_backoff=min_backoff, max_backoff=5.0
        )
        self.lists = 0  # LISTs done, for tests and metrics
        self.gets = 0  # fallback GETs done

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def get(self, *, namespace: str, name: str, uid: str) -> Obj:
        if self._connected.is_set():
            with self._lock:
                cached = self._claims.get((namespace, name))
            if cached is not None and cached["metadata"].get("uid") == uid:
                return cached
        self.gets += 1
        try:
            return self.kube.get_claim(namespace, name)
        except NotFound as err:
            raise ClaimError(f"ResourceClaim {namespace}/{name} not found") from err

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float) -> None:
        self.loop.stopping.set()
        watch = self._watch
        if watch is not None:
            watch.close()  # unblocks the read the loop's thread waits in
        self.loop.stop(timeout)

    # --- the loop ----------------------------------------------------------------------------------

    def _step(self) -> float:
        if self._version is None:
            items, self._version = self.kube.list_claims()
            self.lists += 1
            self._replace_all(items)
        watch = self._watch = self.kube.watch_claims(self._version)
        if self.loop.stopping.is_set():  # stop() ran while the watch was being opened
            watch.close()
            return 0
        # The server accepted the watch: from here on it sends every change since _version, so the
        # cache is as current as a GET would be.
        self._connected.set()
        try:
            for kind, obj in watch:
                version = obj.get("metadata", {}).get("resourceVersion")
                if kind != "BOOKMARK":
                    self._apply(kind, obj)
                if version:
                    self._version = version
                if self.loop.stopping.is_set():
                    break
        finally:
            self._watch = None
            watch.close()
        return 0

    def _on_error(self, err: BaseException) -> None:
        self._connected.clear()
        if isinstance(err, Expired):
            self._version = None

    def _replace_all(self, items: list[Obj]) -> None:
        """A fresh LIST: whatever it does not hold was deleted while nobody watched."""
        claims = {
            (c["metadata"]["namespace"], c["metadata"]["name"]): c
            for c in items
            if allocated_here(c, driver=self.driver, pool=self.pool)
        }
        with self._lock:
            self._claims = claims

    def _apply(self, kind: str, claim: Obj) -> None:
        key = (claim["metadata"]["namespace"], claim["metadata"]["name"])
        with self._lock:
            if kind != "DELETED" and allocated_here(claim, driver=self.driver, pool=self.pool):
                self._claims[key] = claim
            else:
                self._claims.pop(key, None)
