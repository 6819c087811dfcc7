"""Leases in memory, with the API server's rules: the LeaseStore (gpudra.controller.leader) that the
leader elector's and the controller metrics' unit tests run the elector on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpudra.errors import ClusterError
from gpudra.kube.client import Conflict, NotFound
from gpudra.kube.lease import LeaseRecord

NS, NAME = "gpudra", "gpudra-controller"


class MemoryLeases:
    """Leases in memory, with the API server's rules: every write gets a new resourceVersion; a create of
    an existing name and a replace at a stale resourceVersion raise Conflict; a replace of a missing
    Lease NotFound. `down` fails every call before it acts. `before(verb)` and `after(verb)` run around
    each call (after: once the call took effect, so raising there is a reply lost on the way back)."""

    def __init__(self, *, down: bool = False) -> None:
        self.leases: dict[tuple[str, str], LeaseRecord] = {}
        self.version = 0
        self.down = down
        self.before: Callable[[str], None] = lambda verb: None
        self.after: Callable[[str], None] = lambda verb: None
        self.writes = 0

    def _call(self, verb: str, act: Callable[[], Any]) -> Any:
        self.before(verb)
        if self.down:
            raise ClusterError(f"{verb} Lease: cannot reach the API server (MaxRetryError)")
        result = act()
        self.after(verb)
        return result

    def _store(self, key: tuple[str, str], record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.writes += 1
        self.leases[key] = replace(record, resource_version=str(self.version))
        return self.leases[key]

    def get(self, namespace: str, name: str) -> LeaseRecord | None:
        return self._call("get", lambda: self.leases.get((namespace, name)))

    def create(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        def act() -> LeaseRecord:
            assert not record.resource_version
            if (namespace, name) in self.leases:
                raise Conflict(f"creating Lease {namespace}/{name}: HTTP 409 Conflict")
            return self._store((namespace, name), record)

        return self._call("create", act)

    def replace(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        def act() -> LeaseRecord:
            current = self.leases.get((namespace, name))
            if current is None:
                raise NotFound(f"updating Lease {namespace}/{name}: HTTP 404 Not Found")
            if current.resource_version != record.resource_version:
                raise Conflict(f"updating Lease {namespace}/{name}: HTTP 409 Conflict")
            return self._store((namespace, name), record)

        return self._call("replace", act)

    def lease(self) -> LeaseRecord:
        return self.leases[(NS, NAME)]
