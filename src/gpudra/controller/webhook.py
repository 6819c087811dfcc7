"""The validating admission webhook of `gpudra controller`: what it answers (`review`, pure), how the API
server is told to call it (`desired_configuration`, pure) and the HTTPS server that answers
(`WebhookServer`; I/O: one listening socket and a thread per connection).

The judging is `gpudra validate`'s (gpudra.model.manifests): a ResourceClaim, ResourceClaimTemplate or
DeviceClass whose gpudra config is wrong is rejected with every problem on its own line, worded as
`gpudra validate` prints it (kind and name, field path, what is allowed). A valid config that does
otherwise than it may seem to (TimeSlicing on a MIG device sets nothing) is admitted with a warning
naming the field (`gpudra.model.manifests.document_warnings`), as `gpudra validate` warns.

A denial carries HTTP status 400 (BadRequest): the request is wrong in a way its sender can fix by
resending it corrected. 403 (Forbidden) would send users to their RBAC rules, and 422 (Invalid) is the
API server's own field validation, which clients read as carrying `details.causes`.

The API server is told to call the webhook twice, as two webhooks of one configuration:
- `config.<driver>` sees only objects carrying an opaque config of this driver (a CEL matchCondition),
  with the configured failurePolicy: with Fail, no bad config gets past a controller that is down;
- `warnings.<driver>` sees the other claims and templates that ask one of gpudra's DeviceClasses (a
  second matchCondition naming them: the classes whose selectors name the driver, as the cluster picture
  has them; recorded in the configuration's `gpudra.io/warned-classes` annotation so that a controller
  that has not listed the classes yet keeps them), for advice only (`warnings`), so it always has
  failurePolicy Ignore and the shortest timeout (1 s): a hung controller never delays another driver's
  claims, and delays a claim of its own classes by 1 s at most. No such class, no warnings webhook.
Both list only resource.k8s.io/v1 with matchPolicy Equivalent: the API server converts requests made
through v1beta1 and v1beta2 to v1 before calling (admissionregistration/v1 `matchPolicy`), so one
handler reads one version.

The same HTTPS port answers GET requests with `pages` (`/status` and the GPU map behind a bearer token,
gpudra.controller.status_access): it is the port with a certificate.

Any pod that reaches the port can send reviews (they carry no credentials), so what one costs is
bounded before it is decoded: its body is read first, whole within BODY_READ_SECONDS, at most
MAX_BODIES_READING at once and MAX_BODIES_PER_CLIENT from one address (a slow or flooding sender holds
no decode slot, and one pod cannot take every reading slot); then its JSON values are counted at C
speed, and one over MAX_REVIEW_VALUES (a million empty objects would build some 85 MiB) is denied
unread; only then does it take one of the MAX_CONCURRENT_REVIEWS decode slots.

The review's `object` and `oldObject` are decoded each on its own within `gpudra.bounded_json`'s bounds.
One beyond them (a tenant's parameters nested thousands of levels deep) cannot be judged: it is refused
when it carries a config of this driver (found by reading its tokens, as the API server's
matchCondition does on the object it holds), else let through without advice; either way counted and
logged (`skipped`). An UPDATE whose old object was just as unreadable is let through, so that such a
claim stored while no webhook ran can still lose its finalizers.
"""

from __future__ import annotations

import base64
import http.server
import json
import logging
import os
import re
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from gpudra import bounded_json
from gpudra.bounded_json import Poisoned
from gpudra.controller.certs import Material, read_certificates
from gpudra.controller.options import ControllerOptions
from gpudra.errors import ConfigError
from gpudra.model.kube_api import GROUP, VERSION
from gpudra.model.manifests import Problem, document_warnings, validate_documents
from gpudra.model.tolerant import mapping

log = logging.getLogger(__name__)

PATH = "/validate"
WARNED_CLASSES_ANNOTATION = "gpudra.io/warned-classes"
# A class name is at most 253 characters: 64 of them keep the matchCondition well inside the API
# server's CEL cost and size limits.
MAX_WARNED_CLASSES = 64
JUDGED_KINDS = ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass")
WARNED_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
_RESOURCES = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}
_RESOURCES_JUDGED = {**_RESOURCES, "DeviceClass": "deviceclasses"}
_REVIEW_VERSION = "admission.k8s.io/v1"

# The API server adds each warning as an HTTP Warning header. Once all of a request's warnings pass
# 4096 characters it cuts each to 256 and drops the ones that follow (apiserver
# pkg/endpoints/filters/warning.go; the webhook documentation's caution), and it drops a warning with
# a line break or another control character. Warnings are cleaned and kept inside both limits here.
MAX_WARNING_CHARS = 256
MAX_WARNINGS_CHARS = 4096

# The largest review the API server can send. It stores no object larger than etcd accepts in one
# request, `--max-request-bytes`, 1.5 MiB by default (etcd's "System limits: Request size limit",
# etcd.io/docs/v3.6/dev-guide/limit/; the kube-apiserver's own 3 MiB body limit is for the JSON a
# client sends, not what it stores), and an UPDATE's review holds the object twice (object and
# oldObject) plus the envelope (userInfo, options: kilobytes). Twice 1.5 MiB and 512 KiB for the
# envelope and JSON's spelling: a claim, template or class inside the API's own validation limits
# (opaque parameters and CEL expressions 10 KiB each, 32 configs and requests) is far below it. A body
# above it is refused with 413 before it is read; the API server applies the failurePolicy.
ETCD_MAX_REQUEST_BYTES = 1536 * 1024
MAX_BODY_BYTES = 2 * ETCD_MAX_REQUEST_BYTES + 512 * 1024
# Reviews decoded at once. Decoding a review builds Python objects several times its size: a bound
# on the decodes at once keeps concurrent large reviews from pushing the controller past the chart's
# 256 Mi memory limit (tests/integration/test_webhook_memory.py measures it: 32 reviews of 3 MiB at once
# take a 69 MiB process to a 150 MiB peak, the bodies read ahead included; 40 clients sending reviews
# of 900,000 empty objects without pause, 146 MiB, each denied unread). The others wait at most
# REVIEW_WAIT_SECONDS, well inside the API server's timeout for the config webhook
# (`timeoutSeconds: 10` in desired_configuration), then get 503 and the failurePolicy applies. One
# review decodes in tens of milliseconds, so a wait is short unless something is wrong.
MAX_CONCURRENT_REVIEWS = 2
REVIEW_WAIT_SECONDS = 5.0
# What a body may cost before it is decoded, whatever its shape: at most this many JSON values (as
# bounded_json.count_values counts them, at C speed: its objects, arrays and commas). A million empty
# objects in 3 MiB would build some 85 MiB of Python objects; no claim, template or class the API
# server stores comes near this (their API limits: opaque parameters 10 KiB each, 32 configs and
# requests), so a review over it is denied unread.
MAX_REVIEW_VALUES = 400_000
# Bodies are read before a decode slot is taken, so a slow sender holds no slot: at most
# MAX_BODIES_READING at once, MAX_BODIES_PER_CLIENT of them from one address (so that one pod cannot
# take them all), each whole within BODY_READ_SECONDS.
MAX_BODIES_READING = 16
MAX_BODIES_PER_CLIENT = 4
BODY_READ_SECONDS = 10.0
# Seconds a connection may take for its handshake, and between reads; the API server's own
# timeout per call is at most 30 s.
CONNECTION_TIMEOUT = 15.0

Warnings = Callable[[Mapping[str, Any]], list[str]]
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

# The review's objects, each decoded on its own; where an unreadable one's opaque configs name drivers.
_REVIEW_SHAPE = {"request": {"object": bounded_json.ONE, "oldObject": bounded_json.ONE}}
_CONFIG_DRIVERS = {
    "ResourceClaim": ("spec", "devices", "config", "*", "opaque", "driver"),
    "ResourceClaimTemplate": ("spec", "spec", "devices", "config", "*", "opaque", "driver"),
    "DeviceClass": ("spec", "config", "*", "opaque", "driver"),
}
_KEEP = bounded_json.METADATA | set(_CONFIG_DRIVERS.values())


# --- the review ----------------------------------------------------------------------------------


def review(body: Mapping[str, Any], *, driver: str, warnings: Warnings) -> dict[str, Any]:
    """The AdmissionReview response to the AdmissionReview request `body`: allowed unless a CREATE or
    UPDATE of a ResourceClaim, ResourceClaimTemplate or DeviceClass carries a bad config of `driver`;
    on UPDATE only problems the old object did not have count, so an object stored before the webhook
    existed (or was stricter) can still get its finalizers removed. `warnings(object)` adds advice for
    claims and templates. An object `bounded_json` left unread (a `Poisoned`) is judged as the module
    docstring says. A malformed review raises ConfigError naming the field."""
    request = _request(body)
    operation, gvk, obj = request["operation"], request["kind"], request.get("object")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    kind = gvk["kind"]
    judged = operation in ("CREATE", "UPDATE") and gvk.get("group") == GROUP and kind in JUDGED_KINDS
    if judged and isinstance(obj, Poisoned):
        old_unread = operation == "UPDATE" and isinstance(request.get("oldObject"), Poisoned)
        if driver in obj.strings.get(_CONFIG_DRIVERS[kind], ()) and not old_unread:
            response["allowed"] = False
            response["status"] = {
                "status": "Failure",
                "code": 400,
                "reason": "BadRequest",
                "message": f"{kind} {obj.ref}: the object {obj.problem}, so its {driver} config cannot "
                "be checked",
            }
    elif judged:
        if not isinstance(obj, Mapping):
            raise ConfigError(f"must be an object for {operation} of a {kind}", field="request.object")
        problems = _problems(obj, gvk, driver)
        old = request.get("oldObject")
        if problems and operation == "UPDATE" and isinstance(old, Mapping):  # not a Poisoned one
            before = set(_problems(old, gvk, driver))
            problems = [p for p in problems if p not in before]
        if problems:
            response["allowed"] = False
            response["status"] = {
                "status": "Failure",
                "code": 400,
                "reason": "BadRequest",
                "message": "\n".join(str(p) for p in problems),
            }
        advice = [f"{p.field}: {p.message}" for p in _advice(obj, gvk, driver)]
        notes = _clean_warnings([*advice, *(_call_warnings(warnings, obj) if kind in WARNED_KINDS else [])])
        if notes:
            response["warnings"] = notes
    return {"apiVersion": _REVIEW_VERSION, "kind": "AdmissionReview", "response": response}


def _request(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The review's `request`, its envelope and the fields `review` reads checked."""
    if not isinstance(body, Mapping):
        raise ConfigError("must be a JSON object (an AdmissionReview)")
    if body.get("apiVersion") != _REVIEW_VERSION or body.get("kind") != "AdmissionReview":
        raise ConfigError(
            f"must be {_REVIEW_VERSION} AdmissionReview (the configuration's admissionReviewVersions)",
            field="apiVersion, kind",
        )
    request = body.get("request")
    if not isinstance(request, Mapping):
        raise ConfigError("is required (an AdmissionRequest)", field="request")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise ConfigError("is required (a non-empty string)", field="request.uid")
    gvk = request.get("kind")
    if not isinstance(gvk, Mapping) or not isinstance(gvk.get("kind"), str):
        raise ConfigError("is required (group, version and kind)", field="request.kind")
    if request.get("operation") not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise ConfigError("must be one of CREATE, UPDATE, DELETE, CONNECT", field="request.operation")
    return request


def _problems(obj: Mapping[str, Any], gvk: Mapping[str, Any], driver: str) -> list[Problem]:
    return validate_documents([("", _typed(obj, gvk))], driver=driver)


def _advice(obj: Mapping[str, Any], gvk: Mapping[str, Any], driver: str) -> list[Problem]:
    """What the object's valid configs do otherwise than they may seem to, for every kind judged (a
    DeviceClass's config too): advice, never a refusal."""
    return document_warnings([("", _typed(obj, gvk))], driver=driver)


def _typed(obj: Mapping[str, Any], gvk: Mapping[str, Any]) -> Mapping[str, Any]:
    # The object is in the version the request names (converted by the API server); saying so here
    # lets manifests judge an object whose apiVersion and kind were left out.
    return {**obj, "apiVersion": f"{GROUP}/{gvk.get('version', '')}", "kind": gvk["kind"]}


def _call_warnings(warnings: Warnings, obj: Mapping[str, Any]) -> Iterable[object]:
    """The callback's advice; none when it fails: advice must never turn into a refused request."""
    try:
        return list(warnings(obj))
    except Exception:
        log.exception("the admission warnings callback failed; answering without warnings")
        return []


def _clean_warnings(texts: Iterable[object]) -> list[str]:
    """Each warning on one line of printable characters, at most MAX_WARNING_CHARS long, no repeats,
    and no more in all than MAX_WARNINGS_CHARS (see there)."""
    kept: list[str] = []
    total = 0
    for text in texts:
        line = " ".join("".join(ch if ch.isprintable() else " " for ch in str(text)).split())
        if len(line) > MAX_WARNING_CHARS:
            line = line[: MAX_WARNING_CHARS - 1] + "…"
        if not line or line in kept:
            continue
        if total + len(line) > MAX_WARNINGS_CHARS:
            break
        kept.append(line)
        total += len(line)
    return kept


# --- the configuration ---------------------------------------------------------------------------


def desired_configuration(
    options: ControllerOptions, ca_bundle: bytes, warned_classes: Iterable[str] = ()
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration `options.webhook_configuration`, trusting the PEM `ca_bundle`,
    with a warnings webhook for claims asking `warned_classes`.
    The API server reaches the webhook at `options.webhook_url` + /validate when that is set, else
    through the Service `options.webhook_service` in `options.namespace` on port `options.webhook_port`
    (the Service exposes the port the controller listens on). Every field the API server would default
    is set, so that the stored object equals this one and an unchanged configuration is never
    rewritten."""
    client: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode()}
    if options.webhook_url:
        client["url"] = options.webhook_url.rstrip("/") + PATH
    else:
        client["service"] = {
            "namespace": options.namespace,
            "name": options.webhook_service,
            "path": PATH,
            "port": options.webhook_port,
        }
    carries_config = _carries_config_condition(options.driver)
    webhooks = [
        _webhook(
            f"config.{options.driver}",
            client,
            resources=list(_RESOURCES_JUDGED.values()),
            conditions=[("gpudra-config", carries_config)],
            failure_policy=options.failure_policy,
            timeout_seconds=10,
        )
    ]
    warned = sorted(set(warned_classes))
    if len(warned) > MAX_WARNED_CLASSES:
        log.warning(
            "more DeviceClasses of the driver than the warnings webhook names; warning for the first ones",
            extra={"classes": len(warned), "named": MAX_WARNED_CLASSES},
        )
        warned = warned[:MAX_WARNED_CLASSES]
    if warned:
        webhooks.append(
            _webhook(
                f"warnings.{options.driver}",
                client,
                resources=list(_RESOURCES.values()),
                conditions=[
                    ("no-gpudra-config", f"!({carries_config})"),
                    ("gpudra-class", _asks_classes_condition(warned)),
                ],
                failure_policy="Ignore",
                timeout_seconds=1,
            )
        )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": options.webhook_configuration,
            "annotations": {WARNED_CLASSES_ANNOTATION: ",".join(warned)},
        },
        "webhooks": webhooks,
    }


def warned_classes_of(configuration: Mapping[str, Any] | None) -> list[str] | None:
    """The classes a stored configuration's warnings webhook names (its annotation); None without one."""
    value = mapping(mapping(mapping(configuration).get("metadata")).get("annotations")).get(
        WARNED_CLASSES_ANNOTATION
    )
    return None if not isinstance(value, str) else [name for name in value.split(",") if name]


def _asks_classes_condition(classes: Sequence[str]) -> str:
    """CEL, true when a claim's or template's request (or one of its firstAvailable alternatives) asks
    one of `classes`; every step guarded with has(), as in `_carries_config_condition`."""
    names = "[" + ", ".join(_cel_string(name) for name in classes) + "]"

    def asks(devices: str) -> str:
        exactly = (
            f"(has(r.exactly) && has(r.exactly.deviceClassName) && r.exactly.deviceClassName in {names})"
        )
        alternatives = (
            f"(has(r.firstAvailable) && r.firstAvailable.exists(a, has(a.deviceClassName)"
            f" && a.deviceClassName in {names}))"
        )
        return f"has({devices}.requests) && {devices}.requests.exists(r, {exactly} || {alternatives})"

    resource = "request.resource.resource"
    return (
        f'({resource} == "resourceclaims" && has(object.spec) && has(object.spec.devices)'
        f" && {asks('object.spec.devices')})"
        f' || ({resource} == "resourceclaimtemplates" && has(object.spec) && has(object.spec.spec)'
        f" && has(object.spec.spec.devices) && {asks('object.spec.spec.devices')})"
    )


def _webhook(
    name: str,
    client: dict[str, Any],
    *,
    resources: list[str],
    conditions: Sequence[tuple[str, str]],
    failure_policy: str,
    timeout_seconds: int,
) -> dict[str, Any]:
    return {
        "name": name,
        "clientConfig": client,
        "rules": [
            {
                "apiGroups": [GROUP],
                "apiVersions": [VERSION],
                "operations": ["CREATE", "UPDATE"],
                "resources": resources,
                "scope": "*",
            }
        ],
        "matchPolicy": "Equivalent",
        "matchConditions": [{"name": name, "expression": expression} for name, expression in conditions],
        "namespaceSelector": {},
        "objectSelector": {},
        "failurePolicy": failure_policy,
        "sideEffects": "None",
        "timeoutSeconds": timeout_seconds,
        "admissionReviewVersions": ["v1"],
    }


def _carries_config_condition(driver: str) -> str:
    """CEL, true when the object is a claim, template or class with an opaque config of `driver`.
    `object` is untyped here, so each step is guarded with has(): an error in a matchCondition would
    refuse the request under failurePolicy Fail."""
    entry = f"has(c.opaque) && has(c.opaque.driver) && c.opaque.driver == {_cel_string(driver)}"

    def configs(devices: str) -> str:
        return f"has({devices}.config) && {devices}.config.exists(c, {entry})"

    resource = "request.resource.resource"
    return (
        f'({resource} == "resourceclaims" && has(object.spec) && has(object.spec.devices)'
        f" && {configs('object.spec.devices')})"
        f' || ({resource} == "resourceclaimtemplates" && has(object.spec) && has(object.spec.spec)'
        f" && has(object.spec.spec.devices) && {configs('object.spec.spec.devices')})"
        f' || ({resource} == "deviceclasses" && has(object.spec) && {configs("object.spec")})'
    )


def _cel_string(value: str) -> str:
    """`value` as a CEL string literal: printable ASCII but quote and backslash as is, every other
    character as a \\U escape, so that no driver name can end the literal early."""
    return (
        '"'
        + "".join(ch if " " <= ch <= "~" and ch not in '"\\' else f"\\U{ord(ch):08x}" for ch in value)
        + '"'
    )


# --- the server ----------------------------------------------------------------------------------


class WebhookServer:
    """Serves POST /validate over HTTPS on `address:port` (port 0: any free one, `port` tells which
    after `start`), as a `service.Service`. It answers no connection before `use` gave it a
    certificate (they are closed at once, so the API server applies the failurePolicy without waiting);
    `use` again swaps the certificate for new connections without closing the listening socket.
    Each answer is counted by `count_review(kind, result)` (gpudra_admission_reviews_total), each object
    left unread passed to `skipped(resource, poisoned)` (gpudra_skipped_objects_total)."""

    def __init__(
        self,
        address: str,
        port: int,
        driver: str,
        *,
        warnings: Warnings,
        count_review: Callable[[str, str], None] = lambda kind, result: None,
        skipped: Callable[[str, Poisoned], None] = lambda resource, poisoned: None,
        pages: WsgiApp | None = None,
    ) -> None:
        """`pages`: the WSGI application answering GET requests (`/status` and the GPU map behind
        authentication, gpudra.controller.status_access), served on this port because it is the one
        with a certificate."""
        self.pages = pages
        self.address = address
        self.port = port
        self.driver = driver
        self.warnings = warnings
        self._context: ssl.SSLContext | None = None
        self._listener: _Listener | None = None
        self._thread: threading.Thread | None = None
        self._count_review = count_review
        self._skipped = skipped
        self.decoding = threading.BoundedSemaphore(MAX_CONCURRENT_REVIEWS)
        self.reading = ClientSlots(total=MAX_BODIES_READING, per_client=MAX_BODIES_PER_CLIENT)

    def use(self, material: Material) -> None:
        """Serve `material`'s certificate from now on; ConfigError when it cannot be loaded."""
        self._context = _server_context(material)
        expires = read_certificates(material.tls_crt)[0].not_valid_after_utc
        log.info("webhook serving certificate loaded", extra={"expires": expires.isoformat()})

    def problem(self) -> str | None:
        """Readiness: why the webhook cannot answer now, or None."""
        if self._listener is None:
            return "the webhook server is not listening"
        if self._context is None:
            return "no serving certificate yet"
        return None

    def start(self) -> None:
        listener_class = _Listener6 if ":" in self.address else _Listener
        try:
            self._listener = listener_class((self.address, self.port), self)
        except OSError as err:  # in use, or not this host's address: the controller's start ends here
            where = f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"
            raise ConfigError(
                f"cannot listen on {where}: {err.strerror or err}", field="--webhook-port"
            ) from None
        self.port = self._listener.server_address[1]
        self._thread = threading.Thread(target=self._listener.serve_forever, name="webhook", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        if self._listener is not None and self._thread is not None:
            self._listener.shutdown()
            self._listener.server_close()
            self._thread.join(timeout)
            self._listener = None

    def context(self) -> ssl.SSLContext | None:
        """The TLS context new connections get; None before `use`."""
        return self._context

    def answer(self, body: bytes) -> tuple[int, bytes, str]:
        """(HTTP status, body, content type) for a POSTed review."""
        kind, result = "unknown", "error"
        try:
            text = body.decode()
            values = bounded_json.count_values(text)
            if values > MAX_REVIEW_VALUES:
                return self._refuse_unread(text, values)
            document = bounded_json.decode(text, _REVIEW_SHAPE, keep=_KEEP)
            kind = _kind_of(document)
            self._report_unread(document, kind)
            response = review(document, driver=self.driver, warnings=self.warnings)
        except bounded_json.Unreadable as err:
            status, text = 400, f"the review {err}"
        except ConfigError as err:
            status, text = 400, f"malformed AdmissionReview: {err}"
        except ValueError as err:  # not JSON
            status, text = 400, f"the body is not JSON: {err}"
        except Exception:
            log.exception("answering an admission review failed unexpectedly")
            status, text = 500, "internal error; see the controller's log"
        else:
            result = "allowed" if response["response"]["allowed"] else "denied"
            self._count_review(kind, result)
            return 200, json.dumps(response).encode(), "application/json"
        log.warning("admission review refused", extra={"status": status, "error": text})
        self._count_review(kind, result)
        return status, text.encode(), "text/plain; charset=utf-8"

    def _refuse_unread(self, text: str, values: int) -> tuple[int, bytes, str]:
        """A review over MAX_REVIEW_VALUES: denied without decoding it, for the request's UID as the API
        server writes it (first in the request); a 400 when none is found there."""
        self._skipped("other", Poisoned("too-many-values"))
        reason = (
            f"the review holds about {values} JSON values; at most {MAX_REVIEW_VALUES} are decoded (no "
            "claim, template or class the API server stores is that large), so it was refused unread"
        )
        log.warning("admission review refused unread", extra={"values": values})
        uid = _REQUEST_UID.search(text)
        if uid is None:
            self._count_review("unknown", "error")
            return 400, reason.encode(), "text/plain; charset=utf-8"
        self._count_review("unknown", "denied")
        status = {"status": "Failure", "code": 400, "reason": "BadRequest", "message": reason}
        response = {"uid": json.loads(f'"{uid.group(1)}"'), "allowed": False, "status": status}
        document = {"apiVersion": _REVIEW_VERSION, "kind": "AdmissionReview", "response": response}
        return 200, json.dumps(document).encode(), "application/json"

    def _report_unread(self, document: object, kind: str) -> None:
        request = document.get("request") if isinstance(document, Mapping) else None
        for member in ("object", "oldObject"):
            poisoned = request.get(member) if isinstance(request, Mapping) else None
            if isinstance(poisoned, Poisoned):
                self._skipped(_RESOURCES_JUDGED.get(kind, "other"), poisoned)


# The request's UID where the API server writes it, the request's first member (its AdmissionRequest's
# first field); an UID is at most a few dozen characters.
_REQUEST_UID = re.compile(r'"request"\s*:\s*\{\s*"uid"\s*:\s*"([A-Za-z0-9._:-]{1,128})"')


class ClientSlots:
    """Slots for work that holds memory (a body being read), at most `total` at once and `per_client`
    for one client address; `acquire` waits up to its timeout for one."""

    def __init__(self, *, total: int, per_client: int) -> None:
        self.total, self.per_client = total, per_client
        self._held: dict[str, int] = {}
        self._changed = threading.Condition()

    def acquire(self, client: str, timeout: float) -> bool:
        with self._changed:
            free = self._changed.wait_for(
                lambda: sum(self._held.values()) < self.total and self._held.get(client, 0) < self.per_client,
                timeout,
            )
            if free:
                self._held[client] = self._held.get(client, 0) + 1
            return free

    def release(self, client: str) -> None:
        with self._changed:
            self._held[client] -= 1
            if not self._held[client]:
                del self._held[client]
            self._changed.notify_all()


def _kind_of(document: object) -> str:
    """The metric's kind label: one of ours, "other", or "unknown" when the review names none. Any
    client that reaches the port can name kinds, so no other value becomes a series."""
    request = document.get("request") if isinstance(document, Mapping) else None
    gvk = request.get("kind") if isinstance(request, Mapping) else None
    kind = gvk.get("kind") if isinstance(gvk, Mapping) else None
    if not isinstance(kind, str) or not kind:
        return "unknown"
    return kind if kind in JUDGED_KINDS else "other"


def _server_context(material: Material) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # ssl loads certificates from files only: in-memory ones (memfd) keep the key off every disk,
    # and work on a read-only root filesystem.
    with _memory_file("tls.crt", material.tls_crt) as cert, _memory_file("tls.key", material.tls_key) as key:
        try:
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as err:
            raise ConfigError(
                f"cannot be loaded as a certificate and its key ({err})", field="tls.crt, tls.key"
            ) from err
    return context


@contextmanager
def _memory_file(name: str, data: bytes) -> Iterator[str]:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb") as file:
            file.write(data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


class _Listener(http.server.ThreadingHTTPServer):
    """The listening socket. Each accepted connection is wrapped in the certificate current at that
    moment; its handshake runs in the connection's own thread, so a slow client holds up no other."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], webhook: WebhookServer) -> None:
        self.webhook = webhook
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer's own looks the host's name up (socket.getfqdn), which can hang on a pod's DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, peer = self.socket.accept()
        context = self.webhook.context()
        if context is None:
            connection.close()
            raise OSError("no serving certificate yet")  # socketserver drops the connection
        return context.wrap_socket(connection, server_side=True, do_handshake_on_connect=False), peer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failed handshake or a connection reset: the client's problem, not a traceback on stderr."""
        log.debug("webhook connection failed", exc_info=True, extra={"peer": str(client_address)})


class _Listener6(_Listener):
    address_family = socket.AF_INET6


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Listener
    protocol_version = "HTTP/1.1"  # keep-alive: the API server reuses its connections
    timeout = CONNECTION_TIMEOUT

    def setup(self) -> None:
        self.request.settimeout(self.timeout)
        self.request.do_handshake()
        super().setup()

    def do_POST(self) -> None:
        if urlsplit(self.path).path != PATH:
            self.close_connection = True  # its body is left unread
            self._send(404, f"not found; POST admission reviews to {PATH}".encode())
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            self._send(411, b"Content-Length is required")
            return
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True  # the body is left unread
            self._send(413, f"the review is {length} bytes; at most {MAX_BODY_BYTES} are accepted".encode())
            return
        webhook, client = self.server.webhook, str(self.client_address[0])
        started = time.monotonic()
        if not webhook.reading.acquire(client, REVIEW_WAIT_SECONDS):
            self.close_connection = True  # the body is left unread
            log.warning("admission review refused: too many bodies at once", extra={"client": client})
            self._send(503, b"busy: too many reviews are being read (from this address); try again")
            return
        try:
            body = self._read_body(length)
            if body is None:
                self.close_connection = True  # the client went away mid-body, or sent it too slowly
                return
            waited = REVIEW_WAIT_SECONDS - (time.monotonic() - started)
            if not webhook.decoding.acquire(timeout=max(waited, 0)):
                self.close_connection = True
                log.warning("admission review refused: too many at once", extra={"bytes": length})
                self._send(
                    503, f"busy: {MAX_CONCURRENT_REVIEWS} reviews are being decoded; try again".encode()
                )
                return
            try:
                answer = webhook.answer(body)
            finally:
                webhook.decoding.release()
            del body  # the reply is sent outside the bounds; the body is not held while it is
        finally:
            webhook.reading.release(client)
        self._send(*answer)

    def _read_body(self, length: int) -> bytes | None:
        """The body, whole within BODY_READ_SECONDS (a sender dribbling it holds a reading slot no
        longer); None when it did not come."""
        deadline = time.monotonic() + BODY_READ_SECONDS
        chunks, left = [], length
        while left:
            if time.monotonic() > deadline:
                log.warning("admission review refused: its body came too slowly", extra={"bytes": length})
                return None
            chunk = self.rfile.read1(min(left, 256 * 1024))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def do_GET(self) -> None:
        """A page of `pages`, run as a WSGI application (its requests have no body)."""
        pages = self.server.webhook.pages
        if pages is None:
            self._send(404, f"not found; POST admission reviews to {PATH}".encode())
            return
        url = urlsplit(self.path)
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": url.path,
            "QUERY_STRING": url.query,
            "HTTP_AUTHORIZATION": self.headers.get("Authorization", ""),
            "REMOTE_ADDR": str(self.client_address[0]),  # /status bounds new tokens per address
            "wsgi.url_scheme": "https",
        }
        answer: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            answer.update(status=int(status.split(maxsplit=1)[0]), headers=headers)

        body = b"".join(pages(environ, start_response))
        headers = [(k, v) for k, v in answer["headers"] if k.lower() != "content-type"]
        content_type = dict((k.lower(), v) for k, v in answer["headers"]).get("content-type", "text/plain")
        self._send(answer["status"], body, content_type, headers)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")  # the client opens a new one for its next request
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook request", extra={"request": format % args})
