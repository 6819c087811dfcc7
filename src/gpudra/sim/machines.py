"""The simulated machines: GPU models, MIG profile tables and node layouts from the reference tables. Pure.

Numbers come from /work/shared/reference/gpu-mechanics.md section 2 (real `nvidia-smi mig -lgip` /
`-lgipp` output and the MIG user guide), product names, memory and PCI ids from real `nvidia-smi` and
`lspci` output. Profile IDs are the driver's IDs (what create calls take), `index` is the NVML profile
index constant (what the profile-info call takes); the two differ.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

# NVML constants the simulator reports (nvml.h values; the simulator must not import pynvml).
ARCH_TURING, ARCH_AMPERE, ARCH_ADA, ARCH_HOPPER = 6, 7, 8, 9
BRAND_TESLA, BRAND_NVIDIA = 2, 14
PROFILE_1_SLICE, PROFILE_2_SLICE, PROFILE_3_SLICE, PROFILE_4_SLICE, PROFILE_7_SLICE = 0, 1, 2, 3, 4
PROFILE_1_SLICE_REV1, PROFILE_1_SLICE_REV2 = 7, 9
VIRTUALIZATION_NONE, VIRTUALIZATION_PASSTHROUGH = 0, 1  # nvmlGpuVirtualizationMode_t
NVIDIA_VENDOR_ID = 0x10DE
# nvmlEventType bits
EVENT_SINGLE_BIT_ECC, EVENT_DOUBLE_BIT_ECC, EVENT_PSTATE, EVENT_XID, EVENT_CLOCK = 0x1, 0x2, 0x4, 0x8, 0x10
EVENT_MIG_CONFIG_CHANGE = 0x100
# What a bare-metal or passthrough GPU offers to nvmlDeviceRegisterEvents.
EVENTS_OFFERED = (
    EVENT_SINGLE_BIT_ECC
    | EVENT_DOUBLE_BIT_ECC
    | EVENT_PSTATE
    | EVENT_XID
    | EVENT_CLOCK
    | EVENT_MIG_CONFIG_CHANGE
)


@dataclass(frozen=True)
class MigProfileSpec:
    """One GPU-instance profile as the driver reports it (`-lgip` columns plus `-lgipp` placements)."""

    index: int
    id: int
    name: str
    slices: int  # GPU (SM) slices, NVML's sliceCount
    instances: int
    starts: tuple[int, ...]
    size: int  # memory slices per placement
    multiprocessors: int
    copy_engines: int
    decoders: int
    jpegs: int
    ofas: int
    memory_mib: int


@dataclass(frozen=True)
class GpuModel:
    """A GPU product: what NVML reports that does not depend on the board's slot."""

    name: str
    brand: int
    architecture: int
    compute_capability: tuple[int, int]
    memory_mib: int
    pci_device: int
    pci_subsystem: int
    nvlinks: int
    mig_profiles: tuple[MigProfileSpec, ...]
    # Ampere answers profile queries only with MIG enabled; Hopper answers them either way.
    profiles_need_mig_mode: bool

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)


@dataclass(frozen=True)
class NvSwitch:
    bus: int
    pci_device: int


@dataclass(frozen=True)
class GpuSlot:
    """One board in one machine: the model plus where it sits."""

    model: GpuModel
    bus: int  # PCI bus number; domain 0, device 0, function 0
    minor: int
    numa_node: int  # -1 where the firmware gives no proximity information, as sysfs writes it
    pcie_root: str  # sysfs name of the root complex, "pci0000:15"
    nvswitches: tuple[NvSwitch, ...]  # link i goes to nvswitches[i % len]; none: NVLink NOT_SUPPORTED

    @property
    def bus_id(self) -> str:
        """NVML's extended bus id, "00000000:18:00.0"."""
        return f"{0:08X}:{self.bus:02X}:00.0"

    @property
    def bdf(self) -> str:
        """The sysfs name, "0000:18:00.0"."""
        return f"{0:04x}:{self.bus:02x}:00.0"


@dataclass(frozen=True)
class Machine:
    name: str
    driver_version: str
    cuda_driver_version: int
    mig_enabled: bool  # initial MIG mode of the MIG-capable GPUs
    gpus: tuple[GpuSlot, ...]
    # What nvmlDeviceGetVirtualizationMode reports for every GPU: NONE on bare metal, PASSTHROUGH in a
    # VM that was handed the whole board. A VM cannot reset the GPU, so MIG mode changes need a reboot.
    virtualization: int = VIRTUALIZATION_NONE
    # False: the driver refuses time-slice changes (nvidia-smi compute-policy answers Not Supported) and
    # the MPS control daemon does not start, as on GPUs and guests whose driver offers neither.
    sharing_supported: bool = True
    # The event types nvmlDeviceGetSupportedEventTypes reports for every GPU; registering for others is
    # NOT_SUPPORTED (0: a driver that offers no events, as in some vGPU guests).
    event_types: int = EVENTS_OFFERED

    def gpu_uuid(self, index: int) -> str:
        """Deterministic per machine and slot, so test expectations do not drift between runs."""
        return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpudra-sim/{self.name}/{self.gpus[index].bdf}')}"


# index, id, name, GPU slices, max instances, placement starts, memory slices, SMs, CE, DEC, JPEG, OFA, MiB
_Row = tuple[int, int, str, int, int, tuple[int, ...], int, int, int, int, int, int, int]


def _profiles(rows: tuple[_Row, ...]) -> tuple[MigProfileSpec, ...]:
    return tuple(
        MigProfileSpec(
            index=index,
            id=id_,
            name=name,
            slices=slices,
            instances=instances,
            starts=starts,
            size=size,
            multiprocessors=sms,
            copy_engines=ces,
            decoders=decs,
            jpegs=jpegs,
            ofas=ofas,
            memory_mib=memory_mib,
        )
        for index, id_, name, slices, instances, starts, size, sms, ces, decs, jpegs, ofas, memory_mib in rows
    )


_SEVEN = (0, 1, 2, 3, 4, 5, 6)

# Memory in MiB as -lgip shows it (GiB x 1024).
A100_SXM4_40GB = GpuModel(
    name="NVIDIA A100-SXM4-40GB",
    brand=BRAND_NVIDIA,
    architecture=ARCH_AMPERE,
    compute_capability=(8, 0),
    memory_mib=40960,
    pci_device=0x20B0,
    pci_subsystem=0x134F10DE,
    nvlinks=12,
    profiles_need_mig_mode=True,
    mig_profiles=_profiles(
        (
            (PROFILE_1_SLICE, 19, "1g.5gb", 1, 7, _SEVEN, 1, 14, 1, 0, 0, 0, 4864),
            (PROFILE_1_SLICE_REV1, 20, "1g.5gb+me", 1, 1, _SEVEN, 1, 14, 1, 1, 1, 1, 4864),
            (PROFILE_1_SLICE_REV2, 15, "1g.10gb", 1, 4, (0, 2, 4, 6), 2, 14, 1, 1, 0, 0, 9856),
            (PROFILE_2_SLICE, 14, "2g.10gb", 2, 3, (0, 2, 4), 2, 28, 2, 1, 0, 0, 9856),
            (PROFILE_3_SLICE, 9, "3g.20gb", 3, 2, (0, 4), 4, 42, 3, 2, 0, 0, 19968),
            (PROFILE_4_SLICE, 5, "4g.20gb", 4, 1, (0,), 4, 56, 4, 2, 0, 0, 19968),
            (PROFILE_7_SLICE, 0, "7g.40gb", 7, 1, (0,), 8, 98, 7, 5, 1, 1, 40192),
        )
    ),
)

H100_SXM5_80GB = GpuModel(
    name="NVIDIA H100 80GB HBM3",
    brand=BRAND_NVIDIA,
    architecture=ARCH_HOPPER,
    compute_capability=(9, 0),
    memory_mib=81559,
    pci_device=0x2330,
    pci_subsystem=0x16C110DE,
    nvlinks=18,
    profiles_need_mig_mode=False,
    mig_profiles=_profiles(
        (
            (PROFILE_1_SLICE, 19, "1g.10gb", 1, 7, _SEVEN, 1, 16, 1, 1, 1, 0, 9984),
            (PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, _SEVEN, 1, 16, 1, 1, 1, 1, 9984),
            (PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 4, (0, 2, 4, 6), 2, 26, 1, 1, 1, 0, 20096),
            (PROFILE_2_SLICE, 14, "2g.20gb", 2, 3, (0, 2, 4), 2, 32, 2, 2, 2, 0, 20096),
            (PROFILE_3_SLICE, 9, "3g.40gb", 3, 2, (0, 4), 4, 60, 3, 3, 3, 0, 40448),
            (PROFILE_4_SLICE, 5, "4g.40gb", 4, 1, (0,), 4, 64, 4, 4, 4, 0, 40448),
            (PROFILE_7_SLICE, 0, "7g.80gb", 7, 1, (0,), 8, 132, 8, 7, 7, 1, 81152),
        )
    ),
)

# Read from a real H200 through NVML (driver 580.159.04, in a VM): the profile table, PCI ids and memory.
# The profile IDs, SM counts and placements are the H100's; each slice holds about 1.8x the memory.
H200_SXM5_141GB = GpuModel(
    name="NVIDIA H200",
    brand=BRAND_NVIDIA,
    architecture=ARCH_HOPPER,
    compute_capability=(9, 0),
    memory_mib=143771,
    pci_device=0x2335,
    pci_subsystem=0x18BF10DE,
    nvlinks=18,
    profiles_need_mig_mode=False,
    mig_profiles=_profiles(
        (
            (PROFILE_1_SLICE, 19, "1g.18gb", 1, 7, _SEVEN, 1, 16, 1, 1, 1, 0, 16384),
            (PROFILE_1_SLICE_REV1, 20, "1g.18gb+me", 1, 1, _SEVEN, 1, 16, 1, 1, 1, 1, 16384),
            (PROFILE_1_SLICE_REV2, 15, "1g.35gb", 1, 4, (0, 2, 4, 6), 2, 26, 1, 1, 1, 0, 33280),
            (PROFILE_2_SLICE, 14, "2g.35gb", 2, 3, (0, 2, 4), 2, 32, 2, 2, 2, 0, 33280),
            (PROFILE_3_SLICE, 9, "3g.71gb", 3, 2, (0, 4), 4, 60, 3, 3, 3, 0, 71424),
            (PROFILE_4_SLICE, 5, "4g.71gb", 4, 1, (0,), 4, 64, 4, 4, 4, 0, 71424),
            (PROFILE_7_SLICE, 0, "7g.141gb", 7, 1, (0,), 8, 132, 8, 7, 7, 1, 143360),
        )
    ),
)

L4 = GpuModel(
    name="NVIDIA L4",
    brand=BRAND_NVIDIA,
    architecture=ARCH_ADA,
    compute_capability=(8, 9),
    memory_mib=23034,
    pci_device=0x27B8,
    pci_subsystem=0x16CA10DE,
    nvlinks=0,
    profiles_need_mig_mode=False,
    mig_profiles=(),
)

T4 = GpuModel(
    name="Tesla T4",
    brand=BRAND_TESLA,
    architecture=ARCH_TURING,
    compute_capability=(7, 5),
    memory_mib=15360,
    pci_device=0x1EB8,
    pci_subsystem=0x12A210DE,
    nvlinks=0,
    profiles_need_mig_mode=False,
    mig_profiles=(),
)

DRIVER_VERSION = "580.65.06"
CUDA_DRIVER_VERSION = 13000

# DGX A100: AMD Rome, two sockets, GPUs in pairs behind four root complexes per socket; six NVSwitches.
_A100_SWITCHES = tuple(NvSwitch(bus=bus, pci_device=0x1AF1) for bus in (0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9))
DGX_A100 = Machine(
    name="dgx-a100",
    driver_version=DRIVER_VERSION,
    cuda_driver_version=CUDA_DRIVER_VERSION,
    mig_enabled=True,
    gpus=tuple(
        GpuSlot(
            model=A100_SXM4_40GB,
            bus=bus,
            minor=minor,
            numa_node=minor // 4,
            pcie_root=root,
            nvswitches=_A100_SWITCHES,
        )
        for minor, (bus, root) in enumerate(
            [
                (0x07, "pci0000:00"),
                (0x0F, "pci0000:00"),
                (0x47, "pci0000:40"),
                (0x4E, "pci0000:40"),
                (0x87, "pci0000:80"),
                (0x90, "pci0000:80"),
                (0xB7, "pci0000:a0"),
                (0xBD, "pci0000:a0"),
            ]
        )
    ),
)

# DGX H100: Intel Sapphire Rapids, two sockets, one root port per GPU; four NVSwitch chips on the baseboard.
_H100_SWITCHES = tuple(NvSwitch(bus=bus, pci_device=0x22A3) for bus in (0x05, 0x06, 0x07, 0x08))
DGX_H100 = Machine(
    name="dgx-h100",
    driver_version=DRIVER_VERSION,
    cuda_driver_version=CUDA_DRIVER_VERSION,
    mig_enabled=True,
    gpus=tuple(
        GpuSlot(
            model=H100_SXM5_80GB,
            bus=bus,
            minor=minor,
            numa_node=minor // 4,
            pcie_root=root,
            nvswitches=_H100_SWITCHES,
        )
        for minor, (bus, root) in enumerate(
            [
                (0x18, "pci0000:15"),
                (0x2A, "pci0000:26"),
                (0x3A, "pci0000:37"),
                (0x5D, "pci0000:59"),
                (0x9A, "pci0000:97"),
                (0xAB, "pci0000:a7"),
                (0xBA, "pci0000:b7"),
                (0xDB, "pci0000:d7"),
            ]
        )
    ),
)

# A two-socket PCIe server. Minor numbers deliberately differ from NVML's bus-ordered index.
MIXED = Machine(
    name="mixed",
    driver_version=DRIVER_VERSION,
    cuda_driver_version=CUDA_DRIVER_VERSION,
    mig_enabled=False,
    gpus=(
        GpuSlot(model=L4, bus=0x17, minor=0, numa_node=0, pcie_root="pci0000:00", nvswitches=()),
        GpuSlot(model=L4, bus=0x31, minor=1, numa_node=0, pcie_root="pci0000:00", nvswitches=()),
        GpuSlot(model=T4, bus=0x4B, minor=4, numa_node=0, pcie_root="pci0000:00", nvswitches=()),
        GpuSlot(model=L4, bus=0x98, minor=2, numa_node=1, pcie_root="pci0000:80", nvswitches=()),
        GpuSlot(model=L4, bus=0xB1, minor=3, numa_node=1, pcie_root="pci0000:80", nvswitches=()),
        GpuSlot(model=T4, bus=0xCA, minor=5, numa_node=1, pcie_root="pci0000:80", nvswitches=()),
    ),
)

# A cloud VM with one H100 SXM board passed through (the "1 GPU" size of an HGX H100 host): the guest
# sees a plain PCI device behind a virtual root port, no NVSwitch (NVML answers NOT_SUPPORTED for its
# NVLinks), no NUMA proximity information (sysfs numa_node -1), virtualization mode PASSTHROUGH and
# MIG disabled at boot, as an H200 in such a VM showed; the driver is the DGX one.
VM_H100 = Machine(
    name="vm-h100",
    driver_version=DRIVER_VERSION,
    cuda_driver_version=CUDA_DRIVER_VERSION,
    mig_enabled=False,
    gpus=(
        GpuSlot(model=H100_SXM5_80GB, bus=0x04, minor=0, numa_node=-1, pcie_root="pci0000:00", nvswitches=()),
    ),
    virtualization=VIRTUALIZATION_PASSTHROUGH,
)

# The same kind of VM with one H200 passed through, as this project's lent GPU machines are.
VM_H200 = Machine(
    name="vm-h200",
    driver_version=DRIVER_VERSION,
    cuda_driver_version=CUDA_DRIVER_VERSION,
    mig_enabled=False,
    gpus=(
        GpuSlot(
            model=H200_SXM5_141GB, bus=0x06, minor=0, numa_node=-1, pcie_root="pci0000:00", nvswitches=()
        ),
    ),
    virtualization=VIRTUALIZATION_PASSTHROUGH,
)

# A test machine for refusals: one L4 whose driver offers neither time-slice settings nor MPS, so that
# claims asking for either fail with the tools' reason and leave nothing behind, nor NVML events, so
# that health checks fall back to polling (as in a vGPU guest).
NO_SHARING = Machine(
    name="no-sharing",
    driver_version=DRIVER_VERSION,
    cuda_driver_version=CUDA_DRIVER_VERSION,
    mig_enabled=False,
    gpus=(GpuSlot(model=L4, bus=0x17, minor=0, numa_node=0, pcie_root="pci0000:00", nvswitches=()),),
    sharing_supported=False,
    event_types=0,
)

MACHINES = {machine.name: machine for machine in (DGX_A100, DGX_H100, MIXED, VM_H100, VM_H200, NO_SHARING)}
