from __future__ import annotations

import json
import logging
import os
import re
import uuid as uuidlib
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gpudra.errors import ConfigError, GpudraError
from gpudra.node import cdi
from gpudra.node.cdi import CdiSpec, ClaimDevice, MigAccess, Mount, ToolkitSpecs

DRIVER = "gpu.gpudra.io"
CLAIM = "5f7c2a9e-8b1d-4e3f-a6c0-2d9b8e7f1a34"
GPU0 = "GPU-11111111-2222-3333-4444-555555555555"
GPU1 = "GPU-66666666-7777-8888-9999-000000000000"
MIG = "MIG-0a0b0c0d-1111-2222-3333-444455556666"
CONTROL = [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}, {"path": "/dev/nvidia-uvm-tools"}]

# The CDI qualified-name rules, written independently of gpudra.node.cdi.
VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
KNOWN_VERSIONS = ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"]

MPS_MOUNTS = (
    Mount(host_path="/var/lib/kubelet/plugins/gpu.gpudra.io/mps/d1/pipe", container_path="/tmp/nvidia-mps",
          options=("rw", "nosuid", "nodev", "bind")),
    Mount(host_path="/var/lib/kubelet/plugins/gpu.gpudra.io/mps/d1/shm", container_path="/dev/shm",
          options=("rw", "nosuid", "nodev", "bind")),
)  # fmt: skip
MPS_ENV = {
    "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
}


def spec_dict(devices: list[ClaimDevice]) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        cdi.build_claim_spec(driver=DRIVER, claim_uid=CLAIM, devices=devices).to_json()
    )
    return document


def mig_device() -> ClaimDevice:
    return ClaimDevice(
        name="gpu-0-mig-1g10gb-19-0",
        gpu_minor=0,
        uuid=MIG,
        mig=MigAccess(parent_uuid=GPU0, caps_major=508, gi_cap_minor=66, ci_cap_minor=67),
    )


def test_whole_gpu_spec() -> None:
    assert spec_dict([ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0)]) == {
        "cdiVersion": "0.5.0",
        "kind": "gpu.gpudra.io/claim",
        "devices": [
            {
                "name": f"{CLAIM}-gpu-0",
                "containerEdits": {
                    "env": [f"NVIDIA_VISIBLE_DEVICES={GPU0}"],
                    "deviceNodes": [{"path": "/dev/nvidia0"}],
                },
            }
        ],
        "containerEdits": {"deviceNodes": CONTROL},
    }


def test_two_gpus_keep_their_edits_apart() -> None:
    spec = spec_dict(
        [ClaimDevice(name="gpu-3", gpu_minor=3, uuid=GPU0), ClaimDevice(name="gpu-5", gpu_minor=5, uuid=GPU1)]
    )
    assert spec["containerEdits"] == {"deviceNodes": CONTROL}
    assert spec["devices"] == [
        {
            "name": f"{CLAIM}-gpu-3",
            "containerEdits": {
                "env": [f"NVIDIA_VISIBLE_DEVICES={GPU0}"],
                "deviceNodes": [{"path": "/dev/nvidia3"}],
            },
        },
        {
            "name": f"{CLAIM}-gpu-5",
            "containerEdits": {
                "env": [f"NVIDIA_VISIBLE_DEVICES={GPU1}"],
                "deviceNodes": [{"path": "/dev/nvidia5"}],
            },
        },
    ]


def test_mig_device_gets_parent_node_and_capability_nodes() -> None:
    (device,) = spec_dict([mig_device()])["devices"]
    assert device == {
        "name": f"{CLAIM}-gpu-0-mig-1g10gb-19-0",
        "containerEdits": {
            "env": [f"NVIDIA_VISIBLE_DEVICES={MIG}"],
            "deviceNodes": [
                {"path": "/dev/nvidia0"},
                {"path": "/dev/nvidia-caps/nvidia-cap66", "type": "c", "major": 508, "minor": 66},
                {"path": "/dev/nvidia-caps/nvidia-cap67", "type": "c", "major": 508, "minor": 67},
            ],
        },
    }


def test_minor_zero_is_written() -> None:
    mig = ClaimDevice(
        name="gpu-0-mig-7g80gb-0-0",
        gpu_minor=0,
        uuid=MIG,
        mig=MigAccess(parent_uuid=GPU0, caps_major=238, gi_cap_minor=0, ci_cap_minor=1),
    )
    (device,) = spec_dict([mig])["devices"]
    assert device["containerEdits"]["deviceNodes"][1] == {
        "path": "/dev/nvidia-caps/nvidia-cap0",
        "type": "c",
        "major": 238,
        "minor": 0,
    }


def test_mps_device_gets_env_and_mounts() -> None:
    (device,) = spec_dict(
        [ClaimDevice(name="gpu-1", gpu_minor=1, uuid=GPU1, env=MPS_ENV, mounts=MPS_MOUNTS)]
    )["devices"]
    assert device["containerEdits"] == {
        "env": [
            f"NVIDIA_VISIBLE_DEVICES={GPU1}",
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
        ],
        "deviceNodes": [{"path": "/dev/nvidia1"}],
        "mounts": [
            {
                "hostPath": "/var/lib/kubelet/plugins/gpu.gpudra.io/mps/d1/pipe",
                "containerPath": "/tmp/nvidia-mps",
                "options": ["rw", "nosuid", "nodev", "bind"],
            },
            {
                "hostPath": "/var/lib/kubelet/plugins/gpu.gpudra.io/mps/d1/shm",
                "containerPath": "/dev/shm",
                "options": ["rw", "nosuid", "nodev", "bind"],
            },
        ],
    }


def test_no_env_in_spec_wide_edits() -> None:
    # A container that uses one request of a claim gets the spec-wide edits too: they must name no device.
    spec = spec_dict(
        [ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0, env=MPS_ENV, mounts=MPS_MOUNTS), mig_device()]
    )
    assert spec["containerEdits"] == {"deviceNodes": CONTROL}
    assert not any(
        e.startswith("CUDA_VISIBLE_DEVICES=") for d in spec["devices"] for e in d["containerEdits"]["env"]
    )


def test_cdi_version_admits_the_content() -> None:
    spec = cdi.build_claim_spec(driver=DRIVER, claim_uid=CLAIM, devices=[mig_device()])
    version = tuple(int(part) for part in spec.cdi_version.split("."))
    assert spec.cdi_version in KNOWN_VERSIONS
    # Device names start with the claim UID, which may start with a digit: CDI 0.5.0 or newer.
    assert spec.devices[0].name[0].isdigit()
    assert version >= (0, 5, 0)
    # Nothing that needs 0.6.0 (annotations, a dot in the class), so 0.5.0 is the lowest that fits.
    assert "." not in spec.kind.partition("/")[2]
    assert "annotations" not in spec.to_json()
    assert version == (0, 5, 0)


def test_spec_json_round_trips_and_is_strict() -> None:
    spec = cdi.build_claim_spec(
        driver=DRIVER,
        claim_uid=CLAIM,
        devices=[
            ClaimDevice(name="gpu-1", gpu_minor=1, uuid=GPU1, env=MPS_ENV, mounts=MPS_MOUNTS),
            mig_device(),
        ],
    )
    assert CdiSpec.model_validate_json(spec.to_json()) == spec
    document = json.loads(spec.to_json())
    document["devices"][0]["containerEdits"]["hooks"] = []
    with pytest.raises(ValidationError, match="hooks"):
        CdiSpec.model_validate(document)


def test_dev_root_gives_host_nodes_a_host_path() -> None:
    devices = [ClaimDevice(name="gpu-3", gpu_minor=3, uuid=GPU0), mig_device()]
    spec = cdi.build_claim_spec(
        driver=DRIVER, claim_uid=CLAIM, devices=devices, dev_root=PurePosixPath("/run/nvidia/driver")
    )
    document = json.loads(spec.to_json())
    assert document["cdiVersion"] == "0.5.0"  # the first version with deviceNodes[].hostPath
    assert document["containerEdits"] == {
        "deviceNodes": [
            {"path": "/dev/nvidiactl", "hostPath": "/run/nvidia/driver/dev/nvidiactl"},
            {"path": "/dev/nvidia-uvm", "hostPath": "/run/nvidia/driver/dev/nvidia-uvm"},
            {"path": "/dev/nvidia-uvm-tools", "hostPath": "/run/nvidia/driver/dev/nvidia-uvm-tools"},
        ]
    }
    whole, mig = (d["containerEdits"]["deviceNodes"] for d in document["devices"])
    assert whole == [{"path": "/dev/nvidia3", "hostPath": "/run/nvidia/driver/dev/nvidia3"}]
    # The capability nodes are fully specified: the runtime never looks for them on the host.
    assert mig == [
        {"path": "/dev/nvidia0", "hostPath": "/run/nvidia/driver/dev/nvidia0"},
        {"path": "/dev/nvidia-caps/nvidia-cap66", "type": "c", "major": 508, "minor": 66},
        {"path": "/dev/nvidia-caps/nvidia-cap67", "type": "c", "major": 508, "minor": 67},
    ]
    # Everything else is as without a dev root.
    plain = cdi.build_claim_spec(driver=DRIVER, claim_uid=CLAIM, devices=devices)
    assert _without_host_paths(document) == json.loads(plain.to_json())


def _without_host_paths(document: dict[str, Any]) -> dict[str, Any]:
    def strip(edits: dict[str, Any]) -> dict[str, Any]:
        nodes = [{k: v for k, v in n.items() if k != "hostPath"} for n in edits.get("deviceNodes", [])]
        return {**edits, "deviceNodes": nodes}

    return {
        **document,
        "containerEdits": strip(document["containerEdits"]),
        "devices": [{**d, "containerEdits": strip(d["containerEdits"])} for d in document["devices"]],
    }


@pytest.mark.parametrize("dev_root", [PurePosixPath("/"), Path("/")], ids=["pure", "path"])
def test_the_host_dev_root_writes_no_host_path(dev_root: PurePath) -> None:
    devices = [ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0), mig_device()]
    with_root = cdi.build_claim_spec(driver=DRIVER, claim_uid=CLAIM, devices=devices, dev_root=dev_root)
    assert with_root == cdi.build_claim_spec(driver=DRIVER, claim_uid=CLAIM, devices=devices)
    assert "hostPath" not in with_root.to_json()


def test_a_relative_dev_root_is_refused() -> None:
    with pytest.raises(ConfigError, match="not an absolute path") as raised:
        cdi.build_claim_spec(
            driver=DRIVER,
            claim_uid=CLAIM,
            devices=[ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0)],
            dev_root=PurePosixPath("run/nvidia/driver"),
        )
    assert raised.value.field == "dev_root"


# The fields of a CDI DeviceNode (specs-go config.go) and the first spec version with each.
DEVICE_NODE_FIELDS = {
    "path": "0.3.0",
    "hostPath": "0.5.0",
    "type": "0.3.0",
    "major": "0.3.0",
    "minor": "0.3.0",
    "fileMode": "0.3.0",
    "permissions": "0.3.0",
    "uid": "0.3.0",
    "gid": "0.3.0",
}


def test_a_written_spec_with_host_paths_is_valid_cdi(tmp_path: Path) -> None:
    """The rules a runtime's CDI library checks a device node against, written out here."""
    spec = cdi.build_claim_spec(
        driver=DRIVER,
        claim_uid=CLAIM,
        devices=[
            ClaimDevice(name="gpu-1", gpu_minor=1, uuid=GPU1, env=MPS_ENV, mounts=MPS_MOUNTS),
            mig_device(),
        ],
        dev_root=Path("/var/lib/gpudra-sim"),
    )
    path = cdi.write_spec(tmp_path, spec, claim_uid=CLAIM)
    assert cdi.read_spec(path) == spec  # read back as recovery reads it
    document = json.loads(path.read_text())
    version = tuple(int(p) for p in document["cdiVersion"].split("."))
    nodes = [
        *document["containerEdits"]["deviceNodes"],
        *(n for d in document["devices"] for n in d["containerEdits"]["deviceNodes"]),
    ]
    assert len(nodes) == 3 + 1 + 3
    for node in nodes:
        assert set(node) <= set(DEVICE_NODE_FIELDS), node
        assert all(version >= tuple(int(p) for p in DEVICE_NODE_FIELDS[k].split(".")) for k in node)
        assert node["path"].startswith("/dev/")
        assert node.get("type", "c") in {"b", "c", "u", "p"}
        if "hostPath" in node:
            assert node["hostPath"] == "/var/lib/gpudra-sim" + node["path"]
        else:  # the runtime must not need the host to fill in what the spec leaves out
            assert node["type"] == "c" and node["major"] > 0, node


@given(
    claim_uid=st.uuids().map(str),
    device_name=st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z"),
    vendor=st.from_regex(r"\A[a-z]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z]([a-z0-9-]{0,20}[a-z0-9])?){0,3}\Z"),
)
def test_qualified_names_follow_the_cdi_rules(claim_uid: str, device_name: str, vendor: str) -> None:
    device_id = cdi.claim_device_id(driver=vendor, claim_uid=claim_uid, device_name=device_name)
    kind, _, name = device_id.partition("=")
    spec_vendor, _, spec_class = kind.partition("/")
    assert VENDOR_OR_CLASS.match(spec_vendor)
    assert VENDOR_OR_CLASS.match(spec_class)
    assert DEVICE_NAME.match(name)
    spec = cdi.build_claim_spec(
        driver=vendor, claim_uid=claim_uid, devices=[ClaimDevice(name=device_name, gpu_minor=0, uuid=GPU0)]
    )
    assert f"{spec.kind}={spec.devices[0].name}" == device_id


def test_claim_device_id() -> None:
    assert cdi.claim_device_id(driver=DRIVER, claim_uid=CLAIM, device_name="gpu-0") == (
        f"gpu.gpudra.io/claim={CLAIM}-gpu-0"
    )


@pytest.mark.parametrize(
    "driver",
    [
        "",
        "1gpu.example.com",
        "gpu.example.com-",
        "-gpu",
        "gpu/example",
        "gpü.example.com",
        "gpu example",
        "gpu:x",
    ],
    ids=["empty", "leading-digit", "trailing-dash", "leading-dash", "slash", "non-ascii", "space", "colon"],
)
def test_bad_driver_name_is_reported(driver: str) -> None:
    with pytest.raises(ConfigError, match="letters, digits") as raised:
        cdi.build_claim_spec(
            driver=driver, claim_uid=CLAIM, devices=[ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0)]
        )
    assert raised.value.field == "driver"


@pytest.mark.parametrize(
    "claim_uid",
    ["", "-abc", "abc-", "a/b", "a b", "a=b"],
    ids=["empty", "leading-dash", "trailing-dash", "slash", "space", "equals"],
)
def test_bad_claim_uid_is_reported(claim_uid: str) -> None:
    with pytest.raises(ConfigError, match="starting and ending with a letter or digit") as raised:
        cdi.build_claim_spec(
            driver=DRIVER, claim_uid=claim_uid, devices=[ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0)]
        )
    assert raised.value.field == "claim_uid"
    with pytest.raises(ConfigError):
        cdi.spec_path(Path("/var/run/cdi"), driver=DRIVER, claim_uid=claim_uid)


@pytest.mark.parametrize(
    ("devices", "field", "message"),
    [
        ([], "devices", "at least one device"),
        ([ClaimDevice(name="gpu_0/", gpu_minor=0, uuid=GPU0)], "devices[0].name", "CDI device name"),
        (
            [
                ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0),
                ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0),
            ],
            "devices[1].name",
            "listed twice",
        ),
        ([ClaimDevice(name="gpu-0", gpu_minor=-1, uuid=GPU0)], "devices[0].gpu_minor", ">= 0"),
        ([ClaimDevice(name="gpu-0", gpu_minor=0, uuid=MIG)], "devices[0].uuid", "not the UUID of a full GPU"),
        (
            [ClaimDevice(name="gpu-0", gpu_minor=0, uuid="GPU-")],
            "devices[0].uuid",
            "not the UUID of a full GPU",
        ),
        ([ClaimDevice(name="gpu-0", gpu_minor=0, uuid=f"{GPU0},{GPU1}")], "devices[0].uuid", "not the UUID"),
        (
            [ClaimDevice(name="m", gpu_minor=0, uuid=GPU0, mig=MigAccess(GPU0, 508, 1, 2))],
            "devices[0].uuid",
            "not the UUID of a MIG device",
        ),
        (
            [ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0, env={"A=B": "c"})],
            "devices[0].env",
            "not allowed",
        ),
        ([ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0, env={"": "c"})], "devices[0].env", "not allowed"),
        (
            [ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0, env={"NVIDIA_VISIBLE_DEVICES": "all"})],
            "devices[0].env",
            "gpudra sets NVIDIA_VISIBLE_DEVICES",
        ),
        (
            [
                ClaimDevice(
                    name="gpu-0",
                    gpu_minor=0,
                    uuid=GPU0,
                    mounts=(Mount(host_path="pipe", container_path="/p"),),
                )
            ],
            "devices[0].mounts[0]",
            "absolute",
        ),
    ],
    ids=[
        "no-devices",
        "bad-device-name",
        "duplicate-device",
        "negative-minor",
        "mig-uuid-without-mig-access",
        "bare-prefix",
        "two-uuids",
        "gpu-uuid-with-mig-access",
        "env-name-with-equals",
        "empty-env-name",
        "reserved-env",
        "relative-mount",
    ],
)
def test_bad_device_is_reported(devices: list[ClaimDevice], field: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        cdi.build_claim_spec(driver=DRIVER, claim_uid=CLAIM, devices=devices)
    assert raised.value.field == field


def test_spec_path_uses_transient_spec_naming() -> None:
    assert cdi.spec_path(Path("/var/run/cdi"), driver=DRIVER, claim_uid=CLAIM) == Path(
        f"/var/run/cdi/gpu.gpudra.io-claim_{CLAIM}.json"
    )


def test_write_spec_creates_root_and_is_idempotent(tmp_path: Path) -> None:
    root = tmp_path / "run" / "cdi"
    spec = cdi.build_claim_spec(driver=DRIVER, claim_uid=CLAIM, devices=[mig_device()])
    path = cdi.write_spec(root, spec, claim_uid=CLAIM)
    first = path.read_text()
    assert cdi.write_spec(root, spec, claim_uid=CLAIM) == path
    assert path == cdi.spec_path(root, driver=DRIVER, claim_uid=CLAIM)
    assert path.read_text() == first == spec.to_json()
    assert CdiSpec.model_validate_json(first) == spec
    assert [p.name for p in root.iterdir()] == [path.name]
    assert path.stat().st_mode & 0o777 == 0o644


def test_write_spec_replaces_the_previous_spec(tmp_path: Path) -> None:
    old = cdi.build_claim_spec(
        driver=DRIVER, claim_uid=CLAIM, devices=[ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0)]
    )
    new = cdi.build_claim_spec(
        driver=DRIVER, claim_uid=CLAIM, devices=[ClaimDevice(name="gpu-1", gpu_minor=1, uuid=GPU1)]
    )
    cdi.write_spec(tmp_path, old, claim_uid=CLAIM)
    path = cdi.write_spec(tmp_path, new, claim_uid=CLAIM)
    assert CdiSpec.model_validate_json(path.read_text()) == new


def test_delete_spec_is_idempotent(tmp_path: Path) -> None:
    spec = cdi.build_claim_spec(
        driver=DRIVER, claim_uid=CLAIM, devices=[ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0)]
    )
    path = cdi.write_spec(tmp_path, spec, claim_uid=CLAIM)
    assert cdi.delete_spec(tmp_path, driver=DRIVER, claim_uid=CLAIM) is True
    assert not path.exists()
    assert cdi.delete_spec(tmp_path, driver=DRIVER, claim_uid=CLAIM) is False
    assert cdi.delete_spec(tmp_path / "absent", driver=DRIVER, claim_uid=CLAIM) is False


def test_list_claim_specs_finds_only_this_drivers_claim_specs(tmp_path: Path) -> None:
    other_claim = str(uuidlib.UUID(int=7))
    for claim_uid in (CLAIM, other_claim):
        spec = cdi.build_claim_spec(
            driver=DRIVER, claim_uid=claim_uid, devices=[ClaimDevice(name="gpu-0", gpu_minor=0, uuid=GPU0)]
        )
        cdi.write_spec(tmp_path, spec, claim_uid=claim_uid)
    for name in (
        f"k8s.gpu.nvidia.com-claim_{CLAIM}.yaml",  # another driver's claim spec
        f"other.gpudra.io-claim_{CLAIM}.json",  # another gpudra deployment
        f"x.gpu.gpudra.io-claim_{CLAIM}.json",  # a vendor that merely ends like ours
        "nvidia.yaml",  # the toolkit's spec
        "gpu.gpudra.io-claim_.json",  # no claim UID
        f"gpu.gpudra.io-claim_{CLAIM}.yaml",  # not a name gpudra writes
        f".gpu.gpudra.io-claim_{CLAIM}.json.abc123.tmp",  # left by a crash before the rename
    ):
        (tmp_path / name).write_text("{}")
    (tmp_path / f"gpu.gpudra.io-claim_{uuidlib.UUID(int=9)}.json").mkdir()
    assert cdi.list_claim_specs(tmp_path, driver=DRIVER) == {
        CLAIM: cdi.spec_path(tmp_path, driver=DRIVER, claim_uid=CLAIM),
        other_claim: cdi.spec_path(tmp_path, driver=DRIVER, claim_uid=other_claim),
    }


def test_list_claim_specs_of_missing_root_is_empty(tmp_path: Path) -> None:
    assert cdi.list_claim_specs(tmp_path / "absent", driver=DRIVER) == {}


# What `nvidia-ctk cdi generate` writes, shortened: per-GPU, per-MIG and "all" devices, common edits.
TOOLKIT_SPEC = f"""\
cdiVersion: 0.7.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: {GPU0}
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: "0:0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia-caps/nvidia-cap21
- name: {MIG}
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia-caps/nvidia-cap21
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06
    options: [ro, nosuid, nodev, rbind, rprivate]
"""


def gpu(uuid: str = GPU0) -> ClaimDevice:
    return ClaimDevice(name="gpu-0", gpu_minor=0, uuid=uuid)


def dynamic_mig(uuid: str = "MIG-99999999-8888-7777-6666-555555555555", parent: str = GPU0) -> ClaimDevice:
    return ClaimDevice(
        name="gpu-0-mig-1g10gb-19-0",
        gpu_minor=0,
        uuid=uuid,
        mig=MigAccess(parent_uuid=parent, caps_major=508, gi_cap_minor=66, ci_cap_minor=67),
    )


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (gpu(), (f"nvidia.com/gpu={GPU0}",)),
        (dynamic_mig(uuid=MIG), (f"nvidia.com/gpu={MIG}",)),
        (dynamic_mig(), (f"nvidia.com/gpu={GPU0}",)),
        (gpu(GPU1), ()),
        (dynamic_mig(parent=GPU1), ()),
    ],
    ids=[
        "gpu",
        "mig-in-toolkit-spec",
        "mig-created-later-uses-parent",
        "unknown-gpu",
        "unknown-mig-and-parent",
    ],
)
def test_toolkit_ids_from_yaml_spec(tmp_path: Path, device: ClaimDevice, expected: tuple[str, ...]) -> None:
    (tmp_path / "nvidia.yaml").write_text(TOOLKIT_SPEC)
    assert ToolkitSpecs([tmp_path]).device_ids(device) == expected


def test_toolkit_ids_from_json_spec_in_a_later_directory(tmp_path: Path) -> None:
    static, dynamic = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    static.mkdir()
    dynamic.mkdir()
    (dynamic / "nvidia.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.7.0",
                "kind": "nvidia.com/gpu",
                "devices": [{"name": GPU1, "containerEdits": {}}],
            }
        )
    )
    assert ToolkitSpecs([static, dynamic]).device_ids(gpu(GPU1)) == (f"nvidia.com/gpu={GPU1}",)


def test_no_toolkit_spec_means_no_toolkit_ids(tmp_path: Path) -> None:
    spec = cdi.build_claim_spec(driver=DRIVER, claim_uid=CLAIM, devices=[gpu()])
    cdi.write_spec(tmp_path, spec, claim_uid=CLAIM)  # gpudra's own spec is not the toolkit's
    assert ToolkitSpecs([tmp_path, tmp_path / "absent"]).device_ids(gpu()) == ()


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("other.yaml", TOOLKIT_SPEC.replace("kind: nvidia.com/gpu", "kind: example.com/gpu")),
        ("nvidia.yml", TOOLKIT_SPEC),
        (".nvidia.yaml.x1.tmp", TOOLKIT_SPEC),
        ("nvidia.yaml", "kind: nvidia.com/gpu\ndevices: [\n"),
        ("nvidia.json", "{not json"),
        ("nvidia.yaml", "- just\n- a list\n"),
        ("nvidia.yaml", "kind: nvidia.com/gpu\ndevices: 3\n"),
    ],
    ids=[
        "other-kind",
        "yml-extension",
        "temp-file",
        "broken-yaml",
        "broken-json",
        "not-a-mapping",
        "devices-not-a-list",
    ],
)
def test_files_that_offer_no_toolkit_devices(tmp_path: Path, name: str, content: str) -> None:
    (tmp_path / name).write_text(content)
    assert ToolkitSpecs([tmp_path]).device_ids(gpu()) == ()


def test_broken_toolkit_spec_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "nvidia.yaml").write_text("kind: [\n")
    specs = ToolkitSpecs([tmp_path])
    with caplog.at_level(logging.WARNING, logger="gpudra.node.cdi"):
        specs.device_ids(gpu())
        specs.device_ids(gpu())
    assert [record.getMessage().startswith("ignoring CDI spec") for record in caplog.records] == [True]


def test_unquoted_numeric_names_are_read_as_strings(tmp_path: Path) -> None:
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.7.0\nkind: nvidia.com/gpu\ndevices:\n- name: 0\n")
    assert ToolkitSpecs([tmp_path]).device_ids(gpu("0")) == ("nvidia.com/gpu=0",)


def test_toolkit_spec_changes_are_picked_up(tmp_path: Path) -> None:
    path = tmp_path / "nvidia.yaml"
    path.write_text(TOOLKIT_SPEC)
    specs = ToolkitSpecs([tmp_path])
    assert specs.device_ids(gpu(GPU1)) == ()

    # Replaced by rename (a new inode) within the same mtime tick: the inode tells the versions apart.
    before = path.stat()
    replacement = tmp_path / ".nvidia.yaml.new"
    replacement.write_text(TOOLKIT_SPEC.replace(GPU0, GPU1))
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(replacement, path)
    assert specs.device_ids(gpu(GPU1)) == (f"nvidia.com/gpu={GPU1}",)
    assert specs.device_ids(gpu(GPU0)) == ()

    # Rewritten in place with the same size: the newer mtime tells.
    later = path.stat().st_mtime_ns + 10**9
    path.write_text(TOOLKIT_SPEC)
    os.utime(path, ns=(later, later))
    assert specs.device_ids(gpu(GPU0)) == (f"nvidia.com/gpu={GPU0}",)

    path.unlink()
    assert specs.device_ids(gpu(GPU0)) == ()


def test_unchanged_toolkit_spec_is_not_reparsed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "nvidia.yaml"
    path.write_text(TOOLKIT_SPEC)
    specs = ToolkitSpecs([tmp_path])
    assert specs.device_ids(gpu()) == (f"nvidia.com/gpu={GPU0}",)
    # Overwrite in place with content of the same size and restore the mtime: the cache must answer.
    stat = path.stat()
    with path.open("r+") as f:
        f.write("kind: [" + " " * (len("cdiVersion: 0.7.0") - len("kind: [")))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with caplog.at_level(logging.WARNING, logger="gpudra.node.cdi"):
        assert specs.device_ids(gpu()) == (f"nvidia.com/gpu={GPU0}",)
    assert caplog.records == []


def test_only_a_spec_this_user_wrote_is_read_back(tmp_path: Path) -> None:
    """The rebuild holds GPUs for the claims specs name: a planted spec must not be trusted."""
    spec = cdi.build_claim_spec(driver=DRIVER, claim_uid=CLAIM, devices=[mig_device()])
    path = cdi.write_spec(tmp_path, spec, claim_uid=CLAIM)
    assert cdi.read_spec(path) == spec
    os.chmod(path, 0o666)
    with pytest.raises(GpudraError, match="is not one gpudra wrote: mode 0666: writable by others"):
        cdi.read_spec(path)
    os.chmod(path, 0o644)
    os.chown(path, 4242, 4242)
    with pytest.raises(GpudraError, match=f"not one gpudra wrote: owned by uid 4242, not {os.geteuid()}"):
        cdi.read_spec(path)
    planted = tmp_path / "elsewhere.json"
    planted.write_text(spec.to_json())
    path.unlink()
    path.symlink_to(planted)
    with pytest.raises(GpudraError, match="cannot be read"):
        cdi.read_spec(path)  # not followed
    assert cdi.list_claim_specs(tmp_path, driver=DRIVER) == {}  # and not listed
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(GpudraError, match="not a regular file"):
        cdi.read_spec(path)  # a FIFO: never blocks
    path.unlink()
    path.write_bytes(b" " * (cdi.MAX_SPEC_BYTES + 1))
    with pytest.raises(GpudraError, match="more than 1048576"):
        cdi.read_spec(path)
