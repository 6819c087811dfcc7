"""resource.gpudra.io/v1beta1 GpuConfig and MigDeviceConfig: decoding, messages, defaults, normalization."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpudra.api import (
    API_VERSION,
    GpuConfig,
    MigDeviceConfig,
    MpsConfig,
    TimeSlicingConfig,
    config_advice,
    config_problems,
    decode_config,
)
from gpudra.api.decode import MAX_PARAMETERS_BYTES
from gpudra.errors import ConfigError

MIB = 2**20
GIB = 2**30
GPU: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "GpuConfig"}
MIG: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "MigDeviceConfig"}
INTERVALS = "must be one of: Default, Short, Medium, Long"
PERCENT = "must be an integer from 1 to 100"
QUANTITY = "must be a Kubernetes quantity such as 512Mi or 10Gi, or a whole number of bytes"
MPS_FIELDS = (
    "unknown field; the fields here are: defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, "
    "defaultPerDevicePinnedMemoryLimit"
)
AT_LEAST_1MI = "must be at least 1Mi: MPS sets pinned device memory limits in whole MiB"
KEY = (
    "the key must be a device index (0, 1, ...) into the config's devices sorted by UUID, "
    "or a device UUID (GPU-..., MIG-...)"
)


def gpu(**sharing: Any) -> dict[str, Any]:
    return {**GPU, "sharing": sharing}


def mps(**config: Any) -> dict[str, Any]:
    return gpu(strategy="MPS", mpsConfig=config)


def problems(raw: Any) -> list[tuple[str | None, str]]:
    return [(err.field, err.reason) for err in config_problems(raw)]


def dump(config: GpuConfig | MigDeviceConfig) -> dict[str, Any]:
    return config.model_dump(mode="json", exclude_none=True)


# --- good values: what decode_config returns (normalized), as JSON

GOOD = {
    "no sharing": (GPU, GPU),
    "sharing null": ({**GPU, "sharing": None}, GPU),
    "time-slicing, no config: interval Default": (
        gpu(strategy="TimeSlicing"),
        gpu(strategy="TimeSlicing", timeSlicingConfig={"interval": "Default"}),
    ),
    "time-slicing, empty config: interval Default": (
        gpu(strategy="TimeSlicing", timeSlicingConfig={}),
        gpu(strategy="TimeSlicing", timeSlicingConfig={"interval": "Default"}),
    ),
    **{
        f"interval {interval}": (
            gpu(strategy="TimeSlicing", timeSlicingConfig={"interval": interval}),
            gpu(strategy="TimeSlicing", timeSlicingConfig={"interval": interval}),
        )
        for interval in ("Default", "Short", "Medium", "Long")
    },
    "MPS, no config: empty config": (gpu(strategy="MPS"), mps()),
    "MPS, null config: empty config": (gpu(strategy="MPS", mpsConfig=None), mps()),
    "thread percentage 1": (mps(defaultActiveThreadPercentage=1), mps(defaultActiveThreadPercentage=1)),
    "thread percentage 100": (mps(defaultActiveThreadPercentage=100), mps(defaultActiveThreadPercentage=100)),
    "limit 10Gi in bytes": (
        mps(defaultPinnedDeviceMemoryLimit="10Gi"),
        mps(defaultPinnedDeviceMemoryLimit=10 * GIB),
    ),
    "limit 1.5G in bytes": (
        mps(defaultPinnedDeviceMemoryLimit="1.5G"),
        mps(defaultPinnedDeviceMemoryLimit=1_500_000_000),
    ),
    "limit 1Mi is the least": (
        mps(defaultPinnedDeviceMemoryLimit="1Mi"),
        mps(defaultPinnedDeviceMemoryLimit=MIB),
    ),
    "limit as an integer": (mps(defaultPinnedDeviceMemoryLimit=MIB), mps(defaultPinnedDeviceMemoryLimit=MIB)),
    "limit 2e9": (mps(defaultPinnedDeviceMemoryLimit="2e9"), mps(defaultPinnedDeviceMemoryLimit=2 * 10**9)),
    "per-device limits by index and UUID": (
        mps(
            defaultPerDevicePinnedMemoryLimit={
                "0": "1Gi",
                "12": "2Gi",
                "GPU-1a2b": "3Gi",
                "MIG-3c4d": 4 * MIB,
            }
        ),
        mps(
            defaultPerDevicePinnedMemoryLimit={
                "0": GIB,
                "12": 2 * GIB,
                "GPU-1a2b": 3 * GIB,
                "MIG-3c4d": 4 * MIB,
            }
        ),
    ),
    "all MPS fields": (
        mps(defaultActiveThreadPercentage=50, defaultPinnedDeviceMemoryLimit="8Gi"),
        mps(defaultActiveThreadPercentage=50, defaultPinnedDeviceMemoryLimit=8 * GIB),
    ),
    "MIG, no sharing": (MIG, MIG),
    "MIG time-slicing (accepted as NVIDIA's driver does; sets nothing)": (
        {**MIG, "sharing": {"strategy": "TimeSlicing"}},
        {**MIG, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}},
    ),
    "MIG time-slicing with an interval": (
        {**MIG, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}},
        {**MIG, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}},
    ),
    "MIG MPS, no config": (
        {**MIG, "sharing": {"strategy": "MPS"}},
        {**MIG, "sharing": {"strategy": "MPS", "mpsConfig": {}}},
    ),
    "MIG MPS limits": (
        {**MIG, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "5Gi"}}},
        {**MIG, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": 5 * GIB}}},
    ),
}


@pytest.mark.parametrize(("raw", "expected"), GOOD.values(), ids=GOOD.keys())
def test_good_config(raw: dict[str, Any], expected: dict[str, Any]) -> None:
    assert dump(decode_config(raw)) == expected
    assert problems(raw) == []


# --- bad values: every problem, by field, with its exact message

BAD = {
    "not an object": ([1, 2], [(None, "must be a JSON object (a GpuConfig or MigDeviceConfig)")]),
    "no apiVersion": (
        {"kind": "GpuConfig"},
        [("apiVersion", "is required; must be resource.gpudra.io/v1beta1")],
    ),
    "wrong apiVersion": (
        {**GPU, "apiVersion": "resource.gpudra.io/v1"},
        [("apiVersion", "must be resource.gpudra.io/v1beta1")],
    ),
    "NVIDIA's apiVersion": (
        {**GPU, "apiVersion": "resource.nvidia.com/v1beta1"},
        [
            (
                "apiVersion",
                "must be resource.gpudra.io/v1beta1 "
                "(the fields are those of resource.nvidia.com/v1beta1: only the apiVersion differs)",
            )
        ],
    ),
    "no kind": (
        {"apiVersion": API_VERSION},
        [("kind", "is required; must be one of: GpuConfig, MigDeviceConfig")],
    ),
    "unknown kind": (
        {"apiVersion": API_VERSION, "kind": "VfioDeviceConfig"},
        [("kind", "must be one of: GpuConfig, MigDeviceConfig")],
    ),
    "kind not a string": (
        {"apiVersion": API_VERSION, "kind": 3},
        [("kind", "must be one of: GpuConfig, MigDeviceConfig")],
    ),
    "unknown top-level field": (
        {**GPU, "sharnig": {}},
        [("sharnig", "unknown field; the fields here are: apiVersion, kind, sharing")],
    ),
    "sharing not an object": ({**GPU, "sharing": "MPS"}, [("sharing", "must be an object")]),
    "no strategy": (gpu(), [("sharing.strategy", "is required; must be one of: TimeSlicing, MPS")]),
    "unknown strategy": (
        gpu(strategy="Exclusive"),
        [("sharing.strategy", "must be one of: TimeSlicing, MPS")],
    ),
    "strategy in lower case": (
        gpu(strategy="mps"),
        [("sharing.strategy", "must be one of: TimeSlicing, MPS")],
    ),
    "unknown sharing field": (
        gpu(strategy="MPS", replicas=4),
        [("sharing.replicas", "unknown field; the fields here are: strategy, timeSlicingConfig, mpsConfig")],
    ),
    "mpsConfig with TimeSlicing": (
        gpu(strategy="TimeSlicing", mpsConfig={}),
        [("sharing.mpsConfig", "must not be set when strategy is TimeSlicing: it configures strategy MPS")],
    ),
    "timeSlicingConfig with MPS": (
        gpu(strategy="MPS", timeSlicingConfig={"interval": "Long"}),
        [
            (
                "sharing.timeSlicingConfig",
                "must not be set when strategy is MPS: it configures strategy TimeSlicing",
            )
        ],
    ),
    "unknown interval": (
        gpu(strategy="TimeSlicing", timeSlicingConfig={"interval": "VeryLong"}),
        [("sharing.timeSlicingConfig.interval", INTERVALS)],
    ),
    "interval as a number": (
        gpu(strategy="TimeSlicing", timeSlicingConfig={"interval": 2}),
        [("sharing.timeSlicingConfig.interval", INTERVALS)],
    ),
    "unknown time-slicing field": (
        gpu(strategy="TimeSlicing", timeSlicingConfig={"intervalMs": 5}),
        [("sharing.timeSlicingConfig.intervalMs", "unknown field; the fields here are: interval")],
    ),
    "timeSlicingConfig not an object": (
        gpu(strategy="TimeSlicing", timeSlicingConfig="Long"),
        [("sharing.timeSlicingConfig", "must be an object")],
    ),
    "thread percentage 0": (
        mps(defaultActiveThreadPercentage=0),
        [("sharing.mpsConfig.defaultActiveThreadPercentage", PERCENT)],
    ),
    "thread percentage 101": (
        mps(defaultActiveThreadPercentage=101),
        [("sharing.mpsConfig.defaultActiveThreadPercentage", PERCENT)],
    ),
    "thread percentage as a string": (
        mps(defaultActiveThreadPercentage="50"),
        [("sharing.mpsConfig.defaultActiveThreadPercentage", PERCENT)],
    ),
    "thread percentage as a float": (
        mps(defaultActiveThreadPercentage=50.0),
        [("sharing.mpsConfig.defaultActiveThreadPercentage", PERCENT)],
    ),
    "thread percentage true": (
        mps(defaultActiveThreadPercentage=True),
        [("sharing.mpsConfig.defaultActiveThreadPercentage", PERCENT)],
    ),
    "limit not a quantity": (
        mps(defaultPinnedDeviceMemoryLimit="10 GB"),
        [
            (
                "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
                "must be a Kubernetes quantity such as 512Mi, 10Gi, 1.5G or 1e9, not '10 GB'",
            )
        ],
    ),
    "limit as a float": (
        mps(defaultPinnedDeviceMemoryLimit=1.5e9),
        [("sharing.mpsConfig.defaultPinnedDeviceMemoryLimit", QUANTITY)],
    ),
    "limit as a boolean": (
        mps(defaultPinnedDeviceMemoryLimit=True),
        [("sharing.mpsConfig.defaultPinnedDeviceMemoryLimit", QUANTITY)],
    ),
    "limit zero": (
        mps(defaultPinnedDeviceMemoryLimit="0"),
        [
            (
                "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
                AT_LEAST_1MI,
            )
        ],
    ),
    "limit negative": (
        mps(defaultPinnedDeviceMemoryLimit="-1Gi"),
        [
            (
                "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
                AT_LEAST_1MI,
            )
        ],
    ),
    "limit below 1Mi": (
        mps(defaultPinnedDeviceMemoryLimit="1023Ki"),
        [
            (
                "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
                AT_LEAST_1MI,
            )
        ],
    ),
    "limit in fractions of a byte": (
        mps(defaultPinnedDeviceMemoryLimit="1048576500m"),
        [
            (
                "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
                "must be a whole number of bytes, not 1048576.5",
            )
        ],
    ),
    "per-device limits not a map": (
        mps(defaultPerDevicePinnedMemoryLimit=["1Gi"]),
        [("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit", "must be an object")],
    ),
    "per-device key neither index nor UUID": (
        mps(defaultPerDevicePinnedMemoryLimit={"first": "1Gi"}),
        [("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[first]", KEY)],
    ),
    "per-device key a negative index": (
        mps(defaultPerDevicePinnedMemoryLimit={"-1": "1Gi"}),
        [("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[-1]", KEY)],
    ),
    "per-device key a bare prefix": (
        mps(defaultPerDevicePinnedMemoryLimit={"GPU-": "1Gi"}),
        [("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[GPU-]", KEY)],
    ),
    "per-device value bad": (
        mps(defaultPerDevicePinnedMemoryLimit={"GPU-1a2b": "lots"}),
        [
            (
                "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[GPU-1a2b]",
                "must be a Kubernetes quantity such as 512Mi, 10Gi, 1.5G or 1e9, not 'lots'",
            )
        ],
    ),
    "unknown MPS field (NVIDIA's later multiUser)": (
        mps(multiUser=True),
        [("sharing.mpsConfig.multiUser", MPS_FIELDS)],
    ),
    "mpsConfig not an object": (
        gpu(strategy="MPS", mpsConfig=50),
        [("sharing.mpsConfig", "must be an object")],
    ),
    "MIG unknown strategy": (
        {**MIG, "sharing": {"strategy": "Other"}},
        [("sharing.strategy", "must be one of: TimeSlicing, MPS")],
    ),
    "MIG timeSlicingConfig with MPS": (
        {**MIG, "sharing": {"strategy": "MPS", "timeSlicingConfig": {}}},
        [
            (
                "sharing.timeSlicingConfig",
                "must not be set when strategy is MPS: it configures strategy TimeSlicing",
            )
        ],
    ),
    "MIG mpsConfig with TimeSlicing": (
        {**MIG, "sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}},
        [("sharing.mpsConfig", "must not be set when strategy is TimeSlicing: it configures strategy MPS")],
    ),
    "MIG no strategy": (
        {**MIG, "sharing": {}},
        [("sharing.strategy", "is required; must be one of: TimeSlicing, MPS")],
    ),
    "MIG bad MPS limit": (
        {**MIG, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}},
        [("sharing.mpsConfig.defaultActiveThreadPercentage", PERCENT)],
    ),
    "several problems, all listed": (
        {
            "apiVersion": "v1",
            "kind": "GpuConfig",
            "extra": 1,
            "sharing": {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 0,
                    "defaultPinnedDeviceMemoryLimit": "1K",
                    "defaultPerDevicePinnedMemoryLimit": {"x": "1Gi"},
                },
            },
        },
        [
            ("apiVersion", "must be resource.gpudra.io/v1beta1"),
            ("sharing.mpsConfig.defaultActiveThreadPercentage", PERCENT),
            (
                "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
                "must be a Kubernetes quantity such as 512Mi, 10Gi, 1.5G or 1e9, not '1K'",
            ),
            ("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[x]", KEY),
            ("extra", "unknown field; the fields here are: apiVersion, kind, sharing"),
        ],
    ),
}


@pytest.mark.parametrize(("raw", "expected"), BAD.values(), ids=BAD.keys())
def test_bad_config(raw: Any, expected: list[tuple[str | None, str]]) -> None:
    assert problems(raw) == expected
    with pytest.raises(ConfigError) as caught:
        decode_config(raw)
    assert (caught.value.field, caught.value.reason.split("; ")[0]) == (
        expected[0][0],
        expected[0][1].split("; ")[0],
    )


def test_error_lists_every_problem_and_names_the_first_field() -> None:
    raw = mps(defaultActiveThreadPercentage=0, defaultPinnedDeviceMemoryLimit="0", extra=1)
    with pytest.raises(ConfigError) as caught:
        decode_config(raw, field_prefix="spec.devices.config[2].opaque.parameters")
    prefix = "spec.devices.config[2].opaque.parameters.sharing.mpsConfig"
    assert caught.value.field == f"{prefix}.defaultActiveThreadPercentage"
    assert str(caught.value) == (
        f"{prefix}.defaultActiveThreadPercentage: {PERCENT}; "
        f"{prefix}.defaultPinnedDeviceMemoryLimit: {AT_LEAST_1MI}; {prefix}.extra: {MPS_FIELDS}"
    )


def test_field_prefix_names_the_whole_path() -> None:
    found = config_problems(gpu(strategy="Bogus"), field_prefix="spec.config[0].opaque.parameters")
    assert [err.field for err in found] == ["spec.config[0].opaque.parameters.sharing.strategy"]
    assert (
        str(found[0]) == "spec.config[0].opaque.parameters.sharing.strategy: must be one of: TimeSlicing, MPS"
    )


def test_prefix_alone_names_a_non_object() -> None:
    found = config_problems("[]", field_prefix="spec.config[0].opaque.parameters")
    assert [str(err) for err in found] == [
        "spec.config[0].opaque.parameters: must be a JSON object (a GpuConfig or MigDeviceConfig)"
    ]


@pytest.mark.parametrize(
    "raw",
    [json.dumps(mps(defaultActiveThreadPercentage=20)), json.dumps(mps()).encode()],
    ids=["str", "bytes"],
)
def test_decodes_json_text(raw: str | bytes) -> None:
    assert isinstance(decode_config(raw), GpuConfig)


def test_invalid_json_text() -> None:
    with pytest.raises(ConfigError, match=r"^x: is not valid JSON: Expecting property name"):
        decode_config("{sharing", field_prefix="x")


def test_python_attribute_names_are_not_accepted_as_input() -> None:
    assert problems(mps(default_active_thread_percentage=5)) == [
        ("sharing.mpsConfig.default_active_thread_percentage", MPS_FIELDS)
    ]


# --- defaults, normalization and accessors


def test_defaults_leave_the_device_alone() -> None:
    assert dump(GpuConfig()) == GPU
    assert dump(MigDeviceConfig()) == MIG
    assert GpuConfig().sharing is None
    assert MigDeviceConfig().sharing is None


def test_normalized_is_what_decode_returns() -> None:
    raw = gpu(strategy="TimeSlicing")
    decoded = decode_config(raw)
    assert decoded.normalized() == decoded
    assert GpuConfig.model_validate(raw).normalized() == decoded
    assert GpuConfig.model_validate(raw) != decoded


@pytest.mark.parametrize(
    ("interval", "timeslice"), [("Default", 0), ("Short", 1), ("Medium", 2), ("Long", 3)], ids=str
)
def test_interval_maps_to_nvidia_smi_timeslice(interval: str, timeslice: int) -> None:
    config = decode_config(gpu(strategy="TimeSlicing", timeSlicingConfig={"interval": interval}))
    assert isinstance(config, GpuConfig) and config.sharing is not None
    assert config.sharing.time_slicing == TimeSlicingConfig.model_validate({"interval": interval})
    assert config.sharing.time_slicing.timeslice == timeslice


def test_accessors_give_the_active_strategy_settings() -> None:
    time_slicing = GpuConfig.model_validate(gpu(strategy="TimeSlicing")).sharing
    assert time_slicing is not None
    assert (time_slicing.time_slicing, time_slicing.mps) == (TimeSlicingConfig(), None)
    shared = GpuConfig.model_validate(gpu(strategy="MPS")).sharing
    assert shared is not None
    assert (shared.time_slicing, shared.mps) == (None, MpsConfig())
    mig = MigDeviceConfig.model_validate({**MIG, "sharing": {"strategy": "MPS"}}).sharing
    assert mig is not None and mig.mps == MpsConfig()


def test_mig_time_slicing_is_advised_as_setting_nothing() -> None:
    raw = {**MIG, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}
    [advice] = config_advice(raw, field_prefix="opaque.parameters")
    assert advice.field == "opaque.parameters.sharing.strategy"
    assert advice.reason == "MigTimeSliceNotSet"
    assert advice.message == (
        "TimeSlicing on a MIG device sets nothing: the claim's containers share the partition; "
        "interval Long is not applied (the time-slice is the whole GPU's)"
    )
    mig = MigDeviceConfig.model_validate(raw).sharing
    assert mig is not None and (mig.mps, mig.time_slicing) == (None, TimeSlicingConfig(interval="Long"))


@pytest.mark.parametrize(
    "raw",
    [
        MIG,
        {**MIG, "sharing": {"strategy": "MPS"}},
        gpu(strategy="TimeSlicing", timeSlicingConfig={"interval": "Long"}),
        {**MIG, "sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}},  # invalid: its problems say it
    ],
)
def test_other_configs_get_no_advice(raw: dict[str, Any]) -> None:
    assert config_advice(raw) == []


def test_configs_are_frozen() -> None:
    config = GpuConfig()
    with pytest.raises(ValueError, match="frozen"):
        config.sharing = None


# --- pinned memory limits per device

UUIDS = ["GPU-b", "GPU-c", "GPU-a"]  # sorted: GPU-a, GPU-b, GPU-c

LIMITS = {
    "nothing set": ({}, {}),
    "default for every device": (
        {"defaultPinnedDeviceMemoryLimit": "1Gi"},
        dict.fromkeys(["GPU-a", "GPU-b", "GPU-c"], GIB),
    ),
    "index counts in sorted UUID order": (
        {"defaultPerDevicePinnedMemoryLimit": {"0": "2Gi", "2": "3Gi"}},
        {"GPU-a": 2 * GIB, "GPU-c": 3 * GIB},
    ),
    "per-device overrides the default": (
        {"defaultPinnedDeviceMemoryLimit": "1Gi", "defaultPerDevicePinnedMemoryLimit": {"GPU-b": "4Gi"}},
        {"GPU-a": GIB, "GPU-b": 4 * GIB, "GPU-c": GIB},
    ),
}


@pytest.mark.parametrize(("config", "expected"), LIMITS.values(), ids=LIMITS.keys())
def test_pinned_memory_limits(config: dict[str, Any], expected: dict[str, int]) -> None:
    assert MpsConfig.model_validate(config).pinned_memory_limits(UUIDS) == expected


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("3", r"\[3\]: device index 3 is out of range: the config applies to 3 device\(s\), indexes 0 to 2"),
        ("GPU-z", r"\[GPU-z\]: names no device this config applies to; its devices are: GPU-a, GPU-b, GPU-c"),
    ],
    ids=["index out of range", "UUID not among the devices"],
)
def test_pinned_memory_limit_for_a_device_not_in_the_config(key: str, message: str) -> None:
    config = MpsConfig.model_validate({"defaultPerDevicePinnedMemoryLimit": {key: "1Gi"}})
    with pytest.raises(
        ConfigError, match=r"^sharing\.mpsConfig\.defaultPerDevicePinnedMemoryLimit" + message
    ):
        config.pinned_memory_limits(UUIDS)


# --- any valid config round-trips through JSON

quantities = st.one_of(
    st.integers(MIB, 2**50),
    st.builds("{}{}".format, st.integers(2, 4096), st.sampled_from(["Mi", "Gi", "Ti", "M", "G", "T"])),
)
device_keys = st.one_of(
    st.integers(0, 63).map(str),
    st.uuids().map("GPU-{}".format),
    st.uuids().map("MIG-{}".format),
)
mps_configs = st.fixed_dictionaries(
    {},
    optional={
        "defaultActiveThreadPercentage": st.integers(1, 100),
        "defaultPinnedDeviceMemoryLimit": quantities,
        "defaultPerDevicePinnedMemoryLimit": st.dictionaries(device_keys, quantities, max_size=4),
    },
)
gpu_sharing = st.one_of(
    st.fixed_dictionaries(
        {"strategy": st.just("TimeSlicing")},
        optional={
            "timeSlicingConfig": st.fixed_dictionaries(
                {}, optional={"interval": st.sampled_from(["Default", "Short", "Medium", "Long"])}
            )
        },
    ),
    st.fixed_dictionaries({"strategy": st.just("MPS")}, optional={"mpsConfig": mps_configs}),
)
configs = st.one_of(
    st.fixed_dictionaries(
        {"apiVersion": st.just(API_VERSION), "kind": st.just("GpuConfig")}, optional={"sharing": gpu_sharing}
    ),
    st.fixed_dictionaries(
        {"apiVersion": st.just(API_VERSION), "kind": st.just("MigDeviceConfig")},
        optional={
            "sharing": st.fixed_dictionaries(
                {"strategy": st.just("MPS")}, optional={"mpsConfig": mps_configs}
            )
        },
    ),
)


@given(configs)
def test_any_valid_config_round_trips_through_json(raw: dict[str, Any]) -> None:
    config = decode_config(json.dumps(raw))
    assert config.kind == raw["kind"]
    assert decode_config(json.dumps(dump(config))) == config
    assert decode_config(json.dumps(config.model_dump(mode="json"))) == config  # with explicit nulls
    assert config.normalized() == config


# --- bounds: a tenant's parameters never reach pydantic or a recursive step unbounded -----------------


def test_parameters_nested_deeper_than_the_bound_are_refused_with_the_field() -> None:
    deep: dict[str, object] = {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig"}
    inner: dict[str, object] = deep
    for _ in range(40):
        child: dict[str, object] = {}
        inner["x"] = child
        inner = child
    with pytest.raises(ConfigError, match="more than 32 levels deep") as raised:
        decode_config(deep, field_prefix="spec.devices.config[0].opaque.parameters")
    assert raised.value.field == "spec.devices.config[0].opaque.parameters"


def test_json_text_nested_thousands_deep_is_refused_not_a_recursion_error() -> None:
    text = '{"a":' + "[" * 3000 + "]" * 3000 + "}"
    assert len(text) < MAX_PARAMETERS_BYTES
    with pytest.raises(ConfigError, match="levels deep"):
        decode_config(text)
    with pytest.raises(ConfigError, match="levels deep"):
        decode_config(json.loads('{"a":' + "[" * 500 + "]" * 500 + "}"))


def test_parameters_larger_than_the_api_server_allows_are_refused() -> None:
    big = {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig", "pad": "x" * MAX_PARAMETERS_BYTES}
    with pytest.raises(ConfigError, match=f"at most {MAX_PARAMETERS_BYTES} allowed"):
        decode_config(big)
    with pytest.raises(ConfigError, match=f"at most {MAX_PARAMETERS_BYTES} allowed"):
        decode_config(json.dumps(big))
