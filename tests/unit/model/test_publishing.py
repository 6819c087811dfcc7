"""What a node publishes besides whole GPUs: fitted to what the API server keeps, and the warnings when
something is withheld or costs the cluster's scheduler."""

from __future__ import annotations

import dataclasses

import pytest

from gpudra.errors import ConfigError
from gpudra.kube.field_probe import read_fields
from gpudra.model import devices
from gpudra.model.publishing import (
    Publishing,
    ServerFields,
    counter_sets_slow_scheduler,
    fit_to_server,
    parse_feature_gates,
)
from gpudra.node.claim_reader import NodeDevices
from gpudra.node.served_model import ServedModel
from tests.unit import inventories as inv
from tests.unit.harness.kube import Events
from tests.unit.harness.slices import served

EVERYTHING = Publishing(mig_mode="partitionable", shares=True)
ALL_KEPT = {"counters": True, "consumable_capacity": True, "device_taints": True}


@pytest.mark.parametrize(("minor", "slow"), [(34, True), (35, True), (36, True), (37, False), (38, False)])
def test_which_releases_pay_for_counter_sets(minor: int, slow: bool) -> None:
    assert counter_sets_slow_scheduler(minor) is slow


def test_counter_sets_on_a_slow_release_are_reported_once() -> None:
    model, events = served(EVERYTHING, ServerFields(minor=36, **ALL_KEPT))
    model.on_server(36)
    model.on_server(36)  # the server version is read again after an error: still one event
    ((type_, reason, message),) = events.posted
    assert (type_, reason) == ("Warning", "CounterSetsSlowScheduler")
    assert "1.36 scheduler" in message and "docs/install.md" in message


@pytest.mark.parametrize(
    ("publishing", "minor"),
    [(Publishing(), 36), (EVERYTHING, 37)],
    ids=["default-on-1.36", "counters-on-1.37"],
)
def test_nothing_is_reported_when_the_scheduler_does_not_pay(publishing: Publishing, minor: int) -> None:
    model, events = served(publishing, ServerFields(minor=minor, **ALL_KEPT))
    model.on_server(minor)
    assert events.posted == []


@pytest.mark.parametrize(
    ("fields", "mig_mode", "shares", "withheld"),
    [
        (ServerFields(minor=37, **ALL_KEPT), "partitionable", True, []),
        (ServerFields(minor=36, **ALL_KEPT), "partitionable", True, []),
        (ServerFields(minor=35, **ALL_KEPT), "partitionable", False, ["shares"]),
        (
            ServerFields(minor=35, counters=True, consumable_capacity=False, device_taints=True),
            "partitionable",
            False,
            ["shares"],
        ),
        (
            ServerFields(minor=34, counters=False, consumable_capacity=False, device_taints=False),
            "static",
            False,
            ["partitions", "shares", "health-taints"],
        ),
    ],
    ids=["1.37", "1.36", "1.35-all-gates", "1.35-no-consumable-capacity", "1.34-default-gates"],
)
def test_what_a_server_cannot_keep_exclusive_is_withheld(
    fields: ServerFields, mig_mode: str, shares: bool, withheld: list[str]
) -> None:
    fitted, left_out = fit_to_server(EVERYTHING, fields)
    assert (fitted.mig_mode, fitted.shares) == (mig_mode, shares)
    assert [w.form for w in left_out] == withheld


def test_a_server_without_the_gates_gets_one_form_per_gpu_and_no_counters() -> None:
    model, events = served(
        EVERYTHING, ServerFields(minor=34, counters=False, consumable_capacity=False, device_taints=False)
    )
    model.on_server(34)
    published = model.model({})
    assert published.counter_sets == []
    assert not any("consumesCounters" in d or "allowMultipleAllocations" in d for d in published.devices)
    assert events.reasons() == ["PublishingWithheld"] * 3
    uuid = inv.h100_node().gpus[0].uuid
    # no taints kept: an unhealthy GPU is left out rather than published tainted (and ignored)
    taint: devices.DeviceTaint = {"key": "gpudra.io/unhealthy", "effect": "NoSchedule"}
    unhealthy = {d["name"]: taint for d in published.devices if devices.gpu_uuid_of(d) == uuid}
    left = model.model(unhealthy).devices
    assert unhealthy and not any(devices.gpu_uuid_of(d) == uuid for d in left)
    assert len(left) == len(published.devices) - len(unhealthy)


def test_a_server_that_gains_the_gates_gets_the_forms_back() -> None:
    fields = [ServerFields(minor=36, counters=False, consumable_capacity=False, device_taints=True)]
    events = Events()
    model = ServedModel(
        inv.h100_node(),
        EVERYTHING,
        model=devices.publish(inv.h100_node(), EVERYTHING),
        probe=lambda minor: fields[0],
        events=events,
    )
    model.on_server(36)
    assert not model.model({}).counter_sets
    fields[0] = ServerFields(minor=36, **ALL_KEPT)
    model.on_server(36)
    assert model.model({}).counter_sets and model.withheld == []
    assert events.reasons() == [
        "PublishingWithheld",
        "PublishingWithheld",
        "PublishingRestored",
        "PublishingRestored",
        "CounterSetsSlowScheduler",
    ]


def test_read_fields_finds_what_the_server_dropped() -> None:
    kept = [
        {"spec": {"sharedCounters": [{"name": "probe-counters"}]}},
        {
            "spec": {
                "devices": [
                    {
                        "name": "probe-0",
                        "capacity": {"memory": {"value": "2Gi", "requestPolicy": {"default": "1Gi"}}},
                        "allowMultipleAllocations": True,
                        "consumesCounters": [{"counterSet": "probe-counters"}],
                        "taints": [{"key": "k", "effect": "NoSchedule"}],
                    }
                ]
            }
        },
    ]
    assert read_fields(kept, minor=36) == ServerFields(minor=36, **ALL_KEPT)
    dropped = [
        {"spec": {}},
        {"spec": {"devices": [{"name": "probe-0", "capacity": {"memory": {"value": "2Gi"}}}]}},
    ]
    assert read_fields(dropped, minor=34) == ServerFields(
        minor=34, counters=False, consumable_capacity=False, device_taints=False
    )


def test_describe_names_what_is_offered() -> None:
    assert Publishing().describe() == "whole GPUs, existing MIG devices, no shares"
    profiles = frozenset({"3g.40gb", "1g.10gb"})
    offered = Publishing(mig_mode="partitionable", shares=True, mig_profiles=profiles)
    assert offered.describe() == "whole GPUs, MIG partitions on demand (1g.10gb,3g.40gb), shares"


def test_without_partitions_an_idle_mig_mode_hopper_is_offered_whole() -> None:
    """Partitions asked but withheld: a Hopper in MIG mode without MIG devices would offer nothing at all;
    it is offered whole (prepare switches MIG off), one form per GPU. An A100 in MIG mode cannot switch."""
    node = inv.h100_node()
    in_mig_mode = dataclasses.replace(
        node, gpus=tuple(dataclasses.replace(g, mig_enabled=True, mig_devices=()) for g in node.gpus)
    )
    fitted, _ = fit_to_server(
        EVERYTHING, ServerFields(minor=34, counters=False, consumable_capacity=False, device_taints=True)
    )
    assert fitted == Publishing(mig_mode="static", switch_idle_mig=True)
    names = [d["name"] for d in devices.publish(in_mig_mode, fitted).devices]
    assert names == [f"gpu-{g.minor}" for g in sorted(node.gpus, key=lambda g: g.minor)]
    assert devices.publish(in_mig_mode, Publishing()).devices == []  # the plain default leaves MIG alone
    a100 = inv.a100_node()
    a100_in_mig = dataclasses.replace(
        a100, gpus=tuple(dataclasses.replace(g, mig_enabled=True, mig_devices=()) for g in a100.gpus)
    )
    assert devices.publish(a100_in_mig, fitted).devices == []


@pytest.mark.parametrize(
    ("minor", "gates", "expected"),
    [
        (34, {}, (False, False, False)),
        (35, {}, (False, False, False)),
        (35, {"DRAPartitionableDevices": True, "DRADeviceTaints": True}, (True, False, True)),
        (36, {}, (True, True, True)),
        (37, {"DRAConsumableCapacity": False}, (True, False, True)),
    ],
)
def test_a_release_keeps_what_its_gates_turn_on(
    minor: int, gates: dict[str, bool], expected: tuple[bool, bool, bool]
) -> None:
    fields = ServerFields.of_release(minor, gates)
    assert (fields.minor, fields.counters, fields.consumable_capacity, fields.device_taints) == (
        minor,
        *expected,
    )


# (release, gates on) -> form -> what would serve it: the release table of docs/install.md
PARTITIONS = "MIG partitions on demand need feature gate DRAPartitionableDevices (on by default from 1.36)"
SHARES = "GPU shares are not available before Kubernetes 1.36"
SHARES_GATES = (
    f"{SHARES} (feature gates DRAPartitionableDevices and DRAConsumableCapacity on by default there)"
)
TAINTS = "taints on unhealthy GPUs need feature gate DRADeviceTaints (on by default from 1.36)"
NEEDS = {
    (34, False): {
        "partitions": PARTITIONS,
        "shares": SHARES_GATES,
        "health-taints": f"{TAINTS}; on 1.34 also --runtime-config=resource.k8s.io/v1alpha3=true",
    },
    (35, False): {"partitions": PARTITIONS, "shares": SHARES_GATES, "health-taints": TAINTS},
    (34, True): {"shares": SHARES},
    (35, True): {"shares": SHARES},
    (36, False): {},
    (37, False): {},
}


@pytest.mark.parametrize(
    ("minor", "gated"), list(NEEDS), ids=[f"1.{m}{'-gates' if g else ''}" for m, g in NEEDS]
)
def test_each_withheld_form_says_which_gate_or_release_serves_it(minor: int, gated: bool) -> None:
    gates = dict.fromkeys(("DRAPartitionableDevices", "DRAConsumableCapacity", "DRADeviceTaints"), gated)
    _, withheld = fit_to_server(EVERYTHING, ServerFields.of_release(minor, gates if gated else {}))
    assert {w.form: w.needs for w in withheld} == NEEDS[(minor, gated)]
    for item in withheld:
        assert item.why.startswith(item.cause)  # the Node event's line begins with the same cause


def test_the_node_event_still_names_the_gate_that_is_off() -> None:
    _, withheld = fit_to_server(EVERYTHING, ServerFields.of_release(35))
    assert [w.why.split(":")[0] for w in withheld] == [
        "the API server drops counter sets (feature gate DRAPartitionableDevices is off)",
        "the API server drops counter sets (feature gate DRAPartitionableDevices is off)",
        "the API server drops device taints (feature gate DRADeviceTaints is off)",
    ]
    assert [w.gates for w in withheld] == [
        ("DRAPartitionableDevices",),
        ("DRAPartitionableDevices", "DRAConsumableCapacity"),
        ("DRADeviceTaints",),
    ]


def test_feature_gates_are_read_as_the_components_take_them() -> None:
    assert parse_feature_gates("DRAPartitionableDevices=true, DRADeviceTaints=False,") == {
        "DRAPartitionableDevices": True,
        "DRADeviceTaints": False,
    }
    with pytest.raises(
        ConfigError, match="--feature-gates: 'DRADeviceTaints' is not Gate=true or Gate=false"
    ):
        parse_feature_gates("DRADeviceTaints")


def test_prepare_is_told_the_devices_of_the_model_fitted_to_the_server() -> None:
    """Partitions withheld: a MIG device that exists is published with its uuid (static), and prepare
    must read it so, or it would try to create the partition an administrator already made."""
    node = inv.node(inv.h100(0, mig_enabled=True, layout=[("3g.40gb", 4)]), inv.h100(1))
    told: list[devices.DeviceModel] = []
    model = ServedModel(
        node,
        EVERYTHING,
        model=devices.publish(node, EVERYTHING),
        probe=ServerFields.of_release,
        events=Events(),
        on_model=told.append,
    )
    model.on_server(35)
    [fitted] = told
    existing = [d for d in fitted.devices if "-mig-" in d["name"]]
    assert [d["name"] for d in existing] == ["gpu-0-mig-3g40gb-4"] and "uuid" in existing[0]["attributes"]
    model.on_server(35)
    assert len(told) == 1  # the same server: the same model, nothing new to tell


def test_prepare_reads_the_devices_published_now_and_keeps_those_published_before() -> None:
    node = inv.node(inv.h100(0, mig_enabled=True, layout=[("3g.40gb", 4)]), inv.h100(1))
    before = {d["name"]: d for d in devices.publish(node, EVERYTHING).devices}
    published = NodeDevices(node, before)
    assert published.published_uuid("gpu-0-mig-3g40gb-4") is None  # a partition to be made on demand
    fitted, _ = fit_to_server(EVERYTHING, ServerFields.of_release(35))
    published.update({d["name"]: d for d in devices.publish(node, fitted).devices})
    assert published.published_uuid("gpu-0-mig-3g40gb-4") == node.gpus[0].mig_devices[0].uuid
    assert "gpu-1-mig-1g10gb-6" in published  # published before: a claim holding it still unprepares
