"""Fixtures for integration tests: one real local cluster (control plane + kubelet) per test session."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from gpudra.localcluster import LocalCluster

from .procs import cluster_processes

CLUSTER_PREFIX = "gpudra-it-"


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix=CLUSTER_PREFIX, dir="/tmp"))
    with LocalCluster(root, nodes=("node-1",)) as running:
        yield running


@pytest.fixture(scope="session")
def api(cluster: LocalCluster) -> client.ApiClient:
    return config.new_client_from_config(str(cluster.kubeconfig))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any cluster process outlived its test (a leak would poison later runs)."""
    leftovers = cluster_processes(f"/tmp/{CLUSTER_PREFIX}")
    if leftovers:
        print(f"\nprocesses of test clusters still running: {leftovers}")
        for pid in leftovers:
            os.kill(pid, 9)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
