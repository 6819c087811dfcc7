"""The containerd demo (`make demo RUNTIME=containerd`'s steps) works and leaves nothing behind: gpudra
installed with Helm from the loopback registry (`helm install oci://...`, the image pulled by each
node), one release per node, on three nodes with containerd; every example pod runs for real, its
containers show the GPUs CDI gave them, then run the example's own command, which prints what the
example says and keeps running (no restart); the summary is the fake-CRI demo's
(tests/integration/test_demo.py), from containers.

It starts a cluster of its own, so it runs before test_helm_containerd.py's (only one cluster with
containerd runs on a machine at a time), which pytest's file order gives.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.demo_command import run_demo
from tests.integration.procs import cluster_processes
from tests.localcluster import containerd as ctrd
from tests.localcluster.cluster import mounts_under

from .conftest import Published

pytestmark = pytest.mark.e2e


def test_the_demo_with_containerd_runs_end_to_end_and_cleans_up(published: Published) -> None:
    out = run_demo(
        "--runtime=containerd",
        f"--registry={published.registry.address}",
        timeout=580,
        expected=(
            "helm install gpudra: deployed",
            "helm install gpudra-node-a100: deployed",
            "helm install gpudra-node-mixed: deployed",
            "mps-client-a     node-h100",
            # What the containers printed about themselves, checked against the allocation and the specs,
            # and what each example's own command printed, against what the example says it prints.
            "containers whose logs show what their example says: 17 of 17",
            "container restarts: 0",
            "containers with /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia-uvm-tools: 17 of 17",
            "containers whose NVIDIA_VISIBLE_DEVICES is a UUID in their claims' CDI specs: 17 of 17",
            "pods whose /dev/nvidia<N> are exactly their claims' GPUs: 14 of 14",
        ),
    )
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
