"""A ResourceClaim as gpudra reads it: typed, read in one place. Pure.

The API server hands claims over as JSON objects. Each module that walked `status.allocation` by hand
needed its own `or {}` fallbacks and made its own guess at a missing field; this module reads a claim
once into frozen dataclasses, and everything past it (prepare, config resolution, usage) works on
those. Only what gpudra acts on is read: identity, and the allocation's results and config entries.

A claim's spec and the opaque parameters in it are written by a tenant: reading tolerates any shape
(a field of the wrong type reads as absent) and never raises; deciding whether what is there is
acceptable is the job of the code that acts on it (config decoding, prepare's checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AllocationResult:
    """One entry of `status.allocation.devices.results`."""

    request: str  # "req", or "req/sub" for a subrequest
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None  # set for one share of a device several claims share
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)  # capacity name -> quantity

    @property
    def base_request(self) -> str:
        """The request name containers refer to (a subrequest's parent)."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True)
class ConfigEntry:
    """One entry of `status.allocation.devices.config`, at `index` in that list."""

    index: int
    source: str | None  # "FromClass" or "FromClaim" on a valid claim
    requests: frozenset[str]
    driver: str | None  # the opaque config's driver; None for an entry that is not opaque
    parameters: Any  # the opaque parameters as written (tenant input: decode before use)


@dataclass(frozen=True)
class Allocation:
    results: tuple[AllocationResult, ...] = ()
    config: tuple[ConfigEntry, ...] = ()

    def results_of(self, driver: str) -> tuple[AllocationResult, ...]:
        return tuple(result for result in self.results if result.driver == driver)


@dataclass(frozen=True)
class Claim:
    uid: str | None
    namespace: str
    name: str
    allocation: Allocation | None  # None: not allocated

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


def read_claim(obj: Mapping[str, Any]) -> Claim:
    """The parts of a ResourceClaim object gpudra acts on."""
    metadata = _mapping(obj.get("metadata"))
    allocation = _mapping(_mapping(obj.get("status")).get("allocation"))
    return Claim(
        uid=_string(metadata.get("uid")),
        namespace=_string(metadata.get("namespace")) or "",
        name=_string(metadata.get("name")) or "",
        allocation=read_allocation(allocation) if allocation else None,
    )


def read_allocation(allocation: Mapping[str, Any]) -> Allocation:
    """A claim's `status.allocation`."""
    devices = _mapping(allocation.get("devices"))
    return Allocation(
        results=tuple(
            _result(item) for item in _sequence(devices.get("results")) if isinstance(item, Mapping)
        ),
        config=tuple(
            _config_entry(index, item)
            for index, item in enumerate(_sequence(devices.get("config")))
            if isinstance(item, Mapping)
        ),
    )


def _result(item: Mapping[str, Any]) -> AllocationResult:
    consumed = _mapping(item.get("consumedCapacity"))
    return AllocationResult(
        request=_string(item.get("request")) or "",
        driver=_string(item.get("driver")) or "",
        pool=_string(item.get("pool")) or "",
        device=_string(item.get("device")) or "",
        admin_access=item.get("adminAccess") is True,
        share_id=_string(item.get("shareID")) or None,
        consumed_capacity={str(name): str(amount) for name, amount in consumed.items()},
    )


def _config_entry(index: int, item: Mapping[str, Any]) -> ConfigEntry:
    opaque = item.get("opaque")
    opaque = opaque if isinstance(opaque, Mapping) else None
    return ConfigEntry(
        index=index,
        source=_string(item.get("source")),
        requests=frozenset(r for r in _sequence(item.get("requests")) if isinstance(r, str)),
        driver=_string(opaque.get("driver")) if opaque is not None else None,
        parameters=opaque.get("parameters") if opaque is not None else None,
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _sequence(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None
