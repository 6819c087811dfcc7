"""One local cluster with containerd per e2e run, the image archive imported into its node, the chart
installed with the values of `deploy/helm/gpudra/ci/sim-values.yaml` (what docs/install.md tells a kind
user to use) plus the paths of this cluster's node."""

from __future__ import annotations

import json
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from tests.localcluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpudra"
NODE = "node-1"
NAMESPACE = "gpudra"
RELEASE = "gpudra"


@dataclass(frozen=True)
class Image:
    archive: Path
    tags: tuple[str, ...]  # localhost/gpudra:<version> and localhost/gpudra:<version>-<sha>


@pytest.fixture(scope="session")
def image() -> Image:
    """The newest `make image` build as a docker-archive (make e2e builds it first)."""
    built = subprocess.run(
        ["bash", str(REPO / "deploy" / "image" / "archive.sh")], capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, f"deploy/image/archive.sh failed (run make image):\n{built.stderr}"
    archive = Path(built.stdout.strip().splitlines()[-1])
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        tags = tuple(json.load(member)[0]["RepoTags"])
    return Image(archive, tags)


@pytest.fixture(scope="session")
def cluster(image: Image) -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="gpudra-e2e-", dir="/tmp"))
    running = LocalCluster(root, nodes=(NODE,), runtime="containerd", images=(image.archive,))
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def api(cluster: LocalCluster) -> client.ApiClient:
    return config.new_client_from_config(str(cluster.kubeconfig))


def helm_binary() -> str:
    built = subprocess.run(
        ["bash", str(REPO / "deploy" / "local" / "build-helm.sh")], capture_output=True, text=True, check=True
    )
    return built.stdout.strip()


def node_values(cluster: LocalCluster) -> list[str]:
    """The chart's --set for this cluster's node: its kubelet root, CDI root and (empty, simulated GPUs)
    driver root are under the cluster's directory, and the image is never pulled (it was imported)."""
    node = cluster.nodes[NODE]
    return [
        "--set",
        f"kubeletPlugin.driverRoot={node.driver_root}",
        "--set",
        f"kubeletPlugin.kubeletDir={node.kubelet_root}",
        "--set",
        f"kubeletPlugin.cdiDir={node.cdi_root}",
        "--set",
        "image.pullPolicy=Never",
    ]


def helm(cluster: LocalCluster, *args: str, timeout: float = 300) -> str:
    result = subprocess.run(
        [helm_binary(), f"--kubeconfig={cluster.kubeconfig}", "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="session")
def installed(cluster: LocalCluster, api: client.ApiClient) -> str:
    """`helm install` with the chart's simulated-GPU example values; returns the helm output."""
    return helm(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "--create-namespace",
        "-f",
        str(CHART / "ci" / "sim-values.yaml"),
        *node_values(cluster),
        "--wait",
        "--timeout=240s",
    )
