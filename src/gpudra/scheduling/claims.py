"""Claims as the scheduler's allocator takes them, and the devices other claims' allocations hold. Pure.

A claim's spec is read by `gpudra.model.claim` (requests, subrequests, constraints, with what the
scheduler would refuse kept as problems naming their field); `claim_from_spec` names it for the
allocator and raises the first problem. The API server's full validation is not repeated.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpudra.model.claim import AllocationResult, Claim, ClaimSpec, Constraint, Request
from gpudra.quantity import Amount
from gpudra.scheduling.pools import DeviceID, quantity

__all__ = ["Allocations", "AllocatorClaim", "claim_from_spec"]


@dataclass(frozen=True)
class AllocatorClaim:
    """A claim as the allocator reads it: its name and its spec's requests and constraints. Each entry of
    `requests` holds one request, or the subrequests of a `firstAvailable` request in their order."""

    name: str
    requests: tuple[tuple[Request, ...], ...]
    constraints: tuple[Constraint, ...]


def claim_from_spec(name: str, spec: ClaimSpec) -> AllocatorClaim:
    """The claim `spec` describes, named `name`; ConfigError naming the field when it is malformed."""
    spec.check()
    return AllocatorClaim(name, spec.requests, spec.constraints)


# --- what other claims hold ----------------------------------------------------------------------


@dataclass
class Allocations:
    """Devices other claims hold, as the scheduler counts them: dedicated devices, and shares of devices
    that allow multiple allocations with the capacity they consume. An admin-access result holds nothing.
    Values are the holding claims' names."""

    dedicated: dict[DeviceID, list[str]] = field(default_factory=dict)
    shares: dict[DeviceID, list[str]] = field(default_factory=dict)
    consumed: dict[DeviceID, dict[str, Amount]] = field(default_factory=dict)
    _pools: set[tuple[str, str]] | None = field(default=None, repr=False)

    @staticmethod
    def from_claims(claims: Iterable[Claim], *, skip: Iterable[str] = ()) -> Allocations:
        """The allocations of the claims, leaving out the claims named in `skip` ("namespace/name": the
        claims being explained)."""
        held = Allocations()
        left_out = set(skip)
        for claim in claims:
            name = claim.namespaced_name
            if name in left_out or claim.allocation is None:
                continue
            for index, result in enumerate(claim.allocation.results):
                held.add(name, result, field=f"{name}: status.allocation.devices.results[{index}]")
        return held

    def add(self, holder: str, result: AllocationResult, *, field: str) -> None:
        self._pools = None
        device: DeviceID = (result.driver, result.pool, result.device)
        if result.admin_access:
            return
        if result.share_id is not None:
            self.shares.setdefault(device, []).append(holder)
            total = self.consumed.setdefault(device, {})
            for name, value in result.consumed_capacity.items():
                total[name] = total.get(name, 0) + quantity(value, field=f"{field}.consumedCapacity.{name}")
        else:
            self.dedicated.setdefault(device, []).append(holder)

    def uses_pool(self, pool: tuple[str, str]) -> bool:
        """Whether other claims hold any device of the (driver, pool)."""
        if self._pools is None:
            self._pools = {d[:2] for d in (*self.dedicated, *self.shares, *self.consumed)}
        return pool in self._pools

    def holders(self, device: DeviceID) -> list[str]:
        return self.dedicated.get(device, []) + self.shares.get(device, [])

    def is_allocated(self, device: DeviceID) -> bool:
        return device in self.dedicated or device in self.shares or device in self.consumed
