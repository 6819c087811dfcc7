"""Which of gpudra's device forms a request asks for, and what it needs where the API server cannot keep
that form (`gpudra explain`'s "needs feature gate X", the admission warnings). Pure.

A node publishes a GPU in up to three forms besides its existing MIG devices: whole, as a share
(`gpu-<n>-shared`), as MIG partitions on demand. Where the API server drops the fields a form needs,
no node publishes it (`gpudra.model.publishing.fit_to_server`, the rule the kubelet plugin follows), so
a request whose DeviceClass selects only that form can never be allocated there, and the reason is the
cluster's feature gates or release, not the devices in the slices. The form a request asks for is read
from its class's own selectors, evaluated on one device of each form as gpudra publishes it; the
request's selectors are not (they may name products or profiles the exemplars lack).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpudra.model.claim import Request
from gpudra.model.devices import SHARED_ATTRIBUTE
from gpudra.model.publishing import FORM_NAMES, Publishing, ServerFields, Withheld, fit_to_server
from gpudra.scheduling.cel import CelError, compile_selector
from gpudra.scheduling.claims import AllocatorClaim
from gpudra.scheduling.pools import SliceDevice

__all__ = ["FORMS", "Needs", "class_forms", "fields_seen", "needs", "release_limits", "withheld_on"]

# Everything a node can publish: what is left of it on a server is what any node can publish there.
_EVERYTHING = Publishing(mig_mode="partitionable", shares=True)
# The first minor whose scheduler does not keep the counters of a device it turned down for a claim's
# constraint reserved while it searches on. Observed with the gates on: on 1.34.12 a claim of two
# 2g.20gb partitions of one H100 under matchAttribute parentUUID is never allocated (one of 3g.40gb and
# 2g.20gb is), and on 1.35.8 examples/mig-mixed.yaml is allocated in one cluster and never in another
# that differs only in what other claims hold; 1.36.3 and 1.37.2 allocate it every time. Confirmed in the
# scheduler's source, kubernetes#140436: in k8s.io/dynamic-resource-allocation v0.34.12 and v0.35.8
# (structured/internal/{incubating,experimental}), allocateDevice reserves the candidate's counters in
# checkAvailableCounters, then returns on a device taint or a constraint that turns the candidate down
# without deallocateCountersForDevice; the counter set looks used up to every later candidate of the
# search. kubernetes#140431 (rollbackDevice) fixes it in v0.36.3, v0.36.4 and v0.37.0 on; v0.36.2 does
# not have it, so 1.36.0-1.36.2 leak too, which a minor alone cannot tell (docs/install.md says so).
_COUNTER_LEAK_FIXED_MINOR = 36

# The forms a class may select. "mig-devices" (MIG devices that exist) is never withheld.
FORMS = ("whole", "shares", "partitions", "mig-devices")

_GPU = {
    "type": {"string": "gpu"},
    "uuid": {"string": "GPU-00000000-0000-0000-0000-000000000000"},
    "productName": {"string": "NVIDIA H100 80GB HBM3"},
    "minor": {"int": 0},
    "migCapable": {"bool": True},
}
_MIG = {
    "type": {"string": "mig"},
    "profile": {"string": "1g.10gb"},
    "parentUUID": {"string": "GPU-00000000-0000-0000-0000-000000000000"},
    "parentMinor": {"int": 0},
    "productName": {"string": "NVIDIA H100 80GB HBM3"},
    "placementStart": {"int": 0},
    "placementSize": {"int": 1},
}
_COUNTERS = [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "10Gi"}}}]


def _exemplars() -> list[tuple[str, dict[str, Any]]]:
    """(form, device) pairs; a share of a MIG partition is of form "shares" too: it needs what any
    share needs (consumable capacity, counters), and counters are what partitions need."""
    return [*_by_form().items(), ("shares", _MIG_SHARE)]


_MIG_SHARE = {
    "name": "gpu-0-mig-1g10gb-0-shared",
    "attributes": {**_MIG, SHARED_ATTRIBUTE: {"bool": True}},
    "capacity": {"memory": {"value": "10Gi"}, "compute": {"value": "100"}},
    "allowMultipleAllocations": True,
    "consumesCounters": _COUNTERS,
}


def _by_form() -> dict[str, dict[str, Any]]:
    return {
        "whole": {"name": "gpu-0", "attributes": _GPU, "capacity": {"memory": {"value": "80Gi"}}},
        "shares": {
            "name": "gpu-0-shared",
            "attributes": {**_GPU, SHARED_ATTRIBUTE: {"bool": True}},
            "capacity": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}},
            "allowMultipleAllocations": True,
            "consumesCounters": _COUNTERS,
        },
        "partitions": {
            "name": "gpu-0-mig-1g10gb-0",
            "attributes": _MIG,
            "capacity": {"memory": {"value": "10Gi"}},
            "consumesCounters": _COUNTERS,
        },
        "mig-devices": {
            "name": "gpu-0-mig-1g10gb-0",
            "attributes": {**_MIG, "uuid": {"string": "MIG-00000000-0000-0000-0000-000000000000"}},
            "capacity": {"memory": {"value": "10Gi"}},
        },
    }


def class_forms(selectors: Sequence[str], *, driver: str) -> frozenset[str]:
    """The forms of `driver`'s devices that a DeviceClass with these CEL `selectors` selects; empty for
    a class of another driver or one whose selectors do not compile or fail on the exemplars."""
    try:
        compiled = [compile_selector(expression) for expression in selectors]
    except CelError:
        return frozenset()
    found = set()
    for form, raw in _exemplars():
        device = SliceDevice(raw, driver, "exemplar", None)
        try:
            if all(selector.matches(device) for selector in compiled):
                found.add(form)
        except CelError:
            continue
    return frozenset(found)


@dataclass(frozen=True)
class Needs:
    """A request that asks for a form the API server cannot keep, and what would serve it."""

    claim: str
    request: Request
    withheld: Withheld

    @property
    def line(self) -> str:
        """One line, e.g. `request mig (class mig.gpudra.io): MIG partitions on demand need feature gate
        DRAPartitionableDevices (on by default from 1.36): the API server drops counter sets (...)`."""
        return (
            f"request {self.request.name} (class {self.request.device_class}): {self.withheld.needs}: "
            f"{self.withheld.cause}"
        )


def needs(
    claims: Sequence[AllocatorClaim],
    classes: Mapping[str, Sequence[str]],
    withheld: Sequence[Withheld],
    *,
    driver: str,
) -> list[Needs]:
    """The requests of `claims` whose class selects a form the server cannot keep (`withheld`, as
    `fit_to_server` of everything gpudra publishes says). A request whose class also selects a form that
    is served (a MIG class also selects existing MIG devices) is listed too: the caller decides whether
    what is served was enough."""
    by_form = {w.form: w for w in withheld if w.form in FORM_NAMES and w.form in FORMS}
    if not by_form:
        return []
    forms_of: dict[str, frozenset[str]] = {}
    found = []
    for claim in claims:
        for entry in claim.requests:
            for request in entry:
                name = request.device_class
                if name not in classes:
                    continue
                if name not in forms_of:
                    forms_of[name] = class_forms(classes[name], driver=driver)
                asked = [by_form[f] for f in FORMS if f in forms_of[name] and f in by_form]
                found += [Needs(claim.name, request, w) for w in asked]
    return found


def withheld_on(server: ServerFields) -> list[Withheld]:
    """The forms no node can publish on `server`: the kubelet plugin's own rule, applied to everything
    it can publish."""
    return fit_to_server(_EVERYTHING, server)[1]


def release_limits(
    claims: Sequence[AllocatorClaim],
    classes: Mapping[str, Sequence[str]],
    server: ServerFields,
    *,
    driver: str,
) -> list[str]:
    """What `server`'s scheduler may do otherwise than the rules (gpudra.scheduling.allocator) say, for
    these claims, one line each: before 1.36, with partitions kept, a constraint over several requests
    for MIG partitions can keep the claim from ever being allocated."""
    if server.minor >= _COUNTER_LEAK_FIXED_MINOR or not server.counters:
        return []
    found = []
    for claim in claims:
        partitions = {
            request.base
            for entry in claim.requests
            for request in entry
            if request.device_class in classes
            and "partitions" in class_forms(classes[request.device_class], driver=driver)
        }
        for constraint in claim.constraints:
            over = partitions if not constraint.requests else partitions & constraint.requests
            if len(over) < 2:
                continue
            found.append(
                f"{'claim ' + claim.name + ': ' if len(claims) > 1 else ''}the Kubernetes 1.{server.minor} "
                f"scheduler may never allocate requests {', '.join(sorted(over))} together: they take MIG "
                f"partitions under constraint {constraint.description}, and it keeps the counters of a "
                f"partition the constraint turned down reserved (kubernetes#140436); "
                f"1.{_COUNTER_LEAK_FIXED_MINOR}.3 and later allocate them"
            )
    return found


def fields_seen(minor: int, slices: Iterable[Mapping[str, Any]]) -> ServerFields:
    """What an API server of 1.`minor` keeps, without a probe: its release's default gates, and each
    gated field kept where a stored slice carries it (a gate turned on). For the controller, whose
    role may not create slices even in a dry run; a gate turned off on a release that has it on by
    default goes unseen."""
    counters = consumable = taints = False
    for piece in slices:
        spec = piece.get("spec") or {}
        counters = counters or bool(spec.get("sharedCounters"))
        for device in spec.get("devices") or ():
            counters = counters or bool(device.get("consumesCounters"))
            consumable = consumable or device.get("allowMultipleAllocations") is True
            taints = taints or bool(device.get("taints"))
    default = ServerFields.of_release(minor)
    return ServerFields(
        minor=minor,
        counters=default.counters or counters,
        consumable_capacity=default.consumable_capacity or consumable,
        device_taints=default.device_taints or taints,
    )
