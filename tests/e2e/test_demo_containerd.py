"""`make demo RUNTIME=containerd` works and leaves nothing behind: gpudra installed with Helm, one release
per node, on three nodes with containerd; every example pod runs for real and its containers show the
GPUs CDI gave them; the summary is the fake-CRI demo's (tests/integration/test_demo.py), from containers.

It starts a cluster of its own, so it runs before test_helm_containerd.py's (only one cluster with
containerd runs on a machine at a time), which pytest's file order gives.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.procs import cluster_processes
from tests.localcluster import containerd as ctrd
from tests.localcluster.cluster import mounts_under

from .conftest import Image

pytestmark = pytest.mark.e2e


def test_the_demo_with_containerd_runs_end_to_end_and_cleans_up(image: Image) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.localcluster.demo", "--runtime=containerd", f"--image={image.archive}"],
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for line in (
        "helm install gpudra: deployed",
        "helm install gpudra-node-a100: deployed",
        "helm install gpudra-node-mixed: deployed",
        "gpu-pair-nvlink  node-h100",
        "l4-inference     node-mixed",
        "mig-mixed        node-h100",
        "mig-1g           node-h100",
        "mps-client-a     node-h100",
        # What the containers printed about themselves, checked against the allocation and the specs.
        "containers with /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia-uvm-tools: 17 of 17",
        "containers whose NVIDIA_VISIBLE_DEVICES is a UUID in their claims' CDI specs: 17 of 17",
        "pods whose /dev/nvidia<N> are exactly their claims' GPUs: 14 of 14",
        "CDI spec files written: 13",
        "MIG devices created for the claims: 5",
        "MPS control daemons running for the claims: 4 "
        "(SM share/memory limit: 15%/10240M 25%/20480M 50%/16384M 50%/40960M)",
        "CDI spec files left: 0; GPU settings back to default: yes; MIG devices left: 0; MPS daemons left: 0",
        "no process left running",
    ):
        assert line in out, out
    assert "Warning" not in result.stderr, result.stderr
    [directory] = re.findall(r"^kubeconfig: (/\S+)/admin\.kubeconfig$", out, re.MULTILINE)
    root = Path(directory)
    assert cluster_processes(directory) == []
    assert mounts_under(root) == []
    assert list(root.glob("nodes/*/containerd/root")) == []  # the nodes' copies of the image
    bridges = [
        ctrd.NodeRuntime(root / "nodes" / node, index=index, cdi_root=root, cluster_dir=root).bridge
        for index, node in enumerate(("node-h100", "node-a100", "node-mixed"))
    ]
    assert [ctrd.bridge_exists(bridge) for bridge in bridges] == [False, False, False]
