"""Fakes of the API server, one for each narrow part of it that gpudra's code calls, named for that part:

- Claims: a ClaimSource (gpudra.node.allocation) of ResourceClaim objects, what prepare reads.
- Events: an EventPoster (gpudra.kube.events), recording what the node would post.
- FakeSliceKube (with FakeWatch): the ResourceSlice half of gpudra.kube.client.Kube that the slice
  controller lists, watches and writes.
- FakeClaimKube: Kube.get_claim, what ClaimReader calls.
- FakeEventKube: the Event calls of Kube that NodeEvents makes.
- FakeRequestKube: Kube.request, what Leases and ClaimStatus build their calls on.

Kube itself over a fake kubernetes ApiClient is tests/unit/harness/api_client.py; the leader elector's
LeaseStore, tests/unit/harness/leases.py."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple

from gpudra.errors import ClaimError, ClusterError
from gpudra.kube.client import Conflict, NotFound, Obj, request_kind
from gpudra.model.claim import Claim, read_claim
from gpudra.node.allocation import ClaimRef
from gpudra.quantity import parse_quantity
from tests.unit.claims import DRIVER, NODE

NODE_UID = "6a1f3c2e-0000-4000-8000-000000000001"
WATCH_THREAD = "slice-watch"


def ref(claim: dict[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])


class Claims:
    """A dict-backed ClaimSource, saved to a JSON file so that a child process sees the same claims."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        if path.exists():
            for claim in json.loads(path.read_text()):
                self.objects[(claim["metadata"]["namespace"], claim["metadata"]["name"])] = claim

    def add(self, claim: dict[str, Any]) -> ClaimRef:
        self.objects[(claim["metadata"]["namespace"], claim["metadata"]["name"])] = claim
        self._save()
        return ref(claim)

    def clear(self) -> None:
        self.objects.clear()
        self._save()

    def get(self, *, namespace: str, name: str, uid: str) -> Claim:
        try:
            return read_claim(self.objects[(namespace, name)])
        except KeyError:
            raise ClaimError(f"ResourceClaim {namespace}/{name} not found") from None

    def _save(self) -> None:
        self.path.write_text(json.dumps(list(self.objects.values())))


class Events:
    """Records what would be posted on the Node (gpudra.kube.events.NodeEvents.post)."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []
        self.series: list[str | None] = []  # each post's series key (None: its message)

    def post(
        self, type_: Literal["Normal", "Warning"], reason: str, message: str, *, series: str | None = None
    ) -> None:
        self.posted.append((type_, reason, message))
        self.series.append(series)

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.posted]


class FakeWatch:
    """A WATCH on FakeSliceKube: the events after a version, as they come, until closed or timed out."""

    def __init__(self, kube: FakeSliceKube, after: int, timeout: float) -> None:
        self.kube = kube
        self.after = after
        self.timeout = timeout
        self.closed = False

    def __iter__(self) -> Iterator[Obj]:
        kube, deadline = self.kube, time.monotonic() + self.timeout
        with kube.changed:
            position = sum(
                1 for e in kube.events if int(e["object"]["metadata"]["resourceVersion"]) <= self.after
            )
        while True:
            with kube.changed:
                kube.consumed = position  # the consumer asked for more: it is done with the one before
                while not self.closed and position >= len(kube.events):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    kube.changed.wait(left)
                if self.closed:
                    return
                event = copy.deepcopy(kube.events[position])
            position += 1
            yield event  # outside the lock: the consumer may wait for a write that needs it

    def close(self) -> None:
        with self.kube.changed:
            self.closed = True
            self.kube.changed.notify_all()


class FakeSliceKube:
    """The slice half of gpudra.kube.client.Kube, in memory, storing objects as an API server does.

    Stored objects get server fields (uid, resourceVersion, managedFields, ...), reformatted quantities
    and a defaulted field, as a real server would return them; a replace with a stale resourceVersion or
    a create of an existing name is a Conflict. Every change is an event for `watch_slices`. Calls from
    the slice-watch thread go to `watch_calls` and `watch_failures`, the rest to `calls` and `failures`
    (errors to raise from the next calls, in order), so the two threads never take each other's failures.
    `edit`, `remove` and `add` are someone else's writes.
    """

    def __init__(self, *, server_minor: int = 35) -> None:
        self.minor = server_minor
        self.slices: dict[str, Obj] = {}
        self.calls: list[str] = []
        self.watch_calls: list[str] = []
        self.times: list[float] = []
        self.failures: list[Exception | None] = []
        self.watch_failures: list[Exception | None] = []
        self.events: list[Obj] = []
        self.consumed = 0  # events the controller's watch has finished with
        self.opened: FakeWatch | None = None  # the last watch opened
        self.changed = threading.Condition()
        self._version = 100

    @property
    def writes(self) -> list[str]:
        return [call for call in self.calls if call.split()[0] in ("create", "replace", "delete")]

    def _call(self, name: str) -> None:
        watching = threading.current_thread().name == WATCH_THREAD
        (self.watch_calls if watching else self.calls).append(name)
        failures = self.watch_failures if watching else self.failures
        if failures:
            failure = failures.pop(0)
            if failure is not None:
                raise failure

    def server_minor(self) -> int:
        self._call("server_minor")
        return self.minor

    def node_uid(self, name: str) -> str:
        self._call(f"node_uid {name}")
        return NODE_UID

    def list_slices(self, *, driver: str, node_name: str) -> tuple[list[Obj], str]:
        if threading.current_thread().name != WATCH_THREAD:
            self.times.append(time.monotonic())
        self._call("list")
        with self.changed:
            items = [
                copy.deepcopy(s)
                for s in self.slices.values()
                if s["spec"]["driver"] == driver and s["spec"]["nodeName"] == node_name
            ]
            return items, str(self._version)

    def watch_slices(
        self, *, driver: str, node_name: str, resource_version: str, timeout_seconds: int
    ) -> FakeWatch:
        assert (driver, node_name) == (DRIVER, NODE)
        self._call("watch")
        self.opened = FakeWatch(self, int(resource_version), timeout_seconds)
        return self.opened

    def create_slice(self, body: Obj) -> Obj:
        self._call(f"create {body['metadata']['name']}")
        assert "resourceVersion" not in body["metadata"]
        with self.changed:
            if body["metadata"]["name"] in self.slices:
                raise Conflict("already exists")
            return self._store(body, uid=f"uid-{self._version}", kind="ADDED")

    def replace_slice(self, body: Obj, *, dry_run: bool = False) -> Obj:
        name = body["metadata"]["name"]
        self._call(f"{'dry-run ' if dry_run else ''}replace {name}")
        with self.changed:
            current = self.slices.get(name)
            if current is None:
                raise NotFound(name)
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise Conflict(f"{name}: the object has been modified")
            if dry_run:
                return self.server_form(body, uid=current["metadata"]["uid"], version=self._version)
            return self._store(body, uid=current["metadata"]["uid"], kind="MODIFIED")

    def delete_slice(self, name: str) -> None:
        self._call(f"delete {name}")
        self.remove(name)

    # --- someone else's writes -----------------------------------------------------------------

    def edit(self, name: str, change: Callable[[Obj], None]) -> None:
        with self.changed:
            edited = copy.deepcopy(self.slices[name])
            change(edited)
            self._version += 1
            edited["metadata"]["resourceVersion"] = str(self._version)
            self._keep(edited, "MODIFIED")

    def remove(self, name: str) -> None:
        with self.changed:
            gone = self.slices.pop(name, None)
            if gone is not None:
                self._version += 1
                gone["metadata"]["resourceVersion"] = str(self._version)
                self.events.append({"type": "DELETED", "object": gone})
                self.changed.notify_all()

    def add(self, body: Obj) -> None:
        with self.changed:
            self._store(body, uid=f"uid-{self._version}", kind="ADDED")

    def _store(self, body: Obj, *, uid: str, kind: str) -> Obj:
        self._version += 1
        stored = self.server_form(body, uid=uid, version=self._version)
        self._keep(stored, kind)
        return copy.deepcopy(stored)

    def _keep(self, stored: Obj, kind: str) -> None:
        self.slices[stored["metadata"]["name"]] = stored
        self.events.append({"type": kind, "object": copy.deepcopy(stored)})
        self.changed.notify_all()

    @staticmethod
    def server_form(body: Obj, *, uid: str, version: int) -> Obj:
        stored = copy.deepcopy(body)
        stored["metadata"].update(
            uid=uid,
            resourceVersion=str(version),
            creationTimestamp="2026-01-01T00:00:00Z",
            managedFields=[{"manager": "gpudra", "operation": "Update"}],
        )
        for device in stored["spec"].get("devices", []):
            for capacity in device.get("capacity", {}).values():
                capacity["value"] = str(int(parse_quantity(capacity["value"])))  # "80Gi" -> bytes
        stored["spec"].setdefault("perDeviceNodeSelection", None)
        return stored


class FakeClaimKube:
    """Kube.get_claim, as ClaimReader calls it: the objects by (namespace, name), a 404 for the others,
    or `error` raised for every read; `gets` records each read."""

    def __init__(self, objects: dict[tuple[str, str], Obj], error: Exception | None = None) -> None:
        self.objects = objects
        self.error = error
        self.gets: list[tuple[str, str]] = []

    def get_claim(self, namespace: str, name: str) -> Obj:
        self.gets.append((namespace, name))
        if self.error is not None:
            raise self.error
        try:
            return self.objects[(namespace, name)]
        except KeyError:
            raise NotFound(f"reading ResourceClaim {namespace}/{name}: HTTP 404 Not Found") from None


class FakeEventKube:
    """The Event calls of Kube that NodeEvents makes (node_uid, create_node_event, patch_node_event):
    records the events; fails while `down` is set."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.events: list[dict[str, Any]] = []
        self.patches = 0
        self.sent = threading.Condition()

    def node_uid(self, name: str) -> str:
        if self.down.is_set():
            raise ClusterError("reading node n1: cannot reach the API server (MaxRetryError)")
        return "uid-1"

    def create_node_event(self, *, node_name: str, node_uid: str, event: dict[str, Any]) -> str:
        if self.down.is_set():
            raise ClusterError("creating an Event: cannot reach the API server (MaxRetryError)")
        with self.sent:
            name = f"{node_name}.{len(self.events)}"
            self.events.append({"node": node_name, "uid": node_uid, "name": name, **event})
            self.sent.notify_all()
        return name

    def patch_node_event(self, name: str, patch: dict[str, Any]) -> None:
        with self.sent:
            found = [e for e in self.events if e["name"] == name and not e.get("expired")]
            if not found:
                raise NotFound(f"updating the Event {name}: not found")
            found[0].update(patch)
            self.patches += 1
            self.sent.notify_all()

    def wait_for(self, count: int, timeout: float = 10) -> list[dict[str, Any]]:
        with self.sent:
            assert self.sent.wait_for(lambda: len(self.events) >= count, timeout), self.events
            return list(self.events)


class Request(NamedTuple):
    """One call of FakeRequestKube.request: the method, the path and the keyword arguments (query, body,
    content_type) as the caller gave them."""

    method: str
    path: str
    kwargs: dict[str, Any]


class FakeRequestKube:
    """Kube.request, the one call that Leases and ClaimStatus make: records each call in `requests` and
    answers from a queue of replies (a dict, or an error to raise), {} once the queue is empty."""

    def __init__(self, *replies: dict[str, Any] | Exception) -> None:
        self.replies = list(replies)
        self.requests: list[Request] = []

    @property
    def counts(self) -> list[tuple[str, str]]:
        """What Kube counted the requests as (gpudra_api_requests_total's verb and resource)."""
        return [request_kind(r.method, r.path) for r in self.requests]

    def request(self, what: str, method: str, path: str, **kwargs: Any) -> Any:
        self.requests.append(Request(method, path, kwargs))
        reply = self.replies.pop(0) if self.replies else {}
        if isinstance(reply, Exception):
            raise reply
        return reply
