"""What a node publishes besides whole GPUs: fitted to what the API server keeps, and the warnings when
something is withheld or costs the cluster's scheduler."""

from __future__ import annotations

import dataclasses

import pytest

from gpudra.kube.field_probe import read_fields
from gpudra.model import devices
from gpudra.model.publishing import Publishing, ServerFields, counter_sets_slow_scheduler, fit_to_server
from gpudra.node.served_model import ServedModel
from tests.unit import inventories as inv
from tests.unit.harness.kube import Events

EVERYTHING = Publishing(mig_mode="partitionable", shares=True)
ALL_KEPT = {"counters": True, "consumable_capacity": True, "device_taints": True}


@pytest.mark.parametrize(("minor", "slow"), [(34, True), (35, True), (36, True), (37, False), (38, False)])
def test_which_releases_pay_for_counter_sets(minor: int, slow: bool) -> None:
    assert counter_sets_slow_scheduler(minor) is slow


def served(publishing: Publishing, fields: ServerFields) -> tuple[ServedModel, Events]:
    events = Events()
    return ServedModel(
        inv.h100_node(),
        publishing,
        model=devices.publish(inv.h100_node(), publishing),
        probe=lambda minor: fields,
        events=events,
    ), events


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
