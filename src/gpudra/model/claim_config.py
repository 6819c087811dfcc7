"""Which opaque config applies to each device of a claim's allocation, by DRA's precedence rules. Pure.

`status.allocation.devices.config` holds the configs of the claim's DeviceClasses (source FromClass) and
of the claim itself (FromClaim), for every driver. For each allocation result of this driver, entries are
taken class entries first, then claim entries, each in list order, and the last one that applies wins
(one whole config per device; fields are never merged). An entry with `requests` applies to the results
of those requests (`req` also covers its subrequests `req/sub`) and must be the kind that fits the
device; an entry without `requests` applies to every result whose device its kind fits. A device no entry
applies to gets its kind's default config. These are the rules of NVIDIA's and the example DRA drivers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpudra.api import DeviceConfig, GpuConfig, MigDeviceConfig, decode_config
from gpudra.api.decode import combined
from gpudra.errors import ClaimError, ConfigError
from gpudra.model.claim import Allocation, ConfigEntry

DeviceType = Literal["gpu", "mig"]
Source = Literal["FromClass", "FromClaim"]

_KIND_FOR: dict[DeviceType, type[GpuConfig] | type[MigDeviceConfig]] = {
    "gpu": GpuConfig,
    "mig": MigDeviceConfig,
}
_DEVICE_WORDS: dict[DeviceType, str] = {"gpu": "a whole GPU", "mig": "a MIG device"}


@dataclass(frozen=True)
class ResolvedConfig:
    """The config that applies to one allocation result, and where it came from."""

    request: str  # the result's request, "req" or "req/sub"
    pool: str
    device: str
    config: DeviceConfig
    source: Source | None  # None: no entry applied and `config` is the default
    entry: int | None  # index in status.allocation.devices.config of the entry that applied


@dataclass(frozen=True)
class _Entry:
    index: int
    source: Source
    requests: frozenset[str]
    config: DeviceConfig

    def names(self, request: str) -> bool:
        return request in self.requests or request.split("/", 1)[0] in self.requests


def resolve_configs(
    allocation: Allocation, *, driver: str, device_types: Mapping[str, DeviceType]
) -> list[ResolvedConfig]:
    """The config of every result of `driver` in a claim's `status.allocation`, in result order.

    `device_types` tells, by device name, whether each allocated device is a whole GPU or a MIG device.
    Raises ConfigError naming every invalid entry of this driver (even one that no result uses, as
    `gpudra validate` would) or every entry whose kind does not fit a device it names; ClaimError
    when a result names a device that `device_types` does not know.
    """
    entries = _entries(allocation.config, driver)
    resolved, problems = [], []
    for position, result in enumerate(allocation.results):
        if result.driver != driver:
            continue
        device = result.device
        if device not in device_types:
            raise ClaimError(
                f"status.allocation.devices.results[{position}].device: {device} is not a device of "
                f"this node's {driver} pool"
            )
        device_type = device_types[device]
        winner = _winner(entries, request=result.request, device=device, device_type=device_type)
        if isinstance(winner, ConfigError):
            problems.append(winner)
            continue
        resolved.append(
            ResolvedConfig(
                request=result.request,
                pool=result.pool,
                device=device,
                config=_KIND_FOR[device_type]() if winner is None else winner.config,
                source=None if winner is None else winner.source,
                entry=None if winner is None else winner.index,
            )
        )
    if problems:
        raise combined(problems)
    return resolved


def _entries(config: Sequence[ConfigEntry], driver: str) -> list[_Entry]:
    """This driver's entries, decoded, class entries first; ConfigError listing every bad one."""
    entries, problems = [], []
    for item in config:
        field = f"status.allocation.devices.config[{item.index}]"
        # Only opaque configs name a driver; any other kind of entry cannot be gpudra's.
        if item.driver != driver:
            continue
        source: Source = "FromClass" if item.source == "FromClass" else "FromClaim"
        if item.source != source:
            problems.append(ConfigError("must be one of: FromClass, FromClaim", field=f"{field}.source"))
            continue
        try:
            decoded = decode_config(item.parameters, field_prefix=f"{field}.opaque.parameters")
        except ConfigError as err:
            problems.append(err)
            continue
        entries.append(_Entry(item.index, source, item.requests, decoded))
    if problems:
        raise combined(problems)
    return sorted(entries, key=lambda entry: entry.source != "FromClass")


def _winner(
    entries: list[_Entry], *, request: str, device: str, device_type: DeviceType
) -> _Entry | ConfigError | None:
    kind = _KIND_FOR[device_type]
    for entry in reversed(entries):
        if entry.requests and entry.names(request):
            if isinstance(entry.config, kind):
                return entry
            return ConfigError(
                f"{entry.config.kind} cannot configure {device} (request {request}): "
                f"{_DEVICE_WORDS[device_type]} takes a {kind.__name__}",
                field=f"status.allocation.devices.config[{entry.index}].opaque.parameters.kind",
            )
        if not entry.requests and isinstance(entry.config, kind):
            return entry
    return None
