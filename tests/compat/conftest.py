"""Fixtures for `make compat`: one local cluster of the release and feature gates the run names
(K8S, GPUDRA_FEATURE_GATES, GPUDRA_RUNTIME_CONFIG: deploy/local/build.sh, tests.localcluster.cluster),
two nodes with the demo's node groups (a DGX H100 offering partitions and shares, an L4/T4 box offering
shares), gpudra's DeviceClasses and a plugin on each node."""

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
from tests.localcluster.cluster import free_port
from tests.localcluster.node_plugin import PluginProcess

REPO = Path(__file__).resolve().parents[2]
MACHINES = {"node-h100": "dgx-h100", "node-mixed": "mixed"}


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix=f"gpudra-compat-{os.getpid()}-", dir="/tmp"))
    with LocalCluster(root, nodes=tuple(MACHINES)) as running:
        yield running


@pytest.fixture(scope="session")
def api(cluster: LocalCluster) -> client.ApiClient:
    return config.new_client_from_config(str(cluster.kubeconfig))


@pytest.fixture(scope="session")
def gpudra(cluster: LocalCluster, api: client.ApiClient) -> Iterator[dict[str, PluginProcess]]:
    classes = (REPO / "deploy" / "manifests" / "deviceclasses.yaml").read_text()
    # The classes must compile on every release: the API server refuses a selector it cannot check.
    utils.create_from_yaml(api, yaml_objects=[d for d in yaml.safe_load_all(classes) if d])
    plugins = {name: PluginProcess(cluster, cluster.nodes[name], p) for name, p in MACHINES.items()}
    try:
        for plugin in plugins.values():
            plugin.start(metrics_port=free_port())
        yield plugins
    finally:
        for plugin in plugins.values():
            plugin.stop()


# A released gpudra and this one on the local cluster, one after the other: not timed here, so as before
# the layers had their own timeouts.
TIMEOUT = 600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """This layer's default timeout (tests/layers.py)."""
    default_timeout(config, items, layer=Path(__file__).parent, seconds=TIMEOUT)
