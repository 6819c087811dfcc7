"""The slice controller on the fake API server: the device models it publishes, the slices it builds,
and the controller made as the plugin makes it; the model a node serves on a release (ServedModel)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from gpudra.kube.slice_sync import SliceController
from gpudra.model import devices
from gpudra.model.devices import DeviceModel, build_devices
from gpudra.model.inventory import Inventory
from gpudra.model.publishing import Publishing, ServerFields
from gpudra.model.slices import ResourceSlice, build_slices
from gpudra.node.served_model import ServedModel
from tests.unit import inventories as inv
from tests.unit.claims import DRIVER, NODE
from tests.unit.harness.kube import NODE_UID, Events, FakeSliceKube


def model_of(inventory: Inventory) -> DeviceModel:
    return build_devices(inventory, mig_mode="partitionable")


MODELS = {
    "h100": model_of(inv.h100_node()),
    "h100 newer driver": model_of(dataclasses.replace(inv.h100_node(), driver_version="580.82.07")),
    "big": model_of(inv.big_node(16)),
    # without shared devices: one slice of devices only, which tests below count writes on
    "mixed": build_devices(inv.mixed_node(), mig_mode="partitionable", shares=False),
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


def generations(kube: FakeSliceKube) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in kube.slices.values()}


class Model:
    """The controller's model source; tests change `current` between syncs."""

    def __init__(self, current: DeviceModel) -> None:
        self.current = current

    def __call__(self) -> DeviceModel:
        return self.current


def controller(kube: FakeSliceKube, model: Model, **kwargs: Any) -> tuple[SliceController, list[str]]:
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


def wait_until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def served(publishing: Publishing, fields: ServerFields) -> tuple[ServedModel, Events]:
    events = Events()
    return ServedModel(
        inv.h100_node(),
        publishing,
        model=devices.publish(inv.h100_node(), publishing),
        probe=lambda minor: fields,
        events=events,
    ), events
