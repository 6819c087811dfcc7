"""`gpudra.kube.client._api_errors`: every exception the kubernetes client can raise leaves as ClusterError.

The foreign classes are enumerated, not listed: every exception class urllib3.exceptions and http.client
define, every ApiException subclass. Each is built with the API server at 127.0.0.1:6443 in its arguments,
and no message may name that address (the exceptions' own texts do).
"""

from __future__ import annotations

import contextlib
import email.errors
import http.client
import inspect
import json
import logging
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import urllib3
from kubernetes import client, config
from kubernetes.client import exceptions as api_exceptions

from gpudra.errors import ClusterError, ConfigError
from gpudra.kube.client import Conflict, Forbidden, NotFound, _api_errors, connect

HOST, PORT = "127.0.0.1", 6443
URL = f"https://{HOST}:{PORT}/apis/resource.k8s.io/v1/resourceslices?labelSelector=x"
LEAKS = (HOST, str(PORT), "/apis/", "resourceslices", "labelSelector")


def _classes(module: ModuleType, base: type[BaseException]) -> list[type[BaseException]]:
    """Every exception class the module defines or re-exports that subclasses `base`, once each."""
    found = {id(c): c for c in vars(module).values() if inspect.isclass(c) and issubclass(c, base)}
    return sorted(found.values(), key=lambda c: (c.__module__, c.__qualname__))


def _refused() -> ConnectionRefusedError:
    return ConnectionRefusedError(111, "Connection refused")


def _connection() -> urllib3.connection.HTTPSConnection:
    return urllib3.connection.HTTPSConnection(HOST, PORT)


def _new_connection_error() -> urllib3.exceptions.NewConnectionError:
    """What urllib3 raises on a refused connection (then wraps into MaxRetryError)."""
    error = urllib3.exceptions.NewConnectionError(
        _connection(),
        f"Failed to establish a new connection to {HOST}:{PORT}: [Errno 111] Connection refused",
    )
    error.__cause__ = _refused()
    return error


def _response() -> urllib3.HTTPResponse:
    return urllib3.HTTPResponse(body=f"GET {URL}".encode(), preload_content=False)


# Builders for constructor parameters, by name ("Class.name" first): every value names the server.
ARGUMENTS: dict[str, Callable[[], object]] = {
    "pool": lambda: urllib3.HTTPSConnectionPool(HOST, PORT),
    "conn": _connection,
    "url": lambda: URL,
    "message": lambda: f"request to {URL} failed",
    "reason": _new_connection_error,
    "NameResolutionError.reason": lambda: socket.gaierror(-2, f"Name or service not known: {HOST}"),
    "error": _refused,
    "host": lambda: HOST,
    "retries": lambda: 3,
    "scheme": lambda: f"h2x://{HOST}:{PORT}",
    "location": lambda: URL,
    "partial": lambda: 10,
    "expected": lambda: 20,
    "response": _response,
    "length": lambda: bytes(f"{HOST}:{PORT}", "ascii"),
    "defects": lambda: [email.errors.MessageDefect(f"Host: {HOST}:{PORT}")],
    "unparsed_data": lambda: bytes(f"Host: {HOST}:{PORT}", "ascii"),
    "line": lambda: f"Host: {HOST}:{PORT}",
    "line_type": lambda: f"header Host: {HOST}:{PORT}",
    "version": lambda: f"HTTP/9 from {HOST}:{PORT}",
}


def _build(cls: type[BaseException]) -> BaseException:
    """An instance of `cls` whose arguments name the server. Fails, never skips, for a class whose
    constructor takes a parameter nobody taught this test to build."""
    try:
        signature = inspect.signature(cls)
    except ValueError:  # BaseException's own constructor: (*args)
        return cls(f"request to {URL} failed")
    args: list[object] = []
    kwargs: dict[str, object] = {}
    for name, parameter in signature.parameters.items():
        if parameter.kind is parameter.VAR_POSITIONAL:
            args.append(f"request to {URL} failed")
            continue
        if parameter.kind is parameter.VAR_KEYWORD:
            continue
        builder = ARGUMENTS.get(f"{cls.__name__}.{name}") or ARGUMENTS.get(name)
        if builder is None:
            if parameter.default is not parameter.empty:
                continue
            pytest.fail(f"{cls.__module__}.{cls.__qualname__}: no builder for its parameter {name!r}")
        if parameter.kind is parameter.KEYWORD_ONLY:
            kwargs[name] = builder()
        else:
            args.append(builder())
    return cls(*args, **kwargs)


def _translated(error: BaseException) -> ClusterError:
    with pytest.raises(ClusterError) as caught, _api_errors("x"):
        raise error
    assert caught.value.__cause__ is error
    message = str(caught.value)
    assert message.startswith("x: ")
    for leak in LEAKS:
        assert leak not in message, f"{type(error).__name__}: {message!r} names the server ({leak})"
    return caught.value


URLLIB3 = _classes(urllib3.exceptions, BaseException)
HTTP_CLIENT = _classes(http.client, http.client.HTTPException)
API = _classes(api_exceptions, api_exceptions.ApiException)


def test_the_enumerations_are_not_empty() -> None:
    """urllib3 2.8: 40 classes under 41 names (ConnectionError is ProtocolError; MessageDefect and
    http.client's IncompleteRead re-exported); http.client: 14; kubernetes: ApiException and 7 subclasses."""
    assert len(URLLIB3) >= 40
    assert urllib3.exceptions.MaxRetryError in URLLIB3
    assert urllib3.exceptions.InsecureRequestWarning in URLLIB3
    assert len(HTTP_CLIENT) >= 14
    assert http.client.RemoteDisconnected in HTTP_CLIENT
    assert len(API) >= 8


@pytest.mark.parametrize("cls", URLLIB3, ids=lambda c: c.__name__)
def test_every_urllib3_exception_becomes_cluster_error(cls: type[BaseException]) -> None:
    error = _build(cls)
    translated = _translated(error)
    assert type(translated) is ClusterError
    assert cls.__name__ in str(translated)


@pytest.mark.parametrize("cls", HTTP_CLIENT, ids=lambda c: c.__name__)
def test_every_http_client_exception_becomes_cluster_error(cls: type[BaseException]) -> None:
    assert type(_translated(_build(cls))) is ClusterError


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            urllib3.exceptions.MaxRetryError(
                urllib3.HTTPSConnectionPool(HOST, PORT), URL, _new_connection_error()
            ),
            "x: cannot reach the API server (MaxRetryError > NewConnectionError > ConnectionRefusedError: "
            "Connection refused)",
        ),
        (
            urllib3.exceptions.MaxRetryError(
                urllib3.HTTPSConnectionPool(HOST, PORT),
                URL,
                urllib3.exceptions.ProtocolError(
                    "Connection aborted.", ConnectionResetError(104, "Connection reset by peer")
                ),
            ),
            "x: connection broken (MaxRetryError > ProtocolError > ConnectionResetError: "
            "Connection reset by peer)",
        ),
        (
            urllib3.exceptions.ProtocolError(
                "Connection aborted.", http.client.RemoteDisconnected(f"{HOST}:{PORT} closed the connection")
            ),
            "x: connection broken (ProtocolError > RemoteDisconnected)",
        ),
        (
            urllib3.exceptions.ReadTimeoutError(
                urllib3.HTTPSConnectionPool(HOST, PORT), URL, f"Read timed out. (read timeout={PORT})"
            ),
            "x: timed out (ReadTimeoutError)",
        ),
        (
            urllib3.exceptions.NameResolutionError(
                HOST, _connection(), socket.gaierror(-2, "Name or service not known")
            ),
            "x: cannot resolve the API server's name (NameResolutionError)",
        ),
        (
            urllib3.exceptions.InsecureRequestWarning(
                f"Unverified HTTPS request is being made to host '{HOST}'"
            ),
            "x: HTTP client warning raised as an error (InsecureRequestWarning)",
        ),
    ],
    ids=["refused", "reset", "remote-disconnected", "read-timeout", "name-resolution", "warning"],
)
def test_messages_name_the_failure_and_the_classes(error: BaseException, expected: str) -> None:
    assert str(_translated(error)) == expected


def _tls_failure() -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(
        1,
        f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch, certificate is "
        f"not valid for '{HOST}'. (_ssl.c:1000)",
    )
    error.reason = "CERTIFICATE_VERIFY_FAILED"  # set by the ssl module on real failures
    error.verify_message = f"Hostname mismatch, certificate is not valid for '{HOST}'."
    return error


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OSError(113, "No route to host"), "network or I/O failure (OSError: No route to host)"),
        (_refused(), "cannot reach the API server (ConnectionRefusedError: Connection refused)"),
        (ConnectionResetError(104, f"reset by {HOST}:{PORT}"), "connection broken (ConnectionResetError:"),
        (TimeoutError(f"timed out connecting to {HOST}:{PORT}"), "timed out (TimeoutError)"),
        (socket.gaierror(-2, f"unknown {HOST}"), "cannot resolve the API server's name (gaierror)"),
        (
            FileNotFoundError(2, "No such file or directory", f"/run/{HOST}:{PORT}"),
            "(FileNotFoundError: No such",
        ),
        (ssl.SSLError(1, f"[SSL] bad record from {HOST}:{PORT}"), "TLS failure (SSLError)"),
        (_tls_failure(), "TLS failure (SSLCertVerificationError: CERTIFICATE_VERIFY_FAILED)"),
        (
            urllib3.exceptions.SSLError(_tls_failure()),
            "TLS failure (SSLError > SSLCertVerificationError: CERTIFICATE_VERIFY_FAILED)",
        ),
        (ValueError(f"Invalid value for `minor`, from {URL}"), "malformed request or reply (ValueError)"),
        (
            json.JSONDecodeError(f"Expecting value from {URL}", "x", 0),
            "malformed request or reply (JSONDecodeError)",
        ),
        (
            UnicodeDecodeError("utf-8", f"{HOST}:{PORT}".encode(), 0, 1, "bad"),
            "malformed request or reply (UnicodeDecodeError)",
        ),
        (
            api_exceptions.ApiValueError(f"Missing the required parameter for {URL}"),
            "malformed request or reply (ApiValueError)",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else type(value).__name__,
)
def test_os_value_and_ssl_errors_become_cluster_error(error: BaseException, reason: str) -> None:
    translated = _translated(error)
    assert type(translated) is ClusterError
    assert reason in str(translated)


API_STATUSES = [
    (None, ClusterError),
    (0, ClusterError),
    (400, ClusterError),
    (401, ClusterError),
    (403, Forbidden),
    (404, NotFound),
    (409, Conflict),
    (410, ClusterError),
    (422, ClusterError),
    (429, ClusterError),
    (500, ClusterError),
    (503, ClusterError),
]


@pytest.mark.parametrize("cls", API, ids=lambda c: c.__name__)
@pytest.mark.parametrize(("status", "kind"), API_STATUSES, ids=[str(status) for status, _ in API_STATUSES])
def test_api_exceptions_keep_their_status(
    cls: type[api_exceptions.ApiException], status: int | None, kind: type[ClusterError]
) -> None:
    response = urllib3.HTTPResponse(
        body=f'{{"message": "see {URL}"}}'.encode(),
        status=status or 0,
        reason="Reason",
        headers={"Location": URL, "X-Server": f"{HOST}:{PORT}"},
    )
    error = cls(status=status, reason="Reason", http_resp=response)
    translated = _translated(error)
    assert type(translated) is kind
    assert str(translated) == f"x: HTTP {error.status} Reason"  # nothing of the headers or body


def test_the_api_servers_status_message_is_kept_on_one_bounded_line() -> None:
    """A refusal says why (which field, which rule): the Status's message, not a proxy's page."""
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": 'ResourceClaim.resource.k8s.io "c" is invalid:\n status.devices[0].data: Too long: '
        + "x" * 400,
        "reason": "Invalid",
        "code": 422,
    }
    response = urllib3.HTTPResponse(
        body=json.dumps(status).encode(), status=422, reason="Unprocessable Entity"
    )
    message = str(_translated(api_exceptions.ApiException(http_resp=response)))
    assert message.startswith(
        'x: HTTP 422 Unprocessable Entity: ResourceClaim.resource.k8s.io "c" is invalid: '
        "status.devices[0].data: Too long: xxx"
    )
    assert "\n" not in message and message.endswith("…")
    assert len(message) == len("x: HTTP 422 Unprocessable Entity: ") + 300
    for body in (b"<html>502 from 10.1.2.3</html>", b'{"message": "not a Status"}', b"[" * 10_000):
        proxied = urllib3.HTTPResponse(body=body, status=502, reason="Bad Gateway")
        assert str(_translated(api_exceptions.ApiException(http_resp=proxied))) == "x: HTTP 502 Bad Gateway"


def test_urllib3s_own_log_lines_lose_the_address(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with contextlib.suppress(ConfigError):
        connect(None)  # installs the filters whatever the credentials
    with caplog.at_level("DEBUG", logger="urllib3"):
        logging.getLogger("urllib3.connectionpool").warning(
            "Connection pool is full, discarding connection: %s. Connection pool size: %s", HOST, 4
        )
    (record,) = [r for r in caplog.records if r.name == "urllib3.connectionpool"]
    assert record.getMessage() == "Connection pool is full, discarding connection: …. Connection pool size: …"


def test_config_exception_becomes_cluster_error() -> None:
    error = config.ConfigException("Invalid kube-config file. No configuration found.")
    assert str(_translated(error)) == (
        "x: invalid cluster credentials: Invalid kube-config file. No configuration found."
    )


def test_connect_without_credentials_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing to connect with is input to fix (exit 2 for every command), not a cluster that refused."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(
        ConfigError, match=r"in-cluster config \(no --kubeconfig\): invalid cluster credentials"
    ) as caught:
        connect(None)
    assert isinstance(caught.value.__cause__, config.ConfigException)


def test_programming_errors_are_not_translated() -> None:
    """TypeError, KeyError (ApiTypeError: a bad keyword argument) are bugs in gpudra, not the cluster."""
    for error in (TypeError("x"), KeyError("x"), api_exceptions.ApiTypeError("unexpected keyword")):
        with pytest.raises(type(error)), _api_errors("x"):
            raise error


# --- real sockets: what the kubernetes client raises against a broken API server -------------------


@contextlib.contextmanager
def _server(handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """A loopback TCP server that hands each connection to `handle`; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with connection:
                handle(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def _reset(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.recv(65536)
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _not_tls(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.recv(65536)
        connection.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


def _server_version(url: str) -> Any:
    configuration = client.Configuration()
    configuration.host = url
    configuration.retries = 0
    configuration.verify_ssl = False
    with client.ApiClient(configuration) as api:
        return client.VersionApi(api).get_code(_request_timeout=5)


def _real(url: str) -> str:
    with pytest.raises(ClusterError) as caught, _api_errors("x"):
        _server_version(url)
    message = str(caught.value)
    assert "127.0.0.1" not in message
    assert url.rsplit(":", 1)[1] not in message
    return message


def test_real_refused_connection() -> None:
    with socket.socket() as unused:  # bound, never listening: connections to it are refused
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        message = _real(f"http://127.0.0.1:{port}")
    assert message == (
        "x: cannot reach the API server (MaxRetryError > NewConnectionError > ConnectionRefusedError: "
        "Connection refused)"
    )


def test_real_connection_reset() -> None:
    with _server(_reset) as port:
        message = _real(f"http://127.0.0.1:{port}")
    assert message.startswith("x: connection broken (MaxRetryError > ProtocolError > ")


def test_real_tls_failure() -> None:
    with _server(_not_tls) as port:
        message = _real(f"https://127.0.0.1:{port}")
    assert message.startswith("x: TLS failure (MaxRetryError > SSLError > ")
