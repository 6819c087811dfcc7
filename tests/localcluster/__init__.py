"""A real local Kubernetes cluster (control plane + kubelets on a fake CRI or containerd) for the
tests and the demo."""

from tests.localcluster.cluster import TOKEN, LocalCluster, NodePaths, stop_cluster

__all__ = ["TOKEN", "LocalCluster", "NodePaths", "stop_cluster"]
