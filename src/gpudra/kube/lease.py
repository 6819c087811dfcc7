"""The leader Lease of `gpudra controller`: a namespaced `coordination.k8s.io/v1` Lease read, created and
replaced whole. I/O: the API server, via gpudra.kube.client.

Writes are guarded the way the API server guards every object: a create of a name that exists and a
replace whose `resourceVersion` is no longer current both fail with `Conflict`, so of two replicas that
read the same Lease and both write it, exactly one wins. `LeaseRecord` is the part of the object that
leader election reads and writes; the decisions are in gpudra.controller.leader.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from gpudra.kube.client import Kube, NotFound, Obj

_API_VERSION = "coordination.k8s.io/v1"


@dataclass(frozen=True)
class LeaseRecord:
    """A Lease's spec and the version it was read at. `holder` is "" when nobody holds the Lease.
    `resource_version` is "" for a record not yet stored (what `create` takes)."""

    holder: str
    lease_seconds: int
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int
    resource_version: str = ""


def format_micro_time(at: datetime) -> str:
    """A MicroTime as the API server writes it (Go's `2006-01-02T15:04:05.000000Z07:00`, in UTC)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(value: object) -> datetime | None:
    # The API server stores MicroTime in one format (format_micro_time's), which fromisoformat reads.
    return datetime.fromisoformat(str(value)) if value else None


def _record(lease: Obj) -> LeaseRecord:
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        lease_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=_time(spec.get("acquireTime")),
        renew_time=_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
    )


def _body(namespace: str, name: str, record: LeaseRecord, owners: list[Obj]) -> Obj:
    metadata: Obj = {"name": name, "namespace": namespace}
    if owners:
        metadata["ownerReferences"] = owners
    if record.resource_version:
        metadata["resourceVersion"] = record.resource_version  # the API server's precondition
    spec: Obj = {
        "holderIdentity": record.holder,
        "leaseDurationSeconds": record.lease_seconds,
        "leaseTransitions": record.transitions,
    }
    if record.acquire_time is not None:
        spec["acquireTime"] = format_micro_time(record.acquire_time)
    if record.renew_time is not None:
        spec["renewTime"] = format_micro_time(record.renew_time)
    return {"apiVersion": _API_VERSION, "kind": "Lease", "metadata": metadata, "spec": spec}


def _path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/{_API_VERSION}/namespaces/{quote(namespace, safe='')}/leases"
    return f"{path}/{quote(name, safe='')}" if name is not None else path


class Leases:
    """Lease reads and writes on the one client (each counted as `(verb, "leases")`); failures are
    `ClusterError`, a lost race `Conflict`. Implements gpudra.controller.leader.LeaseStore."""

    def __init__(self, kube: Kube, *, owners: list[Obj] | None = None) -> None:
        self.kube = kube
        self.owners = list(owners or [])  # ownerReferences of the Lease (see kube.admission)

    def get(self, namespace: str, name: str) -> LeaseRecord | None:
        """The Lease as stored now, or None when there is none."""
        try:
            lease = self.kube.request(f"reading Lease {namespace}/{name}", "GET", _path(namespace, name))
        except NotFound:
            return None
        return _record(lease)

    def create(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        """The Lease as stored; `Conflict` when one of that name exists."""
        body = _body(namespace, name, record, self.owners)
        return _record(
            self.kube.request(f"creating Lease {namespace}/{name}", "POST", _path(namespace), body=body)
        )

    def replace(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        """The Lease as stored; `Conflict` when it changed since `record.resource_version` was read.
        The whole object is replaced: the Lease is gpudra's own, nothing else labels or annotates it."""
        body = _body(namespace, name, record, self.owners)
        what = f"updating Lease {namespace}/{name}"
        return _record(self.kube.request(what, "PUT", _path(namespace, name), body=body))
