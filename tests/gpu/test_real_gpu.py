"""Discovery on a real NVIDIA GPU, and the simulator's tables checked against the real driver. Needs a GPU.

Read-only: these tests never change the card (no MIG mode, compute mode, clocks or reset); they make
NVML read calls and run `nvidia-smi --query-gpu`. Run with `pytest -m gpu` on a machine with a GPU.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pynvml
import pytest

from gpudra.model import inventory
from gpudra.node import gpu_driver
from gpudra.sim import machines

pytestmark = pytest.mark.gpu

MIB = 1024**2
# product name -> the simulated machine built from it, for the MIG-capable models the simulator has
SIMULATED = {
    machine.gpus[0].model.name: name
    for name, machine in machines.MACHINES.items()
    if machine.gpus[0].model.mig_profiles
}


def _real_inventory() -> inventory.Inventory:
    with gpu_driver.connect("real") as session:
        return session.inventory()


def _nvidia_smi() -> list[list[str]]:
    output = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=uuid,name,memory.total,pci.bus_id,driver_version",
            "--format=csv,noheader,nounits",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [[field.strip() for field in line.split(",")] for line in output.splitlines() if line.strip()]


def test_discovery_matches_nvidia_smi() -> None:
    found = _real_inventory()
    rows = _nvidia_smi()
    assert len(found.gpus) == len(rows) > 0
    for gpu, (uuid, name, memory_mib, bus_id, driver) in zip(found.gpus, rows, strict=True):
        assert gpu.uuid == uuid
        assert gpu.name == name
        assert gpu.memory_bytes // MIB == int(memory_mib)
        domain, rest = bus_id.split(":", 1)
        assert gpu.pci_bus_id == f"{int(domain, 16):04x}:{rest.lower()}"
        assert found.driver_version == driver
        assert gpu.architecture != "Unknown"
        assert re.fullmatch(r"\d+\.\d+", gpu.cuda_compute_capability)
        assert gpu.pcie_root is None or re.fullmatch(r"pci[0-9a-f]{4}:[0-9a-f]{2}", gpu.pcie_root)
        assert gpu.mig_enabled <= gpu.mig_capable
    assert re.fullmatch(r"\d+\.\d+", found.cuda_driver_version)


def _profile_table(gpu: inventory.Gpu) -> list[tuple[object, ...]]:
    return sorted(
        (
            p.id,
            p.name,
            p.slice_count,
            p.instance_count,
            p.multiprocessors,
            p.copy_engines,
            p.decoders,
            p.encoders,
            p.jpegs,
            p.ofas,
            p.placements,
        )
        for p in gpu.mig_profiles
    )


def test_mig_profiles_match_the_simulator(tmp_path: Path) -> None:
    """Each GPU of a model the simulator has is compared with that model's simulated twin."""
    compared = [gpu for gpu in _real_inventory().gpus if gpu.name in SIMULATED]
    if not compared:
        pytest.skip(f"no GPU here is one of the simulated MIG models {sorted(SIMULATED)}")
    for gpu in compared:
        state = tmp_path / f"{SIMULATED[gpu.name]}.json"
        with gpu_driver.connect(f"sim:{SIMULATED[gpu.name]}", state_file=state) as session:
            simulated = session.inventory().gpus[0]
        assert gpu.mig_capable
        if not gpu.mig_profiles:
            # Profile info is NOT_SUPPORTED while MIG is disabled only on Ampere (the simulator agrees).
            assert (gpu.architecture, gpu.mig_enabled) == ("Ampere", False)
            continue
        assert _profile_table(gpu) == _profile_table(simulated)
        memory = {p.id: p.memory_mib for p in simulated.mig_profiles}
        for profile in gpu.mig_profiles:
            assert abs(profile.memory_mib - memory[profile.id]) <= memory[profile.id] / 100, profile.name
        assert gpu.mig_memory_slices == simulated.mig_memory_slices
        assert gpu.multiprocessors == simulated.multiprocessors


def test_profile_names_match_the_drivers_own() -> None:
    """gpudra names profiles with go-nvlib's rule; the driver's v2 profile info carries its own name."""
    with gpu_driver.connect("real") as session:
        found = session.inventory()
        for index, gpu in enumerate(found.gpus):
            if not gpu.mig_profiles:
                continue
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            names = {p.id: p.name for p in gpu.mig_profiles}
            for profile_index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
                try:
                    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_index)
                except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                    continue
                assert info.name.removeprefix("MIG ") == names[info.id]


def test_conditions_are_read_as_the_simulator_reports_them(tmp_path: Path) -> None:
    """The health poll's reading (remapped rows, pending page retirement, NVLink states) on the real card:
    what is reported is what the simulator's twin of the model reports (read-only calls)."""
    with gpu_driver.connect("real") as session:
        real = [(gpu, session.gpu_conditions(gpu_uuid=gpu.uuid)) for gpu in session.inventory().gpus]
    for gpu, conditions in real:
        ampere_or_later = gpu.architecture not in ("Turing", "Volta", "Pascal", "Maxwell", "Kepler")
        assert (conditions.retired_pages_pending is None) == ampere_or_later, gpu.name
        if ampere_or_later and not (gpu.mig_enabled and gpu.mig_devices):
            assert conditions.row_remap_pending is not None, gpu.name
        if gpu.name in SIMULATED:
            state = tmp_path / f"{SIMULATED[gpu.name]}.json"
            with gpu_driver.connect(f"sim:{SIMULATED[gpu.name]}", state_file=state) as sim_session:
                twin = sim_session.gpu_conditions(gpu_uuid=sim_session.inventory().gpus[0].uuid)
            assert twin.reported() >= conditions.reported() - {"NvLinkDown"}, gpu.name
