"""One local cluster with containerd per e2e run, the image archive imported into its node, the chart
installed with the values of `deploy/helm/gpudra/ci/sim-values.yaml` (what docs/install.md tells a kind
user to use) plus the paths of this cluster's node."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from tests.layers import default_timeout
from tests.localcluster import LocalCluster
from tests.localcluster import containerd as ctrd
from tests.localcluster import helm as localhelm

REPO = Path(__file__).resolve().parents[2]
CHART = localhelm.chart()
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
    return Image(archive, ctrd.archive_tags(archive))


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


def node_values(cluster: LocalCluster) -> list[str]:
    return localhelm.node_values(cluster.nodes[NODE])


def helm(cluster: LocalCluster, *args: str, timeout: float = 300) -> str:
    return localhelm.helm(cluster.kubeconfig, *args, namespace=NAMESPACE, timeout=timeout)


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


# The chart on the local cluster with containerd: not timed here, so as before the layers had their own
# timeouts.
TIMEOUT = 600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """This layer's default timeout (tests/layers.py)."""
    default_timeout(config, items, layer=Path(__file__).parent, seconds=TIMEOUT)
