"""A real local Kubernetes cluster (control plane + kubelet on a fake CRI) for tests and the demo."""

from tests.localcluster.cluster import TOKEN, LocalCluster, NodePaths, stop_cluster

__all__ = ["TOKEN", "LocalCluster", "NodePaths", "stop_cluster"]
