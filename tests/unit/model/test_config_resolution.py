"""Which config applies to each allocated device: class then claim, later wins, per request or for all."""

from __future__ import annotations

from typing import Any

import pytest

from gpudra.api import API_VERSION, GpuConfig, MigDeviceConfig, decode_config
from gpudra.errors import ClaimError, ConfigError
from gpudra.model.claim import read_allocation
from gpudra.model.claim_config import DeviceType, ResolvedConfig, resolve_configs

DRIVER = "gpu.gpudra.io"
POOL = "node-a"
TYPES: dict[str, DeviceType] = {
    "gpu-0": "gpu",
    "gpu-1": "gpu",
    "gpu-2": "gpu",
    "gpu-3-mig-1g10gb-0": "mig",
    "gpu-3-mig-1g10gb-1": "mig",
}


def time_slicing(interval: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
    }


def mig_mps(percent: int) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": percent}},
    }


def entry(source: str, parameters: Any, *requests: str, driver: str = DRIVER) -> dict[str, Any]:
    item: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        item["requests"] = list(requests)
    return item


def cls(parameters: Any, *requests: str, driver: str = DRIVER) -> dict[str, Any]:
    return entry("FromClass", parameters, *requests, driver=driver)


def claim(parameters: Any, *requests: str, driver: str = DRIVER) -> dict[str, Any]:
    return entry("FromClaim", parameters, *requests, driver=driver)


def result(request: str, device: str, driver: str = DRIVER) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": POOL, "device": device}


def allocation(config: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"devices": {"config": config, "results": results}}


def resolve(config: list[dict[str, Any]], results: list[dict[str, Any]]) -> list[ResolvedConfig]:
    return resolve_configs(read_allocation(allocation(config, results)), driver=DRIVER, device_types=TYPES)


# Each case: config entries, results, and per resolved result (device, index of the winning entry or None).
CASES = {
    "no config: defaults": (
        [],
        [result("gpus", "gpu-0"), result("migs", "gpu-3-mig-1g10gb-0")],
        [("gpu-0", None), ("gpu-3-mig-1g10gb-0", None)],
    ),
    "class only": ([cls(time_slicing("Short"))], [result("gpus", "gpu-0")], [("gpu-0", 0)]),
    "claim only": ([claim(time_slicing("Long"))], [result("gpus", "gpu-0")], [("gpu-0", 0)]),
    "class then claim: claim wins": (
        [cls(time_slicing("Short")), claim(time_slicing("Long"))],
        [result("gpus", "gpu-0")],
        [("gpu-0", 1)],
    ),
    "claim listed before class: claim still wins": (
        [claim(time_slicing("Long")), cls(time_slicing("Short"))],
        [result("gpus", "gpu-0")],
        [("gpu-0", 0)],
    ),
    "class scoped to the request, claim for all: claim wins": (
        [cls(time_slicing("Short"), "gpus"), claim(time_slicing("Long"))],
        [result("gpus", "gpu-0")],
        [("gpu-0", 1)],
    ),
    "two claim entries: the later wins": (
        [claim(time_slicing("Short")), claim(time_slicing("Medium"))],
        [result("gpus", "gpu-0")],
        [("gpu-0", 1)],
    ),
    "two class entries: the later wins": (
        [cls(time_slicing("Short")), cls(time_slicing("Medium"))],
        [result("gpus", "gpu-0")],
        [("gpu-0", 1)],
    ),
    "scoped entry after an all entry: scoped request takes it, others the all entry": (
        [claim(time_slicing("Short")), claim(time_slicing("Long"), "b")],
        [result("a", "gpu-0"), result("b", "gpu-1")],
        [("gpu-0", 0), ("gpu-1", 1)],
    ),
    "all entry after a scoped entry: the all entry wins everywhere": (
        [claim(time_slicing("Long"), "b"), claim(time_slicing("Short"))],
        [result("a", "gpu-0"), result("b", "gpu-1")],
        [("gpu-0", 1), ("gpu-1", 1)],
    ),
    "entry scoped to another request: default": (
        [claim(time_slicing("Long"), "other")],
        [result("gpus", "gpu-0")],
        [("gpu-0", None)],
    ),
    "entry naming several requests": (
        [claim(time_slicing("Long"), "a", "b")],
        [result("a", "gpu-0"), result("b", "gpu-1"), result("c", "gpu-2")],
        [("gpu-0", 0), ("gpu-1", 0), ("gpu-2", None)],
    ),
    "subrequest result matches an entry naming its request": (
        [claim(time_slicing("Long"), "gpus")],
        [result("gpus/large", "gpu-0")],
        [("gpu-0", 0)],
    ),
    "subrequest result matches an entry naming it": (
        [claim(time_slicing("Long"), "gpus/large")],
        [result("gpus/large", "gpu-0")],
        [("gpu-0", 0)],
    ),
    "subrequest result does not match an entry naming a sibling": (
        [claim(time_slicing("Long"), "gpus/small")],
        [result("gpus/large", "gpu-0")],
        [("gpu-0", None)],
    ),
    "request name is not a prefix match": (
        [claim(time_slicing("Long"), "gpu")],
        [result("gpus", "gpu-0")],
        [("gpu-0", None)],
    ),
    "other driver's entry ignored, even when it would be invalid here": (
        [claim({"anything": True}, driver="gpu.nvidia.com"), claim(time_slicing("Short"), driver="other.io")],
        [result("gpus", "gpu-0")],
        [("gpu-0", None)],
    ),
    "other driver's results not resolved": (
        [claim(time_slicing("Long"))],
        [result("nics", "eth0", driver="nic.example.com"), result("gpus", "gpu-0")],
        [("gpu-0", 0)],
    ),
    "entry without opaque ignored": ([{"source": "FromClaim"}], [result("gpus", "gpu-0")], [("gpu-0", None)]),
    "GpuConfig for all skips MIG devices": (
        [claim(time_slicing("Long"))],
        [result("gpus", "gpu-0"), result("migs", "gpu-3-mig-1g10gb-0")],
        [("gpu-0", 0), ("gpu-3-mig-1g10gb-0", None)],
    ),
    "MIG config for all, GpuConfig for all after it: each device gets its kind": (
        [claim(mig_mps(30)), claim(time_slicing("Long"))],
        [result("gpus", "gpu-0"), result("migs", "gpu-3-mig-1g10gb-0")],
        [("gpu-0", 1), ("gpu-3-mig-1g10gb-0", 0)],
    ),
    "several devices of one request share its entry": (
        [claim(mig_mps(50), "migs")],
        [result("migs", "gpu-3-mig-1g10gb-0"), result("migs", "gpu-3-mig-1g10gb-1")],
        [("gpu-3-mig-1g10gb-0", 0), ("gpu-3-mig-1g10gb-1", 0)],
    ),
    "unused entry of this driver is still decoded but harmless when valid": (
        [claim(mig_mps(50), "unused")],
        [result("gpus", "gpu-0")],
        [("gpu-0", None)],
    ),
}


@pytest.mark.parametrize(("config", "results", "expected"), CASES.values(), ids=CASES.keys())
def test_precedence(
    config: list[dict[str, Any]], results: list[dict[str, Any]], expected: list[tuple[str, int | None]]
) -> None:
    resolved = resolve(config, results)
    assert [(item.device, item.entry) for item in resolved] == expected
    by_device = {item["device"]: item for item in results}
    for item in resolved:
        assert (item.request, item.pool) == (by_device[item.device]["request"], POOL)
        if item.entry is None:
            assert item.source is None
            assert item.config == (GpuConfig() if TYPES[item.device] == "gpu" else MigDeviceConfig())
        else:
            assert item.source == config[item.entry]["source"]
            assert item.config == decode_config(config[item.entry]["opaque"]["parameters"])


def test_winning_config_is_normalized() -> None:
    bare = {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    (resolved,) = resolve([claim(bare)], [result("gpus", "gpu-0")])
    assert isinstance(resolved.config, GpuConfig) and resolved.config.sharing is not None
    assert resolved.config.sharing.time_slicing_config is not None
    assert resolved.config.sharing.time_slicing_config.timeslice == 0


def test_empty_allocation() -> None:
    assert resolve_configs(read_allocation({}), driver=DRIVER, device_types=TYPES) == []


KIND = "status.allocation.devices.config[{}].opaque.parameters.kind"

ERRORS = {
    "GpuConfig scoped to a MIG request": (
        [claim(time_slicing("Long"), "migs")],
        [result("migs", "gpu-3-mig-1g10gb-0")],
        KIND.format(0),
        "GpuConfig cannot configure gpu-3-mig-1g10gb-0 (request migs): a MIG device takes a MigDeviceConfig",
    ),
    "MigDeviceConfig scoped to a GPU subrequest": (
        [cls(time_slicing("Short")), claim(mig_mps(10), "gpus")],
        [result("gpus/any", "gpu-0")],
        KIND.format(1),
        "MigDeviceConfig cannot configure gpu-0 (request gpus/any): a whole GPU takes a GpuConfig",
    ),
    "bad parameters": (
        [claim({**time_slicing("Long"), "sharing": {"strategy": "Spatial"}})],
        [result("gpus", "gpu-0")],
        "status.allocation.devices.config[0].opaque.parameters.sharing.strategy",
        "must be one of: TimeSlicing, MPS",
    ),
    "bad parameters in an entry no result uses": (
        [claim(time_slicing("Long")), claim(time_slicing("Forever"), "unused")],
        [result("gpus", "gpu-0")],
        "status.allocation.devices.config[1].opaque.parameters.sharing.timeSlicingConfig.interval",
        "must be one of: Default, Short, Medium, Long",
    ),
    "parameters missing": (
        [claim(None)],
        [result("gpus", "gpu-0")],
        "status.allocation.devices.config[0].opaque.parameters",
        "must be a JSON object (a GpuConfig or MigDeviceConfig)",
    ),
    "bad source": (
        [entry("FromNowhere", time_slicing("Long"))],
        [result("gpus", "gpu-0")],
        "status.allocation.devices.config[0].source",
        "must be one of: FromClass, FromClaim",
    ),
}


@pytest.mark.parametrize(("config", "results", "field", "message"), ERRORS.values(), ids=ERRORS.keys())
def test_errors_name_the_entry(
    config: list[dict[str, Any]], results: list[dict[str, Any]], field: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(config, results)
    assert (caught.value.field, caught.value.reason) == (field, message)


def test_every_bad_entry_is_listed() -> None:
    config = [claim(time_slicing("Forever")), claim({"kind": "GpuConfig"}), claim(time_slicing("Long"))]
    with pytest.raises(ConfigError) as caught:
        resolve(config, [result("gpus", "gpu-0")])
    assert str(caught.value) == (
        "status.allocation.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval: "
        "must be one of: Default, Short, Medium, Long; "
        "status.allocation.devices.config[1].opaque.parameters.apiVersion: "
        "is required; must be resource.gpudra.io/v1beta1"
    )


def test_every_mismatched_device_is_listed() -> None:
    config = [claim(time_slicing("Long"), "migs")]
    results = [result("migs", "gpu-3-mig-1g10gb-0"), result("migs", "gpu-3-mig-1g10gb-1")]
    with pytest.raises(ConfigError) as caught:
        resolve(config, results)
    assert str(caught.value).count("GpuConfig cannot configure") == 2


def test_device_unknown_to_this_node() -> None:
    with pytest.raises(
        ClaimError,
        match=r"^status\.allocation\.devices\.results\[1\]\.device: gpu-9 is not a device of this node's",
    ):
        resolve([], [result("gpus", "gpu-0"), result("gpus", "gpu-9")])
