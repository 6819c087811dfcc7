"""gpudra's error tree. Pure.

    GpudraError
    ├── ConfigError          bad user input (opaque config, flags, manifests); names the field
    ├── HardwareError        NVML or a GPU tool failed; carries the NVML error name when there is one
    │   ├── NvmlUnavailable  no NVML library / driver on this machine
    │   ├── NotSupported     the GPU cannot do what was asked (MIG on a non-MIG GPU, ...)
    │   ├── InsufficientResources  placement occupied, no capacity left
    │   └── InUse            destroy or reconfigure while processes hold the device
    ├── ClaimError           a ResourceClaim cannot be prepared as allocated (wrong node, UID, ...)
    └── ClusterError         the API server refused or is unreachable

Every message says what was wrong and, for input, which values are allowed. A failure in one claim
becomes that claim's error in the kubelet response; it never crashes the plugin.
"""

from __future__ import annotations


class GpudraError(Exception):
    """Base of every error gpudra raises on purpose."""


class ConfigError(GpudraError):
    """Invalid user input. `field` is the dotted path of the offending field, when known."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.reason = message


class HardwareError(GpudraError):
    """A GPU operation failed. `nvml_error` is the NVML error class name (e.g. 'NVMLError_InUse')."""

    def __init__(self, message: str, *, nvml_error: str | None = None) -> None:
        super().__init__(message)
        self.nvml_error = nvml_error


class NvmlUnavailable(HardwareError):
    """NVML cannot be loaded or initialised (no driver, no library)."""


class NotSupported(HardwareError):
    """The GPU does not support the operation."""


class InsufficientResources(HardwareError):
    """The GPU has no room for the requested instance (placement occupied or capacity used up)."""


class InUse(HardwareError):
    """The device or instance is in use and cannot be changed now."""


class ClaimError(GpudraError):
    """A ResourceClaim cannot be prepared as it is allocated."""


class ClusterError(GpudraError):
    """The Kubernetes API server refused a request or could not be reached."""
