"""The controller's picture of the cluster, fed by watches: this driver's ResourceSlices, every
ResourceClaim, every DeviceClass. I/O: the API server, through `gpudra.kube.informer`.

Every replica keeps it (a follower answers `gpudra status` and admission warnings as well as the
leader). `view()` builds `gpudra.scheduling.cluster_view` from it, again only when a watch saw a change or
VIEW_SECONDS passed (idle times grow with the clock); `survey()` for the GPU map
(`gpudra.scheduling.gpu_map`) is kept by `gpudra.controller.gpu_map_page.SurveyCache` on the same
terms, but a page request never waits for its rebuild once there is one (the last is served with its
age while the next is built in the background); `reach()` holds requests against the published
devices for the admission warnings, rebuilt when slices or classes changed. The warnings also name the
feature gate or release a request's form of the GPUs needs where no node can publish it
(`gpudra.scheduling.forms`): the server's fields are taken from its release's default gates and what
the stored slices show, not probed, since the controller's role may not create ResourceSlices, not even
in a dry run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpudra.controller.gpu_map_page import Served, SurveyCache
from gpudra.errors import GpudraError
from gpudra.kube.client import Kube
from gpudra.kube.informer import Informer
from gpudra.model.claim import read_claim, read_spec_of
from gpudra.model.kube_api import GROUP, VERSION
from gpudra.scheduling import cluster_view, gpu_map
from gpudra.scheduling.explain import device_classes
from gpudra.scheduling.forms import fields_seen, withheld_on
from gpudra.scheduling.pools import ClusterInventory
from gpudra.scheduling.reach import Reach

log = logging.getLogger(__name__)

# A scrape every few seconds must not rebuild a thousand nodes' view each time.
VIEW_SECONDS = 5.0
# How long a watch may fail before readiness calls the picture stale: past the informers' longest retry
# wait (30 s, `service.Loop`), so one blip of the API server does not take the webhook out of its
# Service, while a picture a minute behind is reported rather than served as current.
STALE_AFTER_SECONDS = 60.0


class ClusterWatch:
    """Three informers and what is built from them, as one `service.Service`."""

    def __init__(
        self,
        kube: Kube,
        *,
        driver: str,
        idle_after_seconds: float,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        server_minor: Callable[[], int] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`server_minor`: the API server's minor version, read once when first needed, for the forms
        of the GPUs no node can publish there (the admission warnings)."""
        self.driver = driver
        self.server_minor = server_minor
        self._minor: int | None = None
        self.idle_after_seconds = idle_after_seconds
        self.clock = clock
        base = f"/apis/{GROUP}/{VERSION}"
        self.slices = Informer(
            kube,
            "resourceslices",
            f"{base}/resourceslices",
            field_selector=f"spec.driver={driver}",
            on_change=self._slices_changed,
            clock=monotonic,
        )
        self.claims = Informer(
            kube, "resourceclaims", f"{base}/resourceclaims", on_change=self._changed, clock=monotonic
        )
        self.classes = Informer(
            kube,
            "deviceclasses",
            f"{base}/deviceclasses",
            on_change=self._classes_changed,
            clock=monotonic,
        )
        self.informers = [self.slices, self.claims, self.classes]
        self._lock = threading.Lock()
        self._changes = 0  # watch events seen; a view or reach remembers the count it was built at
        self._device_changes = 0
        # What view() built last: the change count and time it was built at, and it.
        self._built: dict[str, tuple[int, datetime, Any]] = {}
        self._building = threading.Lock()  # one build at a time: callers asking together wait for it
        self.surveys = SurveyCache(
            self._survey, max_age_seconds=VIEW_SECONDS, version=self._change_count, monotonic=monotonic
        )
        self._reach: tuple[int, Reach] | None = None
        # Called after each change to the slices (e.g. housekeeping's wake(): a pool may be gone).
        self.on_slices_change: list[Callable[[], None]] = []
        # Called after each change to the DeviceClasses (the webhook keeper's wake(): the classes warned for).
        self.on_classes_change: list[Callable[[], None]] = []

    def start(self) -> None:
        for informer in self.informers:
            informer.start()

    def stop(self, timeout: float) -> None:
        for informer in self.informers:
            informer.stop(timeout)

    def synced(self) -> str | None:
        """A readiness probe: which watches have not listed yet."""
        waiting = [i.resource for i in self.informers if not i.synced.is_set()]
        return f"not listed yet: {', '.join(waiting)}" if waiting else None

    def current(self) -> str | None:
        """The readiness probe: which watches have not listed yet, or have been failing (no LIST since)
        for longer than STALE_AFTER_SECONDS, with their last error."""
        waiting = self.synced()
        if waiting is not None:
            return waiting
        stale = [
            f"{i.resource} (failing for {i.failing_seconds():.0f} s: {i.loop.last_error or 'no LIST yet'})"
            for i in self.informers
            if i.failing_seconds() > STALE_AFTER_SECONDS
        ]
        return f"the cluster picture is stale: {'; '.join(stale)}" if stale else None

    def _changed(self, *, devices: bool = False) -> None:
        with self._lock:
            self._changes += 1
            self._device_changes += devices

    def _classes_changed(self) -> None:
        self._changed(devices=True)
        for callback in self.on_classes_change:
            callback()

    def _slices_changed(self) -> None:
        self._changed(devices=True)
        for callback in self.on_slices_change:
            callback()

    def view(self) -> cluster_view.ClusterView:
        view: cluster_view.ClusterView = self._build("view", cluster_view.build)
        return view

    def survey(self) -> Served:
        """The GPU map's survey, out of date after a change or VIEW_SECONDS as `view()` is: a page
        refreshing every few seconds in many browsers must not walk a thousand nodes' slices each time,
        nor several times at once, nor wait for that walk once there is a survey to show."""
        return self.surveys.get()

    def _change_count(self) -> int:
        with self._lock:
            return self._changes

    def _survey(self) -> gpu_map.Survey:
        return gpu_map.survey(
            driver=self.driver,
            slices=self.slices.objects(),
            claims=[read_claim(obj) for obj in self.claims.objects()],
            classes=self.classes.objects(),
            now=self.clock(),
            idle_after_seconds=self.idle_after_seconds,
        )

    def _build(self, name: str, build: Callable[..., Any]) -> Any:
        """`build` over the watched picture, again only after a change and at most every VIEW_SECONDS;
        builds wait for each other, so callers asking together get one build."""
        with self._building:
            now = self.clock()
            with self._lock:
                changes, cached = self._changes, self._built.get(name)
            if (
                cached is not None
                and cached[0] == changes
                and (now - cached[1]).total_seconds() < VIEW_SECONDS
            ):
                return cached[2]
            found = build(
                driver=self.driver,
                slices=self.slices.objects(),
                claims=[read_claim(obj) for obj in self.claims.objects()],
                classes=self.classes.objects(),
                now=now,
                idle_after_seconds=self.idle_after_seconds,
            )
            with self._lock:
                self._built[name] = (changes, now, found)
            return found

    def reach(self) -> Reach:
        with self._lock:
            changes, cached = self._device_changes, self._reach
        if cached is not None and cached[0] == changes:
            return cached[1]
        classes = self.classes.objects()
        slices = self.slices.objects()
        inventory = ClusterInventory(slices)
        devices = [device for pool in inventory.pools.values() for device in pool.devices]
        minor = self._read_minor()
        reach = Reach(
            devices,
            device_classes(classes),
            cluster_view.driver_classes(classes, driver=self.driver),
            withheld=withheld_on(fields_seen(minor, slices)) if minor is not None else (),
            driver=self.driver,
        )
        with self._lock:
            self._reach = (changes, reach)
        return reach

    def _read_minor(self) -> int | None:
        """The API server's minor, None while it cannot be read (the warnings then name no gates)."""
        if self._minor is None and self.server_minor is not None:
            try:
                self._minor = self.server_minor()
            except GpudraError:
                log.warning("cannot read the API server's version", exc_info=True)
        return self._minor

    def warned_classes(self) -> list[str] | None:
        """The DeviceClasses whose claims get admission warnings (those naming the driver); None until
        the classes' watch has listed."""
        if not self.classes.synced.is_set():
            return None
        return sorted(cluster_view.driver_classes(self.classes.objects(), driver=self.driver))

    def warnings(self, obj: Mapping[str, Any]) -> list[str]:
        """The admission warnings for a claim or template (none until the watches have listed)."""
        if self.synced() is not None:
            return []
        return self.reach().warnings(read_spec_of(obj))
