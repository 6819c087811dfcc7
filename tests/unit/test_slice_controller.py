"""plan_sync and SliceController: what gets written to the API server, and how failures are retried."""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudra.errors import ClusterError
from gpudra.kube.client import Conflict, NotFound, Obj
from gpudra.kube.slice_sync import SPEC_HASH, SliceController, SyncPlan, plan_sync, spec_hash
from gpudra.model.devices import DeviceModel, build_devices
from gpudra.model.inventory import Inventory
from gpudra.model.slices import ResourceSlice, build_slices
from gpudra.quantity import parse_quantity
from tests.unit import inventories as inv

DRIVER = "gpu.gpudra.io"
NODE = "node-a"
NODE_UID = "6a1f3c2e-0000-4000-8000-000000000001"


def model_of(inventory: Inventory) -> DeviceModel:
    return build_devices(inventory, mig_mode="partitionable")


MODELS = {
    "h100": model_of(inv.h100_node()),
    "h100 newer driver": model_of(dataclasses.replace(inv.h100_node(), driver_version="580.82.07")),
    "big": model_of(inv.big_node(16)),
    "mixed": model_of(inv.mixed_node()),
    "empty": DeviceModel(devices=[], counter_sets=[]),
}


def builder(model: DeviceModel, server_minor: int = 35) -> Callable[[int], list[ResourceSlice]]:
    def build(generation: int) -> list[ResourceSlice]:
        return build_slices(
            model,
            driver=DRIVER,
            node_name=NODE,
            generation=generation,
            server_minor=server_minor,
            node_uid=NODE_UID,
        )

    return build


class FakeKube:
    """The slice half of gpudra.kube.client.Kube, in memory, storing objects as an API server does.

    Stored objects get server fields (uid, resourceVersion, managedFields, ...) and reformatted
    quantities, as a real server would return them; a replace with a stale resourceVersion or a create
    of an existing name is a Conflict. `failures` holds errors to raise from the next calls, in order.
    """

    def __init__(self, *, server_minor: int = 35) -> None:
        self.minor = server_minor
        self.slices: dict[str, Obj] = {}
        self.calls: list[str] = []
        self.times: list[float] = []
        self.failures: list[Exception | None] = []
        self._version = 100

    @property
    def writes(self) -> list[str]:
        return [call for call in self.calls if call.split()[0] in ("create", "replace", "delete")]

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.failures:
            failure = self.failures.pop(0)
            if failure is not None:
                raise failure

    def server_minor(self) -> int:
        self._call("server_minor")
        return self.minor

    def node_uid(self, name: str) -> str:
        self._call(f"node_uid {name}")
        return NODE_UID

    def list_slices(self, *, driver: str, node_name: str) -> list[Obj]:
        self.times.append(time.monotonic())
        self._call("list")
        return [
            copy.deepcopy(s)
            for s in self.slices.values()
            if s["spec"]["driver"] == driver and s["spec"]["nodeName"] == node_name
        ]

    def create_slice(self, body: Obj) -> Obj:
        self._call(f"create {body['metadata']['name']}")
        assert "resourceVersion" not in body["metadata"]
        if body["metadata"]["name"] in self.slices:
            raise Conflict("already exists")
        return self._store(body, uid=f"uid-{self._version}")

    def replace_slice(self, body: Obj) -> Obj:
        name = body["metadata"]["name"]
        self._call(f"replace {name}")
        current = self.slices.get(name)
        if current is None:
            raise NotFound(name)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise Conflict(f"{name}: the object has been modified")
        return self._store(body, uid=current["metadata"]["uid"])

    def delete_slice(self, name: str) -> None:
        self._call(f"delete {name}")
        self.slices.pop(name, None)

    def _store(self, body: Obj, *, uid: str) -> Obj:
        self._version += 1
        stored = copy.deepcopy(body)
        stored["metadata"].update(
            uid=uid,
            resourceVersion=str(self._version),
            creationTimestamp="2026-01-01T00:00:00Z",
            managedFields=[{"manager": "gpudra", "operation": "Update"}],
        )
        for device in stored["spec"].get("devices", []):
            for capacity in device.get("capacity", {}).values():
                capacity["value"] = str(int(parse_quantity(capacity["value"])))  # "80Gi" -> bytes
        stored["spec"].setdefault("perDeviceNodeSelection", None)
        self.slices[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)


def publish(kube: FakeKube, model: DeviceModel, server_minor: int = 35) -> SyncPlan:
    """Apply plan_sync's writes to the fake, as SliceController does."""
    plan = plan_sync(builder(model, server_minor), kube.list_slices(driver=DRIVER, node_name=NODE))
    for piece in plan.create:
        kube.create_slice(dict(piece))
    for piece in plan.update:
        kube.replace_slice(dict(piece))
    for name in plan.delete:
        kube.delete_slice(name)
    return plan


def generations(kube: FakeKube) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in kube.slices.values()}


# --- plan_sync ---------------------------------------------------------------------------------


def test_first_publish_creates_every_slice_with_generation_one() -> None:
    plan = plan_sync(builder(MODELS["h100"]), [])
    expected = builder(MODELS["h100"])(1)
    assert (plan.generation, len(plan.create), plan.update, plan.delete) == (1, len(expected), [], [])
    assert len(expected) > 1
    for piece, want in zip(plan.create, expected, strict=True):
        assert piece["spec"] == want["spec"]
        assert piece["metadata"]["name"] == want["metadata"]["name"]
        assert piece["metadata"]["annotations"][SPEC_HASH] == spec_hash(want)


def test_an_unchanged_model_writes_nothing_despite_server_defaults() -> None:
    kube = FakeKube()
    publish(kube, MODELS["h100"])
    existing = kube.list_slices(driver=DRIVER, node_name=NODE)
    assert any(s["spec"]["perDeviceNodeSelection"] is None for s in existing)  # the server's additions
    again = plan_sync(builder(MODELS["h100"]), existing)
    assert again == SyncPlan(generation=1)
    assert again.writes == 0


def test_a_changed_model_rewrites_every_slice_with_the_next_generation() -> None:
    kube = FakeKube()
    publish(kube, MODELS["h100"])
    versions = {name: s["metadata"]["resourceVersion"] for name, s in kube.slices.items()}
    plan = plan_sync(builder(MODELS["h100 newer driver"]), kube.list_slices(driver=DRIVER, node_name=NODE))
    assert (plan.generation, plan.create, plan.delete) == (2, [], [])
    assert {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in plan.update} == versions
    assert {p["spec"]["pool"]["generation"] for p in plan.update} == {2}


def test_fewer_slices_delete_the_extras() -> None:
    kube = FakeKube()
    publish(kube, MODELS["big"])
    before = sorted(kube.slices)
    plan = plan_sync(builder(MODELS["mixed"]), kube.list_slices(driver=DRIVER, node_name=NODE))
    assert [p["metadata"]["name"] for p in plan.update] == before[:1]
    assert plan.create == []
    assert plan.delete == sorted(set(before) - set(before[:1]))
    assert plan.generation == 2


def test_more_slices_create_the_new_ones() -> None:
    kube = FakeKube()
    publish(kube, MODELS["mixed"])
    plan = plan_sync(builder(MODELS["big"]), kube.list_slices(driver=DRIVER, node_name=NODE))
    assert len(plan.update) == 1 and len(plan.create) == len(builder(MODELS["big"])(1)) - 1
    assert {p["spec"]["pool"]["generation"] for p in plan.create + plan.update} == {2}


def test_slices_without_the_hash_annotation_are_rewritten() -> None:
    kube = FakeKube()
    publish(kube, MODELS["h100"])
    existing = kube.list_slices(driver=DRIVER, node_name=NODE)
    del existing[0]["metadata"]["annotations"]
    plan = plan_sync(builder(MODELS["h100"]), existing)
    assert (plan.generation, len(plan.update), plan.create, plan.delete) == (2, len(existing), [], [])


def test_a_slice_with_another_hash_is_rewritten() -> None:
    kube = FakeKube()
    publish(kube, MODELS["h100"])
    existing = kube.list_slices(driver=DRIVER, node_name=NODE)
    existing[-1]["metadata"]["annotations"][SPEC_HASH] = "0" * 32
    assert plan_sync(builder(MODELS["h100"]), existing).generation == 2


def test_a_pool_left_half_rewritten_is_rewritten_at_a_newer_generation() -> None:
    kube = FakeKube()
    publish(kube, MODELS["h100"])
    existing = kube.list_slices(driver=DRIVER, node_name=NODE)
    existing[0]["spec"]["pool"]["generation"] = 3  # one slice got through before a crash
    plan = plan_sync(builder(MODELS["h100"]), existing)
    assert plan.generation == 4 and len(plan.update) == len(existing)


def test_a_stranger_slice_in_the_pool_is_deleted() -> None:
    kube = FakeKube()
    publish(kube, MODELS["mixed"])
    existing = kube.list_slices(driver=DRIVER, node_name=NODE)
    stranger = copy.deepcopy(existing[0])
    stranger["metadata"]["name"] = "node-a-old-name-0"
    plan = plan_sync(builder(MODELS["mixed"]), [*existing, stranger])
    assert plan.delete == ["node-a-old-name-0"]
    assert plan.generation == 2 and len(plan.update) == 1


def test_the_hash_leaves_out_the_generation_but_not_the_content() -> None:
    one, two = builder(MODELS["h100"])(1)[0], builder(MODELS["h100"])(2)[0]
    assert spec_hash(one) == spec_hash(two)
    two["spec"]["pool"]["resourceSliceCount"] += 1
    assert spec_hash(one) != spec_hash(two)


@settings(max_examples=15, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["h100", "h100 newer driver", "mixed", "empty"]), st.sampled_from([34, 35])
        ),
        min_size=1,
        max_size=4,
    )
)
def test_publishing_any_sequence_of_models(steps: list[tuple[str, int]]) -> None:
    """Each publish leaves exactly the built slices at one generation; only a change bumps it."""
    kube = FakeKube()
    generation, previous = 0, None
    for name, minor in steps:
        wanted = builder(MODELS[name], minor)(0)
        changed = wanted != previous
        plan = publish(kube, MODELS[name], minor)
        generation += 1 if changed else 0
        assert plan.generation == generation
        assert (plan.writes > 0) == changed
        assert generations(kube) == {generation}
        assert sorted(kube.slices) == sorted(s["metadata"]["name"] for s in wanted)
        assert publish(kube, MODELS[name], minor).writes == 0
        previous = wanted


# --- SliceController ---------------------------------------------------------------------------


class Model:
    """The controller's model source; tests change `current` between syncs."""

    def __init__(self, current: DeviceModel) -> None:
        self.current = current

    def __call__(self) -> DeviceModel:
        return self.current


def controller(kube: FakeKube, model: Model, **kwargs: Any) -> tuple[SliceController, list[str]]:
    published: list[str] = []
    made = SliceController(
        kube,
        driver=DRIVER,
        node_name=NODE,
        model=model,
        on_publish=published.append,
        **kwargs,
    )
    return made, published


def test_sync_once_publishes_then_writes_nothing() -> None:
    kube, model = FakeKube(), Model(MODELS["h100"])
    slices, published = controller(kube, model)
    first = slices.sync_once()
    count = len(builder(MODELS["h100"])(1))
    assert len(first.create) == count and published == ["create"] * count
    owners = {s["metadata"]["ownerReferences"][0]["uid"] for s in kube.slices.values()}
    assert owners == {NODE_UID}

    calls = len(kube.calls)
    assert slices.sync_once().writes == 0
    assert kube.calls[calls:] == ["list"]  # server version and node UID are remembered
    assert len(published) == count


def test_sync_once_updates_after_a_model_change_and_deletes_extras() -> None:
    kube, model = FakeKube(), Model(MODELS["big"])
    slices, published = controller(kube, model)
    slices.sync_once()
    model.current = MODELS["h100 newer driver"]
    plan = slices.sync_once()
    assert generations(kube) == {2}
    assert published.count("update") == len(plan.update) > 0
    assert published.count("delete") == len(plan.delete) > 0
    assert sorted(kube.slices) == sorted(s["metadata"]["name"] for s in builder(model.current)(2))


def test_sync_once_raises_a_write_failure() -> None:
    kube, model = FakeKube(), Model(MODELS["mixed"])
    slices, _ = controller(kube, model)
    kube.failures = [None, None, None, ClusterError("creating ResourceSlice: HTTP 500")]
    with pytest.raises(ClusterError, match="HTTP 500"):
        slices.sync_once()


def test_the_thread_retries_with_backoff_and_resets_it_after_a_success() -> None:
    kube, model = FakeKube(), Model(MODELS["mixed"])
    slices, _ = controller(kube, model, resync_seconds=0.1)
    down = ClusterError("listing ResourceSlices: connection refused")
    # attempts 1 and 2 fail at the list; 3 lists and creates; 4 (cluster facts remembered) fails; 5 works
    kube.failures = [None, None, down, None, None, down, None, None, None, None, down]
    slices.start()
    try:
        assert slices.synced.wait(5)
        deadline = time.monotonic() + 5
        while len(kube.times) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        slices.stop(5)
    assert not slices.loop.alive
    gaps = [later - earlier for earlier, later in zip(kube.times, kube.times[1:], strict=False)]
    assert 0.4 < gaps[0] < 0.9  # first retry after 0.5 s
    assert 0.9 < gaps[1] < 1.6  # then 1 s
    assert gaps[2] < 0.4  # a success: the next sync after resync_seconds
    assert 0.4 < gaps[3] < 0.9  # the backoff starts again at 0.5 s
    # cluster facts are read again after each failure: the node or server may have changed
    assert kube.calls.count("server_minor") == 4
    assert len(kube.slices) == 1


def test_trigger_syncs_early_and_stop_ends_the_thread() -> None:
    kube, model = FakeKube(), Model(MODELS["mixed"])
    slices, published = controller(kube, model, resync_seconds=60)
    slices.start()
    try:
        assert slices.synced.wait(5)
        model.current = MODELS["h100"]
        slices.trigger()
        deadline = time.monotonic() + 5
        while generations(kube) != {2} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert generations(kube) == {2}
    finally:
        started = time.monotonic()
        slices.stop(5)
    assert time.monotonic() - started < 2
    assert not slices.loop.alive
    assert "update" in published


def test_stop_without_start() -> None:
    slices, _ = controller(FakeKube(), Model(MODELS["mixed"]))
    slices.stop(5)
    assert not slices.synced.is_set()


def test_the_thread_is_not_synced_until_a_sync_succeeds() -> None:
    kube, model = FakeKube(), Model(MODELS["mixed"])
    slices, _ = controller(kube, model)
    kube.failures = [ClusterError("reading the server version: HTTP 503")]
    slices.start()
    try:
        assert not slices.synced.wait(0.2)
        assert slices.synced.wait(3)
    finally:
        slices.stop(5)
