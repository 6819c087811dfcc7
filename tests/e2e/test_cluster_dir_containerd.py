"""`make cluster-up` works in either runtime whatever an earlier run left in its directory: the same
directory up with the fake CRI, down, then up with containerd, whose API server listens on the host's
address instead of 127.0.0.1 and so needs a serving certificate of its own (the scheduler and the
controller manager refused the first run's one). Through `python -m tests.localcluster`, as the make
targets run it.

It starts a containerd cluster of its own, so it runs before the files that share one (pytest's file
order: test_demo_containerd.py and test_helm_containerd.py come after it).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client, config

from tests.integration.kube_helpers import wait_for
from tests.integration.procs import cluster_processes
from tests.localcluster.cluster import certificate_names

pytestmark = pytest.mark.e2e


def _cluster(action: str, directory: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tests.localcluster", action, f"--dir={directory}", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"cluster {action} {' '.join(args)}:\n{done.stderr}"
    return done.stdout


def _schedules_a_deployments_pod(kubeconfig: Path, name: str) -> None:
    """The controller manager makes the Deployment's pod, the scheduler binds it: both talk to the API
    server over its certificate."""
    api = config.new_client_from_config(str(kubeconfig))
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    labels = {"app": name}
    apps.create_namespaced_deployment(
        "default",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "c", "image": "localhost/never-pulled:none"}]},
                },
            },
        },
    )

    def bound() -> bool:
        pods = core.list_namespaced_pod("default", label_selector=f"app={name}").items
        return any(p.spec.node_name for p in pods)

    wait_for("the Deployment's pod to be made and bound to a node", bound, timeout=120)


def test_one_cluster_directory_up_with_the_fake_cri_then_with_containerd() -> None:
    directory = Path(tempfile.mkdtemp(prefix="gpudra-e2e-reuse-", dir="/tmp"))
    certificate = directory / "pki" / "apiserver.crt"
    try:
        kubeconfig = Path(_cluster("up", directory).strip().splitlines()[-1])
        _schedules_a_deployments_pod(kubeconfig, "first")
        assert certificate_names(certificate, "127.0.0.1")
        _cluster("down", directory)

        _cluster("up", directory, "--runtime=containerd")
        [entry] = yaml.safe_load(kubeconfig.read_text())["clusters"]
        host = urlsplit(entry["cluster"]["server"]).hostname
        assert host is not None and host != "127.0.0.1"
        assert certificate_names(certificate, host)  # made again for the host's address
        _schedules_a_deployments_pod(kubeconfig, "second")
    finally:
        _cluster("down", directory)
    assert cluster_processes(str(directory)) == []
