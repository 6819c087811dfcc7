"""The user's path on one local cluster with containerd: `make release`'s image and chart published with
`make publish` to a real OCI registry on loopback (tests/localcluster/registry.py), the node's containerd
pulling the image from it (no archive import), and gpudra installed with `helm install
oci://<registry>/charts/gpudra --version <version>` with the values of
`deploy/helm/gpudra/ci/sim-values.yaml` (what docs/install.md tells a kind user to use) plus the paths
of this cluster's node. The previous release (deploy/release/previous.sh: a fixed earlier commit) is
published beside it for the upgrade test; the containerd demo (test_demo_containerd.py) installs from
the same registry."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from tests.layers import default_timeout
from tests.localcluster import LocalCluster
from tests.localcluster import helm as localhelm
from tests.localcluster.registry import LoopbackRegistry

REPO = Path(__file__).resolve().parents[2]
CHART = localhelm.chart()
NODE = "node-1"
NAMESPACE = "gpudra"
RELEASE = "gpudra"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@dataclass(frozen=True)
class Published:
    registry: LoopbackRegistry
    version: str  # this release's, pyproject.toml's
    previous: str  # the previous release's (deploy/release/previous.sh)

    @property
    def chart(self) -> str:
        return f"oci://{self.registry.address}/charts/gpudra"

    @property
    def repository(self) -> str:
        return f"{self.registry.address}/gpudra"


def _root_script(*args: str) -> str:
    done = subprocess.run(
        ["bash", *args], capture_output=True, text=True, check=False, env={**os.environ, "PLAIN_HTTP": "1"}
    )
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="session")
def published() -> Iterator[Published]:
    """This release (`make release`, which `make e2e` runs first) and the previous one, in a loopback
    registry: `make publish REGISTRY=127.0.0.1:<port> PLAIN_HTTP=1`."""
    directory = Path(tempfile.mkdtemp(prefix="gpudra-e2e-registry-", dir="/tmp"))
    try:
        with LoopbackRegistry(directory) as registry:
            _root_script(str(REPO / "deploy" / "release" / "publish.sh"), registry.address)
            previous = _root_script(
                str(REPO / "deploy" / "release" / "previous.sh"), registry.address
            ).split()[-1]
            yield Published(registry, VERSION, previous)
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # the registry's blobs: two releases, two arches


@pytest.fixture(scope="session")
def cluster(published: Published) -> Iterator[LocalCluster]:
    # Short: an MPS claim's sockets live under the node's plugin directory, and a unix socket's path has at
    # most 107 bytes (/var/lib/kubelet/plugins/... on a real node leaves plenty; "gpudra-e2e-" left none).
    root = Path(tempfile.mkdtemp(prefix="e2e-", dir="/tmp"))
    running = LocalCluster(
        root, nodes=(NODE,), runtime="containerd", registries=(published.registry.address,)
    )
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def api(cluster: LocalCluster) -> client.ApiClient:
    return config.new_client_from_config(str(cluster.kubeconfig))


def node_values(cluster: LocalCluster, published: Published) -> list[str]:
    """The node's paths, and the image from the loopback registry, pulled when the node lacks it."""
    return localhelm.node_values(
        cluster.nodes[NODE], image_repository=published.repository, pull_policy="IfNotPresent"
    )


def helm(cluster: LocalCluster, *args: str, timeout: float = 300) -> str:
    return localhelm.helm(cluster.kubeconfig, *args, namespace=NAMESPACE, timeout=timeout)


@pytest.fixture(scope="session")
def installed(cluster: LocalCluster, api: client.ApiClient, published: Published) -> str:
    """`helm install oci://...` of this release with the chart's simulated-GPU example values; returns
    the helm output."""
    return helm(
        cluster,
        "install",
        RELEASE,
        published.chart,
        "--version",
        published.version,
        "--plain-http",
        "--create-namespace",
        "-f",
        str(CHART / "ci" / "sim-values.yaml"),
        *node_values(cluster, published),
        "--wait",
        "--timeout=240s",
    )


# The chart on the local cluster with containerd: not timed here, so as before the layers had their own
# timeouts.
TIMEOUT = 600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """This layer's default timeout (tests/layers.py)."""
    default_timeout(config, items, layer=Path(__file__).parent, seconds=TIMEOUT)
