"""A watch-fed mirror of one collection of the cluster (the controller's ResourceSlices, ResourceClaims and
DeviceClasses). I/O: the API server.

It LISTs once, then WATCHes from the list's version, resuming each watch where the last one ended (with
bookmarks, a quiet collection's version stays recent enough to resume from). A failed watch, a version
the API server no longer has (HTTP 410) included, is followed by a fresh LIST: events may have been
missed, and only a LIST shows a deletion that happened meanwhile. So the cluster view is kept current
without polling: after the first LIST, an unchanged cluster costs one WATCH request per WATCH_SECONDS.

An object beyond `gpudra.bounded_json`'s bounds (a tenant's claim nested thousands of levels deep) is
left out of the LIST and reported as DELETED by the watch (`gpudra.kube.client`): the mirror holds every
other object and stays current. `failing_seconds()` tells how long the mirror has not been current
(a LIST or a watch failed, and no LIST succeeded since), for the controller's readiness.

`on_change` runs in the informer's thread after each change (not after bookmarks); it must be quick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpudra.kube.client import Kube, Obj, Watch
from gpudra.runtime.service import Loop

log = logging.getLogger(__name__)

# How long one WATCH request runs; the API server ends it then and the informer opens the next.
WATCH_SECONDS = 300
PAGE_SIZE = 500


def _key(obj: Obj) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


class Informer:
    """Mirrors the collection at `path` (e.g. /apis/resource.k8s.io/v1/resourceclaims) as a `Service`."""

    def __init__(
        self,
        kube: Kube,
        resource: str,
        path: str,
        *,
        field_selector: str | None = None,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.path = path
        self.field_selector = field_selector
        self.on_change = on_change
        self.loop = Loop(f"watch-{resource}", self._step, on_error=self._forget_position)
        self.synced = threading.Event()  # set once the first LIST is in
        self._objects: dict[tuple[str, str], Obj] = {}
        self._lock = threading.Lock()
        self._version: str | None = None  # where the next watch resumes; None: LIST first
        self._watch: Watch | None = None
        self._watch_guard = threading.Lock()  # _watch, against stop() closing it
        self._clock = clock
        self._failing_since: float | None = None  # when the mirror stopped being current; None: it is

    def objects(self) -> list[Obj]:
        """The objects as last seen (the dicts are shared: callers must not change them)."""
        with self._lock:
            return list(self._objects.values())

    def failing_seconds(self) -> float:
        """Seconds since a LIST or watch failed with no LIST succeeding since (0: the mirror is current)."""
        since = self._failing_since
        return 0.0 if since is None else max(0.0, self._clock() - since)

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float) -> None:
        self.loop.stopping.set()  # a watch opened from now on closes itself (see _step)
        with self._watch_guard:
            if self._watch is not None:
                self._watch.close()
        self.loop.stop(timeout)

    def _step(self) -> float:
        if self._version is None:
            self._relist()
            return 0.0
        watch = self.kube.watch(
            self.resource,
            self.path,
            resource_version=self._version,
            timeout_seconds=WATCH_SECONDS,
            field_selector=self.field_selector,
        )
        with self._watch_guard:
            self._watch = watch
            if self.loop.stopping.is_set():
                watch.close()
        try:
            for event in watch:
                kind, obj = event["type"], event["object"]
                # Every event carries its version; that of an object left out may not have been found.
                self._version = str(obj["metadata"].get("resourceVersion") or self._version)
                if kind == "BOOKMARK":
                    continue
                with self._lock:
                    if kind == "DELETED":
                        self._objects.pop(_key(obj), None)
                    else:
                        self._objects[_key(obj)] = obj
                self.on_change()
        finally:
            with self._watch_guard:
                self._watch = None
        return 0.0

    def _relist(self) -> None:
        objects: dict[tuple[str, str], Obj] = {}
        cont: str | None = None
        version = ""
        while True:
            page = self.kube.list_page(
                self.resource, self.path, limit=PAGE_SIZE, cont=cont, field_selector=self.field_selector
            )
            # Every page of one LIST is served from the first page's snapshot, at its version.
            version = version or str((page.get("metadata") or {}).get("resourceVersion") or "")
            # List items come without kind and apiVersion (watch events carry them): filled in, so every
            # object reads the same whichever way it came.
            kind = str(page.get("kind", "")).removesuffix("List")
            for obj in page.get("items") or []:
                objects[_key(obj)] = {"kind": kind, "apiVersion": page.get("apiVersion"), **obj}
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                break
        with self._lock:
            self._objects = objects
        self._version = version
        self._failing_since = None
        self.synced.set()
        log.info("listed", extra={"resource": self.resource, "objects": len(objects)})
        self.on_change()

    def _forget_position(self, err: BaseException) -> None:
        """Events may have been missed (or the version is too old to resume from): LIST again."""
        self._version = None
        if self._failing_since is None:
            self._failing_since = self._clock()
