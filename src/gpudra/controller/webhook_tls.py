"""`CertificateKeeper`: keeps the admission webhook's TLS Secret and its ValidatingWebhookConfiguration
current, and the webhook server on the Secret's certificate. I/O: the API server (through an
`AdmissionApi`, gpudra.kube.admission.AdmissionObjects in the controller) and the webhook server.

Every replica reads the Secret each step and hands a changed certificate to its own server, so all
replicas serve what the Secret holds. Only the leader writes, and only what differs: a restart with a
good Secret and configuration writes nothing. Another replica's write that got in first (`Conflict`)
is retried on the next step.

The order of writes keeps the API server trusting the certificate served at every moment:
- a new CA is first added to the bundle beside the old one (the Secret, then the configuration in the
  same step), while the served certificate, signed by the old CA, stays;
- a serving certificate from a CA the configuration does not trust yet waits until a step that finds
  the configuration trusting it; replicas only ever load it from the Secret afterwards;
- the leader's own server takes new material after the configuration was written.
Only when nothing is trusted anyway (no Secret, an unusable CA or one not valid now, a serving
certificate the configuration's bundle does not verify now) are CA and serving certificate made and
written together.

Each step reads the clock afresh and judges the stored material against it alone (gpudra.controller.certs),
and the loop's wait is monotonic: a wall clock stepped ahead or back, and put right again, is noticed on
the next step, one PERIOD at most.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol
from urllib.parse import urlsplit

from gpudra.controller import certs
from gpudra.controller.certs import Material
from gpudra.controller.options import ControllerOptions
from gpudra.controller.webhook import WebhookServer, desired_configuration, warned_classes_of
from gpudra.errors import ConfigError
from gpudra.kube.client import Conflict, Obj
from gpudra.model.tolerant import items, mapping, text
from gpudra.runtime.service import Loop

log = logging.getLogger(__name__)

# Seconds between steps: short while this replica's server has no certificate to serve, so that a
# new controller becomes ready soon after the leader wrote the Secret.
PERIOD = 60.0
SHORT_PERIOD = 2.0


class AdmissionApi(Protocol):
    """The calls the keeper makes (gpudra.kube.admission.AdmissionObjects). Reads answer None for an
    object that does not exist; writes raise `Conflict` when another writer got in first."""

    def get_secret(self, namespace: str, name: str) -> Obj | None: ...

    def create_secret(self, namespace: str, secret: Obj) -> Obj: ...

    def replace_secret(self, namespace: str, secret: Obj) -> Obj: ...

    def get_webhook_configuration(self, name: str) -> Obj | None: ...

    def create_webhook_configuration(self, configuration: Obj) -> Obj: ...

    def replace_webhook_configuration(self, configuration: Obj) -> Obj: ...


def serving_names(options: ControllerOptions) -> list[str]:
    """The names the API server checks the serving certificate against: the host of `webhook_url`, or
    the Service's `<name>.<namespace>.svc`."""
    if options.webhook_url:
        host = urlsplit(options.webhook_url).hostname
        if not host:
            raise ConfigError(
                f"must be an https:// URL with a host, not {options.webhook_url!r}", field="webhook_url"
            )
        return [host]
    return [f"{options.webhook_service}.{options.namespace}.svc"]


class CertificateKeeper:
    """Keeps the Secret `options.webhook_secret` in `options.namespace` and the configuration
    `options.webhook_configuration` (writing when `is_leader()`), and `server` on the Secret's
    certificate; a `service.Service` on its own `Loop`."""

    def __init__(
        self,
        api: AdmissionApi,
        options: ControllerOptions,
        server: WebhookServer,
        *,
        is_leader: Callable[[], bool],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        warned_classes: Callable[[], Sequence[str] | None] = lambda: (),
    ) -> None:
        """`warned_classes()`: the DeviceClasses claims are given warnings for; None while unknown (the
        stored configuration's are kept)."""
        self.api = api
        self.warned_classes = warned_classes
        self.options = options
        self.server = server
        self.is_leader = is_leader
        self.clock = clock
        self.loop = Loop("webhook-certificates", self.step)
        self._served: Material | None = None

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float) -> None:
        self.loop.stop(timeout)

    def step(self) -> float:
        """One pass (the loop's step): read, write what differs when leading, hand over the
        certificate. Returns the seconds until the next."""
        namespace, name = self.options.namespace, self.options.webhook_secret
        secret = self.api.get_secret(namespace, name)
        material = None if secret is None else certs.from_secret_data(secret.get("data"))
        if self.is_leader():
            try:
                material = self._lead(secret, material)
            except Conflict as err:
                log.info("another replica wrote first; retrying", extra={"error": str(err)})
                return SHORT_PERIOD
        # Material without a serving certificate its own bundle trusts is half-made: the leader
        # completes it.
        if material is not None and material != self._served and certs.trusts(material.ca_crt, material):
            self.server.use(material)
            self._served = material
        return PERIOD if self._served is not None else SHORT_PERIOD

    def _lead(self, secret: Obj | None, stored: Material | None) -> Material:
        """The material after this step's writes (see the module docstring for their order)."""
        names = serving_names(self.options)
        now = self.clock()
        configuration = self.api.get_webhook_configuration(self.options.webhook_configuration)
        reason = certs.renewal_reason(now, stored, names)
        if reason is not None:
            candidate = certs.renewed(now, stored, names)
            if stored is not None and self._must_wait(now, names, stored, candidate, configuration):
                log.info(
                    "webhook certificate renewal waits for the configuration to trust its CA",
                    extra={"reason": reason},
                )
            else:
                self._write_secret(secret, candidate, reason)
                stored = candidate
        assert stored is not None  # renewal_reason has a reason for every missing material
        self._write_configuration(configuration, stored.ca_crt)
        return stored

    @staticmethod
    def _must_wait(
        now: datetime, names: list[str], stored: Material, candidate: Material, configuration: Obj | None
    ) -> bool:
        """Whether `candidate` would replace a serving certificate that the configuration's bundles
        verify now with one they do not trust yet. One they do not verify now (expired, not valid yet,
        from a CA not valid now) is no trust to keep: it is replaced at once."""
        if candidate.tls_crt == stored.tls_crt:
            return False
        bundles = _bundles(configuration)
        trusted_now = bool(bundles) and all(
            certs.chain_problem(now, bundle, stored, names) is None for bundle in bundles
        )
        return trusted_now and not all(certs.trusts(b, candidate) for b in bundles)

    def _write_secret(self, secret: Obj | None, material: Material, reason: str) -> None:
        namespace, name = self.options.namespace, self.options.webhook_secret
        data = certs.to_secret_data(material)
        if secret is None:
            self.api.create_secret(
                namespace,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": certs.SECRET_TYPE,
                    "metadata": {"name": name, "namespace": namespace},
                    "data": data,
                },
            )
        else:
            self.api.replace_secret(namespace, {**secret, "data": data})  # its resourceVersion guards it
        log.info("webhook TLS material written", extra={"reason": reason, "secret": f"{namespace}/{name}"})

    def _write_configuration(self, configuration: Obj | None, bundle: bytes) -> None:
        classes = self.warned_classes()
        if classes is None:
            classes = warned_classes_of(configuration) or ()
        desired = desired_configuration(self.options, bundle, classes)
        stored_annotations = mapping(mapping(mapping(configuration).get("metadata")).get("annotations"))
        wanted_annotations = {**stored_annotations, **desired["metadata"]["annotations"]}
        if configuration is None:
            self.api.create_webhook_configuration(desired)
        elif configuration.get("webhooks") != desired["webhooks"] or stored_annotations != wanted_annotations:
            metadata = {**configuration["metadata"], "annotations": wanted_annotations}
            self.api.replace_webhook_configuration(
                {**configuration, "metadata": metadata, "webhooks": desired["webhooks"]}
            )
        else:
            return
        log.info("webhook configuration written", extra={"configuration": self.options.webhook_configuration})


def _bundles(configuration: Obj | None) -> list[bytes]:
    """The CA bundle of each webhook of a stored configuration (PEM; empty where unreadable)."""
    bundles = []
    for webhook in items(mapping(configuration).get("webhooks")):
        encoded = text(mapping(mapping(webhook).get("clientConfig")).get("caBundle"))
        try:
            bundles.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            bundles.append(b"")
    return bundles
