"""Node inventories built by hand from the MIG tables in reference/gpu-mechanics.md section 2."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

from gpudra.model.inventory import Gpu, Inventory, MigDevice, MigPlacement, MigProfile

DRIVER_VERSION = "580.65.06"
CUDA_DRIVER_VERSION = "13.0"
MIB = 1024**2


def _placements(starts: Iterable[int], size: int) -> tuple[MigPlacement, ...]:
    return tuple(MigPlacement(start, size) for start in starts)


def profile(row: tuple[int, str, int, int, Iterable[int], int, int, int, int, int, int, int]) -> MigProfile:
    """A MigProfile from a row of the tables below."""
    id, name, slices, instances, starts, size, sm, ce, dec, jpeg, ofa, mib = row
    return MigProfile(
        id=id,
        name=name,
        slice_count=slices,
        instance_count=instances,
        multiprocessors=sm,
        copy_engines=ce,
        decoders=dec,
        encoders=0,
        jpegs=jpeg,
        ofas=ofa,
        memory_mib=mib,
        placements=_placements(starts, size),
    )


# id, name, GPU slices, instances, placement starts, size, SM, CE, DEC, JPEG, OFA, MiB

# H100 80GB HBM3 (SXM5), `nvidia-smi mig -lgip` / `-lgipp`
H100_PROFILES = tuple(
    map(
        profile,
        [
            (19, "1g.10gb", 1, 7, range(7), 1, 16, 1, 1, 1, 0, 9984),
            (20, "1g.10gb+me", 1, 1, range(7), 1, 16, 1, 1, 1, 1, 9984),
            (15, "1g.20gb", 1, 4, (0, 2, 4, 6), 2, 26, 1, 1, 1, 0, 20096),
            (14, "2g.20gb", 2, 3, (0, 2, 4), 2, 32, 2, 2, 2, 0, 20096),
            (9, "3g.40gb", 3, 2, (0, 4), 4, 60, 3, 3, 3, 0, 40448),
            (5, "4g.40gb", 4, 1, (0,), 4, 64, 4, 4, 4, 0, 40448),
            (0, "7g.80gb", 7, 1, (0,), 8, 132, 8, 7, 7, 1, 81152),
        ],
    )
)

# A100-SXM4-40GB
A100_PROFILES = tuple(
    map(
        profile,
        [
            (19, "1g.5gb", 1, 7, range(7), 1, 14, 1, 0, 0, 0, 4864),
            (20, "1g.5gb+me", 1, 1, range(7), 1, 14, 1, 1, 1, 1, 4864),
            (15, "1g.10gb", 1, 4, (0, 2, 4, 6), 2, 14, 1, 1, 0, 0, 9856),
            (14, "2g.10gb", 2, 3, (0, 2, 4), 2, 28, 2, 1, 0, 0, 9856),
            (9, "3g.20gb", 3, 2, (0, 4), 4, 42, 3, 2, 0, 0, 19968),
            (5, "4g.20gb", 4, 1, (0,), 4, 56, 4, 2, 0, 0, 19968),
            (0, "7g.40gb", 7, 1, (0,), 8, 98, 7, 5, 1, 1, 40192),
        ],
    )
)

# A30-24GB: 4 memory slices
A30_PROFILES = tuple(
    map(
        profile,
        [
            (14, "1g.6gb", 1, 4, range(4), 1, 14, 1, 1, 0, 0, 5952),
            (21, "1g.6gb+me", 1, 1, range(4), 1, 14, 1, 1, 1, 1, 5952),
            (5, "2g.12gb", 2, 2, (0, 2), 2, 28, 2, 2, 0, 0, 11968),
            (6, "2g.12gb+me", 2, 1, (0, 2), 2, 28, 2, 2, 1, 1, 11968),
            (0, "4g.24gb", 4, 1, (0,), 4, 56, 4, 4, 1, 1, 24000),
        ],
    )
)

# DGX H100 and DGX A100 GPU bus numbers, in minor order
_H100_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_A100_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


def _uuid(kind: str, *parts: object) -> str:
    return f"{kind}-{uuid.uuid5(uuid.NAMESPACE_OID, '/'.join(map(str, parts)))}"


def mig_device(gpu_uuid: str, mig_profile: MigProfile, start: int, gi: int) -> MigDevice:
    return MigDevice(
        uuid=_uuid("MIG", gpu_uuid, mig_profile.name, start),
        profile_id=mig_profile.id,
        profile_name=mig_profile.name,
        placement=MigPlacement(start, mig_profile.memory_slices),
        gpu_instance_id=gi,
        compute_instance_id=0,
        memory_mib=mig_profile.memory_mib,
        multiprocessors=mig_profile.multiprocessors,
    )


def existing(
    gpu_uuid: str, profiles: Sequence[MigProfile], layout: Iterable[tuple[str, int]]
) -> tuple[MigDevice, ...]:
    by_name = {p.name: p for p in profiles}
    return tuple(mig_device(gpu_uuid, by_name[name], start, gi) for gi, (name, start) in enumerate(layout, 1))


def h100(
    minor: int,
    *,
    mig_enabled: bool = False,
    layout: Iterable[tuple[str, int]] = (),
    virtualized: bool = False,
) -> Gpu:
    """An H100 on bare metal, whose MIG mode switches without a reset; in a VM it would need one."""
    gpu_uuid = _uuid("GPU", "h100", minor)
    return Gpu(
        index=minor,
        minor=minor,
        uuid=gpu_uuid,
        name="NVIDIA H100 80GB HBM3",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability="9.0",
        memory_bytes=81559 * MIB,
        pci_bus_id=f"0000:{_H100_BUSES[minor % 8]:02x}:00.0",
        pcie_root=f"pci0000:{_H100_BUSES[minor % 8] - 2:02x}",
        numa_node=0 if minor % 8 < 4 else 1,
        nvlink_peers=tuple(f"0000:{bus:02x}:00.0" for i, bus in enumerate(_H100_BUSES) if i != minor % 8),
        nvlink_domain="nvswitch-0",
        multiprocessors=132,
        mig_capable=True,
        mig_enabled=mig_enabled,
        mig_memory_slices=8,
        mig_mode_switchable=not virtualized,
        mig_profiles=H100_PROFILES,
        mig_devices=existing(gpu_uuid, H100_PROFILES, layout),
    )


def a100(minor: int, *, mig_enabled: bool = True, layout: Iterable[tuple[str, int]] = ()) -> Gpu:
    gpu_uuid = _uuid("GPU", "a100", minor)
    return Gpu(
        index=minor,
        minor=minor,
        uuid=gpu_uuid,
        name="NVIDIA A100-SXM4-40GB",
        brand="Nvidia",
        architecture="Ampere",
        cuda_compute_capability="8.0",
        memory_bytes=40960 * MIB,
        pci_bus_id=f"0000:{_A100_BUSES[minor % 8]:02x}:00.0",
        pcie_root=f"pci0000:{_A100_BUSES[minor % 8] & 0xF0:02x}",
        numa_node=(minor % 8) // 2 % 4,
        nvlink_peers=tuple(f"0000:{bus:02x}:00.0" for i, bus in enumerate(_A100_BUSES) if i != minor % 8),
        nvlink_domain="nvswitch-0",
        multiprocessors=108,
        mig_capable=True,
        mig_enabled=mig_enabled,
        mig_memory_slices=8,
        mig_profiles=A100_PROFILES,
        mig_devices=existing(gpu_uuid, A100_PROFILES, layout),
    )


def a30(minor: int) -> Gpu:
    return Gpu(
        index=minor,
        minor=minor,
        uuid=_uuid("GPU", "a30", minor),
        name="NVIDIA A30",
        brand="Nvidia",
        architecture="Ampere",
        cuda_compute_capability="8.0",
        memory_bytes=24576 * MIB,
        pci_bus_id=f"0000:{0x21 + minor:02x}:00.0",
        pcie_root="pci0000:20",
        numa_node=0,
        nvlink_peers=(),
        nvlink_domain=None,
        multiprocessors=56,
        mig_capable=True,
        mig_enabled=True,
        mig_memory_slices=4,
        mig_profiles=A30_PROFILES,
    )


def plain(minor: int, kind: str) -> Gpu:
    """A GPU without MIG: "l4" (NVIDIA L4) or "t4" (Tesla T4)."""
    l4 = kind == "l4"
    return Gpu(
        index=minor,
        minor=minor,
        uuid=_uuid("GPU", kind, minor),
        name="NVIDIA L4" if l4 else "Tesla T4",
        brand="Nvidia" if l4 else "Tesla",
        architecture="Ada Lovelace" if l4 else "Turing",
        cuda_compute_capability="8.9" if l4 else "7.5",
        memory_bytes=(23034 if l4 else 15360) * MIB,
        pci_bus_id=f"0000:{0x31 + minor:02x}:00.0",
        pcie_root=None,
        numa_node=None,
        nvlink_peers=(),
        nvlink_domain=None,
        multiprocessors=58 if l4 else 40,
        mig_capable=False,
        mig_enabled=False,
        mig_memory_slices=0,
    )


def node(*gpus: Gpu) -> Inventory:
    return Inventory(driver_version=DRIVER_VERSION, cuda_driver_version=CUDA_DRIVER_VERSION, gpus=gpus)


def h100_node() -> Inventory:
    """8x H100 80GB HBM3 with NVSwitch: 0-3 MIG off, 4-7 MIG on, some instances on 4 and 5."""
    layouts = {4: (("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb+me", 3), ("3g.40gb", 4)), 5: (("7g.80gb", 0),)}
    return node(*(h100(m, mig_enabled=m >= 4, layout=layouts.get(m, ())) for m in range(8)))


def a100_node() -> Inventory:
    """8x A100-SXM4-40GB: 0-5 MIG on (two 3g.20gb on 0, seven 1g.5gb on 1), 6-7 MIG off."""
    layouts = {0: (("3g.20gb", 0), ("3g.20gb", 4)), 1: tuple(("1g.5gb", s) for s in range(7))}
    return node(*(a100(m, mig_enabled=m < 6, layout=layouts.get(m, ())) for m in range(8)))


def mixed_node() -> Inventory:
    """Two L4 and two T4, no MIG, no NVLink, no NUMA or PCIe root known."""
    return node(plain(0, "l4"), plain(1, "l4"), plain(2, "t4"), plain(3, "t4"))


def big_node(count: int = 64) -> Inventory:
    """`count` H100s, every other one with MIG on."""
    return node(*(h100(m, mig_enabled=m % 2 == 1) for m in range(count)))


def synthetic_gpu(minor: int, profiles: Sequence[MigProfile], *, memory_slices: int, memory_mib: int) -> Gpu:
    """A made-up MIG GPU (Blackwell, so MIG mode toggles without a reset) with the given profiles."""
    return Gpu(
        index=minor,
        minor=minor,
        uuid=_uuid("GPU", "synthetic", minor),
        name="Synthetic MIG GPU",
        brand="Nvidia",
        architecture="Blackwell",
        cuda_compute_capability="10.0",
        memory_bytes=memory_mib * MIB,
        pci_bus_id=f"0000:{0x41 + minor:02x}:00.0",
        pcie_root="pci0000:40",
        numa_node=0,
        nvlink_peers=(),
        nvlink_domain=None,
        multiprocessors=None,
        mig_capable=True,
        mig_enabled=True,
        mig_memory_slices=memory_slices,
        mig_mode_switchable=True,
        mig_profiles=tuple(profiles),
    )


def many_profiles_gpu(minor: int = 0, *, variants: int = 20) -> Gpu:
    """8 slices; `variants` one-slice profiles at all 8 placements, and one spanning the GPU."""
    ones = [
        profile((100 + i, f"1g.9gb+v{i}", 1, 8, range(8), 1, 16, 1, 0, 0, 0, 9216)) for i in range(variants)
    ]
    full = profile((0, "8g.72gb", 8, 1, (0,), 8, 128, 8, 0, 0, 0, 73728))
    return synthetic_gpu(minor, [*ones, full], memory_slices=8, memory_mib=73728)


REALISTIC = {"h100": h100_node, "a100": a100_node, "mixed": mixed_node}
