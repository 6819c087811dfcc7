"""Fixtures for integration tests: one real local cluster per test session, three nodes, one per
simulated machine, and gpudra's kubelet plugin on each of them."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config, utils

from tests.layers import default_timeout
from tests.localcluster import LocalCluster
from tests.localcluster.node_plugin import PluginProcess

from .procs import cluster_processes

# Per test run: the leak check at the end of a run must not see (and kill) the clusters of another run
# on the same machine.
CLUSTER_PREFIX = f"gpudra-it-{os.getpid()}-"
REPO = Path(__file__).resolve().parents[2]
MACHINES = {"node-h100": "dgx-h100", "node-a100": "dgx-a100", "node-mixed": "mixed"}


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix=CLUSTER_PREFIX, dir="/tmp"))
    with LocalCluster(root, nodes=tuple(MACHINES)) as running:
        yield running


@pytest.fixture(scope="session")
def api(cluster: LocalCluster) -> client.ApiClient:
    return config.new_client_from_config(str(cluster.kubeconfig))


@pytest.fixture(scope="session")
def gpudra(cluster: LocalCluster, api: client.ApiClient) -> Iterator[dict[str, PluginProcess]]:
    """gpudra installed: DeviceClasses applied and the kubelet plugin running on every node."""
    utils.create_from_yaml(
        api,
        yaml_objects=list(
            yaml.safe_load_all((REPO / "deploy" / "manifests" / "deviceclasses.yaml").read_text())
        ),
    )
    plugins = {
        name: PluginProcess(cluster, cluster.nodes[name], profile) for name, profile in MACHINES.items()
    }
    try:
        for plugin in plugins.values():
            plugin.start()
        yield plugins
    finally:
        for plugin in plugins.values():
            plugin.stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any cluster process outlived its test (a leak would poison later runs)."""
    leftovers = cluster_processes(f"/tmp/{CLUSTER_PREFIX}")
    if leftovers:
        print(f"\nprocesses of test clusters still running: {leftovers}")
        for pid in leftovers:
            os.kill(pid, 9)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# The real local control plane, started once per session, and plugins on it: these could not be timed
# here, so they keep what every test had before the layers had their own timeouts.
TIMEOUT = 600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """This layer's default timeout (tests/layers.py)."""
    default_timeout(config, items, layer=Path(__file__).parent, seconds=TIMEOUT)
