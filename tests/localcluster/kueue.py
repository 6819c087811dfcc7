"""Kueue's manager as a process beside the local control plane, as its Deployment would run it, with gpudra's
DeviceClasses mapped to quota resources. I/O: the API server, a child process, its files and ports.

Kueue is built from its Go module into the cache (deploy/local/build-kueue.sh, which pins the release); its
CRDs come from the same module's config/. What differs from Kueue's own manifests, and why:
- Webhooks: there are no Services here, so the API server calls Kueue at a URL on loopback. Its
  certificate, for 127.0.0.1, is signed by a CA made per run (gpudra's own issuer, gpudra.controller.certs)
  and the webhook configurations carry that CA; Kueue's internal certificate manager is off (it issues for
  the Service's DNS name). Only the webhooks of what the tests use are registered (batch Jobs and Kueue's
  own kinds): the Pod, Deployment and StatefulSet webhooks would stand in front of every other test's pods.
- CRD conversion webhooks are left out: every object here is written and read as v1beta2, the storage
  version, so the API server never converts.
- The metrics endpoint reads its certificate from the fixed path /etc/kueue/metrics/certs when the
  internal certificate manager is off; the manager runs in a private mount namespace where /etc is a
  directory of this run holding that certificate (root, as the containerd tests; nothing is written to the
  host's /etc).
- VisibilityOnDemand is off: it serves an aggregated API that needs an APIService and a Service.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, utils

from gpudra.controller import certs
from gpudra.errors import ClusterError
from tests.localcluster.cluster import LocalCluster, free_port
from tests.localcluster.processes import http_get, terminate

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "kueue-system"
WEBHOOK_GROUPS = {"batch", "kueue.x-k8s.io"}
KUEUE_CONFIGURATION = REPO / "examples" / "quota" / "kueue-configuration.yaml"


def build() -> Path:
    """The cache directory with Kueue's `manager` and `crds/` (built on first use)."""
    done = subprocess.run(
        ["bash", str(REPO / "deploy" / "local" / "build-kueue.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(done.stdout.strip().splitlines()[-1])


def version(directory: Path) -> str:
    """The pinned release, from the cache directory's name (kueue-vX.Y.Z-noopt: the build's flags follow
    the version, deploy/local/build-kueue.sh)."""
    return directory.name.removeprefix("kueue-").removesuffix("-noopt")


class KueueProcess:
    """Kueue's CRDs installed, its webhooks registered and its manager running; `stop` takes the webhook
    configurations away first, so that nothing is left calling a manager that is gone."""

    def __init__(self, cluster: LocalCluster, api: client.ApiClient) -> None:
        self.cluster = cluster
        self.api = api
        self.directory = cluster.directory / "kueue"
        self.log = cluster.directory / "logs" / "kueue.log"
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.home = Path()

    def start(self, *, timeout: float = 120) -> None:
        self.home = build()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._install_crds()
        ca = self._write_certificates()
        config = self.directory / "config.yaml"
        config.write_text(json.dumps(self.configuration()))
        etc = self.directory / "etc"
        script = (
            f"mount --bind {etc} /etc && exec {self.home / 'manager'} --config={config} "
            f"--kubeconfig={self.cluster.kubeconfig} --zap-log-level=2"
        )
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait(lambda: self._probe("/readyz"), "ready", timeout)
        self._register_webhooks(ca)

    def configuration(self) -> dict[str, Any]:
        """examples/quota/kueue-configuration.yaml (the device-class mapping and gates a cluster admin
        sets) with this process's addresses and certificate directory."""
        config: dict[str, Any] = yaml.safe_load(KUEUE_CONFIGURATION.read_text())
        config.update(
            namespace=NAMESPACE,
            health={"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            metrics={"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            webhook={
                "host": "127.0.0.1",
                "port": self.webhook_port,
                "certDir": str(self.directory / "serving"),
            },
            leaderElection={"leaderElect": False},
            internalCertManagement={"enable": False},
        )
        config["featureGates"] = {**config.get("featureGates", {}), "VisibilityOnDemand": False}
        return config

    def stop(self) -> None:
        admission = client.AdmissionregistrationV1Api(self.api)
        for delete in (
            admission.delete_mutating_webhook_configuration,
            admission.delete_validating_webhook_configuration,
        ):
            try:
                delete("kueue-gpudra-test")
            except client.ApiException as err:
                if err.status != 404:
                    raise
        terminate(self.process)
        self.process = None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- steps ---------------------------------------------------------------------------------

    def _install_crds(self) -> None:
        for path in sorted((self.home / "crds").glob("*.yaml")):
            try:
                utils.create_from_yaml(self.api, str(path))
            except utils.FailToCreateError as err:
                if any(e.status != 409 for e in err.api_exceptions):
                    raise
        extensions = client.ApiextensionsV1Api(self.api)
        for path in sorted((self.home / "crds").glob("*.yaml")):
            name = yaml.safe_load(path.read_text())["metadata"]["name"]
            deadline = time.monotonic() + 60
            while not _established(extensions.read_custom_resource_definition(name)):
                if time.monotonic() > deadline:
                    raise ClusterError(f"CRD {name} not established")
                time.sleep(0.1)
        core = client.CoreV1Api(self.api)
        try:
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        except client.ApiException as err:
            if err.status != 409:
                raise

    def _write_certificates(self) -> bytes:
        """The webhook's serving certificate (for 127.0.0.1) and the metrics one under the private /etc;
        returns the CA the API server is to trust."""
        now = datetime.now(UTC)
        ca = certs.issue_ca(now)
        serving = certs.issue_serving(now, ca, ["127.0.0.1"])
        etc = self.directory / "etc"
        shutil.rmtree(etc, ignore_errors=True)
        for directory in (self.directory / "serving", etc / "kueue" / "metrics" / "certs"):
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "tls.crt").write_bytes(serving.cert)
            (directory / "tls.key").write_bytes(serving.key)
            (directory / "tls.key").chmod(0o600)
        return ca.cert

    def _register_webhooks(self, ca: bytes) -> None:
        """Kueue's own webhook manifests, each webhook's Service replaced by this process's URL."""
        source = list(yaml.safe_load_all((self.home / "webhooks.yaml").read_text()))
        bundle = base64.b64encode(ca).decode()
        admission = client.AdmissionregistrationV1Api(self.api)
        for document in source:
            webhooks = []
            for webhook in document["webhooks"]:
                if not {g for rule in webhook["rules"] for g in rule["apiGroups"]} <= WEBHOOK_GROUPS:
                    continue
                path = webhook["clientConfig"]["service"]["path"]
                webhook["clientConfig"] = {
                    "url": f"https://127.0.0.1:{self.webhook_port}{path}",
                    "caBundle": bundle,
                }
                webhooks.append(webhook)
            body = {**document, "metadata": {"name": "kueue-gpudra-test"}, "webhooks": webhooks}
            if document["kind"] == "MutatingWebhookConfiguration":
                admission.create_mutating_webhook_configuration(body)
            else:
                admission.create_validating_webhook_configuration(body)

    def _probe(self, path: str) -> bool:
        try:
            return http_get(f"http://127.0.0.1:{self.health_port}{path}")[0] == 200
        except OSError:
            return False

    def _wait(self, done: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if self.process is not None and self.process.poll() is not None:
                raise ClusterError(f"kueue exited:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"kueue not {what} in {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.2)


def _established(crd: Any) -> bool:
    return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])
