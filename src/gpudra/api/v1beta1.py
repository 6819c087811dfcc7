"""The opaque device configuration kinds of resource.gpudra.io/v1beta1: GpuConfig and MigDeviceConfig. Pure.

Field names and meanings follow NVIDIA's resource.nvidia.com/v1beta1 kinds of the same names, so a config
written for that driver works here once its apiVersion is changed. The models are strict (unknown fields
and wrong types are errors) and frozen. `decode_config` (gpudra.api.decode) is the way in from user input:
it turns pydantic's errors into ConfigErrors naming each field and returns the `normalized()` form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from gpudra.errors import ConfigError
from gpudra.quantity import QUANTITY_PATTERN, parse_quantity

API_VERSION: Final = "resource.gpudra.io/v1beta1"

Strategy = Literal["TimeSlicing", "MPS"]
Interval = Literal["Default", "Short", "Medium", "Long"]

# `nvidia-smi compute-policy --set-timeslice N` takes 0..3 for DEFAULT, SHORT, MEDIUM, LONG.
TIMESLICE: Final[dict[str, int]] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}

MIB: Final = 2**20

PER_DEVICE_LIMITS_FIELD: Final = "defaultPerDevicePinnedMemoryLimit"


def _problem(message: str) -> PydanticCustomError:
    """A validation error whose message gpudra.api.decode passes through as it is."""
    return PydanticCustomError("gpudra", "{reason}", {"reason": message})


def _one_of(*allowed: str) -> BeforeValidator:
    def check(value: object) -> object:
        if not (isinstance(value, str) and value in allowed):
            raise _problem(f"must be one of: {', '.join(allowed)}")
        return value

    return BeforeValidator(check)


def _percentage(value: object) -> object:
    if type(value) is not int or not 1 <= value <= 100:
        raise _problem("must be an integer from 1 to 100")
    return value


_LIMIT_EXPECTED = "must be a Kubernetes quantity such as 512Mi or 10Gi, or a whole number of bytes"


def _memory_limit(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _problem(_LIMIT_EXPECTED)
    try:
        amount = parse_quantity(value) if isinstance(value, str) else Fraction(value)
    except ConfigError as err:
        raise _problem(err.reason) from err
    if amount.denominator != 1:
        raise _problem(f"must be a whole number of bytes, not {float(amount)}")
    if amount < MIB:
        raise _problem("must be at least 1Mi: MPS sets pinned device memory limits in whole MiB")
    return int(amount)


def _device_key(value: object) -> object:
    is_index = isinstance(value, str) and value.isascii() and value.isdigit()
    is_uuid = isinstance(value, str) and len(value) > 4 and value.startswith(("GPU-", "MIG-"))
    if not (is_index or is_uuid):
        raise _problem(
            "the key must be a device index (0, 1, ...) into the config's devices sorted by UUID, "
            "or a device UUID (GPU-..., MIG-...)"
        )
    return value


_LIMIT_SCHEMA: Final = {
    "anyOf": [{"type": "string", "pattern": QUANTITY_PATTERN}, {"type": "integer", "minimum": MIB}],
    "description": "a Kubernetes quantity (e.g. 512Mi, 10Gi) or a number of bytes; at least 1Mi",
}

Percentage = Annotated[
    int, BeforeValidator(_percentage), WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 100})
]
MemoryLimit = Annotated[int, BeforeValidator(_memory_limit), WithJsonSchema(_LIMIT_SCHEMA)]
DeviceLimits = Annotated[
    dict[Annotated[str, BeforeValidator(_device_key)], MemoryLimit],
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": r"^([0-9]+|(GPU|MIG)-.+)$"},
            "additionalProperties": _LIMIT_SCHEMA,
        }
    ),
]


class _Object(BaseModel):
    # Input must use the JSON (camelCase) names; Python code reads the snake_case attributes.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
        field_title_generator=lambda name, _info: to_camel(name),
    )


class TimeSlicingConfig(_Object):
    """How long a CUDA context runs before the GPU switches to the next one."""

    interval: Annotated[Interval, _one_of(*TIMESLICE)] = Field(
        default="Default",
        description="time-slice length; nvidia-smi compute-policy --set-timeslice 0 (Default) to 3 (Long)",
    )

    @property
    def timeslice(self) -> int:
        """The value `nvidia-smi compute-policy --set-timeslice` takes for this interval."""
        return TIMESLICE[self.interval]


class MpsConfig(_Object):
    """Limits for every client of the claim's MPS control daemon on its devices. Unset: no limit."""

    default_active_thread_percentage: Percentage | None = Field(
        default=None,
        description="share of each device's SMs one client may use, in percent (MPS default 100)",
    )
    default_pinned_device_memory_limit: MemoryLimit | None = Field(
        default=None, description="device memory one client may pin on each device"
    )
    default_per_device_pinned_memory_limit: DeviceLimits | None = Field(
        default=None,
        description="per-device override of defaultPinnedDeviceMemoryLimit; key: a device UUID, "
        "or an index into the config's devices sorted by UUID",
    )

    def pinned_memory_limits(self, uuids: Sequence[str]) -> dict[str, int]:
        """Each device's pinned memory limit in bytes, for the devices (UUIDs) this config applies to.

        The default limit applies to every device, then the per-device entries override it; an index key
        counts in the UUIDs' sorted order, which is also the order the MPS daemon is given them. Devices
        without a limit are absent. A key naming no device of this config is a ConfigError.
        """
        ordered = sorted(uuids)
        default = self.default_pinned_device_memory_limit
        limits = {} if default is None else dict.fromkeys(ordered, default)
        for key, limit in (self.default_per_device_pinned_memory_limit or {}).items():
            field = f"sharing.mpsConfig.{PER_DEVICE_LIMITS_FIELD}[{key}]"
            if key.isdigit():
                if int(key) >= len(ordered):
                    raise ConfigError(
                        f"device index {key} is out of range: the config applies to {len(ordered)} "
                        f"device(s), indexes 0 to {len(ordered) - 1}",
                        field=field,
                    )
                limits[ordered[int(key)]] = limit
            elif key in ordered:
                limits[key] = limit
            else:
                raise ConfigError(
                    f"names no device this config applies to; its devices are: {', '.join(ordered)}",
                    field=field,
                )
        return limits


def _not_with(strategy: str, *, configures: str) -> Callable[[object, ValidationInfo], object]:
    def check(value: object, info: ValidationInfo) -> object:
        if value is not None and info.data.get("strategy") == strategy:
            raise _problem(
                f"must not be set when strategy is {strategy}: it configures strategy {configures}"
            )
        return value

    return check


class GpuSharing(_Object):
    """How the containers that share a whole GPU (by sharing one claim) run on it."""

    strategy: Annotated[Strategy, _one_of("TimeSlicing", "MPS")] = Field(description="the sharing strategy")
    time_slicing_config: TimeSlicingConfig | None = Field(
        default=None, description="settings for strategy TimeSlicing"
    )
    mps_config: MpsConfig | None = Field(default=None, description="settings for strategy MPS")

    _time_slicing_only = field_validator("time_slicing_config")(_not_with("MPS", configures="TimeSlicing"))
    _mps_only = field_validator("mps_config")(_not_with("TimeSlicing", configures="MPS"))

    @property
    def time_slicing(self) -> TimeSlicingConfig | None:
        """The time-slicing settings when the strategy is TimeSlicing, else None."""
        if self.strategy != "TimeSlicing":
            return None
        return self.time_slicing_config or TimeSlicingConfig()

    @property
    def mps(self) -> MpsConfig | None:
        """The MPS settings when the strategy is MPS, else None."""
        if self.strategy != "MPS":
            return None
        return self.mps_config or MpsConfig()

    def normalized(self) -> GpuSharing:
        """The same settings with the chosen strategy's config spelled out."""
        return self.model_copy(update={"time_slicing_config": self.time_slicing, "mps_config": self.mps})


MIG_TIME_SLICING_REASON: Final = "MigTimeSliceNotSet"


@dataclass(frozen=True)
class Advice:
    """What a valid config does otherwise than it may seem to: an admission warning, a line of
    `gpudra validate` and `gpudra explain`, and an Event when the node prepares it. `reason` is the
    Event's (UpperCamelCase, stable); `field` is relative to the config."""

    field: str
    message: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class MigDeviceSharing(_Object):
    """How the containers that share a MIG device (by sharing one claim) run on it. MPS: the claim's
    control daemon runs on the partition with the limits. TimeSlicing (accepted as NVIDIA's driver
    accepts it) sets nothing: the time-slice is a setting of the whole physical GPU, whose other
    partitions may serve other claims, so the containers share the partition and an interval is not
    applied (a warning says so)."""

    strategy: Annotated[Strategy, _one_of("TimeSlicing", "MPS")] = Field(
        description="the sharing strategy; TimeSlicing on a MIG device sets nothing (the time-slice is "
        "the whole GPU's): the claim's containers share the partition"
    )
    time_slicing_config: TimeSlicingConfig | None = Field(
        default=None,
        description="accepted for strategy TimeSlicing, not applied: a MIG device has no time-slice",
    )
    mps_config: MpsConfig | None = Field(default=None, description="settings for strategy MPS")

    _time_slicing_only = field_validator("time_slicing_config")(_not_with("MPS", configures="TimeSlicing"))
    _mps_only = field_validator("mps_config")(_not_with("TimeSlicing", configures="MPS"))

    @property
    def time_slicing(self) -> TimeSlicingConfig | None:
        """The (unapplied) time-slicing settings when the strategy is TimeSlicing, else None."""
        if self.strategy != "TimeSlicing":
            return None
        return self.time_slicing_config or TimeSlicingConfig()

    @property
    def mps(self) -> MpsConfig | None:
        """The MPS settings when the strategy is MPS, else None."""
        if self.strategy != "MPS":
            return None
        return self.mps_config or MpsConfig()

    def normalized(self) -> MigDeviceSharing:
        """The same settings with the chosen strategy's config spelled out."""
        return self.model_copy(update={"time_slicing_config": self.time_slicing, "mps_config": self.mps})

    def advice(self) -> list[Advice]:
        if self.time_slicing is None:
            return []
        interval = self.time_slicing.interval
        return [
            Advice(
                "sharing.strategy",
                f"TimeSlicing on a MIG device sets nothing: the claim's containers share the partition; "
                f"interval {interval} is not applied (the time-slice is the whole GPU's)",
                MIG_TIME_SLICING_REASON,
            )
        ]


def _require_type_fields(schema: dict[str, Any]) -> None:
    # The models default apiVersion and kind for Python callers; documents must still state them.
    schema["required"] = ["apiVersion", "kind"]


class GpuConfig(_Object):
    """Configuration of whole GPUs allocated by gpudra. Without `sharing`, the GPU runs with the default
    time-slice (a setting left by an earlier claim is reset)."""

    model_config = ConfigDict(json_schema_extra=_require_type_fields, title="GpuConfig")

    api_version: Literal["resource.gpudra.io/v1beta1"] = API_VERSION
    kind: Literal["GpuConfig"] = "GpuConfig"
    sharing: GpuSharing | None = Field(default=None, description="how containers sharing the GPU run on it")

    def normalized(self) -> GpuConfig:
        """The same configuration with every default that the settings imply spelled out."""
        if self.sharing is None:
            return self
        return self.model_copy(update={"sharing": self.sharing.normalized()})

    def advice(self) -> list[Advice]:
        """What the configuration does otherwise than it may seem to (see `Advice`): nothing here."""
        return []


class MigDeviceConfig(_Object):
    """Configuration of MIG devices allocated by gpudra. Without `sharing`, the device is left as it is."""

    model_config = ConfigDict(json_schema_extra=_require_type_fields, title="MigDeviceConfig")

    api_version: Literal["resource.gpudra.io/v1beta1"] = API_VERSION
    kind: Literal["MigDeviceConfig"] = "MigDeviceConfig"
    sharing: MigDeviceSharing | None = Field(
        default=None, description="how containers sharing the MIG device run on it"
    )

    def normalized(self) -> MigDeviceConfig:
        """The same configuration with every default that the settings imply spelled out."""
        if self.sharing is None:
            return self
        return self.model_copy(update={"sharing": self.sharing.normalized()})

    def advice(self) -> list[Advice]:
        """What the configuration does otherwise than it may seem to (see `Advice`)."""
        return [] if self.sharing is None else self.sharing.advice()


DeviceConfig = GpuConfig | MigDeviceConfig

KINDS: Final[dict[str, type[GpuConfig] | type[MigDeviceConfig]]] = {
    "GpuConfig": GpuConfig,
    "MigDeviceConfig": MigDeviceConfig,
}
