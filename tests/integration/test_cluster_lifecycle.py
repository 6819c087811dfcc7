"""The launcher itself: two nodes on request, the real version, and nothing left behind after stop."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from tests.localcluster import TOKEN, LocalCluster, stop_cluster
from tests.localcluster.processes import http_get

from .procs import cluster_processes


def test_two_node_cluster_starts_and_stops_without_leftovers() -> None:
    root = Path(tempfile.mkdtemp(prefix="gpudra-it-life-", dir="/tmp"))
    started = time.monotonic()
    with LocalCluster(root, nodes=("node-a", "node-b")) as cluster:
        bring_up = time.monotonic() - started
        status, body = http_get(f"{cluster.server}/version", token=TOKEN)
        assert status == 200
        assert json.loads(body)["gitVersion"] == _pinned_version()
        status, body = http_get(f"{cluster.server}/api/v1/nodes", token=TOKEN)
        names = sorted(item["metadata"]["name"] for item in json.loads(body)["items"])
        assert names == ["node-a", "node-b"]
        for node in cluster.nodes.values():
            assert node.kubelet_root.is_relative_to(root)
            assert node.registry_dir.is_dir()
        assert cluster_processes(str(root))
    print(f"two-node cluster ready in {bring_up:.1f}s")
    assert cluster_processes(str(root)) == []
    assert not (root / "state.json").exists()


def _pinned_version() -> str:
    go_mod = Path(__file__).resolve().parents[2] / "deploy" / "local" / "go.mod"
    return next(
        line.split()[1]
        for line in go_mod.read_text().splitlines()
        if line.split()[:1] == ["k8s.io/kubernetes"]
    )


def test_stop_cluster_from_another_process_state(tmp_path: Path) -> None:
    assert stop_cluster(tmp_path) is False
