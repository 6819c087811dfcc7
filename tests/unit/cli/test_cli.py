"""`gpudra inventory`, `gpudra validate` and kubelet-plugin's option checks as a user runs them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from gpudra import cli
from gpudra.model.slices import validate_slices
from gpudra.node import gpu_driver

# MIG partitions per H100 80GB and A100-SXM4-40GB GPU, from the placement tables
H100 = {"1g.10gb": 7, "1g.10gb+me": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}
A100 = {"1g.5gb": 7, "1g.5gb+me": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}


def _inventory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, profile: str, *extra: str
) -> tuple[int, str]:
    code = cli.main(["inventory", f"--nvml=sim:{profile}", "--node-name=node-a", *extra])
    return code, capsys.readouterr().out


# Every form of every GPU: partitions on demand and shares (the default publishes neither).
EVERYTHING = ("--mig-mode=partitionable", "--shares=on")


@pytest.fixture(autouse=True)
def _sim_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDRA_SIM_STATE", str(tmp_path / "sim" / "state.json"))


@pytest.mark.parametrize(
    ("profile", "gpus", "partitions"),
    [("dgx-h100", 8, H100), ("dgx-a100", 8, A100), ("mixed", 6, {})],
    ids=["dgx-h100", "dgx-a100", "mixed"],
)
@pytest.mark.parametrize("server_minor", [34, 36])
def test_inventory_json_is_a_list_of_valid_slices(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    profile: str,
    gpus: int,
    partitions: dict[str, int],
    server_minor: int,
) -> None:
    # 1.34 with the gates that keep counter sets: its own way of splitting them into slices
    gates = "--feature-gates=DRAPartitionableDevices=true,DRAConsumableCapacity=true"
    code, out = _inventory(
        capsys, tmp_path, profile, "-o", "json", f"--server-minor={server_minor}", gates, *EVERYTHING
    )
    assert code == 0
    listing = json.loads(out)
    assert (listing["apiVersion"], listing["kind"]) == ("v1", "List")
    slices = listing["items"]
    assert validate_slices(slices, server_minor=server_minor) == []
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    names = [d["name"] for d in devices]
    assert len(names) == len(set(names))
    counters = {c["name"]: set(c["counters"]) for s in slices for c in s["spec"].get("sharedCounters", [])}
    for device in devices:
        for use in device.get("consumesCounters", []):
            assert set(use["counters"]) <= counters[use["counterSet"]], device["name"]
    per_gpu: dict[int, Counter[str]] = {}
    for device in devices:
        attrs = device["attributes"]
        if attrs["type"]["string"] == "mig":
            per_gpu.setdefault(attrs["parentMinor"]["int"], Counter())[attrs["profile"]["string"]] += 1
    assert len(per_gpu) == (gpus if partitions else 0)
    for minor, profiles in per_gpu.items():
        assert dict(profiles) == partitions, f"gpu-{minor}"


def test_inventory_yaml_matches_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _, as_json = _inventory(capsys, tmp_path, "mixed", "-o", "json")
    _, as_yaml = _inventory(capsys, tmp_path, "mixed", "-o", "yaml")
    assert yaml.safe_load(as_yaml) == json.loads(as_json)


def test_inventory_table_lists_gpus_and_partitions(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out = _inventory(capsys, tmp_path, "dgx-h100", *EVERYTHING)
    assert code == 0
    assert "NVIDIA H100 80GB HBM3" in out and "0000:18:00.0" in out
    assert "1g.10gb x7 @0,1,2,3,4,5,6" in out and "7g.80gb x1 @0" in out
    assert "216 devices (8 shared), 8 counter sets" in out
    header, first = out.splitlines()[2:4]
    assert header.split("  ")[-1] == "LARGEST PLACEABLE" and first.endswith("  7g.80gb")
    assert first.split()[-2] == "gpu-0-shared"  # the SHARED column


def test_inventory_names_each_form_withheld_on_the_server_and_what_would_serve_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The plugin's own rule (fit_to_server): on 1.35 with default gates partitions and shares are left
    out, and each withheld form gets a line saying which gate or release it needs and why."""
    code, out = _inventory(capsys, tmp_path, "dgx-h100", "--server-minor=35", *EVERYTHING)
    assert code == 0
    tail = out.splitlines()[-5:]
    assert tail == [
        "publishing: whole GPUs, existing MIG devices, idle MIG-mode GPUs whole, no shares",
        "for: Kubernetes 1.35 (drops counter sets, allowMultipleAllocations, device taints)",
        "withheld partitions: MIG partitions on demand need feature gate DRAPartitionableDevices (on by "
        "default from 1.36): the API server drops counter sets",
        "withheld shares: GPU shares are not available before Kubernetes 1.36 (feature gates "
        "DRAPartitionableDevices and DRAConsumableCapacity on by default there): the API server drops "
        "counter sets",
        "withheld health-taints: taints on unhealthy GPUs need feature gate DRADeviceTaints (on by default "
        "from 1.36): the API server drops device taints",
    ]
    assert "8 devices (0 shared), 0 counter sets" in out


def test_inventory_says_why_an_a100_in_mig_mode_offers_nothing_where_partitions_are_withheld(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out = _inventory(capsys, tmp_path, "dgx-a100", "--server-minor=34", *EVERYTHING)
    assert code == 0
    assert (
        "not published: gpu-0, gpu-1, gpu-2, gpu-3, gpu-4, gpu-5, gpu-6, gpu-7 (MIG mode on without MIG "
        "devices: create them; partitions on demand are withheld on this server (below))"
    ) in out
    assert "withheld partitions: MIG partitions on demand need feature gate DRAPartitionableDevices" in out


def test_inventory_with_the_gates_on_withholds_only_what_the_release_cannot_serve(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    gates = "--feature-gates=DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceTaints=true"
    code = cli.main(
        [
            "inventory",
            "--nvml=sim:dgx-h100",
            "--node-name=n",
            "--server-minor=34",
            gates,
            "-o",
            "json",
            *EVERYTHING,
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    devices = [d for s in json.loads(captured.out)["items"] for d in s["spec"].get("devices", [])]
    assert any("-mig-" in d["name"] for d in devices)  # partitions on demand: the gate keeps their counters
    assert not any(d.get("allowMultipleAllocations") for d in devices)  # no shares before 1.36
    assert captured.err.splitlines() == [
        "withheld shares: GPU shares are not available before Kubernetes 1.36: the 1.34 scheduler does not "
        "count the counters shares consume (fixed in 1.36), so a share and its whole GPU could go to two "
        "claims"
    ]


def test_inventory_on_the_newest_release_withholds_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out = _inventory(capsys, tmp_path, "dgx-h100", *EVERYTHING)
    assert code == 0
    assert "for: Kubernetes 1.37\n" in out and "withheld" not in out


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--feature-gates=DRADeviceTaints=yes", "--feature-gates: 'DRADeviceTaints=yes' is not Gate=true"),
        ("--server-minor=30", "--server-minor: 1.30 is older than 1.34"),
    ],
)
def test_inventory_refuses_a_bad_release_option(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, option: str, message: str
) -> None:
    code = cli.main(["inventory", "--nvml=sim:dgx-h100", "--node-name=n", option])
    assert code == 2 and message in capsys.readouterr().err


def test_inventory_table_shows_the_largest_profile_the_existing_instances_leave_room_for(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # (profile ID, placement start): 1g.10gb is 19, 2g.20gb 14, 3g.40gb 9, 4g.40gb 5
    layouts = {0: [(19, 0)], 1: [(19, 6)], 2: [(5, 0), (9, 4)], 3: [(14, 0), (14, 2), (14, 4)]}
    with gpu_driver.connect("sim:dgx-h100") as session:
        gpus = session.inventory().gpus
        for index, layout in layouts.items():
            for profile_id, start in layout:
                session.create_mig_device(
                    gpu_uuid=gpus[index].uuid, profile_id=profile_id, placement_start=start
                )
    code, out = _inventory(capsys, tmp_path, "dgx-h100")
    assert code == 0
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines()[3:11]}
    # 1g@0 blocks 4g@0 and 3g@0, leaving 3g@4; of those, 1g@6 blocks only 3g@4; 4g+3g fill the GPU;
    # three 2g leave slices 6 and 7, which 1g.20gb@6 takes
    assert rows == {
        "gpu-0": "3g.40gb",
        "gpu-1": "4g.40gb",
        "gpu-2": "none",
        "gpu-3": "1g.20gb",
        **{f"gpu-{m}": "7g.80gb" for m in range(4, 8)},
    }


def test_inventory_table_has_no_largest_profile_for_gpus_without_mig(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out = _inventory(capsys, tmp_path, "mixed")
    assert code == 0
    assert all(line.endswith("  -") for line in out.splitlines()[3:9])


def test_inventory_static_mode_publishes_existing_mig_devices_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out = _inventory(capsys, tmp_path, "dgx-h100", "-o", "json", "--mig-mode=static")
    assert code == 0
    slices = json.loads(out)["items"]
    assert all("sharedCounters" not in s["spec"] for s in slices)
    assert [d for s in slices for d in s["spec"].get("devices", [])] == []  # MIG on, no instances yet


@pytest.mark.parametrize("profile", ["mixed", "vm-h100"])
def test_the_default_publishes_whole_gpus_and_no_counter_sets(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, profile: str
) -> None:
    """One form per GPU, so the scheduler pays for gpudra what it pays for whole GPUs (issue 26)."""
    code, out = _inventory(capsys, tmp_path, profile, "-o", "json")
    assert code == 0
    slices = json.loads(out)["items"]
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    assert devices and all("sharedCounters" not in s["spec"] for s in slices)
    assert not any("consumesCounters" in d or "allowMultipleAllocations" in d for d in devices)
    uuids = [d["attributes"]["uuid"]["string"] for d in devices]
    assert len(uuids) == len(set(uuids))  # no GPU published twice


def test_mig_profiles_narrow_the_partitions_offered(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out = _inventory(
        capsys,
        tmp_path,
        "dgx-h100",
        "-o",
        "json",
        "--mig-mode=partitionable",
        "--mig-profiles=1g.10gb, 3g.40gb",
    )
    assert code == 0
    devices = [d for s in json.loads(out)["items"] for d in s["spec"].get("devices", [])]
    profiles = {
        d["attributes"]["profile"]["string"] for d in devices if d["attributes"]["type"]["string"] == "mig"
    }
    assert profiles == {"1g.10gb", "3g.40gb"}
    assert sum(d["attributes"]["type"]["string"] == "mig" for d in devices) == 8 * (7 + 2)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--mig-profiles=1g.10gb"],
            "--mig-profiles: names MIG profiles to offer on demand, which needs --mig-mode partitionable",
        ),
        (
            ["--mig-mode=partitionable", "--mig-profiles=1g.5gb"],
            "--mig-profiles: none of 1g.5gb is a MIG profile of this node's GPUs; they have: 1g.10gb, ",
        ),
    ],
)
def test_mig_profiles_refused_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], message: str
) -> None:
    code = cli.main(["inventory", "--nvml=sim:dgx-h100", "--node-name=node-a", *extra])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1
    assert message in err


def test_shares_per_gpu_adds_the_count_to_every_shared_device(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out = _inventory(capsys, tmp_path, "dgx-h100", "-o", "json", *EVERYTHING, "--shares-per-gpu=4")
    assert code == 0
    devices = [d for s in json.loads(out)["items"] for d in s["spec"].get("devices", [])]
    shared = [d for d in devices if d.get("allowMultipleAllocations")]
    assert len(shared) == 8
    assert {d["capacity"]["shares"]["value"] for d in shared} == {"4"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--shares-per-gpu=4"],
            "--shares-per-gpu: sets a count of shares per GPU, which needs --shares on "
            "(or --mig-share-profiles)",
        ),
        (
            ["--shares=on", "--shares-per-gpu=1"],
            "argument --shares-per-gpu: '1' is not a whole number from 2 to 64, or 0 (off)",
        ),
        (
            ["--shares=on", "--shares-per-gpu=65"],
            "'65' is not a whole number from 2 to 64, or 0 (off)",
        ),
        (["--shares=on", "--shares-per-gpu=four"], "'four' is not a whole number from 2 to 64, or 0 (off)"),
    ],
)
def test_shares_per_gpu_refused_with_one_line(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    code = cli.main(["inventory", "--nvml=sim:dgx-h100", "--node-name=node-a", *extra])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1
    assert message in err


def test_mig_share_profiles_add_a_shared_form_of_each_placement(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out = _inventory(
        capsys,
        tmp_path,
        "dgx-h100",
        "-o",
        "json",
        "--mig-mode=partitionable",
        "--mig-profiles=1g.10gb,3g.40gb",
        "--mig-share-profiles=1g.10gb",
        "--shares-per-gpu=4",  # without --shares on: a count for the shares of partitions
    )
    assert code == 0
    devices = [d for s in json.loads(out)["items"] for d in s["spec"].get("devices", [])]
    shared = [d for d in devices if d.get("allowMultipleAllocations")]
    assert len(shared) == 8 * 7  # one per 1g.10gb placement, no GPU shared device without --shares on
    assert {d["attributes"]["profile"]["string"] for d in shared} == {"1g.10gb"}
    assert {d["capacity"]["shares"]["value"] for d in shared} == {"4"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--mig-share-profiles=1g.10gb"],
            "--mig-share-profiles: names MIG profiles to offer as shareable partitions, which needs "
            "--mig-mode partitionable",
        ),
        (
            ["--mig-mode=partitionable", "--mig-profiles=1g.10gb,3g.40gb", "--mig-share-profiles=2g.20gb"],
            "--mig-share-profiles: 2g.20gb is not among the offered --mig-profiles; "
            "allowed: 1g.10gb, 3g.40gb",
        ),
        (
            ["--mig-mode=partitionable", "--mig-share-profiles=1g.5gb"],
            "--mig-share-profiles: 1g.5gb is not a MIG profile offered on this node; allowed: 1g.10gb, ",
        ),
        (
            ["--mig-mode=partitionable", "--mig-share-profiles=1g"],
            "argument --mig-share-profiles: '1g' is not comma-separated MIG profile names",
        ),
    ],
)
def test_mig_share_profiles_refused_with_one_line(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    code = cli.main(["inventory", "--nvml=sim:dgx-h100", "--node-name=node-a", *extra])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1
    assert message in err


def test_unknown_nvml_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli.main(["inventory", "--nvml=sim:dgx-z900"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--nvml" in err and "sim:dgx-h100" in err


def test_validate_reports_each_bad_config_with_file_object_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "c", "namespace": "ns"},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpudra.io"}},
                            {"name": "fpga", "exactly": {"deviceClassName": "fpga.example.com"}},
                        ],
                        "config": [
                            {
                                "opaque": {
                                    "driver": "gpu.gpudra.io",
                                    "parameters": {
                                        "apiVersion": "resource.gpudra.io/v1beta1",
                                        "kind": "GpuConfig",
                                        "sharing": {
                                            "strategy": "MPS",
                                            "mpsConfig": {"defaultActiveThreadPercentage": 150},
                                        },
                                    },
                                }
                            },
                            {
                                "requests": ["fpga"],
                                "opaque": {"driver": "other.example.com", "parameters": {"anything": True}},
                            },
                        ],
                    }
                },
            }
        )
    )
    assert cli.main(["validate", str(bad)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert out[0].startswith(
        f"{bad}: ResourceClaim ns/c: spec.devices.config[0].opaque.parameters.sharing.mpsConfig"
    )
    assert "1 to 100" in out[0]


def test_validate_accepts_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[3]
    files = sorted(str(p) for p in (root / "examples").glob("*.yaml"))
    assert cli.main(["validate", *files, str(root / "deploy/manifests/deviceclasses.yaml")]) == 0


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf"], ids=["negative", "word", "nan", "infinite"])
def test_a_bad_health_interval_is_a_clear_error(capsys: pytest.CaptureFixture[str], value: str) -> None:
    code = cli.main(["kubelet-plugin", "--node-name=node-a", f"--health-interval-seconds={value}"])
    assert code == 2
    assert capsys.readouterr().err == (
        f"gpudra kubelet-plugin: argument --health-interval-seconds: {value!r} is not a number of "
        "seconds >= 0 (0: no health service) (see gpudra kubelet-plugin --help)\n"
    )


def test_a_relative_dev_root_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["kubelet-plugin", "--node-name=node-a", "--dev-root=run/nvidia/driver"])
    assert code == 2
    assert capsys.readouterr().err == (
        "gpudra kubelet-plugin: argument --dev-root: 'run/nvidia/driver' is not an absolute path (one "
        "starting with /) (see gpudra kubelet-plugin --help)\n"
    )


@pytest.mark.parametrize(
    ("option", "environment", "expected"),
    [
        ("health-interval-seconds", None, 10.0),
        ("health-interval-seconds", "0", 0.0),
        ("health-interval-seconds", "2.5", 2.5),
        ("driver-root", None, Path("/")),
        ("driver-root", "/driver-root", Path("/driver-root")),
        ("dev-root", None, Path("/")),
        ("dev-root", "/run/nvidia/driver", Path("/run/nvidia/driver")),
    ],
)
def test_plugin_option_defaults_and_environment(
    monkeypatch: pytest.MonkeyPatch, option: str, environment: str | None, expected: object
) -> None:
    variable = "GPUDRA_" + option.upper().replace("-", "_")
    if environment is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, environment)
    args = cli.build_parser().parse_args(["kubelet-plugin", "--node-name=node-a"])
    assert getattr(args, option.replace("-", "_")) == expected
