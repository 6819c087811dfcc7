"""Housekeeping no other component does. I/O: the API server (through the given write), on the leader only.

What gpudra puts in the cluster per claim is the node plugin's usage report: entries of this driver in
the claim's `status.devices` (`gpudra.model.claim_usage`). The API server drops them itself when the
claim is deallocated or deleted, so a report never outlives its claim. What it cannot know is that the
node which wrote a report is gone: a node removed from the cluster, or gpudra's plugin taken off it (the
kubelet then deletes the node's ResourceSlices). Its reports would stand unchanged for as long as the
claim stays allocated: a GPU reported idle (or busy) forever by a plugin that no longer looks. So the
leader removes this driver's entries whose pool no longer has a ResourceSlice.

Nothing is removed before every watch has listed (an empty picture is not "every pool is gone").

Each claim is judged as `gpudra.model.claim` reads it; the write replaces the claim's `status.devices` in
the object as the watch served it (the rest of its status goes back unchanged, other drivers' entries
as they were written), so the objects themselves travel along to it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpudra.model.claim import read_claim
from gpudra.runtime.service import Loop

log = logging.getLogger(__name__)
PERIOD_SECONDS = 60.0

Obj = dict[str, Any]
# (claim object as seen, the status.devices entries to keep): replaces the claim's entries if it is unchanged
ClearStatus = Callable[[Mapping[str, Any], list[Obj]], None]


def stale_reports(
    claims: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]], *, driver: str
) -> list[tuple[Mapping[str, Any], list[Obj]]]:
    """(claim object, the status.devices entries it keeps) for each claim with entries of `driver` from
    a pool without slices. Pure."""
    pools = {str(((s.get("spec") or {}).get("pool") or {}).get("name")) for s in slices}
    found = []
    for obj in claims:
        stale = {d.index for d in read_claim(obj).devices if d.driver == driver and d.pool not in pools}
        if stale:
            entries = obj["status"]["devices"]
            found.append((obj, [e for i, e in enumerate(entries) if i not in stale]))
    return found


class Housekeeping:
    """Runs `stale_reports` every PERIOD_SECONDS while leading, as a `service.Service`."""

    def __init__(
        self,
        *,
        driver: str,
        claims: Callable[[], list[Obj]],
        slices: Callable[[], list[Obj]],
        synced: Callable[[], str | None],
        is_leader: Callable[[], bool],
        clear: ClearStatus,
    ) -> None:
        self.driver = driver
        self.claims = claims
        self.slices = slices
        self.synced = synced
        self.is_leader = is_leader
        self.clear = clear
        self.removed = 0  # claims cleaned since start, for tests and logs
        self.loop = Loop("housekeeping", self._step)

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float) -> None:
        self.loop.stop(timeout)

    def wake(self) -> None:
        """Look now (the slices changed: a pool may be gone)."""
        self.loop.wake()

    def _step(self) -> float:
        if self.synced() is not None or not self.is_leader():
            return PERIOD_SECONDS
        for obj, keep in stale_reports(self.claims(), self.slices(), driver=self.driver):
            if not self.is_leader():  # checked right before each write: a deposed leader writes nothing
                break
            self.clear(obj, keep)
            self.removed += 1
            log.info("removed usage reports of nodes gone", extra={"claim": read_claim(obj).namespaced_name})
        return PERIOD_SECONDS
