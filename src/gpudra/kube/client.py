"""Typed access to the Kubernetes API for gpudra. I/O: the API server (the only importer of `kubernetes`).

Objects travel as plain JSON dicts (what the API server sends), so the pure modules (device model,
slices, config resolution) work on the same shapes the tests build by hand. API failures become
`ClusterError` with the HTTP status.

Every call goes through the client's generic request path (`Kube.request`, `Kube.watch`), never the
generated APIs: an instance of the generated CoreV1Api costs the process about 20 MiB (its hundreds of
validated methods), more than everything else the plugin holds; a generated method's argument
validation and serializer cost a sixth more CPU per call; and its JSON decoder fails with RecursionError
on an object nested thousands of levels deep. Both send through `Kube._send`, which counts every request
by its method and path (`request_kind`): no caller counts by hand, none can forget to.

Every reply is decoded by `gpudra.bounded_json`, object by object: any tenant can write a claim that
breaks its bounds (opaque parameters nested thousands of levels deep). A single object that does fails
its call (`ClusterError`: "the object nests too deeply to decode"); in a LIST page or a watch event it is
left out, logged once and counted (`SkippedObjects`), and the rest is used: a watch reports it as
DELETED, so every mirror forgets whatever version of it came before.
"""

from __future__ import annotations

import collections
import http.client
import logging
import os
import re
import socket
import ssl
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from gpudra import bounded_json
from gpudra.bounded_json import Poisoned
from gpudra.errors import ClusterError, ConfigError
from gpudra.kube.cluster_clock import ClusterClock
from gpudra.model.kube_api import GROUP, VERSION

log = logging.getLogger(__name__)

# (connect, read) seconds for every call: a hung API server fails a call instead of holding it forever.
REQUEST_TIMEOUT = (5.0, 30.0)
# urllib3 retries nothing: by default it tries a call 4 times, so a hung API server held each call for
# four read timeouts, and every caller waited behind it. Where gpudra retries, it does so itself, with
# its own backoff and counting (its loops, the kubelet's retries of a prepare); a stale pooled
# connection is not a reason, since urllib3 replaces one it finds dropped before sending. A redirect
# is answered as it is (an API server sends none).
NO_RETRIES = urllib3.Retry(total=0, redirect=False)
Obj = dict[str, Any]


def _obj(value: object) -> Obj:
    """The client returns decoded JSON typed as `object`."""
    return cast(Obj, value)


class NotFound(ClusterError):
    """The object does not exist (HTTP 404)."""


class Forbidden(ClusterError):
    """403: the caller's RBAC does not allow the request."""


class Conflict(ClusterError):
    """The object changed since it was read, or already exists (HTTP 409)."""


# What the kubernetes client lets through besides ApiException: urllib3's errors (MaxRetryError on a
# refused connection, ProtocolError on a reset: neither is an OSError), http.client's and the socket's,
# malformed replies (ValueError), and urllib3's warnings where a warnings filter raises them.
_TRANSPORT_ERRORS = (
    urllib3.exceptions.HTTPError,
    urllib3.exceptions.HTTPWarning,
    http.client.HTTPException,
    OSError,
    ValueError,
)
# What a transport failure means, by the first of these that its cause chain holds; most specific first.
_TRANSPORT_REASONS: tuple[tuple[tuple[type[BaseException], ...], str], ...] = (
    ((urllib3.exceptions.NameResolutionError, socket.gaierror), "cannot resolve the API server's name"),
    ((ssl.SSLError, urllib3.exceptions.SSLError), "TLS failure"),
    ((urllib3.exceptions.ProxyError,), "proxy failure"),
    ((urllib3.exceptions.NewConnectionError, ConnectionRefusedError), "cannot reach the API server"),
    ((urllib3.exceptions.TimeoutError, TimeoutError), "timed out"),
    ((urllib3.exceptions.ProtocolError, http.client.HTTPException, ConnectionError), "connection broken"),
    ((urllib3.exceptions.ResponseError,), "too many error responses"),
    ((urllib3.exceptions.HTTPWarning,), "HTTP client warning raised as an error"),
    (
        (ValueError, urllib3.exceptions.DecodeError, urllib3.exceptions.HeaderParsingError),
        "malformed request or reply",
    ),
    ((OSError,), "network or I/O failure"),
)


def _cause_chain(err: BaseException) -> list[BaseException]:
    """`err` and what it wraps, outermost first: MaxRetryError's reason, ProxyError's original error,
    `raise ... from`, else an exception among the arguments (urllib3's `ProtocolError(msg, error)`)."""
    chain: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and len(chain) < 10 and all(current is not seen for seen in chain):
        chain.append(current)
        if isinstance(current, urllib3.exceptions.MaxRetryError) and current.reason is not None:
            current = current.reason
        elif isinstance(current, urllib3.exceptions.ProxyError):
            current = current.original_error
        elif current.__cause__ is not None:
            current = current.__cause__
        else:
            current = next((arg for arg in current.args if isinstance(arg, BaseException)), None)
    return chain


def _transport_message(what: str, err: BaseException) -> str:
    """The message: "<what>: <reason> (<exception classes>[: <detail>])", from class names, errno and OpenSSL
    reason codes only: the exceptions' own texts name the API server's host, port and URL."""
    chain = _cause_chain(err)
    reason = next(
        (text for kinds, text in _TRANSPORT_REASONS if any(isinstance(e, kinds) for e in chain)),
        "HTTP client failure",
    )
    root, detail = chain[-1], ""
    if isinstance(root, ssl.SSLError):
        code = getattr(root, "reason", None)
        detail = code if isinstance(code, str) and re.fullmatch(r"[A-Z0-9_]+", code) else ""
    elif isinstance(root, OSError) and isinstance(root.errno, int) and root.errno > 0:
        detail = os.strerror(root.errno)
    names = " > ".join(type(e).__name__ for e in chain)
    return f"{what}: {reason} ({names}{': ' + detail if detail else ''})"


# The API server's own words on a refusal (a Status's message: which field is invalid and why), kept to
# one line of this many printable characters.
MAX_STATUS_MESSAGE = 300


def status_message(body: bytes | str | None) -> str:
    """The `message` of the metav1.Status an API server sends with an error status, on one line of at
    most MAX_STATUS_MESSAGE printable characters; "" when the body is no Status (bounded decoding)."""
    if not body:
        return ""
    try:
        text = body.decode() if isinstance(body, bytes) else body
        if len(text) > bounded_json.MAX_CHARS:
            return ""
        document = bounded_json.decode(text, bounded_json.ONE)
    except (bounded_json.Unreadable, ValueError):
        return ""
    # Only the API server's Status: a proxy or load balancer in between answers in its own words, which
    # may name addresses.
    if not isinstance(document, dict) or document.get("kind") != "Status":
        return ""
    message = document.get("message")
    if not isinstance(message, str):
        return ""
    line = " ".join("".join(ch if ch.isprintable() else " " for ch in message).split())
    return line if len(line) <= MAX_STATUS_MESSAGE else line[: MAX_STATUS_MESSAGE - 1] + "…"


def _http_error(
    what: str, status: int | None, reason: object, body: bytes | str | None = None
) -> ClusterError:
    """The error for an HTTP error status: 404 `NotFound`, 409 `Conflict`, else `ClusterError`; with the
    API server's message when it sent one (a 422 says which field it refused)."""
    kind = {403: Forbidden, 404: NotFound, 409: Conflict}.get(int(status or 0), ClusterError)
    message = status_message(body)
    return kind(f"{what}: HTTP {status} {reason}" + (f": {message}" if message else ""))


@contextmanager
def _api_errors(what: str) -> Iterator[None]:
    """Turns every failure the kubernetes client raises into `ClusterError` (404 `NotFound`, 409
    `Conflict`). No message carries the API server's address."""
    try:
        yield
    except ApiException as err:
        raise _http_error(what, err.status, err.reason, err.body) from err
    except config.ConfigException as err:  # kubeconfig or service account unusable, exec plugin failed
        raise ClusterError(f"{what}: invalid cluster credentials: {err}") from err
    except _TRANSPORT_ERRORS as err:
        raise ClusterError(_transport_message(what, err)) from err


class _NoAddresses(logging.Filter):
    """urllib3's own log lines carry the API server's host, port and URL in their arguments: the line is
    kept, its arguments blanked, as gpudra's own messages never name the address."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple("…" for _ in record.args)
        elif isinstance(record.args, Mapping):
            record.args = {key: "…" for key in record.args}
        return True


def _quiet_transport() -> None:
    """Blanks the arguments of every urllib3 logger's lines (a logger's filters see only its own
    records, so each gets one), once."""
    for name in [n for n in logging.Logger.manager.loggerDict if n == "urllib3" or n.startswith("urllib3.")]:
        found = logging.getLogger(name)
        if not any(isinstance(f, _NoAddresses) for f in found.filters):
            found.addFilter(_NoAddresses())


def _load_kubeconfig(path: str, configuration: client.Configuration, context: str | None) -> None:
    """The kubeconfig at `path` into `configuration`. What the client's loader trips over in a file that
    is not a kubeconfig (YAML errors, a list where a map belongs, a missing file) is a ConfigError
    naming the file."""
    if not os.path.isfile(path):
        raise ConfigError("is not a file (--kubeconfig, else $KUBECONFIG)", field=f"kubeconfig {path}")
    try:
        config.load_kube_config(path, context=context, client_configuration=configuration)
    except config.ConfigException:
        raise  # the loader's own message (a missing context, an exec plugin that failed)
    except OSError as err:
        raise ConfigError(f"cannot be read: {err.strerror or err}", field=f"kubeconfig {path}") from err
    except yaml.YAMLError as err:
        raise ConfigError(
            f"is not valid YAML: {str(err).splitlines()[0]}", field=f"kubeconfig {path}"
        ) from err
    except (TypeError, AttributeError, KeyError, ValueError, IndexError) as err:
        raise ConfigError(
            f"is not a kubeconfig (apiVersion: v1, kind: Config, clusters, users, contexts): {err}",
            field=f"kubeconfig {path}",
        ) from err


def kubeconfig_path(given: str | None) -> str | None:
    """--kubeconfig, else $KUBECONFIG's first file, else ~/.kube/config if there is one, as kubectl
    finds it; None: in-cluster."""
    if given:
        return given
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"].split(os.pathsep)[0]
    default = os.path.expanduser("~/.kube/config")
    return default if os.path.exists(default) else None


def context_namespace(kubeconfig: str, context: str | None = None) -> str | None:
    """The namespace the kubeconfig's `context` (default: its current context) names, as kubectl's
    default for -n; None when it names none."""
    with _api_errors("loading cluster credentials"):
        try:
            contexts, current = config.list_kube_config_contexts(kubeconfig)
        except (OSError, yaml.YAMLError, TypeError, AttributeError, KeyError, ValueError):
            return None  # connect() names what is wrong with the file
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    namespace = ((chosen or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else None


def connect(kubeconfig: str | None, context: str | None = None) -> client.ApiClient:
    """An API client from a kubeconfig file (its `context`, default the current one), or the in-cluster
    service account when none is given; it never retries a call (NO_RETRIES)."""
    _quiet_transport()
    configuration = client.Configuration()
    configuration.retries = NO_RETRIES  # read when the client makes its connection pools, below
    try:
        if kubeconfig:
            _load_kubeconfig(kubeconfig, configuration, context)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException as err:
        # what was given cannot be used (a missing context or certificate file, no service account):
        # input to fix, exit 2 for every command (gpudra.cli.EXIT_CODES), not a cluster that refused
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config (no --kubeconfig)"
        raise ConfigError(f"invalid cluster credentials: {err}", field=where) from err
    if not configuration.verify_ssl:
        # urllib3 would warn on every request, naming the host; said once here instead.
        warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
        log.warning(
            "the kubeconfig turns TLS verification off (insecure-skip-tls-verify): "
            "the API server's identity is not checked"
        )
    api = client.ApiClient(configuration)
    # Both loaders' token hooks assign the server's address again before every request, and each
    # assignment makes the client's Configuration look up the proxy in the environment anew (getproxies()
    # decodes all of os.environ: about 50 µs, an eighth of a claim's GET). Nothing changes this
    # process's environment, so the proxy it named at start is set once, explicitly: no more look-ups.
    api.configuration.proxy = api.configuration.proxy
    return api


@dataclass(frozen=True)
class Credentials:
    """What a kubeconfig context holds for talking to its cluster: the server's URL, the bearer token
    (None with client certificates only) and the CA file it trusts (None: the system's)."""

    server: str
    token: str | None
    ca_file: str | None


def credentials(kubeconfig: str | None, context: str | None = None) -> Credentials:
    """The kubeconfig's (else the in-cluster service account's) server, token and CA; ConfigError as
    `connect` words it."""
    configuration = connect(kubeconfig, context).configuration
    if configuration.refresh_api_key_hook is not None:  # an exec plugin's or a file's token, fetched now
        configuration.refresh_api_key_hook(configuration)
    header = str((configuration.api_key or {}).get("authorization") or "")
    scheme, _, token = header.partition(" ")
    return Credentials(
        server=str(configuration.host),
        token=token.strip() if scheme.lower() == "bearer" and token.strip() else None,
        ca_file=str(configuration.ssl_ca_cert) if configuration.ssl_ca_cert else None,
    )


def _decoded(what: str, body: bytes | str, shape: bounded_json.Shape) -> Any:
    """The JSON document the API server sent, decoded here rather than by the client, within
    `bounded_json`'s bounds, the objects `shape` names each on its own."""
    try:
        text = body.decode() if isinstance(body, bytes) else body
        document = bounded_json.decode(text, shape)
    except bounded_json.Unreadable as err:
        raise ClusterError(f"{what}: the reply {err}") from err
    except ValueError as err:  # not UTF-8, not JSON
        raise ClusterError(f"{what}: the API server sent no JSON object ({err})") from err
    if not isinstance(document, dict | Poisoned):
        raise ClusterError(f"{what}: the API server sent no JSON object")
    return document


class SkippedObjects:
    """Objects left out of LIST pages and watch events because they break `bounded_json`'s bounds, or
    refused when read alone. Each version of an object is logged once (a warning naming it) and counted
    once, by resource and reason (gpudra_skipped_objects_total): a relist or a repeated event does not
    report it again. The last MEMORY versions reported are remembered. `report(line)`, when given, takes
    the place of the log (a command prints the line)."""

    MEMORY = 10_000

    def __init__(self, report: Callable[[str], None] | None = None) -> None:
        self._report = report
        self._lock = threading.Lock()  # the informers' threads, the webhook's, the gRPC workers
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._reported: collections.OrderedDict[tuple[str, ...], None] = collections.OrderedDict()

    def record(self, resource: str, poisoned: Poisoned) -> None:
        key = (resource, poisoned.namespace, poisoned.name, poisoned.resource_version, poisoned.reason)
        with self._lock:
            if key in self._reported:
                self._reported.move_to_end(key)
                return
            self._reported[key] = None
            if len(self._reported) > self.MEMORY:
                self._reported.popitem(last=False)
            self._counts[(resource, poisoned.reason)] += 1
        line = f"left out {resource} {poisoned.ref}: the object {poisoned.problem}"
        if self._report is not None:
            self._report(line)
        else:
            log.warning(line, extra={"resource": resource, "object": poisoned.ref, "reason": poisoned.reason})

    def counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


def request_kind(method: str, path: str, *, watch: bool = False) -> tuple[str, str]:
    """The (verb, resource) a request is counted under (gpudra_api_requests_total), named as the API
    server names them: the verb from the method (a GET is `get` of one object, `list` of a collection,
    `watch` with `watch=true`); the resource is the path's plural with its subresource
    (`resourceclaims/status`), namespace and name left out; a path outside /api and /apis names itself
    (`/version`: `version`)."""
    parts = [part for part in path.split("?", 1)[0].split("/") if part]
    if parts[:1] == ["api"]:
        rest = parts[2:]  # /api/v1/...
    elif parts[:1] == ["apis"]:
        rest = parts[3:]  # /apis/<group>/<version>/...
    else:
        return method.lower(), "/".join(parts)
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]  # namespaces/<ns>/<resource>...; /api/v1/namespaces/<ns> is the namespace itself
    resource = "/".join(rest[:1] + rest[2:3])
    named = len(rest) >= 2
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method.upper())
    if verb is None and method.upper() == "GET":
        verb = "watch" if watch else "get" if named else "list"
    elif verb is None and method.upper() == "DELETE":
        verb = "delete" if named else "deletecollection"
    return verb or method.lower(), resource


_SLICES = f"/apis/{GROUP}/{VERSION}/resourceslices"
# The workloads whose pod template `gpudra explain KIND/NAME` reads: kind -> (group/version, resource).
WORKLOADS: dict[str, tuple[str, str]] = {
    "Deployment": ("apps/v1", "deployments"),
    "StatefulSet": ("apps/v1", "statefulsets"),
    "ReplicaSet": ("apps/v1", "replicasets"),
    "DaemonSet": ("apps/v1", "daemonsets"),
    "Job": ("batch/v1", "jobs"),
    "CronJob": ("batch/v1", "cronjobs"),
}


def _slice(name: str) -> str:
    return f"{_SLICES}/{quote(name, safe='')}"


def _slice_selector(driver: str, node_name: str) -> str:
    return f"spec.driver={driver},spec.nodeName={node_name}"


def _dry_run(dry_run: bool) -> Obj:
    """The query of a write that, with `dry_run`, the API server checks and answers but does not store."""
    return {"dryRun": "All"} if dry_run else {}


class Watch:
    """One WATCH request (`Kube.watch`). Iterating yields its events as they arrive, `{"type": "ADDED" |
    "MODIFIED" | "DELETED" | "BOOKMARK", "object": {...}}`, and ends when the API server ends the watch;
    an ERROR event (410: the version is too old) or a broken stream raises `ClusterError`. An event whose
    object breaks `bounded_json`'s bounds is recorded in `skipped` and yields a DELETED event of an
    object holding only its namespace, name and resourceVersion. `close()` from another thread ends the
    iteration at once, quietly: it shuts the socket down under the read that waits for the next event."""

    def __init__(self, response: Any, what: str, resource: str, skipped: SkippedObjects) -> None:
        self._response = response
        self._what = what
        self._resource = resource
        self._skipped = skipped
        self._closed = False

    def __iter__(self) -> Iterator[Obj]:
        try:
            with _api_errors(self._what):
                for line in iter_resp_lines(self._response):
                    if not line:
                        continue
                    event = _obj(_decoded(self._what, line, {"object": bounded_json.ONE}))
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise _http_error(self._what, status.get("code"), status.get("message"))
                    poisoned = event.get("object")
                    if isinstance(poisoned, Poisoned):
                        self._skipped.record(self._resource, poisoned)
                        event = {"type": "DELETED", "object": _stub(poisoned)}
                    yield event
        except ClusterError:
            if not self._closed:
                raise
        finally:
            self._response.close()

    def close(self) -> None:
        self._closed = True
        # ValueError, RuntimeError: the response already ended and let go of its socket.
        with suppress(ValueError, RuntimeError, OSError):
            self._response.shutdown()


def _stub(poisoned: Poisoned) -> Obj:
    """What a watch reports of an object it left out: where it was, so that mirrors forget it."""
    fields = {
        "namespace": poisoned.namespace,
        "name": poisoned.name,
        "resourceVersion": poisoned.resource_version,
    }
    return {"metadata": {key: value for key, value in fields.items() if value}}


class Kube:
    """The API calls gpudra makes. `request_counts()` counts every request sent, by `request_kind`'s
    (verb, resource), failed ones included, so the API load a daemon puts on the cluster can be watched
    (gpudra_api_requests_total). `skipped` records the objects left out of its replies
    (gpudra_skipped_objects_total)."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        timeout: tuple[float, float] = REQUEST_TIMEOUT,
        report_skipped: Callable[[str], None] | None = None,
    ) -> None:
        self.api = api
        self.timeout = timeout  # (connect, read) seconds of every call
        self._requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self._requests_lock = threading.Lock()  # calls come from the gRPC workers and every loop
        self.skipped = SkippedObjects(report_skipped)
        self.clock = ClusterClock()  # the cluster's time, from each reply's Date header

    def request_counts(self) -> dict[tuple[str, str], int]:
        with self._requests_lock:
            return dict(self._requests)

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, Any]],
        body: Obj | None = None,
        content_type: str = "application/json",
        timeout: tuple[float, float] | None = None,
    ) -> Any:
        """Send one request and count it (before it goes: a failed one counts too); the response as
        the client returns it. Callers wrap it in `_api_errors`."""
        kind = request_kind(method, path, watch=("watch", "true") in query)
        with self._requests_lock:
            self._requests[kind] += 1
        headers = {"Accept": "application/json"} | ({"Content-Type": content_type} if body else {})
        request = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request, _request_timeout=timeout or self.timeout)
        replied = getattr(response, "headers", None)
        self.clock.observe(replied.get("Date") if replied is not None else None)
        return response

    def request(
        self,
        what: str,
        method: str,
        path: str,
        *,
        query: Obj | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One call to `path` (under the API server's address) with JSON in and out, as the generated
        APIs make it: the configured credentials, the client's timeout, errors as `_api_errors` words them.
        `content_type` names a patch's kind (e.g. application/apply-patch+yaml for server-side apply,
        whose body JSON also is). The other modules of gpudra.kube build their calls on this one; it
        counts the request (`request_kind`). An object beyond `bounded_json`'s bounds fails the call."""
        reply = self._call(what, method, path, query=query, body=body, content_type=content_type)
        if isinstance(reply, Poisoned):
            self.skipped.record(request_kind(method, path)[1], reply)
            raise ClusterError(f"{what}: the object {reply.problem}")
        return _obj(reply)

    def _list(self, resource: str, path: str, query: Obj) -> Obj:
        """One page of the collection at `path`, without the items beyond `bounded_json`'s bounds
        (recorded in `skipped`)."""
        page = _obj(
            self._call(f"listing {resource}", "GET", path, query=query, shape={"items": bounded_json.EACH})
        )
        items = page.get("items") or []
        for item in items:
            if isinstance(item, Poisoned):
                self.skipped.record(resource, item)
        page["items"] = [item for item in items if not isinstance(item, Poisoned)]
        return page

    def _call(
        self,
        what: str,
        method: str,
        path: str,
        *,
        query: Obj | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
        shape: bounded_json.Shape = bounded_json.ONE,
    ) -> Any:
        with _api_errors(what):
            query_params = list((query or {}).items())
            response = self._send(method, path, query=query_params, body=body, content_type=content_type)
            data = response.read()
        if not 200 <= int(response.status) <= 299:
            raise _http_error(what, response.status, response.reason, data)
        return _decoded(what, data, shape)

    def server_minor(self) -> int:
        info = self.request("reading the server version", "GET", "/version")
        return int("".join(ch for ch in str(info.get("minor", "")) if ch.isdigit()))

    def node_uid(self, name: str) -> str:
        node = self.request(f"reading node {name}", "GET", f"/api/v1/nodes/{quote(name, safe='')}")
        uid = (node.get("metadata") or {}).get("uid")
        if not uid:
            raise ClusterError(f"node {name} has no metadata.uid")
        return str(uid)

    def node_annotation(self, name: str, key: str) -> str:
        """One annotation of a node; "" when it has none."""
        node = self.request(f"reading node {name}", "GET", f"/api/v1/nodes/{quote(name, safe='')}")
        value = ((node.get("metadata") or {}).get("annotations") or {}).get(key, "")
        return value if isinstance(value, str) else ""

    # --- ResourceSlices ------------------------------------------------------------------------

    def list_slices(self, *, driver: str, node_name: str) -> tuple[list[Obj], str]:
        """The slices of `driver` on `node_name`, and the list's resourceVersion (where a watch resumes)."""
        result = self._list("resourceslices", _SLICES, {"fieldSelector": _slice_selector(driver, node_name)})
        return list(result["items"]), str(result["metadata"]["resourceVersion"])

    def watch_slices(
        self, *, driver: str, node_name: str, resource_version: str, timeout_seconds: int
    ) -> Watch:
        """The changes to `list_slices(driver, node_name)` after `resource_version`, for at most
        `timeout_seconds`."""
        return self.watch(
            "resourceslices",
            _SLICES,
            field_selector=_slice_selector(driver, node_name),
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
        )

    def watch(
        self,
        resource: str,
        path: str,
        *,
        resource_version: str,
        timeout_seconds: int,
        field_selector: str | None = None,
    ) -> Watch:
        """The changes to the collection at `path` after `resource_version`, for at most
        `timeout_seconds`. Bookmarks are asked for: the API server's periodic "nothing for you up to
        this version" keeps the version a quiet collection's next watch resumes from recent enough to
        serve."""
        what = f"watching {resource}"
        query: list[tuple[str, Any]] = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", timeout_seconds),
        ]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        # The server ends the watch after timeout_seconds, so no read waits longer unless it hung.
        timeout = (self.timeout[0], timeout_seconds + self.timeout[1])
        with _api_errors(what):
            response: Any = self._send("GET", path, query=query, timeout=timeout).response
        if not 200 <= int(response.status) <= 299:
            response.close()
            raise _http_error(what, int(response.status), response.reason)
        return Watch(response, what, resource, self.skipped)

    def list_page(
        self,
        resource: str,
        path: str,
        *,
        limit: int = 500,
        cont: str | None = None,
        field_selector: str | None = None,
    ) -> Obj:
        """One page of the collection at `path` (its `metadata.continue` names the next), without the
        objects beyond `bounded_json`'s bounds (recorded in `skipped`)."""
        query: Obj = {"limit": limit} | ({"continue": cont} if cont else {})
        if field_selector:
            query["fieldSelector"] = field_selector
        return self._list(resource, path, query)

    def create_slice(self, body: Obj, *, dry_run: bool = False) -> Obj:
        """The slice as the API server stored it, or with `dry_run` as it would store it."""
        name = body["metadata"].get("name")
        what = f"creating ResourceSlice {name}{' (dry run)' if dry_run else ''}"
        return self.request(what, "POST", _SLICES, query=_dry_run(dry_run), body=body)

    def replace_slice(self, body: Obj, *, dry_run: bool = False) -> Obj:
        """The slice as the API server stored it, or with `dry_run` as it would store it (defaults
        filled in, quantities normalized), changing nothing."""
        name = body["metadata"]["name"]
        what = f"updating ResourceSlice {name}{' (dry run)' if dry_run else ''}"
        return self.request(what, "PUT", _slice(name), query=_dry_run(dry_run), body=body)

    def delete_slice(self, name: str) -> None:
        with suppress(NotFound):  # gone already: what was asked
            self.request(f"deleting ResourceSlice {name}", "DELETE", _slice(name))

    # --- ResourceClaims ------------------------------------------------------------------------

    def get_claim(self, namespace: str, name: str) -> Obj:
        """The claim (every prepare reads one: see the module docstring for why through `request`)."""
        path = (
            f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/resourceclaims/"
            f"{quote(name, safe='')}"
        )
        return self.request(f"reading ResourceClaim {namespace}/{name}", "GET", path)

    # --- Events --------------------------------------------------------------------------------

    def create_node_event(self, *, node_name: str, node_uid: str, event: Obj) -> str:
        """A core/v1 Event about a Node (in `default`, where the kubelet puts its own node events, so
        `kubectl describe node` shows it). `event` holds reason, message, type, timestamps, count; the
        created Event's name."""
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{node_name}.", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid},
            **event,
        }
        created = self.request(
            f"creating an Event on node {node_name}", "POST", "/api/v1/namespaces/default/events", body=body
        )
        return str((created.get("metadata") or {}).get("name", ""))

    def patch_node_event(self, name: str, patch: Obj) -> None:
        """Merge `patch` (count, lastTimestamp, message) into the node Event `name`: a repeat of it.
        NotFound once the API server has let it expire."""
        self.request(
            f"updating the Event {name}",
            "PATCH",
            f"/api/v1/namespaces/default/events/{quote(name, safe='')}",
            body=patch,
            content_type="application/merge-patch+json",
        )

    def list_node_events(self, node_name: str) -> list[Obj]:
        """Events about a Node, as JSON dicts (for tools and tests)."""
        selector = f"involvedObject.kind=Node,involvedObject.name={node_name}"
        result = self._list("events", "/api/v1/namespaces/default/events", {"fieldSelector": selector})
        return list(result["items"])

    # --- gpudra explain: what the scheduler sees ----------------------------------------------

    def list_device_classes(self) -> list[Obj]:
        return self._list_all("deviceclasses", f"/apis/{GROUP}/{VERSION}/deviceclasses")

    def list_all_slices(self) -> list[Obj]:
        """Every ResourceSlice of every driver and node."""
        return self._list_all("resourceslices", _SLICES)

    def list_all_claims(self) -> list[Obj]:
        """Every ResourceClaim in every namespace (their allocations hold devices)."""
        return self._list_all("resourceclaims", f"/apis/{GROUP}/{VERSION}/resourceclaims")

    def list_claims(self, namespace: str) -> list[Obj]:
        """The ResourceClaims of one namespace (a caller who may not list them in every one)."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/resourceclaims"
        return self._list_all("resourceclaims", path)

    def get_claim_template(self, namespace: str, name: str) -> Obj:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/resourceclaimtemplates"
        return self.request(
            f"reading ResourceClaimTemplate {namespace}/{name}", "GET", f"{path}/{quote(name, safe='')}"
        )

    def list_nodes(self) -> list[Obj]:
        """Every Node (their taints and labels decide where a pod may go)."""
        return self._list_all("nodes", "/api/v1/nodes")

    def get_pod(self, namespace: str, name: str) -> Obj:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
        return self.request(f"reading Pod {namespace}/{name}", "GET", path)

    def list_unfinished_pods(self) -> list[Obj]:
        """Every pod not Succeeded or Failed, in every namespace: what their requests use of their
        nodes (`gpudra explain`'s cpu and memory check)."""
        selector = "status.phase!=Succeeded,status.phase!=Failed"
        return self._list_all("pods", "/api/v1/pods", {"fieldSelector": selector})

    def get_workload(self, kind: str, namespace: str, name: str) -> Obj:
        """A Deployment, StatefulSet, ReplicaSet, DaemonSet, Job or CronJob (WORKLOADS): its pod template
        is what `gpudra explain deployment/NAME` explains."""
        group, resource = WORKLOADS[kind]
        path = f"/apis/{group}/namespaces/{quote(namespace, safe='')}/{resource}/{quote(name, safe='')}"
        found = self.request(f"reading {kind} {namespace}/{name}", "GET", path)
        return {**found, "kind": kind}

    def _list_all(self, resource: str, path: str, query: Obj | None = None) -> list[Obj]:
        """Every object at `path`, a page of at most 500 at a time (a large cluster's slices run to
        hundreds of megabytes; one response would hold them all in memory twice), but those beyond
        `bounded_json`'s bounds (recorded in `skipped`). The API server leaves kind and apiVersion out
        of list items; they are filled in, as kubectl does, so that the objects read like the same
        objects from a file."""
        items: list[Obj] = []
        first: Obj = {**(query or {}), "limit": 500}
        page_query = first
        while True:
            page = self._list(resource, path, page_query)
            kind = str(page.get("kind", "")).removesuffix("List")
            items.extend(
                {"kind": kind, "apiVersion": page.get("apiVersion"), **item}
                for item in page.get("items") or []
            )
            more = (page.get("metadata") or {}).get("continue")
            if not more:
                return items
            page_query = {**first, "continue": more}
