"""The controller's options, as `gpudra controller` parses them. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FailurePolicy = Literal["Fail", "Ignore"]


@dataclass(frozen=True)
class ControllerOptions:
    driver: str
    kubeconfig: str | None
    namespace: str  # where the webhook's Secret and the leader Lease live (the controller's own)
    identity: str  # this replica's name in the Lease (the pod name in a cluster)
    # The admission webhook. The API server reaches it through `webhook_service` (a Service in
    # `namespace`), or at `webhook_url` when that is set (a controller run outside the cluster).
    webhook_port: int
    webhook_address: str
    webhook_service: str
    webhook_url: str | None
    webhook_configuration: str  # the ValidatingWebhookConfiguration the controller keeps
    webhook_secret: str  # the Secret holding the webhook's CA and serving certificate
    failure_policy: FailurePolicy
    metrics_port: int
    metrics_address: str
    gpu_map: bool  # the GPU map page at / on the metrics port
    idle_after_seconds: float  # an allocated GPU without activity this long is reported idle
    lease_name: str
    lease_seconds: float  # how long a leader's Lease holds without renewal
    # The ClusterRole that owns the Secret, webhook configuration and Lease the controller creates
    # (the chart's own role, so that `helm uninstall` removes them); None: no owner.
    owner_cluster_role: str | None = None
