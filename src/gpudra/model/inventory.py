"""What a node's GPUs are: the records that discovery produces and the device model consumes. Pure.

These are plain frozen dataclasses so that the device model, slice building and the CLI can be
tested without NVML; `gpudra.gpu.nvml` fills them from pynvml (real or simulated).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class MigPlacement:
    """A GPU-instance placement in memory-slice units (`start`, `size`), as NVML reports it."""

    start: int
    size: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile as `nvmlDeviceGetGpuInstanceProfileInfo` reports it.

    `id` is the profile ID (what create/placement calls take), not the NVML index constant.
    """

    id: int
    name: str  # e.g. "1g.10gb", "1g.10gb+me"
    slice_count: int  # GPU (compute) slices
    instance_count: int  # max instances of this profile on one GPU
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    memory_mib: int
    placements: tuple[MigPlacement, ...]

    @property
    def memory_slices(self) -> int:
        """Memory slices one instance occupies (the placement size)."""
        return self.placements[0].size if self.placements else 0


@dataclass(frozen=True)
class MigDevice:
    """An existing MIG device (one compute instance in one GPU instance)."""

    uuid: str
    profile_id: int
    profile_name: str
    placement: MigPlacement
    gpu_instance_id: int
    compute_instance_id: int
    memory_mib: int
    multiprocessors: int


@dataclass(frozen=True)
class GpuInstance:
    """An existing MIG GPU instance and the MIG devices (compute instances) in it, by UUID: none for
    one made without, or left between the two steps of creating a MIG device."""

    id: int
    profile_id: int
    profile_name: str
    placement: MigPlacement
    mig_devices: tuple[str, ...]


@dataclass(frozen=True)
class MigCapabilities:
    """What a container needs to reach one MIG device besides /dev/nvidia<minor>: two capability nodes.

    The driver's `nvidia-caps` character devices `/dev/nvidia-caps/nvidia-cap<minor>`: `gi_minor` grants
    access to the GPU instance, `ci_minor` to the compute instance in it. The major is assigned when
    the driver loads (238, 241 and 508 all occur), so it is read from /proc/devices, not assumed.
    """

    major: int
    gi_minor: int
    ci_minor: int


@dataclass(frozen=True)
class Gpu:
    """One physical GPU."""

    index: int  # NVML index (not stable across reboots; not the minor number)
    minor: int  # N in /dev/nvidiaN; device names use it
    uuid: str
    name: str  # product name, e.g. "NVIDIA H100 80GB HBM3"
    brand: str  # e.g. "Nvidia", "Tesla"
    architecture: str  # e.g. "Hopper", "Ampere", "Ada Lovelace", "Turing"
    cuda_compute_capability: str  # "9.0"
    memory_bytes: int
    pci_bus_id: str  # extended BDF, lower case: "0000:17:00.0"
    pcie_root: str | None  # "pci0000:00"; None where sysfs does not say
    numa_node: int | None
    nvlink_peers: tuple[str, ...]  # PCI bus IDs of GPUs reachable over NVLink (directly or via NVSwitch)
    nvlink_domain: str | None  # same value for every GPU of one NVLink island; None without NVLink
    multiprocessors: int | None  # SMs of the full GPU; None where NVML cannot tell
    mig_capable: bool
    mig_enabled: bool
    mig_memory_slices: int  # memory slices of the full GPU (8 on A100/H100, 4 on A30); 0 without MIG
    # MIG mode can be changed here without a GPU reset: MIG-capable, Hopper or newer, and not
    # virtualized. Ampere needs a reset, and a VM (even with passthrough) cannot reset the GPU itself,
    # so there a mode change only takes effect after an out-of-band reset or a reboot.
    mig_mode_switchable: bool = False
    mig_profiles: tuple[MigProfile, ...] = field(default=())
    mig_devices: tuple[MigDevice, ...] = field(default=())


@dataclass(frozen=True)
class Inventory:
    """Everything discovery found on one node."""

    driver_version: str  # "580.65.06"
    cuda_driver_version: str  # "13.0"
    gpus: tuple[Gpu, ...]
