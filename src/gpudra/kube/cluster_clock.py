"""The cluster's time, as the API server tells it: the `Date` header of its last reply, carried forward
on this process's monotonic clock. What the controller dates with what the API server judges by its
own clock (the webhook's serving certificate), so that a step of this node's wall clock (250 days
ahead, say) cannot make the controller issue a certificate the API server rejects. Pure but for
reading the clocks.

The header has whole seconds; the reply's own latency adds a fraction more: the cluster's time is
known to about a second, which the certificates' backdating (gpudra.controller.certs) absorbs. Before
the first reply, and when a reply's header cannot be read, the local wall clock stands in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

log = logging.getLogger(__name__)

# A difference between this node's wall clock and the API server's beyond this is a clock step (or
# drift NTP should have corrected): logged when it starts and ends.
SKEW_WARNING_SECONDS = 60.0


class ClusterClock:
    def __init__(
        self,
        *,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._seen: tuple[datetime, float] | None = None  # the server's Date, and when it came
        self._skewed = False

    def observe(self, date: str | None) -> None:
        """A reply's `Date` header (None or unreadable: nothing learnt)."""
        if not date:
            return
        try:
            server = parsedate_to_datetime(date)
        except (TypeError, ValueError):
            return
        if server.tzinfo is None:
            server = server.replace(tzinfo=UTC)
        with self._lock:
            self._seen = (server.astimezone(UTC), self._monotonic())
        skew = self.skew_seconds()
        skewed = skew is not None and abs(skew) > SKEW_WARNING_SECONDS
        if skewed != self._skewed:
            self._skewed = skewed
            if skewed:
                log.warning(
                    "this node's clock differs from the API server's; certificates are dated by the "
                    "API server's",
                    extra={"skew_seconds": round(skew or 0.0)},
                )
            else:
                log.info("this node's clock agrees with the API server's again")

    def now(self) -> datetime:
        """The cluster's time: the API server's last Date, plus the monotonic time since it came."""
        with self._lock:
            seen = self._seen
        if seen is None:
            return self._wall()
        server, at = seen
        return server + timedelta(seconds=self._monotonic() - at)

    def skew_seconds(self) -> float | None:
        """This node's wall clock minus the cluster's (None before the API server has answered)."""
        with self._lock:
            known = self._seen is not None
        return (self._wall() - self.now()).total_seconds() if known else None
