"""Fixtures for `make compat`: `make demo` on the release and feature gates the run names (K8S,
GPUDRA_FEATURE_GATES, GPUDRA_RUNTIME_CONFIG: deploy/local/build.sh, tests.localcluster.cluster), its
steps run one by one so that the tests can look at the cluster while the example pods run.

The demo's three nodes and node groups (tests.localcluster.node_plugin: a DGX H100 offering MIG
partitions on demand and shares, an L4/T4 box offering shares) but for the A100, whose group runs
`--mig-mode static` with an administrator's MIG layout (one 3g.20gb device on gpu-0, made before the
plugin starts), as examples/mig-static.yaml describes: so that existing MIG devices are served, and
checked, on every release, default gates included. (A partitionable node would offer the layout's
placement on demand too, and refuse to prepare it: it never takes a MIG device it did not make.)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from gpudra.node import gpu_driver
from tests.layers import default_timeout
from tests.localcluster import LocalCluster
from tests.localcluster.api import DemoApi
from tests.localcluster.demo import MACHINES, Demo
from tests.localcluster.demo_installs import HostProcesses

REPO = Path(__file__).resolve().parents[2]
# node -> its group's publishing options, where they are not the demo's
GROUPS = {"node-a100": {"mig-mode": "static", "shares": "on"}}
# node -> (MIG profile, placement start) of the MIG device an administrator made on its gpu-0
ADMIN_LAYOUT = {"node-a100": ("3g.20gb", 4)}


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix=f"gpudra-compat-{os.getpid()}-", dir="/tmp"))
    with LocalCluster(root, nodes=tuple(MACHINES)) as running:
        yield running


@pytest.fixture(scope="session")
def api(cluster: LocalCluster) -> client.ApiClient:
    return config.new_client_from_config(str(cluster.kubeconfig))


@pytest.fixture(scope="session")
def gpudra(cluster: LocalCluster) -> HostProcesses:
    return HostProcesses(cluster, MACHINES, metrics=True, groups=GROUPS)


@pytest.fixture(scope="session")
def demo(cluster: LocalCluster, api: client.ApiClient, gpudra: HostProcesses) -> Iterator[Demo]:
    """The demo installed, its examples judged, applied and shown; cleaned up after the last test."""
    for node, (profile, start) in ADMIN_LAYOUT.items():
        make_mig_device(gpudra.plugins[node].sim_state, gpudra.plugins[node].profile, profile, start)
    running = Demo(DemoApi(api), gpudra, repo=REPO, kubeconfig=cluster.kubeconfig)
    try:
        running.install()
        running.apply()
        running.show()
        yield running
        running.clean_up()
    finally:
        gpudra.stop()


def make_mig_device(sim_state: Path, machine: str, profile: str, start: int) -> None:
    """What `nvidia-smi mig -cgi PROFILE -C` does, on gpu-0 of the simulated machine in `sim_state`."""
    before = os.environ.get("GPUDRA_SIM_STATE")
    os.environ["GPUDRA_SIM_STATE"] = str(sim_state)
    try:
        with gpu_driver.connect(f"sim:{machine}") as session:
            gpu = min(session.inventory().gpus, key=lambda g: g.minor)
            profile_id = next(p.id for p in gpu.mig_profiles if p.name == profile)
            session.create_mig_device(gpu_uuid=gpu.uuid, profile_id=profile_id, placement_start=start)
    finally:
        if before is None:
            os.environ.pop("GPUDRA_SIM_STATE", None)
        else:
            os.environ["GPUDRA_SIM_STATE"] = before


# Each module starts a control plane of its release and runs the demo on it: the cluster layers' timeout.
TIMEOUT = 600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """This layer's default timeout (tests/layers.py)."""
    default_timeout(config, items, layer=Path(__file__).parent, seconds=TIMEOUT)
