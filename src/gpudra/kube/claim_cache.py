"""ResourceClaims this node's plugin may be asked to prepare, fed by a watch. I/O: the API server.

Prepare reads the claim from here; a miss, or a cached copy with another UID or no allocation yet,
falls through to a GET (the watch may lag the scheduler by a moment).
"""

from __future__ import annotations

import logging
import threading

from gpudra.errors import ClaimError, GpudraError
from gpudra.kube.client import Kube, NotFound, Obj

log = logging.getLogger(__name__)


def allocated_here(claim: Obj, *, driver: str, pool: str) -> bool:
    """True when some allocation result of `claim` is one of `driver`'s devices in `pool`. Pure."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    return any(r.get("driver") == driver and r.get("pool") == pool for r in results)


class ClaimCache:
    def __init__(self, kube: Kube, *, driver: str, pool: str) -> None:
        self.kube = kube
        self.driver = driver
        self.pool = pool
        self._claims: dict[tuple[str, str], Obj] = {}
        self._seen: set[tuple[str, str]] = set()  # keys with an event since the last relist
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def get(self, *, namespace: str, name: str, uid: str) -> Obj:
        with self._lock:
            cached = self._claims.get((namespace, name))
        if cached is not None and cached["metadata"].get("uid") == uid:
            return cached
        try:
            return self.kube.get_claim(namespace, name)
        except NotFound as err:
            raise ClaimError(f"ResourceClaim {namespace}/{name} not found") from err

    def _on_event(self, kind: str, claim: Obj) -> None:
        if kind == "RESYNC":
            # A relist just replayed every claim that exists: whatever was not replayed was deleted
            # while the watch was down.
            with self._lock:
                for key in set(self._claims) - self._seen:
                    del self._claims[key]
                self._seen.clear()
            return
        key = (claim["metadata"]["namespace"], claim["metadata"]["name"])
        with self._lock:
            self._seen.add(key)
            if kind != "DELETED" and allocated_here(claim, driver=self.driver, pool=self.pool):
                self._claims[key] = claim
            else:
                self._claims.pop(key, None)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="claim-cache", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.kube.watch_claims(self._on_event, stop=self._stop)
            except GpudraError as err:
                log.warning(
                    "watching ResourceClaims failed; prepare falls back to GET", extra={"error": str(err)}
                )
                self._stop.wait(2.0)
