"""Helm against the local cluster with containerd: the binary, and the chart's values for a node of it.
I/O: runs deploy/local/build-helm.sh and helm.

Used by the e2e tests and by `make demo RUNTIME=containerd`, which install deploy/helm/gpudra as a user
would; only the node's paths differ from a real cluster's (every node of the local cluster keeps its
kubelet root, CDI root and driver root under the cluster's directory).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpudra.errors import ClusterError
from tests.localcluster.binaries import repo_root
from tests.localcluster.cluster import NodePaths


def chart() -> Path:
    return repo_root() / "deploy" / "helm" / "gpudra"


def helm_binary() -> Path:
    """Helm, built once from its Go module by deploy/local/build-helm.sh."""
    script = repo_root() / "deploy" / "local" / "build-helm.sh"
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ClusterError(f"building Helm failed ({script} exited {result.returncode}):\n{result.stderr}")
    return Path(result.stdout.strip().splitlines()[-1])


def helm(kubeconfig: Path, *args: str, namespace: str, timeout: float = 300) -> str:
    """Run `helm ARGS` in `namespace`; returns its output, ClusterError with it when helm fails."""
    result = subprocess.run(
        [str(helm_binary()), f"--kubeconfig={kubeconfig}", "--namespace", namespace, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise ClusterError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def node_values(
    node: NodePaths, *, image_repository: str = "localhost/gpudra", pull_policy: str = "Never"
) -> list[str]:
    """The chart's --set for a node of the local cluster: its kubelet root, CDI root and (empty,
    simulated GPUs) driver root are under the cluster's directory; the image is by default `make
    image`'s localhost/gpudra (not the chart's default, the published one), never pulled: it was
    imported into the node's containerd. The e2e names the loopback registry's instead."""
    return [
        "--set",
        f"image.repository={image_repository}",
        "--set",
        f"kubeletPlugin.driverRoot={node.driver_root}",
        "--set",
        f"kubeletPlugin.kubeletDir={node.kubelet_root}",
        "--set",
        f"kubeletPlugin.cdiDir={node.cdi_root}",
        "--set",
        f"image.pullPolicy={pull_policy}",
    ]
