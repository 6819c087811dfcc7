"""Splitting the device model into ResourceSlices within each server version's limits, and validating them."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudra.errors import ClusterError, NotSupported
from gpudra.model.devices import (
    CounterSet,
    Device,
    DeviceModel,
    DeviceTaint,
    build_devices,
    gpu_uuid_of,
    with_health_taints,
)
from gpudra.model.gpu_health import device_taints
from gpudra.model.inventory import Gpu
from gpudra.model.slices import ResourceSlice, build_slices, validate_slices
from tests.unit import inventories as inv

DRIVER = "gpu.gpudra.io"
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MINORS = [34, 35, 36]


def publish(model: DeviceModel, server_minor: int, **overrides: object) -> list[ResourceSlice]:
    arguments: dict[str, object] = {"driver": DRIVER, "node_name": "node-a", "generation": 1} | overrides
    return build_slices(model, server_minor=server_minor, **arguments)


def devices_of(slices: list[ResourceSlice]) -> list[Device]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def counter_sets_of(slices: list[ResourceSlice]) -> list[CounterSet]:
    return [c for s in slices for c in s["spec"].get("sharedCounters", [])]


def shape(slices: list[ResourceSlice]) -> list[tuple[int, int]]:
    """(devices, counter sets) per slice."""
    return [(len(s["spec"].get("devices", [])), len(s["spec"].get("sharedCounters", []))) for s in slices]


def plain_devices(count: int, prefix: str = "dev") -> list[Device]:
    return [
        {"name": f"{prefix}-{i}", "attributes": {"type": {"string": "gpu"}}, "capacity": {}}
        for i in range(count)
    ]


def counter_set(name: str, counters: int) -> CounterSet:
    return {"name": name, "counters": {f"c-{i}": {"value": "1"} for i in range(counters)}}


def consuming(counter_set: CounterSet, count: int, *, counters: int = 1) -> list[Device]:
    """`count` devices each consuming the first `counters` counters of `counter_set`."""
    used = dict(list(counter_set["counters"].items())[:counters])
    return [
        {
            "name": f"{counter_set['name']}-dev-{i}",
            "attributes": {},
            "capacity": {},
            "consumesCounters": [{"counterSet": counter_set["name"], "counters": used}],
        }
        for i in range(count)
    ]


def counted_model(sets: int, devices_per_set: int, *, counters: int = 15, consumed: int = 1) -> DeviceModel:
    counter_sets = [counter_set(f"set-{i}", counters) for i in range(sets)]
    devices = [d for s in counter_sets for d in consuming(s, devices_per_set, counters=consumed)]
    return DeviceModel(devices=devices, counter_sets=counter_sets)


# ---- shape of what is published


def test_slice_objects() -> None:
    model = build_devices(inv.h100_node(), mig_mode="partitionable")
    slices = publish(model, 36, node_uid="8c1e-uid", generation=7)
    assert [s["metadata"]["name"] for s in slices] == [f"node-a-gpu-gpudra-io-{i}" for i in range(5)]
    for slice_ in slices:
        assert slice_["apiVersion"] == "resource.k8s.io/v1"
        assert slice_["kind"] == "ResourceSlice"
        assert slice_["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "8c1e-uid", "controller": True}
        ]
        spec = slice_["spec"]
        assert (spec["driver"], spec["nodeName"]) == (DRIVER, "node-a")
        assert spec["pool"] == {"name": "node-a", "generation": 7, "resourceSliceCount": 5}


def test_no_owner_reference_without_the_node_uid() -> None:
    slices = publish(build_devices(inv.mixed_node(), mig_mode="static"), 36)
    assert slices and all("ownerReferences" not in s["metadata"] for s in slices)


def test_republishing_the_same_model_gives_the_same_slices() -> None:
    model = build_devices(inv.a100_node(), mig_mode="partitionable")
    assert publish(model, 34) == publish(build_devices(inv.a100_node(), mig_mode="partitionable"), 34)


def test_slice_names_of_a_very_long_node_name_stay_valid_and_distinct() -> None:
    node = ".".join(["a" * 62] * 4) + "-x"  # 253 characters
    model = DeviceModel(devices=plain_devices(300), counter_sets=[])
    names = [s["metadata"]["name"] for s in publish(model, 36, node_name=node)]
    assert len(names) == 3 == len(set(names))
    assert all(len(n) <= 253 and DNS_SUBDOMAIN.fullmatch(n) for n in names), names
    assert names == [s["metadata"]["name"] for s in publish(model, 36, node_name=node)]
    assert validate_slices(publish(model, 36, node_name=node), server_minor=36) == []


def test_a_node_without_devices_publishes_one_empty_slice() -> None:
    (slice_,) = publish(DeviceModel(devices=[], counter_sets=[]), 36)
    assert "devices" not in slice_["spec"] and "sharedCounters" not in slice_["spec"]
    assert slice_["spec"]["pool"]["resourceSliceCount"] == 1


def test_servers_before_1_34_are_refused() -> None:
    with pytest.raises(ClusterError, match=r"1\.33 does not serve resource\.k8s\.io/v1"):
        publish(DeviceModel(devices=[], counter_sets=[]), 33)
    assert validate_slices([], server_minor=33) == [
        "Kubernetes 1.33 does not serve resource.k8s.io/v1; gpudra needs 1.34 or newer"
    ]


REALISTIC_COUNTS = [
    # inventory, mode, server minor, devices, counter sets, (devices, counter sets) per slice
    # (each whole GPU comes with its shared device; one without MIG partitions, with a one-counter set)
    ("h100", "partitionable", 34, 216, 8, [(81, 3), (81, 3), (54, 2)]),
    ("h100", "partitionable", 36, 216, 8, [(0, 8), (64, 0), (64, 0), (64, 0), (24, 0)]),
    ("h100", "static", 34, 13, 4, [(13, 4)]),
    ("h100", "static", 36, 13, 4, [(0, 4), (13, 0)]),
    ("a100", "partitionable", 34, 154, 8, [(50, 2), (50, 2), (54, 4)]),
    ("a100", "partitionable", 36, 154, 8, [(0, 8), (64, 0), (64, 0), (26, 0)]),
    ("a100", "static", 34, 13, 2, [(13, 2)]),
    ("a100", "static", 36, 13, 2, [(0, 2), (13, 0)]),
    ("mixed", "partitionable", 34, 8, 4, [(8, 4)]),
    ("mixed", "partitionable", 36, 8, 4, [(0, 4), (8, 0)]),
]


@pytest.mark.parametrize(
    ("name", "mode", "server_minor", "expected"),
    [(c[0], c[1], c[2], c[3:]) for c in REALISTIC_COUNTS],
    ids=[f"{c[0]}-{c[1]}-1.{c[2]}" for c in REALISTIC_COUNTS],
)
def test_realistic_inventories(name: str, mode: str, server_minor: int, expected: tuple[object, ...]) -> None:
    model = build_devices(inv.REALISTIC[name](), mig_mode=mode)
    slices = publish(model, server_minor)
    assert (len(model.devices), len(model.counter_sets), shape(slices)) == expected
    assert validate_slices(slices, server_minor=server_minor) == []
    assert devices_of(slices) == model.devices
    assert counter_sets_of(slices) == model.counter_sets


# ---- splitting at the limits


SPLITS = [
    # server minor, plain devices, counter sets of 15 counters, devices per set, (devices, sets) per slice
    (34, 128, 0, 0, [(128, 0)]),
    (34, 129, 0, 0, [(128, 0), (1, 0)]),
    (35, 128, 0, 0, [(128, 0)]),
    (35, 129, 0, 0, [(128, 0), (1, 0)]),
    (36, 129, 0, 0, [(128, 0), (1, 0)]),
    (35, 0, 1, 64, [(0, 1), (64, 0)]),
    (35, 0, 1, 65, [(0, 1), (64, 0), (1, 0)]),
    (36, 0, 1, 64, [(0, 1), (64, 0)]),
    (36, 0, 1, 65, [(0, 1), (64, 0), (1, 0)]),
    (36, 100, 1, 1, [(0, 1), (100, 0), (1, 0)]),  # a consuming device would cap the first slice at 64
    (35, 0, 8, 1, [(0, 8), (8, 0)]),
    (35, 0, 9, 1, [(0, 8), (0, 1), (9, 0)]),
    (36, 0, 9, 1, [(0, 8), (0, 1), (9, 0)]),
    (34, 0, 1, 128, [(128, 1)]),  # on 1.34 counters never lower the device limit
    (34, 0, 2, 1, [(2, 2)]),  # 2 x 15 counters fit the 32 a slice may hold
    (34, 0, 3, 1, [(2, 2), (1, 1)]),
    (34, 0, 2, 64, [(128, 2)]),
    (34, 0, 2, 65, [(65, 1), (65, 1)]),
    (34, 10, 1, 120, [(10, 0), (120, 1)]),
]


@pytest.mark.parametrize(
    ("server_minor", "plain", "sets", "per_set", "layout"),
    SPLITS,
    ids=[f"1.{c[0]}-{c[1]}plain-{c[2]}x{c[3]}" for c in SPLITS],
)
def test_split_at_the_limits(
    server_minor: int, plain: int, sets: int, per_set: int, layout: list[tuple[int, int]]
) -> None:
    counted = counted_model(sets, per_set)
    model = DeviceModel(devices=plain_devices(plain) + counted.devices, counter_sets=counted.counter_sets)
    slices = publish(model, server_minor)
    assert shape(slices) == layout
    assert validate_slices(slices, server_minor=server_minor) == []
    assert devices_of(slices) == model.devices


def test_1_34_keeps_the_device_counters_of_a_slice_within_1024() -> None:
    # two sets of 10 counters, 60 devices each consuming all 10: 1200 together, so apart
    model = counted_model(2, 60, counters=10, consumed=10)
    assert shape(publish(model, 34)) == [(60, 1), (60, 1)]
    assert validate_slices(publish(model, 34), server_minor=34) == []


def test_1_34_devices_share_a_slice_with_the_counter_set_they_consume() -> None:
    slices = publish(build_devices(inv.h100_node(), mig_mode="partitionable"), 34)
    for slice_ in slices:
        own = {c["name"] for c in slice_["spec"]["sharedCounters"]}
        used = {u["counterSet"] for d in slice_["spec"]["devices"] for u in d.get("consumesCounters", [])}
        assert used == own


def test_1_35_keeps_counter_sets_apart_from_devices() -> None:
    slices = publish(build_devices(inv.h100_node(), mig_mode="partitionable"), 35)
    assert all(not ("devices" in s["spec"] and "sharedCounters" in s["spec"]) for s in slices)


@pytest.mark.parametrize("server_minor", MINORS)
def test_a_counter_set_over_32_counters_cannot_be_published(server_minor: int) -> None:
    with pytest.raises(NotSupported, match=r"counter set set-0 has 33 counters.*at most 32.*static MIG mode"):
        publish(counted_model(1, 1, counters=33), server_minor)


@pytest.mark.parametrize(
    ("per_set", "consumed", "message"),
    [(129, 1, "129 devices consume counter set set-0.*at most 128"), (69, 15, "1035 counters in all.*1024")],
    ids=["devices", "consumed-counters"],
)
def test_1_34_refuses_a_counter_set_whose_devices_cannot_share_one_slice(
    per_set: int, consumed: int, message: str
) -> None:
    with pytest.raises(NotSupported, match=message):
        publish(counted_model(1, per_set, consumed=consumed), 34)
    assert validate_slices(publish(counted_model(1, per_set, consumed=consumed), 36), server_minor=36) == []


def test_a_gpu_with_many_profiles_is_spread_over_slices_from_1_35() -> None:
    model = build_devices(inv.node(inv.many_profiles_gpu()), mig_mode="partitionable")
    assert len(model.devices) == 2 + 20 * 8 + 1
    assert shape(publish(model, 36)) == [(0, 1), (64, 0), (64, 0), (35, 0)]
    with pytest.raises(NotSupported, match="163 devices consume counter set gpu-0-counters"):
        publish(model, 34)


@pytest.mark.parametrize(
    ("server_minor", "expected"),
    [(34, [(81, 3)] * 21 + [(27, 1)]), (36, [(0, 8)] * 8 + [(64, 0)] * 27)],
    ids=["1.34", "1.36"],
)
def test_64_gpus(server_minor: int, expected: list[tuple[int, int]]) -> None:
    model = build_devices(inv.big_node(64), mig_mode="partitionable")
    slices = publish(model, server_minor)
    assert (len(model.devices), len(model.counter_sets), shape(slices)) == (64 * 27, 64, expected)
    assert validate_slices(slices, server_minor=server_minor) == []


@pytest.mark.parametrize("server_minor", MINORS)
def test_a_gpu_with_too_many_memory_slices_for_one_counter_set_is_refused(server_minor: int) -> None:
    one_slice = inv.profile((1, "1g.2gb", 1, 33, range(33), 1, 4, 1, 0, 0, 0, 2048))
    gpu = inv.synthetic_gpu(0, [one_slice], memory_slices=33, memory_mib=67584)
    model = build_devices(inv.node(gpu), mig_mode="partitionable")
    with pytest.raises(NotSupported, match="counter set gpu-0-counters has 33 counters"):
        publish(model, server_minor)


# ---- validation: each rule, broken once


def base(server_minor: int) -> list[Any]:
    """A valid pool: an H100 (partitionable) and an L4; one slice on 1.34, counters + devices from 1.35.

    Typed as plain JSON, since the breakers below write what the TypedDicts would not allow.
    """
    model = build_devices(inv.node(inv.h100(0), inv.plain(1, "l4")), mig_mode="partitionable")
    return list(publish(model, server_minor))


def first_device(slices: list[Any]) -> Any:
    return devices_of(slices)[0]


def device_slice(slices: list[Any]) -> Any:
    return next(s for s in slices if s["spec"].get("devices"))


def counter_slice(slices: list[Any]) -> Any:
    return next(s for s in slices if s["spec"].get("sharedCounters"))


def attributes(slices: list[Any]) -> Any:
    return first_device(slices)["attributes"]


def gpu_counters(slices: list[Any]) -> Any:
    return counter_slice(slices)["spec"]["sharedCounters"][0]["counters"]


def consumption(slices: list[Any]) -> Any:
    return first_device(slices)["consumesCounters"][0]


def grow(counters: dict[str, Any], total: int) -> None:
    """Counters `x-<i>` added until there are `total`."""
    counters.update({f"x-{i}": {"value": "1"} for i in range(total - len(counters))})


def shared_device(slices: list[Any]) -> Any:
    return next(d for d in devices_of(slices) if d.get("allowMultipleAllocations"))


def memory_policy(slices: list[Any]) -> Any:
    return shared_device(slices)["capacity"]["memory"]["requestPolicy"]


def many_devices(slices: list[Any], count: int, *, taints: int = 0) -> None:
    extra: list[Any] = plain_devices(count, "extra")
    for device in extra:
        device["taints"] = [{"key": f"k{i}", "effect": "NoSchedule"} for i in range(taints)]
    device_slice(slices)["spec"]["devices"] = extra


def second_slice(slices: list[Any]) -> list[Any]:
    """`slices` plus a renamed copy of the last one and its devices; resourceSliceCount kept right."""
    twin = copy.deepcopy(slices[-1])
    twin["metadata"]["name"] += "-twin"
    for device in twin["spec"].get("devices", []):
        device["name"] += "-twin"
    slices.append(twin)
    for slice_ in slices:
        slice_["spec"]["pool"]["resourceSliceCount"] = len(slices)
    return slices


Breaker = Callable[[list[Any]], object]

BROKEN: list[tuple[str, list[int], Breaker, str]] = [
    ("slice-name", MINORS, lambda s: s[0]["metadata"].update(name="Node_A"), "name is not a DNS subdomain"),
    (
        "driver",
        MINORS,
        lambda s: s[0]["spec"].update(driver="gpu_gpudra"),
        "driver 'gpu_gpudra' is not a DNS",
    ),
    ("pool-name", MINORS, lambda s: [x["spec"]["pool"].update(name="a//b") for x in s], "pool name 'a//b'"),
    (
        "generation",
        MINORS,
        lambda s: [x["spec"]["pool"].update(generation=-1) for x in s],
        "generation -1 is negative",
    ),
    (
        "slice-count-zero",
        MINORS,
        lambda s: s[0]["spec"]["pool"].update(resourceSliceCount=0),
        "0 is not positive",
    ),
    (
        "slice-count-wrong",
        MINORS,
        lambda s: [x["spec"]["pool"].update(resourceSliceCount=5) for x in s],
        r"resourceSliceCount \[5\] but",
    ),
    (
        "generations-differ",
        [36],
        lambda s: s[0]["spec"]["pool"].update(generation=2),
        r"generations \[1, 2\]",
    ),
    ("node-name", MINORS, lambda s: s[0]["spec"].update(nodeName=""), "nodeName must be set"),
    (
        "device-name",
        MINORS,
        lambda s: first_device(s).update(name="GPU.0"),
        "device GPU.0: name is not a DNS label",
    ),
    ("device-name-long", MINORS, lambda s: first_device(s).update(name="g" * 64), "is not a DNS label"),
    (
        "attribute-identifier",
        MINORS,
        lambda s: attributes(s).update({"x" * 33: {"int": 1}}),
        "C identifier of at most 32",
    ),
    (
        "attribute-domain",
        MINORS,
        lambda s: attributes(s).update({"bad_domain/x": {"int": 1}}),
        "domain 'bad_domain'",
    ),
    (
        "attribute-two-values",
        MINORS,
        lambda s: attributes(s).update(index={"int": 0, "string": "0"}),
        "exactly one of",
    ),
    ("attribute-no-value", MINORS, lambda s: attributes(s).update(index={}), "exactly one of"),
    ("attribute-kind", MINORS, lambda s: attributes(s).update(index={"float": 1.5}), "'float' is not one of"),
    (
        "int-type",
        MINORS,
        lambda s: attributes(s).update(index={"int": "0"}),
        "int '0' is not a 64-bit integer",
    ),
    ("int-bool", MINORS, lambda s: attributes(s).update(index={"int": True}), "is not a 64-bit integer"),
    ("int-range", MINORS, lambda s: attributes(s).update(index={"int": 2**63}), "is not a 64-bit integer"),
    (
        "bool-type",
        MINORS,
        lambda s: attributes(s).update(migCapable={"bool": 1}),
        "bool 1 is not true or false",
    ),
    (
        "string-long",
        MINORS,
        lambda s: attributes(s).update(brand={"string": "b" * 65}),
        "at most 64 characters",
    ),
    (
        "version-long",
        MINORS,
        lambda s: attributes(s).update(driverVersion={"version": "1.2.3-" + "a" * 60}),
        "at most 64 characters",
    ),
    (
        "version-leading-zero",
        MINORS,
        lambda s: attributes(s).update(driverVersion={"version": "580.65.06"}),
        "version '580.65.06' is not semver",
    ),
    (
        "version-prefix",
        MINORS,
        lambda s: attributes(s).update(driverVersion={"version": "v1.2.3"}),
        "is not semver",
    ),
    (
        "capacity-name",
        MINORS,
        lambda s: first_device(s)["capacity"].update({"bad name": {"value": "1"}}),
        "capacity name 'bad name'",
    ),
    (
        "capacity-value",
        MINORS,
        lambda s: first_device(s)["capacity"].update(memory={"value": "80GB"}),
        "capacity memory needs a quantity",
    ),
    (
        "allow-multiple-allocations-type",
        MINORS,
        lambda s: shared_device(s).update(allowMultipleAllocations="yes"),
        "allowMultipleAllocations 'yes' is not true or false",
    ),
    (
        "request-policy-of-an-exclusive-device",
        MINORS,
        lambda s: shared_device(s).pop("allowMultipleAllocations"),
        "capacity memory: requestPolicy is allowed only with allowMultipleAllocations",
    ),
    (
        "request-policy-default-missing",
        MINORS,
        lambda s: memory_policy(s).pop("default"),
        "requestPolicy: default is required with validRange",
    ),
    (
        "request-policy-quantity",
        MINORS,
        lambda s: memory_policy(s).update(default="lots"),
        "requestPolicy: default 'lots' is not a quantity",
    ),
    (
        "request-policy-both",
        MINORS,
        lambda s: memory_policy(s).update(validValues=["1Gi"]),
        "sets both validValues and validRange",
    ),
    (
        "request-policy-min-missing",
        MINORS,
        lambda s: memory_policy(s)["validRange"].pop("min"),
        "validRange.min is required",
    ),
    (
        "request-policy-min-over-value",
        MINORS,
        lambda s: memory_policy(s)["validRange"].update(min="81Gi"),
        "validRange.min is larger than the capacity's value",
    ),
    (
        "request-policy-default-under-min",
        MINORS,
        lambda s: memory_policy(s).update(default="512Mi"),
        "default is less than validRange.min",
    ),
    (
        "request-policy-min-over-max",
        MINORS,
        lambda s: memory_policy(s)["validRange"].update(min="2Gi", max="1Gi"),
        "validRange.min is larger than validRange.max",
    ),
    (
        "request-policy-max-over-value",
        MINORS,
        lambda s: memory_policy(s)["validRange"].update(max="80Gi"),
        "validRange.max is larger than the capacity's value",
    ),
    (
        "request-policy-default-over-max",
        MINORS,
        lambda s: memory_policy(s).update(default="80Gi"),
        "default is more than validRange.max",
    ),
    (
        "request-policy-one-step-over-value",
        MINORS,
        lambda s: shared_device(s)["capacity"]["memory"].update(value="1536Mi"),
        "validRange.min plus one step is larger than the capacity's value",
    ),
    (
        "request-policy-default-off-step",
        MINORS,
        lambda s: memory_policy(s).update(default="1536Mi"),
        "default is not a whole number of steps from validRange.min",
    ),
    (
        "request-policy-max-off-step",
        MINORS,
        lambda s: memory_policy(s)["validRange"].update(max="1536Mi"),
        "validRange.max is not a whole number of steps from validRange.min",
    ),
    (
        "request-policy-step-zero",
        MINORS,
        lambda s: memory_policy(s)["validRange"].update(step="0"),
        "validRange.step is not positive",
    ),
    (
        "valid-values-order",
        MINORS,
        lambda s: memory_policy(s).update(validRange=None, validValues=["2Gi", "1Gi"], default="1Gi"),
        "validValues are not in ascending order",
    ),
    (
        "valid-values-default",
        MINORS,
        lambda s: memory_policy(s).update(validRange=None, validValues=["1Gi", "2Gi"], default="3Gi"),
        "default is not one of validValues",
    ),
    (
        "valid-values-over-value",
        MINORS,
        lambda s: memory_policy(s).update(validRange=None, validValues=["1Gi", "100Gi"], default="1Gi"),
        "a validValues option is larger than the capacity's value",
    ),
    (
        "valid-values-eleven",
        MINORS,
        lambda s: memory_policy(s).update(
            validRange=None, validValues=[f"{i}Gi" for i in range(1, 12)], default="1Gi"
        ),
        "11 validValues; at most 10",
    ),
    (
        "attribute-in-the-drivers-own-domain",
        MINORS,
        lambda s: first_device(s)["attributes"].update({f"{DRIVER}/serial": {"string": "1"}}),
        f"attribute name '{DRIVER}/serial' carries the driver's own domain: write it bare, 'serial'",
    ),
    (
        "capacity-in-the-drivers-own-domain",
        MINORS,
        lambda s: first_device(s)["capacity"].update({f"{DRIVER}/slots": {"value": "1"}}),
        f"capacity name '{DRIVER}/slots' carries the driver's own domain",
    ),
    (
        "attributes-and-capacities",
        MINORS,
        lambda s: first_device(s)["capacity"].update({f"c{i}": {"value": "1"} for i in range(11)}),
        "16 attributes and 18 capacities; at most 32",
    ),
    (
        "consumption-repeated",
        MINORS,
        lambda s: first_device(s)["consumesCounters"].append(
            copy.deepcopy(first_device(s)["consumesCounters"][0])
        ),
        "in 2 entries; one per set",
    ),
    (
        "consumption-set-name",
        MINORS,
        lambda s: consumption(s).update(counterSet="Set_0"),
        "'Set_0' is not a DNS label",
    ),
    (
        "consumption-counters",
        [35, 36],
        lambda s: grow(consumption(s)["counters"], 33),
        "33 counters; at most 32",
    ),
    (
        "consumption-counter-name",
        MINORS,
        lambda s: consumption(s)["counters"].update({"Memory": {"value": "1"}}),
        "counter name 'Memory' is not a DNS label",
    ),
    (
        "consumption-counter-value",
        MINORS,
        lambda s: consumption(s)["counters"].update({"memory": {"value": "lots"}}),
        "counter memory needs a quantity",
    ),
    (
        "consumption-unknown-set",
        MINORS,
        lambda s: consumption(s).update(counterSet="gpu-9-counters"),
        "consumes counter set gpu-9-counters, which is not defined",
    ),
    (
        "consumption-unknown-counter",
        MINORS,
        lambda s: consumption(s)["counters"].update({"tensor-cores": {"value": "1"}}),
        "consumes counter tensor-cores, missing from set gpu-0-counters",
    ),
    (
        "three-consumptions",
        [35, 36],
        lambda s: first_device(s)["consumesCounters"].extend(
            [
                {"counterSet": "b", "counters": {"c": {"value": "1"}}},
                {"counterSet": "c", "counters": {"c": {"value": "1"}}},
            ]
        ),
        "consumes 3 counter sets; at most 2",
    ),
    (
        "device-counters-1.34",
        [34],
        lambda s: grow(consumption(s)["counters"], 33),
        "consumes 33 counters; at most 32 on Kubernetes 1.34",
    ),
    (
        "taints-1.34",
        [34],
        lambda s: first_device(s).update(taints=[{"key": f"k{i}", "effect": "NoSchedule"} for i in range(5)]),
        "5 taints; at most 4",
    ),
    (
        "taints",
        [35, 36],
        lambda s: first_device(s).update(
            taints=[{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)]
        ),
        "17 taints; at most 16",
    ),
    ("devices-129", MINORS, lambda s: many_devices(s, 129), "129 devices; at most 128"),
    ("devices-65-tainted", [35, 36], lambda s: many_devices(s, 65, taints=1), "65 devices; at most 64"),
    (
        "devices-65-consuming",
        [35, 36],
        lambda s: device_slice(s)["spec"]["devices"].extend(plain_devices(65 - len(devices_of(s)))),
        "65 devices; at most 64",
    ),
    (
        "counter-set-name",
        MINORS,
        lambda s: counter_slice(s)["spec"]["sharedCounters"][0].update(name="GPU-0"),
        "counter set name 'GPU-0' is not a DNS label",
    ),
    (
        "counter-set-empty",
        MINORS,
        lambda s: counter_slice(s)["spec"]["sharedCounters"].append({"name": "e", "counters": {}}),
        "counter set e lists no counters",
    ),
    (
        "counter-set-33",
        [35, 36],
        lambda s: grow(gpu_counters(s), 33),
        "counter set gpu-0-counters has 33 counters; at most 32",
    ),
    (
        "counter-name",
        MINORS,
        lambda s: gpu_counters(s).update({"Memory": {"value": "1"}}),
        "counter name 'Memory'",
    ),
    (
        "counter-value",
        MINORS,
        lambda s: gpu_counters(s).update(memory={"value": ""}),
        "counter memory needs a quantity",
    ),
    (
        "devices-with-counters",
        [35, 36],
        lambda s: device_slice(s)["spec"].update(sharedCounters=[counter_set("x", 1)]),
        "holds both devices and sharedCounters",
    ),
    (
        "nine-counter-sets",
        [35, 36],
        lambda s: counter_slice(s)["spec"].update(
            sharedCounters=[counter_set(f"s-{i}", 1) for i in range(9)]
        ),
        "9 counter sets; at most 8",
    ),
    (
        "shared-counters-1.34",
        [34],
        lambda s: s[0]["spec"]["sharedCounters"].append(counter_set("x", 33 - len(gpu_counters(s)))),
        r"3\d shared counters; at most 32",
    ),
    (
        "device-counters-per-slice-1.34",
        [34],
        lambda s: s[0]["spec"]["devices"].extend(consuming(gpu_counters_set(s), 94, counters=10)),
        r"devices consume \d+ counters; at most 1024",
    ),
    (
        "counter-set-twice-1.34",
        [34],
        lambda s: s[0]["spec"]["sharedCounters"].append(copy.deepcopy(gpu_counters_set(s))),
        "counter set gpu-0-counters is defined 2 times",
    ),
    (
        "counter-set-in-another-slice-1.34",
        [34],
        lambda s: second_slice(s)[1]["spec"].pop("sharedCounters"),
        "consumes counter set gpu-0-counters, which is not defined",
    ),
    (
        "counter-set-twice-in-pool",
        [35, 36],
        lambda s: second_slice(s)[0]["spec"]["sharedCounters"].append(counter_set("gpu-0-counters", 1)),
        "counter set gpu-0-counters is defined 2 times",
    ),
    (
        "device-name-twice",
        MINORS,
        lambda s: device_slice(s)["spec"]["devices"][1].update(name="gpu-0"),
        "device name gpu-0 is used 2 times",
    ),
    (
        "slice-name-twice",
        MINORS,
        lambda s: second_slice(s)[-1]["metadata"].update(name=s[0]["metadata"]["name"]),
        "slice name node-a-gpu-gpudra-io-0 is used 2 times",
    ),
]


def gpu_counters_set(slices: list[Any]) -> Any:
    return counter_slice(slices)["spec"]["sharedCounters"][0]


CASES = [(name, minor, breaker, message) for name, minors, breaker, message in BROKEN for minor in minors]


@pytest.mark.parametrize("server_minor", MINORS)
def test_the_base_pool_is_valid(server_minor: int) -> None:
    assert validate_slices(base(server_minor), server_minor=server_minor) == []


@pytest.mark.parametrize("server_minor", MINORS)
def test_a_valid_values_request_policy_passes(server_minor: int) -> None:
    slices = base(server_minor)
    memory_policy(slices).update(validRange=None, validValues=["1Gi", "2Gi", "79Gi"], default="2Gi")
    assert validate_slices(slices, server_minor=server_minor) == []


@pytest.mark.parametrize(
    ("server_minor", "breaker", "message"),
    [case[1:] for case in CASES],
    ids=[f"{case[0]}-1.{case[1]}" for case in CASES],
)
def test_validate_slices_catches(server_minor: int, breaker: Breaker, message: str) -> None:
    slices = base(server_minor)
    breaker(slices)
    problems = validate_slices(slices, server_minor=server_minor)
    assert any(re.search(message, p) for p in problems), problems


def test_devices_with_counters_may_fill_128_on_1_34_but_not_later() -> None:
    model = counted_model(1, 128)
    slices = build_slices(model, driver=DRIVER, node_name="n", generation=0, server_minor=34)
    assert validate_slices(slices, server_minor=34) == []
    assert "128 devices; at most 64 here" in " ".join(validate_slices(slices, server_minor=35))


@pytest.mark.parametrize(
    ("server_minor", "expected"),
    [(34, [(100, 0)]), (35, [(64, 0), (36, 0)]), (36, [(64, 0), (36, 0)])],
    ids=["1.34", "1.35", "1.36"],
)
def test_a_health_taint_lowers_the_limit_of_its_slice_to_64(
    server_minor: int, expected: list[tuple[int, int]]
) -> None:
    inventory = inv.node(*(inv.plain(m, "l4") for m in range(100)))
    # without shared devices, whose counters would lower the limit already
    model = build_devices(inventory, mig_mode="partitionable", shares=False)
    assert shape(publish(model, server_minor)) == [(100, 0)]
    lost = inventory.gpus[10].uuid
    slices = publish(
        with_health_taints(model, _gpu_taints(model, {lost: "NVMLError_GpuIsLost"})), server_minor
    )
    assert shape(slices) == expected
    assert validate_slices(slices, server_minor=server_minor) == []
    assert [d["name"] for d in devices_of(slices)] == [d["name"] for d in model.devices]
    assert [d["name"] for d in devices_of(slices) if d.get("taints")] == ["gpu-10"]


def _gpu_taints(model: DeviceModel, lost: dict[str, str]) -> dict[str, DeviceTaint]:
    """The taints of each device of the `lost` GPUs (UUID -> reason)."""
    return device_taints(device_gpus={d["name"]: gpu_uuid_of(d) for d in model.devices}, lost=lost, marks=())


# ---- any inventory: published slices pass validation and carry the model unchanged


GPU_KINDS: dict[str, Callable[[int, bool], Gpu]] = {
    "h100": lambda m, on: inv.h100(
        m, mig_enabled=on, layout=[("3g.40gb", 4), ("1g.10gb+me", 0)] if on else []
    ),
    "a100": lambda m, on: inv.a100(m, mig_enabled=on, layout=[("4g.20gb", 0)] if on else []),
    "a30": lambda m, on: inv.a30(m),
    "l4": lambda m, on: inv.plain(m, "l4"),
    "t4": lambda m, on: inv.plain(m, "t4"),
}


@settings(max_examples=60, deadline=None)
@given(
    gpus=st.lists(st.tuples(st.sampled_from(sorted(GPU_KINDS)), st.booleans()), max_size=24),
    mode=st.sampled_from(["partitionable", "static"]),
    server_minor=st.sampled_from(MINORS),
    generation=st.integers(min_value=0, max_value=2**40),
)
def test_published_slices_always_validate_and_preserve_the_model(
    gpus: list[tuple[str, bool]], mode: str, server_minor: int, generation: int
) -> None:
    inventory = inv.node(*(GPU_KINDS[kind](minor, on) for minor, (kind, on) in enumerate(gpus)))
    model = build_devices(inventory, mig_mode=mode)
    slices = publish(model, server_minor, generation=generation)
    assert validate_slices(slices, server_minor=server_minor) == []
    assert devices_of(slices) == model.devices
    assert counter_sets_of(slices) == model.counter_sets
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {generation}


@settings(max_examples=40, deadline=None)
@given(
    gpus=st.lists(st.tuples(st.sampled_from(sorted(GPU_KINDS)), st.booleans()), min_size=1, max_size=24),
    mode=st.sampled_from(["partitionable", "static"]),
    server_minor=st.sampled_from(MINORS),
    lost=st.sets(st.integers(min_value=0, max_value=23)),
)
def test_published_slices_with_unhealthy_gpus_always_validate(
    gpus: list[tuple[str, bool]], mode: str, server_minor: int, lost: set[int]
) -> None:
    inventory = inv.node(*(GPU_KINDS[kind](minor, on) for minor, (kind, on) in enumerate(gpus)))
    unhealthy = {gpu.uuid: "NVMLError_GpuIsLost" for gpu in inventory.gpus if gpu.minor in lost}
    model = build_devices(inventory, mig_mode=mode)
    model = with_health_taints(model, _gpu_taints(model, unhealthy))
    slices = publish(model, server_minor)
    assert validate_slices(slices, server_minor=server_minor) == []
    assert devices_of(slices) == model.devices
