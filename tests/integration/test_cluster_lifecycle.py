"""The launcher itself: two nodes on request, the real version, and nothing left behind after stop:
no process, and no mount (the kubelet bind-mounts its root directory, and mounts outlive processes)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.localcluster import TOKEN, LocalCluster, stop_cluster
from tests.localcluster.cluster import unmount_under
from tests.localcluster.processes import http_get

from .procs import cluster_processes


def test_two_node_cluster_starts_and_stops_without_leftovers() -> None:
    root = Path(tempfile.mkdtemp(prefix="gpudra-it-life-", dir="/tmp"))
    started = time.monotonic()
    with LocalCluster(root, nodes=("node-a", "node-b")) as cluster:
        bring_up = time.monotonic() - started
        status, body = http_get(f"{cluster.server}/version", token=TOKEN)
        assert status == 200
        # K8S runs the suite on another release (deploy/local/build.sh)
        assert json.loads(body)["gitVersion"] == (os.environ.get("K8S") or _pinned_version())
        status, body = http_get(f"{cluster.server}/api/v1/nodes", token=TOKEN)
        names = sorted(item["metadata"]["name"] for item in json.loads(body)["items"])
        assert names == ["node-a", "node-b"]
        for node in cluster.nodes.values():
            assert node.kubelet_root.is_relative_to(root)
            assert node.registry_dir.is_dir()
        assert cluster_processes(str(root))
        assert _mount_points(root)  # the kubelets' own: what stop must take away
    print(f"two-node cluster ready in {bring_up:.1f}s")
    assert cluster_processes(str(root)) == []
    assert _mount_points(root) == []
    assert not (root / "state.json").exists()


def _mount_points(directory: Path) -> list[str]:
    """Mount points at or under `directory`, read straight from /proc/self/mountinfo."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    points = [line.split()[4] for line in lines]
    return [p for p in points if p == str(directory) or p.startswith(f"{directory}/")]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_unmount_under_takes_nested_stacked_and_busy_mounts(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    deep = root / "nodes" / "n" / "kubelet" / "pods" / "volume dir"
    deep.mkdir(parents=True)
    kubelet = root / "nodes" / "n" / "kubelet"
    for source, target in ((kubelet, kubelet), (kubelet, kubelet), (tmp_path, deep)):
        subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    assert len(_mount_points(root)) == 3
    with (deep / "cluster" / "held").open("w"):  # a busy mount: detached lazily
        unmount_under(root)
        assert _mount_points(root) == []
    unmount_under(root)  # nothing left: a no-op


def _pinned_version() -> str:
    go_mod = Path(__file__).resolve().parents[2] / "deploy" / "local" / "go.mod"
    return next(
        line.split()[1]
        for line in go_mod.read_text().splitlines()
        if line.split()[:1] == ["k8s.io/kubernetes"]
    )


def test_stop_cluster_from_another_process_state(tmp_path: Path) -> None:
    assert stop_cluster(tmp_path) is False
