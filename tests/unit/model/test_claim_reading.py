"""gpudra.model.claim: a ResourceClaim read once into typed parts: its spec as the scheduler's port reads
it (with what the scheduler would refuse kept as problems naming the field), its allocation, the pods
reserving it and its status.devices; any shape read without raising."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import pytest

from gpudra.errors import ConfigError
from gpudra.model.claim import (
    Claim,
    ClaimSpec,
    Condition,
    Constraint,
    Consumer,
    DeviceStatus,
    FieldProblem,
    Toleration,
    read_claim,
    read_spec,
    read_spec_of,
)

DRIVER = "gpu.gpudra.io"


def exactly(name: str = "gpu", **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "gpu.gpudra.io", **fields}}


def spec(*requests: Any, constraints: Any = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints is not None:
        devices["constraints"] = constraints
    return {"devices": devices}


def test_a_claim_reads_its_spec_allocation_reservations_and_device_status() -> None:
    claim = read_claim(
        {
            "metadata": {
                "namespace": "ns",
                "name": "c",
                "uid": "u-1",
                "creationTimestamp": "2026-11-23T08:00:00Z",
            },
            "spec": spec(
                exactly(
                    "gpu",
                    count=2,
                    selectors=[{"cel": {"expression": "true"}}],
                    tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
                    capacity={"requests": {"memory": "1.5Gi", "multiprocessors": "10"}},
                ),
                {
                    "name": "any",
                    "firstAvailable": [
                        {"name": "big", "deviceClassName": "gpu.gpudra.io", "allocationMode": "All"},
                        {"name": "small", "deviceClassName": "mig.gpudra.io", "adminAccess": True},
                    ],
                },
                constraints=[{"matchAttribute": "gpu.gpudra.io/productName", "requests": ["gpu"]}],
            ),
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"request": "gpu", "driver": DRIVER, "pool": "n", "device": "gpu-0"}]
                    }
                },
                "reservedFor": [
                    {"resource": "pods", "name": "p2", "uid": "x"},
                    {"resource": "pods", "name": "p1", "uid": "y"},
                    {"resource": "jobs", "name": "j", "uid": "z"},
                ],
                "devices": [
                    {
                        "driver": DRIVER,
                        "pool": "n",
                        "device": "gpu-0",
                        "shareID": "s",
                        "conditions": [
                            {
                                "type": "Idle",
                                "status": "True",
                                "reason": "NoActivity",
                                "message": "m",
                                "lastTransitionTime": "2026-11-23T08:00:00Z",
                            }
                        ],
                    }
                ],
            },
        }
    )
    assert (claim.namespaced_name, claim.uid) == ("ns/c", "u-1")
    assert claim.created == datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
    assert claim.allocation is not None and [r.device for r in claim.allocation.results] == ["gpu-0"]
    assert claim.pods == ("p1", "p2")
    assert Consumer("jobs", "j") in claim.reserved_for
    assert claim.devices == (
        DeviceStatus(
            0,
            DRIVER,
            "n",
            "gpu-0",
            "s",
            (Condition("Idle", "True", "NoActivity", "m", "2026-11-23T08:00:00Z"),),
        ),
    )
    assert claim.spec.problems == ()
    [(gpu,), (big, small)] = claim.spec.requests
    assert (gpu.name, gpu.count, gpu.all_devices, gpu.selectors) == ("gpu", 2, False, ("true",))
    assert gpu.tolerations == (Toleration(key="k", operator="Exists", effect="NoSchedule"),)
    assert gpu.capacity == (("memory", Fraction(3 * 1024**3, 2)), ("multiprocessors", 10))
    assert gpu.field == "spec.devices.requests[0].exactly"
    assert (big.name, big.base, big.sub, big.all_devices, big.count) == ("any/big", "any", "big", True, 0)
    assert (small.device_class, small.admin_access, small.field) == (
        "mig.gpudra.io",
        True,
        "spec.devices.requests[1].firstAvailable[1]",
    )
    assert claim.spec.constraints == (
        Constraint(frozenset({"gpu"}), "gpu.gpudra.io/productName", False, "spec.devices.constraints[0]"),
    )
    assert claim.spec.device_classes == {"gpu.gpudra.io", "mig.gpudra.io"}


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        ({"devices": "x"}, "spec.devices", "must be an object, not str"),
        (
            {"devices": {"requests": 5}},
            "spec.devices.requests",
            "must be a list",
        ),
        (spec(7), "spec.devices.requests[0]", "must be an object, not int"),
        (spec({"exactly": {"deviceClassName": "c"}}), "spec.devices.requests[0].name", "is required"),
        (spec(exactly("a"), exactly("a")), "spec.devices.requests[1].name", "duplicate request name 'a'"),
        (spec({"name": "a"}), "spec.devices.requests[0]", "exactly one of exactly or firstAvailable"),
        (
            spec({"name": "a", "exactly": {}}),
            "spec.devices.requests[0].exactly.deviceClassName",
            "is required",
        ),
        (spec(exactly(allocationMode="Some")), "spec.devices.requests[0].exactly.allocationMode", "'Some'"),
        (spec(exactly(count=True)), "spec.devices.requests[0].exactly.count", "True is not a count"),
        (
            spec(exactly(selectors=[{"cel": {}}])),
            "spec.devices.requests[0].exactly.selectors[0].cel.expression",
            "is required",
        ),
        (
            spec(exactly(capacity={"requests": {"memory": "lots"}})),
            "spec.devices.requests[0].exactly.capacity.requests.memory",
            "must be a Kubernetes quantity",
        ),
        (
            spec(exactly(tolerations=[3])),
            "spec.devices.requests[0].exactly.tolerations[0]",
            "must be an object",
        ),
        (
            spec({"name": "a", "firstAvailable": []}),
            "spec.devices.requests[0].firstAvailable",
            "at least one",
        ),
        (
            spec({"name": "a", "firstAvailable": [{"deviceClassName": "c"}]}),
            "spec.devices.requests[0].firstAvailable[0].name",
            "is required",
        ),
        (
            spec(exactly(), constraints=[{"distinctAttribute": "uuid"}]),
            "spec.devices.constraints[0].distinctAttribute",
            "must be a fully qualified name",
        ),
        (
            spec(exactly(), constraints=[{"matchAttribute": "a/b", "requests": "gpu"}]),
            "spec.devices.constraints[0].requests",
            "must be a list, not str",
        ),
    ],
)
def test_what_the_scheduler_refuses_is_a_problem_naming_the_field(raw: Any, field: str, message: str) -> None:
    read = read_spec(raw)
    with pytest.raises(ConfigError) as caught:
        read.check()
    assert caught.value.field == field
    assert message in caught.value.reason


def test_the_first_problem_is_the_one_raised_and_the_rest_of_the_spec_is_still_read() -> None:
    read = read_spec(
        spec(exactly("a", count=0), exactly("b", deviceClassName="mig.gpudra.io"), 5), path="spec.spec"
    )
    assert read.problems == (
        FieldProblem(
            "spec.spec.devices.requests[0].exactly.count",
            "0 is not a count; use a whole number of at least 1",
        ),
        FieldProblem("spec.spec.devices.requests[2]", "must be an object, not int"),
    )
    assert [entry[0].name for entry in read.requests] == ["a", "b"]
    assert read.device_classes == {"gpu.gpudra.io", "mig.gpudra.io"}
    assert read.path == "spec.spec"


def test_absent_null_and_empty_fields_are_no_problem() -> None:
    empty: list[Any] = [None, {}, {"devices": None}, {"devices": {"requests": None, "constraints": []}}]
    for raw in empty:
        assert read_spec(raw) == ClaimSpec()
    [(request,)] = read_spec(spec(exactly(selectors=None, capacity=None, tolerations=[]))).requests
    assert (request.count, request.selectors, request.capacity, request.tolerations) == (1, (), (), ())


def test_the_spec_of_a_claim_or_a_template_and_nothing_else() -> None:
    claim = read_spec_of({"kind": "ResourceClaim", "spec": spec(exactly())})
    template = read_spec_of({"kind": "ResourceClaimTemplate", "spec": {"spec": spec(exactly())}})
    assert claim is not None and claim.path == "spec" and len(claim.requests) == 1
    assert template is not None and template.path == "spec.spec"
    assert template.requests[0][0].field == "spec.spec.devices.requests[0].exactly"
    broken = read_spec_of({"kind": "ResourceClaimTemplate", "spec": "x"})
    assert broken is not None and broken.problems == (FieldProblem("spec", "must be an object, not str"),)
    assert read_spec_of({"kind": "DeviceClass", "spec": {}}) is None


HOSTILE: list[Any] = [
    {},
    {"metadata": "x", "spec": "x", "status": "x"},
    {"metadata": {"uid": 5, "name": [], "creationTimestamp": "yesterday"}},
    {"metadata": {"creationTimestamp": 7}, "spec": {"devices": {"requests": [None, [], {"name": {}}]}}},
    {"spec": {"devices": {"requests": [{"name": "a", "firstAvailable": "x"}], "constraints": [None, {}]}}},
    {"spec": spec(exactly(capacity={"requests": {"m": "9" * 99, "n": None, "o": "1e999"}}))},
    {"spec": spec(exactly(count=[], allocationMode={}, selectors=[{"cel": "x"}], tolerations=[{"key": 5}]))},
    {
        "status": {
            "reservedFor": [5, {"resource": "pods"}, {"name": 3}],
            "devices": [5, {}, {"conditions": 5}],
        }
    },
    {"status": {"devices": [{"conditions": [7, {"type": 1, "lastTransitionTime": []}]}]}},
    {"status": {"allocation": {"devices": {"results": [5, {"consumedCapacity": 5}], "config": "x"}}}},
]


@pytest.mark.parametrize("raw", HOSTILE)
def test_any_shape_is_read_without_raising(raw: Any) -> None:
    claim = read_claim(raw)
    assert isinstance(claim, Claim)
    hash(claim.spec.requests)  # the allocator keys its selector cache by request


def test_a_malformed_status_devices_entry_is_left_out_and_the_others_keep_their_index() -> None:
    claim = read_claim(
        {
            "status": {
                "devices": [
                    "x",
                    {"driver": DRIVER, "pool": 3, "device": "gpu-0", "conditions": [5, {"type": "Idle"}]},
                    {"driver": DRIVER, "pool": "n", "device": "gpu-1"},
                ]
            }
        }
    )
    assert claim.devices == (
        DeviceStatus(1, DRIVER, "", "gpu-0", None, (Condition("Idle", "", "", "", ""),)),
        DeviceStatus(2, DRIVER, "n", "gpu-1", None, ()),
    )
