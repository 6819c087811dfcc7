"""gpudra's opaque device configuration API, resource.gpudra.io/v1beta1 (GpuConfig, MigDeviceConfig). Pure.

Users put these objects in `opaque.parameters` of a DeviceClass's or ResourceClaim's `config` entries
whose `opaque.driver` is gpudra's driver name; api/README.md is the reference page.
"""

from __future__ import annotations

from gpudra.api.decode import config_advice, config_problems, decode_config
from gpudra.api.schemas import write_schemas
from gpudra.api.v1beta1 import (
    API_VERSION,
    Advice,
    DeviceConfig,
    GpuConfig,
    GpuSharing,
    MigDeviceConfig,
    MigDeviceSharing,
    MpsConfig,
    TimeSlicingConfig,
)

__all__ = [
    "API_VERSION",
    "Advice",
    "DeviceConfig",
    "GpuConfig",
    "GpuSharing",
    "MigDeviceConfig",
    "MigDeviceSharing",
    "MpsConfig",
    "TimeSlicingConfig",
    "config_advice",
    "config_problems",
    "decode_config",
    "write_schemas",
]
