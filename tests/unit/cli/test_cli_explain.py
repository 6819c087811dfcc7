"""`gpudra explain` offline (gpudra.cli.explain through gpudra.cli): files in, verdict and exit status out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudra import cli
from gpudra.cli.output_format import documents
from gpudra.model.devices import build_devices
from gpudra.model.slices import build_slices
from tests.unit import inventories as inv

DRIVER = "gpu.gpudra.io"
A = f'device.attributes["{DRIVER}"]'


def write(path: Path, *objects: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(objects))
    return path


@pytest.fixture
def node_file(tmp_path: Path) -> Path:
    """What `gpudra inventory -o yaml` prints for a node with two L4s and two T4s."""
    model = build_devices(inv.mixed_node(), mig_mode="partitionable")
    items = build_slices(model, driver=DRIVER, node_name="node-mixed", generation=1, server_minor=36)
    return write(tmp_path / "node.yaml", {"apiVersion": "v1", "kind": "List", "items": items})


def template(name: str, expression: str, **extra: Any) -> dict[str, Any]:
    exactly = {
        "deviceClassName": "gpu.gpudra.io",
        "selectors": [{"cel": {"expression": expression}}],
        **extra,
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def pod(name: str, *templates: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "image": "x"}],
            "resourceClaims": [{"name": t, "resourceClaimTemplateName": t} for t in templates],
        },
    }


def test_each_claim_of_a_file_is_explained_and_the_exit_status_says_whether_all_fit(
    tmp_path: Path, node_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = write(
        tmp_path / "claims.yaml",
        template("t4", f'{A}.productName == "Tesla T4"'),
        template("h200", f'{A}.productName == "NVIDIA H200"'),
    )
    assert cli.main(["explain", str(claims), "--slices", str(node_file)]) == 1
    out = capsys.readouterr().out
    assert "== template default/t4 ==\nfits on node-mixed: gpu-2\n" in out
    assert '== template default/h200 ==\ncannot fit: no device has productName == "NVIDIA H200"' in out


def test_the_claims_of_a_pod_are_explained_together_and_json_is_one_object_per_line(
    tmp_path: Path, node_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = write(
        tmp_path / "pod.yaml",
        template("a", f'{A}.productName == "Tesla T4"', count=2),
        template("b", f'{A}.productName == "Tesla T4"'),
        pod("p", "a", "b"),
    )
    assert cli.main(["explain", str(claims), "--slices", str(node_file), "-o", "json"]) == 1
    [result] = documents(capsys.readouterr().out)
    assert result["claims"] == ["template default/a", "template default/b"]
    assert not result["fits"]
    written = write(
        tmp_path / "one.yaml", template("a", f'{A}.productName == "Tesla T4"', count=2), pod("p", "a")
    )
    assert cli.main(["explain", str(written), "--slices", str(node_file), "-o", "json"]) == 0
    explanation = json.loads(capsys.readouterr().out)
    assert (explanation["apiVersion"], explanation["kind"]) == ("gpudra.io/v1alpha1", "Explanation")
    assert explanation["verdict"] == "fits on node-mixed: gpu-2, gpu-3"


def test_allocated_claims_beside_the_slices_hold_their_devices(
    tmp_path: Path, node_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    held = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "x", "namespace": "ml"},
        "spec": {},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": DRIVER, "pool": "node-mixed", "device": d}
                        for d in ("gpu-2", "gpu-3")
                    ]
                }
            }
        },
    }
    allocated = write(
        tmp_path / "claims-in-cluster.yaml", {"kind": "List", "apiVersion": "v1", "items": [held]}
    )
    claims = write(tmp_path / "claim.yaml", template("t4", f'{A}.productName == "Tesla T4"'))
    assert cli.main(["explain", str(claims), "--slices", str(node_file), "--slices", str(allocated)]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert "gpu-2: allocated to ml/x; gpu-3: allocated to ml/x" in first


@pytest.mark.parametrize(
    ("objects", "message"),
    [
        ([], "holds no ResourceClaim, ResourceClaimTemplate or Pod"),
        (
            [pod("p", "missing")],
            "ResourceClaimTemplate default/missing is not in the file (and no cluster is read)",
        ),
    ],
)
def test_what_cannot_be_explained_is_one_line_on_stderr(
    tmp_path: Path,
    node_file: Path,
    capsys: pytest.CaptureFixture[str],
    objects: list[dict[str, Any]],
    message: str,
) -> None:
    claims = write(tmp_path / "claims.yaml", *objects) if objects else tmp_path / "empty.yaml"
    claims.touch()
    assert cli.main(["explain", str(claims), "--slices", str(node_file)]) == 2
    assert message in capsys.readouterr().err


def test_a_cluster_object_needs_a_cluster(node_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "claim/x", "--slices", str(node_file)]) == 2
    assert (
        "claim/x names an object in a cluster; with --slices, pass a file of claims"
        in capsys.readouterr().err
    )


def test_another_class_file(tmp_path: Path, node_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    classes = write(
        tmp_path / "classes.yaml",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.gpudra.io"},
            "spec": {"selectors": [{"cel": {"expression": f'{A}.productName == "Tesla T4"'}}]},
        },
    )
    claims = write(tmp_path / "claim.yaml", template("any", "true"))
    assert cli.main(["explain", str(claims), "--slices", str(node_file), "--classes", str(classes)]) == 0
    assert capsys.readouterr().out.startswith("fits on node-mixed: gpu-2\n")


def test_a_tenant_claim_nested_too_deeply_in_the_cluster_dump_is_left_out_with_a_warning(
    tmp_path: Path, node_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kubectl get resourceclaims -A -o yaml` holds every tenant's claims; one nested 3000 deep (the API
    server stores it) is named on stderr, and the rest is explained."""
    deep = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "deep", "namespace": "team-b"},
        "spec": {"devices": {"config": [{"opaque": {"driver": "x.example.com", "parameters": "__DEEP__"}}]}},
    }
    dump = tmp_path / "claims.yaml"
    listed = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [deep]})
    dump.write_text(listed.replace("__DEEP__", "[" * 3000 + "]" * 3000))
    claims = write(tmp_path / "claims-to-explain.yaml", template("l4", f'{A}.productName == "NVIDIA L4"'))
    code = cli.main(["explain", str(claims), "--slices", str(node_file), "--slices", str(dump)])
    captured = capsys.readouterr()
    assert code == 0, captured
    assert captured.err == (
        f"gpudra explain: warning: left out {dump}: document 1, items[0]: nests deeper than 100 levels\n"
    )


# --- what rules a node out before its devices, invalid configs, workloads ---------------------------

BAD_MPS = {
    "opaque": {
        "driver": DRIVER,
        "parameters": {
            "apiVersion": "resource.gpudra.io/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}},
        },
    }
}


def _with_config(obj: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    obj["spec"]["spec"]["devices"]["config"] = [config]
    return obj


def test_a_claim_with_an_invalid_config_cannot_fit(
    tmp_path: Path, node_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = write(tmp_path / "claims.yaml", _with_config(template("t4", "true"), BAD_MPS))
    assert cli.main(["explain", str(claims), "--slices", str(node_file)]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(
        "cannot fit: invalid config: spec.spec.devices.config[0].opaque.parameters.sharing"
    )
    assert "1 to 100" in first


def test_time_slicing_a_mig_device_fits_with_the_webhooks_warning_as_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = build_devices(inv.node(inv.h100(0)), mig_mode="partitionable")
    items = build_slices(model, driver=DRIVER, node_name="node-h100", generation=1, server_minor=36)
    slices = write(tmp_path / "node.yaml", {"apiVersion": "v1", "kind": "List", "items": items})
    mig = template("mig", "true")
    mig["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "mig.gpudra.io"
    config = {
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "resource.gpudra.io/v1beta1",
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
            },
        }
    }
    claims = write(tmp_path / "claims.yaml", _with_config(mig, config))
    assert cli.main(["explain", str(claims), "--slices", str(slices)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fits on node-h100: gpu-0-mig-")
    assert (
        "note: warning: spec.spec.devices.config[0].opaque.parameters.sharing.strategy: TimeSlicing on a MIG "
        "device sets nothing: the claim's containers share the partition; interval Short is not applied "
        "(the time-slice is the whole GPU's)\n"
    ) in out


def _node(
    name: str, *, taints: list[dict[str, str]] | None = None, labels: dict[str, str] | None = None
) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or []},
    }


def _pod(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "containers": [],
            "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t4"}],
            **spec,
        },
    }


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("node", "pod", "fits", "says"),
    [
        (
            _node("node-mixed", taints=[GPU_TAINT]),
            _pod(),
            False,
            "cannot fit: 1 node excluded by taint nvidia.com/gpu=present:NoSchedule (the devices of 1 node "
            "would fit: node-mixed)",
        ),
        (
            _node("node-mixed", taints=[GPU_TAINT]),
            _pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]),
            True,
            "fits on node-mixed",
        ),
        (_node("node-mixed"), _pod(nodeSelector={"pool": "a"}), False, "nodeSelector pool=a"),
        (_node("node-mixed", labels={"pool": "a"}), _pod(nodeSelector={"pool": "a"}), True, "fits"),
        (
            _node("node-mixed", labels={"zone": "b"}),
            _pod(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                            ]
                        }
                    }
                }
            ),
            False,
            "required node affinity",
        ),
    ],
    ids=["taint", "tolerated", "selector", "selected", "affinity"],
)
def test_a_pod_goes_only_where_the_scheduler_would_send_it(
    tmp_path: Path,
    node_file: Path,
    capsys: pytest.CaptureFixture[str],
    node: dict[str, Any],
    pod: dict[str, Any],
    fits: bool,
    says: str,
) -> None:
    nodes = write(tmp_path / "nodes.yaml", node)
    claims = write(tmp_path / "pod.yaml", pod, template("t4", f'{A}.productName == "Tesla T4"'))
    code = cli.main(["explain", str(claims), "--slices", str(node_file), "--slices", str(nodes)])
    first = capsys.readouterr().out.splitlines()[0]
    assert code == (0 if fits else 1) and says in first, first


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("Deployment", ["spec", "template"]),
        ("StatefulSet", ["spec", "template"]),
        ("Job", ["spec", "template"]),
        ("DaemonSet", ["spec", "template"]),
        ("CronJob", ["spec", "jobTemplate", "spec", "template"]),
    ],
)
def test_a_workload_is_explained_as_a_pod_of_its_template(
    tmp_path: Path, node_file: Path, capsys: pytest.CaptureFixture[str], kind: str, path: list[str]
) -> None:
    workload: dict[str, Any] = {"spec": _pod(nodeSelector={"pool": "x"})["spec"]}
    for key in reversed(path):
        workload = {key: workload}
    workload.update(
        {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "w", "namespace": "default"}}
    )
    nodes = write(tmp_path / "nodes.yaml", _node("node-mixed"))
    claims = write(tmp_path / "w.yaml", workload, template("t4", f'{A}.productName == "Tesla T4"'))
    assert cli.main(["explain", str(claims), "--slices", str(node_file), "--slices", str(nodes)]) == 1
    assert "nodeSelector pool=x" in capsys.readouterr().out.splitlines()[0]


@pytest.fixture
def four_nodes(tmp_path: Path) -> Path:
    """Four mixed nodes (two L4s and two T4s each): a-0, a-1 (labelled gpu=a), b-0, b-1."""
    model = build_devices(inv.mixed_node(), mig_mode="partitionable")
    items = [
        item
        for name in ("a-0", "a-1", "b-0", "b-1")
        for item in build_slices(model, driver=DRIVER, node_name=name, generation=1, server_minor=36)
    ]
    return write(tmp_path / "nodes-slices.yaml", {"apiVersion": "v1", "kind": "List", "items": items})


def _sized_node(name: str, **spec: Any) -> dict[str, Any]:
    node = _node(name, labels={"gpu": name[0]})
    return {
        **node,
        "spec": {**node["spec"], **spec},
        "status": {"allocatable": {"cpu": "8", "memory": "64Gi"}},
    }


def test_the_verdict_counts_the_nodes_each_filter_excludes(
    tmp_path: Path, four_nodes: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nodeSelector, taints, cpu requests against what running pods left: each names its nodes in the
    verdict and on its own line, the JSON has them as `excluded`; the devices of the node left decide."""
    nodes = write(
        tmp_path / "nodes.yaml",
        _sized_node("a-0"),
        _sized_node("a-1", taints=[GPU_TAINT]),
        _sized_node("b-0"),
        _sized_node("b-1"),
        {
            "kind": "Pod",
            "metadata": {"name": "busy"},
            "spec": {
                "nodeName": "a-0",
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "7"}}}],
            },
            "status": {"phase": "Running"},
        },
    )
    wants = _pod(
        nodeSelector={"gpu": "a"},
        containers=[{"name": "c", "resources": {"requests": {"cpu": "2"}}}],
        topologySpreadConstraints=[{"maxSkew": 1}],
    )
    claims = write(tmp_path / "pod.yaml", wants, template("t4", f'{A}.productName == "Tesla T4"'))
    argv = ["explain", str(claims), "--slices", str(four_nodes), "--slices", str(nodes)]
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == (
        "cannot fit: 2 nodes excluded by nodeSelector gpu=a, 1 by insufficient cpu, 1 by taint "
        "nvidia.com/gpu=present:NoSchedule (the devices of 4 nodes would fit: a-0, a-1, b-0, +1 more)"
    )
    assert "excluded by insufficient cpu: 1 node (a-0)" in lines
    assert not any(line.startswith("note: its devices") for line in lines)  # said of its node
    assert (
        "a-0: cannot fit: insufficient cpu: the pod requests 2, the node has 1 free of 8 allocatable" in out
    )
    assert any(
        line.startswith("note: the pod's topologySpreadConstraints is not evaluated") for line in lines
    )
    assert cli.main([*argv, "-o", "json"]) == 1
    excluded = json.loads(capsys.readouterr().out)["excluded"]
    assert excluded[0] == {"check": "nodeSelector gpu=a", "nodes": ["b-0", "b-1"]}
    # with nodes left whose devices decide (a-1: the taint comes first, as in the scheduler)
    write(
        tmp_path / "pod.yaml", _pod(nodeSelector={"gpu": "b"}), template("t4", f'{A}.productName == "H100"')
    )
    assert cli.main(argv) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(
        "cannot fit: 1 node excluded by nodeSelector gpu=b, 1 by taint nvidia.com/gpu=present:NoSchedule; "
        "on the other 2 nodes: no device has"
    )


def test_a_pod_that_names_its_node_goes_there_only_and_is_told_the_scheduler_is_skipped(
    tmp_path: Path, node_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = write(
        tmp_path / "pod.yaml", _pod(nodeName="node-other"), template("t4", f'{A}.productName == "Tesla T4"')
    )
    nodes = write(tmp_path / "nodes.yaml", _node("node-mixed"))
    argv = ["explain", str(claims), "--slices", str(node_file), "--slices", str(nodes)]
    assert cli.main(argv) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("cannot fit: 1 node excluded by spec.nodeName node-other")
    assert any(line.startswith("note: spec.nodeName skips the scheduler") for line in lines)
    # a pod the scheduler bound (PodScheduled True) has its nodeName from the binding: no such note
    bound = {
        **_pod(nodeName="node-mixed"),
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
    }
    write(tmp_path / "pod.yaml", bound, template("t4", f'{A}.productName == "Tesla T4"'))
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("fits on node-mixed") and "skips the scheduler" not in out
