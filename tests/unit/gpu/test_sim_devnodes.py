"""The simulator's stand-in device nodes: real character devices where a container runtime looks for them."""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from gpudra import sim
from gpudra.errors import ConfigError
from gpudra.model.publishing import Publishing
from gpudra.node import cdi, gpu_driver, wiring
from gpudra.node.cdi import ClaimDevice, MigAccess
from gpudra.node.options import PluginOptions
from gpudra.sim import devnodes, machines, procfs

needs_mknod = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs CAP_MKNOD (root)")
H100_NODES = [f"nvidia{minor}" for minor in range(8)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
CAPS = ["nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2"]


def _numbers(path: Path) -> tuple[int, int, int]:
    found = os.lstat(path)
    assert stat.S_ISCHR(found.st_mode), f"{path} is not a character device"
    return os.major(found.st_rdev), os.minor(found.st_rdev), stat.S_IMODE(found.st_mode)


def _tree(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if not p.is_dir())


def _character_majors(proc_devices: str) -> dict[str, int]:
    """Name -> major of the "Character devices:" section of a /proc/devices text."""
    section = proc_devices.partition("Character devices:\n")[2].partition("\n\n")[0]
    return {name: int(major) for major, name in (line.split() for line in section.splitlines())}


def _real_nvidia_driver() -> bool:
    try:
        return "nvidia" in _character_majors(Path("/proc/devices").read_text())
    except OSError:
        return False


def test_the_nodes_of_a_machine_are_the_drivers() -> None:
    listed = {str(n.path): (n.major, n.minor, n.mode) for n in devnodes.nodes(machines.MACHINES["dgx-h100"])}
    assert sorted(listed) == sorted(H100_NODES + CAPS)
    assert listed["nvidia5"] == (195, 5, 0o666)
    assert listed["nvidiactl"] == (195, 255, 0o666)
    # The dynamic majors are the ones the simulated /proc/devices gives.
    registered = _character_majors(procfs.devices())
    assert listed["nvidia-uvm"] == (registered["nvidia-uvm"], 0, 0o666)
    assert listed["nvidia-uvm-tools"] == (registered["nvidia-uvm"], 1, 0o666)
    assert listed["nvidia-caps/nvidia-cap1"] == (registered["nvidia-caps"], 1, 0o400)
    assert listed["nvidia-caps/nvidia-cap2"] == (registered["nvidia-caps"], 2, 0o444)
    assert registered["nvidia"] == registered["nvidiactl"] == 195


def test_gpu_nodes_follow_the_minors_and_mig_capability() -> None:
    mixed = machines.MACHINES["mixed"]  # L4 and T4: no MIG, minors not in slot order
    names = [str(n.path) for n in devnodes.nodes(mixed)]
    assert names[: len(mixed.gpus)] == [f"nvidia{gpu.minor}" for gpu in mixed.gpus]
    assert not any(name.startswith("nvidia-caps/") for name in names)


@needs_mknod
def test_write_makes_character_devices(tmp_path: Path) -> None:
    dev = tmp_path / "root" / "dev"
    old_umask = os.umask(0o077)  # the modes are the driver's whatever the umask
    try:
        written = sim.write_device_nodes("dgx-h100", dev)
    finally:
        os.umask(old_umask)
    assert _tree(dev) == sorted(H100_NODES + CAPS)
    assert sorted(written) == sorted(dev / name for name in H100_NODES + CAPS)
    assert _numbers(dev / "nvidia0") == (195, 0, 0o666)
    assert _numbers(dev / "nvidia7") == (195, 7, 0o666)
    assert _numbers(dev / "nvidiactl") == (195, 255, 0o666)
    assert _numbers(dev / "nvidia-uvm") == (procfs.NVIDIA_UVM_MAJOR, 0, 0o666)
    assert _numbers(dev / "nvidia-uvm-tools") == (procfs.NVIDIA_UVM_MAJOR, 1, 0o666)
    assert _numbers(dev / "nvidia-caps" / "nvidia-cap1") == (procfs.NVIDIA_CAPS_MAJOR, 1, 0o400)
    assert _numbers(dev / "nvidia-caps" / "nvidia-cap2") == (procfs.NVIDIA_CAPS_MAJOR, 2, 0o444)
    if not _real_nvidia_driver():  # on a machine with a GPU the numbers reach the real driver
        # No driver behind them: opening one fails, as on a node whose driver is not loaded.
        with pytest.raises(OSError) as opened:
            os.close(os.open(dev / "nvidia0", os.O_RDONLY))
        assert opened.value.errno in {errno.ENXIO, errno.ENODEV, errno.EACCES, errno.EPERM}


@needs_mknod
def test_write_again_keeps_good_nodes_and_replaces_wrong_ones(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    sim.write_device_nodes("dgx-a100", dev)
    kept = os.lstat(dev / "nvidia1").st_ino
    (dev / "nvidiactl").unlink()
    (dev / "nvidiactl").write_text("not a device")
    os.chmod(dev / "nvidia2", 0o600)
    (dev / "nvidia3").unlink()
    os.mknod(dev / "nvidia3", stat.S_IFCHR | 0o666, os.makedev(195, 9))
    sim.write_device_nodes("dgx-a100", dev)
    assert os.lstat(dev / "nvidia1").st_ino == kept
    assert _numbers(dev / "nvidiactl") == (195, 255, 0o666)
    assert _numbers(dev / "nvidia2") == (195, 2, 0o666)
    assert _numbers(dev / "nvidia3") == (195, 3, 0o666)
    assert not [p for p in dev.iterdir() if p.name.startswith(".")]  # no scratch nodes left


def test_refused_mknod_names_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Any, mode: int = 0o600, device: int = 0) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(path))

    monkeypatch.setattr(os, "mknod", refuse)
    with pytest.raises(ConfigError) as raised:
        sim.write_device_nodes("dgx-h100", tmp_path / "dev")
    assert raised.value.field == "--dev-root"
    message = str(raised.value)
    assert message.startswith(f"--dev-root: cannot create the simulated device node {tmp_path}/dev/nvidia0: ")
    assert "Operation not permitted" in message and "CAP_MKNOD" in message
    assert not list((tmp_path / "dev").iterdir())


def test_a_dev_root_that_cannot_hold_nodes_is_reported(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"--dev-root: cannot create .*/file/dev/nvidia0: .*writable"):
        sim.write_device_nodes("mixed", tmp_path / "file" / "dev")


def test_an_unknown_profile_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown simulated machine 'dgx-z100'"):
        sim.write_device_nodes("dgx-z100", tmp_path / "dev")


def _options(nvml: str, dev_root: str) -> PluginOptions:
    return PluginOptions(
        node_name="node-a",
        driver="gpu.gpudra.io",
        nvml=nvml,
        publishing=Publishing(mig_mode="partitionable"),
        kubeconfig=None,
        registry_dir=Path("/r"),
        plugin_dir=Path("/p"),
        cdi_root=Path("/c"),
        state_dir=Path("/s"),
        toolkit_cdi_dirs=(),
        metrics_port=0,
        metrics_address="0.0.0.0",
        resync_seconds=30,
        health_interval_seconds=0,
        usage_interval_seconds=0,
        mps_check_interval_seconds=0,
        driver_root=Path("/"),
        dev_root=Path(dev_root),
    )


@pytest.mark.parametrize(
    ("nvml", "dev_root", "expected"),
    [
        ("sim:dgx-h100", "/var/lib/gpudra-sim", Path("/var/lib/gpudra-sim/dev")),
        ("sim:dgx-h100", "/", None),  # never the node's own /dev
        ("real", "/run/nvidia/driver", None),  # a real driver's nodes exist already
    ],
)
def test_the_plugin_makes_nodes_only_for_the_simulator_off_root(
    nvml: str, dev_root: str, expected: Path | None
) -> None:
    assert gpu_driver.device_node_dir(nvml, Path(dev_root)) == expected


class _Started(Exception):
    pass


@needs_mknod
def test_the_plugin_makes_the_nodes_before_it_opens_nvml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def connect(spec: str, **_: Any) -> None:
        assert _numbers(tmp_path / "dev" / "nvidia7") == (195, 7, 0o666)
        raise _Started(spec)

    monkeypatch.setattr(gpu_driver, "connect", connect)
    with pytest.raises(_Started, match="sim:dgx-h100"):
        wiring.run(_options("sim:dgx-h100", str(tmp_path)), server=None, stop=threading.Event())
    assert _tree(tmp_path / "dev") == sorted(H100_NODES + CAPS)


@needs_mknod
def test_a_runtime_finds_every_node_of_a_spec_under_the_dev_root(tmp_path: Path) -> None:
    """What containerd's CDI injection does with a spec: every node without type and major is looked
    up on the host (at hostPath, else at path) and must be a device; the others are used as given."""
    sim.write_device_nodes("dgx-a100", tmp_path / "dev")
    claim = "5f7c2a9e-8b1d-4e3f-a6c0-2d9b8e7f1a34"
    mig = MigAccess(
        parent_uuid="GPU-1",
        caps_major=procfs.NVIDIA_CAPS_MAJOR,
        gi_cap_minor=procfs.gi_minor(gpu_minor=2, gpu_instance_id=1),
        ci_cap_minor=procfs.ci_minor(gpu_minor=2, gpu_instance_id=1, compute_instance_id=0),
    )
    spec = cdi.build_claim_spec(
        driver="gpu.gpudra.io",
        claim_uid=claim,
        devices=[
            ClaimDevice(name="gpu-5", gpu_minor=5, uuid="GPU-5"),
            ClaimDevice(name="gpu-2-mig-1g5gb-19-0", gpu_minor=2, uuid="MIG-1", mig=mig),
        ],
        dev_root=tmp_path,
    )
    document = json.loads(cdi.write_spec(tmp_path / "cdi", spec, claim_uid=claim).read_text())
    nodes = [
        *document["containerEdits"]["deviceNodes"],
        *(n for d in document["devices"] for n in d["containerEdits"]["deviceNodes"]),
    ]
    resolved = {}
    for node in nodes:
        if node.get("type") and node.get("major"):
            resolved[node["path"]] = (node["major"], node["minor"])
        else:
            resolved[node["path"]] = _numbers(Path(node.get("hostPath", node["path"])))[:2]
    assert resolved == {
        "/dev/nvidiactl": (195, 255),
        "/dev/nvidia-uvm": (procfs.NVIDIA_UVM_MAJOR, 0),
        "/dev/nvidia-uvm-tools": (procfs.NVIDIA_UVM_MAJOR, 1),
        "/dev/nvidia5": (195, 5),
        "/dev/nvidia2": (195, 2),
        f"/dev/nvidia-caps/nvidia-cap{mig.gi_cap_minor}": (procfs.NVIDIA_CAPS_MAJOR, mig.gi_cap_minor),
        f"/dev/nvidia-caps/nvidia-cap{mig.ci_cap_minor}": (procfs.NVIDIA_CAPS_MAJOR, mig.ci_cap_minor),
    }
