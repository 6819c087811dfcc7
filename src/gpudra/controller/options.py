"""`gpudra controller`'s options, each declared once (gpudra.options.declared): its flags, GPUDRA_*
variables and chart values are made from these fields. Pure but for the defaults read from the pod's
environment (POD_NAMESPACE) and host name."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from typing import Literal

from gpudra.options.declared import option
from gpudra.options.shared import LogFormat, driver_option, log_format_option, log_level_option
from gpudra.options.types import Choice, Pattern, Port, Seconds, Switch

FailurePolicy = Literal["Fail", "Ignore"]


@dataclass(frozen=True, kw_only=True)
class ControllerOptions:
    driver: str = driver_option()
    kubeconfig: str | None = option(
        "kubeconfig file (in-cluster config when absent)", chart="in-cluster config"
    )
    # Where the webhook's Secret and the leader Lease live (the controller's own).
    namespace: str = option(
        "the controller's namespace: its Lease and the webhook's Secret live there",
        default=lambda _: os.environ.get("POD_NAMESPACE", "gpudra"),
        chart="the release namespace",
    )
    # This replica's name in the Lease (the pod name in a cluster).
    identity: str = option(
        "this replica's name in the Lease (default: host name + random)",
        default=lambda _: f"{socket.gethostname()}_{secrets.token_hex(4)}",
        chart="the pod's name",
    )
    # The admission webhook. The API server reaches it through `webhook_service` (a Service in
    # `namespace`), or at `webhook_url` when that is set (a controller run outside the cluster).
    webhook_port: int = option(
        "HTTPS port of the admission webhook, and of /status and the GPU map for a bearer token "
        "(0: none of them)",
        type=Port(),
        default="9443",
        chart="controller.webhookPort",
    )
    webhook_address: str = option(
        "address the webhook binds", default="0.0.0.0", chart="all of the pod's addresses"
    )
    webhook_service: str = option(
        "the Service the API server calls", default="gpudra-controller", chart="the chart's Service"
    )
    webhook_url: str | None = option(
        "https://HOST:PORT the API server calls (+ /validate) instead of the Service (a controller "
        "outside the cluster)",
        type=Pattern(
            r"https://[^/\s]+", "https://HOST:PORT (no path: /validate is added)", empty="the Service"
        ),
        chart="the chart's Service",
    )
    # The ValidatingWebhookConfiguration the controller keeps.
    webhook_configuration: str = option(
        "ValidatingWebhookConfiguration name", default="gpudra", chart="named after the release"
    )
    # The Secret holding the webhook's CA and serving certificate.
    webhook_secret: str = option(
        "Secret with the webhook's CA and cert", default="gpudra-webhook-tls", chart="named after the release"
    )
    failure_policy: FailurePolicy = option(
        "when the webhook cannot be reached: Fail refuses claims with gpudra configs, Ignore admits "
        "them unchecked (a bad config then fails at prepare)",
        type=Choice(("Fail", "Ignore")),
        default="Fail",
    )
    metrics_port: int = option(
        "HTTP port for /metrics, /livez, /readyz (0: off)",
        type=Port(),
        default="8080",
        chart="controller.port (the probes use it)",
    )
    metrics_address: str = option(
        "address the HTTP port binds", default="0.0.0.0", chart="all of the pod's addresses"
    )
    # The GPU map page at / on the metrics port.
    gpu_map: bool = option(
        "serve the read-only GPU map page at / on the HTTP port (docs/gpu-map.md: who can reach it)",
        type=Switch(("true", "false"), on="true"),
        default="true",
    )
    # An allocated GPU without activity this long is reported idle.
    idle_after_seconds: float = option(
        "report an allocated GPU idle after this long", type=Seconds(), default="1800"
    )
    lease_name: str = option(
        "the leader election Lease", default="gpudra-controller", chart="named after the release"
    )
    # How long a leader's Lease holds without renewal.
    lease_seconds: float = option(
        "how long a leader holds the Lease without renewing (at least 3)",
        type=Seconds(minimum=3),
        default="15",
    )
    # The ClusterRole that owns the Secret, webhook configuration and Lease the controller creates
    # (the chart's own role, so that `helm uninstall` removes them); None: no owner.
    owner_cluster_role: str | None = option(
        "ClusterRole that owns the Secret, webhook configuration and Lease this controller creates, "
        "so deleting it removes them (the chart sets its own)",
        chart="the controller's ClusterRole",
    )
    log_format: LogFormat = log_format_option()
    log_level: str = log_level_option()
