"""A daemon's HTTP endpoint: Prometheus metrics, liveness and readiness probes. I/O: one listening
socket and its request threads. Both binaries use it; it checks no credentials, so it serves nothing
that names a tenant (the controller's `/status` is on its HTTPS port, gpudra.controller.status_access).

`/metrics` serves the registry. `/livez` fails only when the process cannot recover by itself (a
background thread ended): the kubelet restarts the container then. `/readyz` fails while the plugin
cannot do its job on this node (checkpoint refused, not registered with the kubelet, slices not yet
published, CDI root not writable): a rolling update waits for it, and the failing check names the
reason. An outage of the API server fails neither: restarting or holding back every node's plugin
would not bring it back. Both answer in the kube-apiserver's style: one `[+]name ok` or
`[-]name failed: reason` line per check, HTTP 200 or 503.
"""

from __future__ import annotations

import socket
import socketserver
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from gpudra.errors import ConfigError
from gpudra.runtime.metrics import CollectorRegistry, wsgi_app
from gpudra.runtime.service import Loop

# A probe answers "why not" (a short reason) or None when the check passes.
Probe = Callable[[], str | None]


@dataclass(frozen=True)
class Check:
    name: str
    probe: Probe


def report(checks: Iterable[Check]) -> tuple[bool, str]:
    """Run `checks`: (all passed, the text body). A probe that raises fails its check. Pure but for
    the probes themselves."""
    ok, lines = True, []
    for check in checks:
        try:
            reason = check.probe()
        except Exception as err:  # a broken probe must fail its check, not the endpoint
            reason = f"probe raised {type(err).__name__}: {err}"
        if reason is None:
            lines.append(f"[+]{check.name} ok")
        else:
            ok = False
            lines.append(f"[-]{check.name} failed: {reason}")
    lines.append("ok" if ok else "failed")
    return ok, "\n".join(lines) + "\n"


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds up shutdown


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes come every few seconds: an access log line each would drown the plugin's log."""


class HttpEndpoint:
    """Serves `/metrics`, `/livez` and `/readyz` on `address:port`, as a `service.Service`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        address: str,
        port: int,
        liveness: Sequence[Check] = (),
        readiness: Sequence[Check] = (),
    ) -> None:
        self.address = address
        self.port = port
        self.liveness = list(liveness)
        self.readiness = list(readiness)
        self._metrics = wsgi_app(registry)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        checks = {"/livez": self.liveness, "/healthz": self.liveness, "/readyz": self.readiness}.get(path)
        if checks is None:
            return self._metrics(environ, start_response)  # type: ignore[no-any-return]
        ok, body = report(checks)
        start_response(
            "200 OK" if ok else "503 Service Unavailable",
            [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")],
        )
        return [body.encode()]

    def start(self) -> None:
        """Listen, or ConfigError naming --metrics-port when the address cannot be had (in use, not
        this host's): a daemon's start then ends in that one line."""
        server_class = _Server6 if ":" in self.address else _Server
        try:
            self._server = make_server(
                self.address, self.port, self.app, server_class=server_class, handler_class=_QuietHandler
            )
        except OSError as err:
            where = f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"
            raise ConfigError(
                f"cannot listen on {where}: {err.strerror or err}", field="--metrics-port"
            ) from None
        self.port = self._server.server_port  # the one bound, when 0 asked for any
        self._thread = threading.Thread(target=self._server.serve_forever, name="http-endpoint", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout)


def loops_alive(loops: Iterable[Loop]) -> list[Check]:
    """A liveness check per background loop: it fails once the loop's thread has ended (it never should;
    a restart is the remedy)."""
    return [Check(f"loop-{loop.name}", _not_ended(loop)) for loop in loops]


def _not_ended(loop: Loop) -> Probe:
    return lambda: "its thread ended" if loop.ended else None


def writable_directory(path: Path) -> Probe:
    """A probe that creates and removes a file in `path`: a read-only or full filesystem fails it
    before a prepare does."""

    def probe() -> str | None:
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".gpudra-probe-") as probe_file:
                probe_file.write(b"x")  # an empty file can still be created on a full filesystem
                probe_file.flush()
        except OSError as err:
            return f"cannot write in {path}: {err.strerror or type(err).__name__}"
        return None

    return probe
