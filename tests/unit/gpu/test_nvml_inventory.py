"""Discovery through pynvml on each simulated machine, checked against the reference tables."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from gpudra import errors, sim
from gpudra.gpu import nvml
from gpudra.model import inventory
from gpudra.node import gpu_driver

# Transcribed from reference/gpu-mechanics.md section 2 (real -lgip / -lgipp output):
# name, profile ID, max instances, placement starts, memory slices, SMs, CE, DEC, JPEG, OFA, MiB
A100_40GB = [
    ("1g.5gb", 19, 7, (0, 1, 2, 3, 4, 5, 6), 1, 14, 1, 0, 0, 0, 4864),
    ("1g.5gb+me", 20, 1, (0, 1, 2, 3, 4, 5, 6), 1, 14, 1, 1, 1, 1, 4864),
    ("1g.10gb", 15, 4, (0, 2, 4, 6), 2, 14, 1, 1, 0, 0, 9856),
    ("2g.10gb", 14, 3, (0, 2, 4), 2, 28, 2, 1, 0, 0, 9856),
    ("3g.20gb", 9, 2, (0, 4), 4, 42, 3, 2, 0, 0, 19968),
    ("4g.20gb", 5, 1, (0,), 4, 56, 4, 2, 0, 0, 19968),
    ("7g.40gb", 0, 1, (0,), 8, 98, 7, 5, 1, 1, 40192),
]
H100_80GB = [
    ("1g.10gb", 19, 7, (0, 1, 2, 3, 4, 5, 6), 1, 16, 1, 1, 1, 0, 9984),
    ("1g.10gb+me", 20, 1, (0, 1, 2, 3, 4, 5, 6), 1, 16, 1, 1, 1, 1, 9984),
    ("1g.20gb", 15, 4, (0, 2, 4, 6), 2, 26, 1, 1, 1, 0, 20096),
    ("2g.20gb", 14, 3, (0, 2, 4), 2, 32, 2, 2, 2, 0, 20096),
    ("3g.40gb", 9, 2, (0, 4), 4, 60, 3, 3, 3, 0, 40448),
    ("4g.40gb", 5, 1, (0,), 4, 64, 4, 4, 4, 0, 40448),
    ("7g.80gb", 0, 1, (0,), 8, 132, 8, 7, 7, 1, 81152),
]
MIB = 1024**2


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "machine.json"


def _inventory(profile: str, state_file: Path) -> inventory.Inventory:
    with gpu_driver.connect(f"sim:{profile}", state_file=state_file) as session:
        return session.inventory()


@pytest.fixture(scope="module")
def dgx_a100(tmp_path_factory: pytest.TempPathFactory) -> inventory.Inventory:
    return _inventory("dgx-a100", tmp_path_factory.mktemp("a100") / "machine.json")


@pytest.fixture(scope="module")
def dgx_h100(tmp_path_factory: pytest.TempPathFactory) -> inventory.Inventory:
    return _inventory("dgx-h100", tmp_path_factory.mktemp("h100") / "machine.json")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> inventory.Inventory:
    return _inventory("mixed", tmp_path_factory.mktemp("mixed") / "machine.json")


@pytest.fixture(scope="module")
def vm_h100(tmp_path_factory: pytest.TempPathFactory) -> inventory.Inventory:
    return _inventory("vm-h100", tmp_path_factory.mktemp("vm-h100") / "machine.json")


def _table(gpu: inventory.Gpu) -> list[tuple[object, ...]]:
    return sorted(
        (
            p.name,
            p.id,
            p.instance_count,
            tuple(pl.start for pl in p.placements),
            p.memory_slices,
            p.multiprocessors,
            p.copy_engines,
            p.decoders,
            p.jpegs,
            p.ofas,
            p.memory_mib,
        )
        for p in gpu.mig_profiles
    )


@pytest.mark.parametrize(
    ("machine", "expected"), [("dgx_a100", A100_40GB), ("dgx_h100", H100_80GB)], ids=["a100", "h100"]
)
def test_mig_profile_tables_match_the_reference(
    machine: str, expected: list[tuple[object, ...]], request: pytest.FixtureRequest
) -> None:
    found: inventory.Inventory = request.getfixturevalue(machine)
    for gpu in found.gpus:
        assert _table(gpu) == sorted(expected)
        assert all(p.encoders == 0 for p in gpu.mig_profiles)
        assert {p.slice_count for p in gpu.mig_profiles} == {1, 2, 3, 4, 7}


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        ("dgx_a100", ("NVIDIA A100-SXM4-40GB", "Ampere", "8.0", "Nvidia", 40960 * MIB, 98)),
        ("dgx_h100", ("NVIDIA H100 80GB HBM3", "Hopper", "9.0", "Nvidia", 81559 * MIB, 132)),
    ],
    ids=["a100", "h100"],
)
def test_dgx_gpus(machine: str, expected: tuple[object, ...], request: pytest.FixtureRequest) -> None:
    found: inventory.Inventory = request.getfixturevalue(machine)
    assert found.driver_version == "580.65.06"
    assert found.cuda_driver_version == "13.0"
    assert len(found.gpus) == 8
    for gpu in found.gpus:
        # multiprocessors: the 7-slice profile's SMs, what MIG can hand out
        facts = (gpu.name, gpu.architecture, gpu.cuda_compute_capability, gpu.brand, gpu.memory_bytes)
        assert (*facts, gpu.multiprocessors) == expected
        assert (gpu.mig_capable, gpu.mig_enabled, gpu.mig_memory_slices) == (True, True, 8)
        assert gpu.mig_devices == ()
    assert len({g.uuid for g in found.gpus}) == 8
    assert all(g.uuid.startswith("GPU-") for g in found.gpus)


def test_dgx_h100_topology(dgx_h100: inventory.Inventory) -> None:
    buses = [g.pci_bus_id for g in dgx_h100.gpus]
    assert buses == [f"0000:{b}:00.0" for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]
    assert [g.numa_node for g in dgx_h100.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.index for g in dgx_h100.gpus] == list(range(8))
    assert [g.minor for g in dgx_h100.gpus] == list(range(8))
    assert len({g.pcie_root for g in dgx_h100.gpus}) == 8
    assert dgx_h100.gpus[0].pcie_root == "pci0000:15"
    # NVSwitch: one island of all eight, named after its lowest bus id.
    for gpu in dgx_h100.gpus:
        assert gpu.nvlink_domain == "0000:18:00.0"
        assert set(gpu.nvlink_peers) == set(buses) - {gpu.pci_bus_id}
        assert list(gpu.nvlink_peers) == sorted(gpu.nvlink_peers)


def test_dgx_a100_topology(dgx_a100: inventory.Inventory) -> None:
    buses = [g.pci_bus_id for g in dgx_a100.gpus]
    assert buses == [f"0000:{b}:00.0" for b in ("07", "0f", "47", "4e", "87", "90", "b7", "bd")]
    assert [g.numa_node for g in dgx_a100.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.pcie_root for g in dgx_a100.gpus] == [
        "pci0000:00", "pci0000:00", "pci0000:40", "pci0000:40",
        "pci0000:80", "pci0000:80", "pci0000:a0", "pci0000:a0",
    ]  # fmt: skip
    assert {g.nvlink_domain for g in dgx_a100.gpus} == {"0000:07:00.0"}


def test_mixed_node(mixed: inventory.Inventory) -> None:
    rows = [
        (g.name, g.architecture, g.cuda_compute_capability, g.memory_bytes // MIB, g.brand, g.multiprocessors)
        for g in mixed.gpus
    ]
    l4 = ("NVIDIA L4", "Ada Lovelace", "8.9", 23034, "Nvidia", 58)
    t4 = ("Tesla T4", "Turing", "7.5", 15360, "Tesla", 40)
    assert rows == [l4, l4, t4, l4, l4, t4]
    for gpu in mixed.gpus:
        assert (gpu.mig_capable, gpu.mig_enabled, gpu.mig_memory_slices) == (False, False, 0)
        assert (gpu.mig_profiles, gpu.mig_devices) == ((), ())
        assert (gpu.nvlink_domain, gpu.nvlink_peers) == (None, ())
    assert {g.pcie_root for g in mixed.gpus} == {"pci0000:00", "pci0000:80"}
    assert [g.numa_node for g in mixed.gpus] == [0, 0, 0, 1, 1, 1]
    # The minor number is not the NVML index.
    assert [g.minor for g in mixed.gpus] == [0, 1, 4, 2, 3, 5]


def test_a_cloud_vm_with_one_h100(vm_h100: inventory.Inventory) -> None:
    assert (vm_h100.driver_version, vm_h100.cuda_driver_version) == ("580.65.06", "13.0")
    [gpu] = vm_h100.gpus
    assert (gpu.name, gpu.architecture, gpu.multiprocessors) == ("NVIDIA H100 80GB HBM3", "Hopper", 132)
    assert (gpu.index, gpu.minor, gpu.pci_bus_id, gpu.pcie_root) == (0, 0, "0000:04:00.0", "pci0000:00")
    assert gpu.numa_node is None  # no proximity information in the guest: sysfs says -1
    assert (gpu.nvlink_domain, gpu.nvlink_peers) == (None, ())  # no NVSwitch in a one-GPU VM
    # MIG-capable and booted with MIG disabled; Hopper shows its profiles anyway.
    assert (gpu.mig_capable, gpu.mig_enabled, gpu.mig_memory_slices, gpu.mig_devices) == (True, False, 8, ())
    assert _table(gpu) == sorted(H100_80GB)


@pytest.mark.parametrize(
    ("machine", "switchable"),
    [("dgx_h100", True), ("dgx_a100", False), ("mixed", False), ("vm_h100", False)],
    ids=["hopper bare metal", "ampere", "no mig", "hopper in a vm"],
)
def test_mig_mode_is_switchable_on_bare_metal_hopper_only(
    machine: str, switchable: bool, request: pytest.FixtureRequest
) -> None:
    found: inventory.Inventory = request.getfixturevalue(machine)
    assert {gpu.mig_mode_switchable for gpu in found.gpus} == {switchable}


def test_mig_mode_stays_switchable_with_mig_disabled(state_file: Path) -> None:
    uuid = _inventory("dgx-h100", state_file).gpus[0].uuid
    sim.set_mig_mode(state_file=state_file, gpu_uuid=uuid, enabled=False)
    gpu = _inventory("dgx-h100", state_file).gpus[0]
    assert (gpu.mig_enabled, gpu.mig_mode_switchable) == (False, True)


def test_an_unknown_virtualization_mode_is_not_switchable(state_file: Path) -> None:
    """A driver that cannot say whether it runs in a VM is treated as one: gpudra must not start a
    MIG mode change that only a reboot would finish."""
    with gpu_driver.connect("sim:dgx-h100", state_file=state_file) as session:
        cache = pynvml._nvmlGetFunctionPointer_cache
        original = cache["nvmlDeviceGetVirtualizationMode"]
        cache["nvmlDeviceGetVirtualizationMode"] = lambda *args: pynvml.NVML_ERROR_NOT_SUPPORTED
        try:
            gpus = session.inventory().gpus
        finally:
            cache["nvmlDeviceGetVirtualizationMode"] = original
    assert {(g.mig_capable, g.mig_mode_switchable) for g in gpus} == {(True, False)}


def test_ampere_hides_mig_profiles_while_mig_is_disabled(state_file: Path) -> None:
    uuid = _inventory("dgx-a100", state_file).gpus[0].uuid
    sim.set_mig_mode(state_file=state_file, gpu_uuid=uuid, enabled=False)
    gpu = _inventory("dgx-a100", state_file).gpus[0]
    assert (gpu.mig_capable, gpu.mig_enabled, gpu.mig_profiles) == (True, False, ())
    assert gpu.multiprocessors == 108  # the whole GPU, no longer what MIG can use


def test_hopper_shows_mig_profiles_while_mig_is_disabled(state_file: Path) -> None:
    uuid = _inventory("dgx-h100", state_file).gpus[0].uuid
    sim.set_mig_mode(state_file=state_file, gpu_uuid=uuid, enabled=False)
    gpu = _inventory("dgx-h100", state_file).gpus[0]
    assert (gpu.mig_capable, gpu.mig_enabled) == (True, False)
    assert _table(gpu) == sorted(H100_80GB)


def test_sysfs_is_read_from_the_given_root(state_file: Path) -> None:
    with gpu_driver.connect("sim:mixed", state_file=state_file) as session:
        assert session.inventory().gpus[0].numa_node == 0
        device = state_file.parent / "sysfs" / "bus" / "pci" / "devices" / "0000:17:00.0"
        (device / "numa_node").write_text("-1\n")
        assert session.inventory().gpus[0].numa_node is None
        device.unlink()
        gpu = session.inventory().gpus[0]
        assert (gpu.numa_node, gpu.pcie_root) == (None, None)


def test_the_uuids_are_stable_per_machine(tmp_path: Path) -> None:
    first = _inventory("dgx-h100", tmp_path / "one.json")
    second = _inventory("dgx-h100", tmp_path / "two.json")
    assert [g.uuid for g in first.gpus] == [g.uuid for g in second.gpus]
    other = _inventory("dgx-a100", tmp_path / "three.json")
    assert not {g.uuid for g in first.gpus} & {g.uuid for g in other.gpus}


def test_gpu_utilization(state_file: Path) -> None:
    with gpu_driver.connect("sim:mixed", state_file=state_file) as session:
        uuid = session.inventory().gpus[3].uuid
        assert session.device_usage(uuid=uuid).utilization == 0
        sim.set_utilization(state_file=state_file, gpu_uuid=uuid, percent=37)
        assert session.device_usage(uuid=uuid).utilization == 37


def test_gpu_utilization_is_not_reported_in_mig_mode(state_file: Path) -> None:
    with gpu_driver.connect("sim:dgx-h100", state_file=state_file) as session:
        uuid = session.inventory().gpus[0].uuid
        assert session.device_usage(uuid=uuid).utilization is None  # NotSupported: no figure, no fake 0


def test_real_nvml_absent_is_nvml_unavailable() -> None:
    # This machine has no NVIDIA driver: pynvml cannot load libnvidia-ml.so.1.
    with pytest.raises(errors.NvmlUnavailable) as missing:
        gpu_driver.connect("real")
    assert missing.value.nvml_error == "NVMLError_LibraryNotFound"
    assert "nvmlInit" in str(missing.value)


@pytest.mark.parametrize(
    "spec",
    ["sim:dgx-a200", "sim:", "simulated", "", "SIM:mixed"],
    ids=["profile", "empty", "word", "blank", "case"],
)
def test_unknown_spec_is_a_config_error(spec: str) -> None:
    with pytest.raises(errors.ConfigError) as bad:
        gpu_driver.connect(spec)
    assert bad.value.field == "--nvml"
    assert "real, sim:dgx-a100, sim:dgx-h100, sim:mixed, sim:vm-h100" in str(bad.value)


def test_state_file_defaults_to_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDRA_SIM_STATE", str(tmp_path / "from-env.json"))
    gpu_driver.connect("sim:mixed").close()
    assert (tmp_path / "from-env.json").exists()


def test_state_file_defaults_to_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUDRA_SIM_STATE", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    gpu_driver.connect("sim:mixed").close()
    assert (tmp_path / "gpudra-sim" / "mixed.json").exists()


def test_a_state_file_belongs_to_one_machine(state_file: Path) -> None:
    _inventory("mixed", state_file)
    with pytest.raises(errors.ConfigError) as clash:
        gpu_driver.connect("sim:dgx-h100", state_file=state_file)
    assert "'mixed'" in str(clash.value)
    assert clash.value.field == "GPUDRA_SIM_STATE"


def test_real_nvml_is_refused_while_the_simulator_is_installed(state_file: Path) -> None:
    with gpu_driver.connect("sim:mixed", state_file=state_file), pytest.raises(errors.ConfigError):
        gpu_driver.connect("real")


def test_two_machines_cannot_share_one_process(tmp_path: Path) -> None:
    with gpu_driver.connect("sim:mixed", state_file=tmp_path / "a.json"):
        with pytest.raises(errors.ConfigError) as clash:
            gpu_driver.connect("sim:dgx-h100", state_file=tmp_path / "b.json")
        assert "close it first" in str(clash.value)
        # The same machine nests.
        with gpu_driver.connect("sim:mixed", state_file=tmp_path / "a.json") as inner:
            assert len(inner.inventory().gpus) == 6


def test_sessions_share_the_process_wide_library(state_file: Path) -> None:
    outer = gpu_driver.connect("sim:mixed", state_file=state_file)
    gpu_driver.connect("sim:mixed", state_file=state_file).close()
    assert len(outer.inventory().gpus) == 6  # the inner close left the outer session working
    outer.close()
    outer.close()  # idempotent
    with pytest.raises(errors.NvmlUnavailable):  # the last close took the simulator out of pynvml
        gpu_driver.connect("real")


NAMES = [
    ("a100 1g", (0x0, 1, 4864, 40960), "1g.5gb"),
    ("a100 1g+me", (0x7, 1, 4864, 40960), "1g.5gb+me"),
    ("a100-80gb 1g", (0x0, 1, 9728, 81920), "1g.10gb"),
    ("a30 1g", (0x0, 1, 5952, 24576), "1g.6gb"),
    ("a30 2g+me", (0x8, 2, 11968, 24576), "2g.12gb+me"),
    ("h100 7g", (0x4, 7, 81152, 81559), "7g.80gb"),
    ("all media", (0xF, 1, 4864, 40960), "1g.5gb+me.all"),
    ("graphics", (0xA, 1, 4864, 40960), "1g.5gb+gfx"),
    ("no media", (0xD, 1, 4864, 40960), "1g.5gb-me"),
    ("half rounds up", (0x0, 1, 2560, 20480), "1g.3gb"),
]


@pytest.mark.parametrize(("facts", "name"), [n[1:] for n in NAMES], ids=[n[0] for n in NAMES])
def test_mig_profile_names_follow_go_nvlib(facts: tuple[int, int, int, int], name: str) -> None:
    index, slices, memory_mib, total_mib = facts
    found = nvml.mig_profile_name(
        index=index, slices=slices, memory_mib=memory_mib, total_bytes=total_mib * MIB
    )
    assert found == name
