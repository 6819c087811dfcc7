"""Runs `gpudra controller` as a real process beside a local cluster, as a Deployment's replica would run,
with the webhook reached at a URL on loopback (there are no Services or pod networks here). I/O: a child
process, its log, its HTTP ports. Used by the demo and the integration tests.

`StatusEndpoint` is where a controller serves `/status` (its webhook port, HTTPS, a bearer token): read
here with the cluster's admin token, and by `gpudra status` with the arguments it gives."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudra.errors import ClusterError
from tests.localcluster.cluster import TOKEN, LocalCluster, free_port
from tests.localcluster.processes import http_get, scrape, terminate

NAMESPACE = "gpudra"
SECRET = "gpudra-webhook-tls"


@dataclass(frozen=True)
class StatusEndpoint:
    """A controller's `/status`: `url` (https://, its webhook port), the CA that signed its certificate
    (PEM) and the name the certificate carries."""

    url: str
    ca_crt: bytes
    server_name: str

    def get(self, token: str = TOKEN) -> dict[str, Any]:
        """The view `token` may see (the cluster's admin token: all of it); TLS unverified, as every
        request to this throwaway cluster."""
        status, body = http_get(f"{self.url}/status", token=token)
        if status != 200:
            raise ClusterError(f"the controller's /status at {self.url}: HTTP {status}: {body[:200]!r}")
        document: dict[str, Any] = json.loads(body)
        return document

    def cli_args(self, directory: Path) -> list[str]:
        """`gpudra status`'s arguments to read it with the admin token, the CA written in `directory`."""
        ca = directory / "controller-ca.crt"
        ca.write_bytes(self.ca_crt)
        return [
            f"--controller-url={self.url}",
            f"--token={TOKEN}",
            f"--certificate-authority={ca}",
            f"--tls-server-name={self.server_name}",
        ]


def webhook_ca(cluster: LocalCluster, namespace: str, secret: str) -> bytes:
    """The CA in the webhook's Secret, as the controller wrote it."""
    status, body = http_get(f"{cluster.server}/api/v1/namespaces/{namespace}/secrets/{secret}", token=TOKEN)
    if status != 200:
        raise ClusterError(f"reading the webhook Secret {namespace}/{secret}: HTTP {status}")
    return base64.b64decode(json.loads(body)["data"]["ca.crt"])


class ControllerProcess:
    """One replica. Replicas of one cluster share the Lease and the webhook URL (`webhook_port`, which
    only the first replica binds unless told otherwise: the API server calls one address)."""

    def __init__(
        self,
        cluster: LocalCluster,
        identity: str,
        *,
        webhook_url_port: int,
        bind_webhook_port: int | None = None,
        idle_after_seconds: float = 1800,
        lease_seconds: float = 15,
        namespace: str = NAMESPACE,
        kubeconfig: Path | None = None,
        extra_args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`kubeconfig` replaces the cluster's admin credentials (e.g. the chart's service account);
        `extra_args` are more `gpudra controller` options (names the chart gives, an owner); `env` is
        added to the process's environment (a stepped wall clock: tests.localcluster.clock_step)."""
        self.cluster = cluster
        self.namespace = namespace
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.extra_args = extra_args
        self.env = dict(env or {})
        self.identity = identity
        self.webhook_url_port = webhook_url_port
        self.bind_webhook_port = bind_webhook_port or webhook_url_port
        self.metrics_port = free_port()
        self.idle_after_seconds = idle_after_seconds
        self.lease_seconds = lease_seconds
        self.log = cluster.directory / "logs" / f"gpudra-controller-{identity}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, wait_ready: bool = True) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpudra",
                    "controller",
                    f"--kubeconfig={self.kubeconfig}",
                    f"--namespace={self.namespace}",
                    f"--identity={self.identity}",
                    "--webhook-address=127.0.0.1",
                    f"--webhook-port={self.bind_webhook_port}",
                    f"--webhook-url=https://127.0.0.1:{self.webhook_url_port}",
                    "--metrics-address=127.0.0.1",
                    f"--metrics-port={self.metrics_port}",
                    f"--idle-after-seconds={self.idle_after_seconds}",
                    f"--lease-seconds={self.lease_seconds}",
                    *self.extra_args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env} if self.env else None,
            )
        if wait_ready:
            self.wait(self.ready, "ready", 60)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def ready(self) -> bool:
        try:
            return http_get(f"{self.url}/readyz")[0] == 200
        except OSError:
            return False

    def wait(self, done: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if self.process is not None and self.process.poll() is not None:
                raise ClusterError(f"gpudra controller {self.identity} exited:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"gpudra controller {self.identity} not {what} in {timeout:.0f}s:\n{self.tail()}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        terminate(self.process)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: no chance to release the Lease."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def metrics(self) -> dict[str, float]:
        """Prometheus samples, `name{labels}` -> value."""
        return scrape(f"{self.url}/metrics", f"controller {self.identity}")

    def leading(self) -> bool:
        try:
            return self.metrics().get("gpudra_controller_leader") == 1.0
        except (OSError, ClusterError):
            return False

    def endpoint(self) -> StatusEndpoint:
        """Where this replica serves /status (its webhook port; the certificate names the webhook URL's
        host)."""
        return StatusEndpoint(
            f"https://127.0.0.1:{self.bind_webhook_port}",
            webhook_ca(self.cluster, self.namespace, SECRET),
            "127.0.0.1",
        )

    def status(self, token: str = TOKEN) -> dict[str, Any]:
        """The view `token` may see (default: the admin's, all of it)."""
        status, body = http_get(f"https://127.0.0.1:{self.bind_webhook_port}/status", token=token)
        if status != 200:
            raise ClusterError(f"status of controller {self.identity}: HTTP {status}: {body[:200]!r}")
        document: dict[str, Any] = json.loads(body)
        return document
