"""`gpudra status --web`: the GPU map page (gpudra.gpu_map_page) served on loopback from the caller's
kubeconfig, without the controller. I/O: the API server, one listening socket.

Each refresh of the page lists this driver's ResourceSlices, the ResourceClaims and the DeviceClasses
with the caller's own credentials (at most once per SURVEY_SECONDS, whatever the number of open tabs),
so the page shows only what they may read: a caller who may not list ResourceClaims cluster-wide sees
the GPUs without their holders, and the page says why. It binds 127.0.0.1 unless `--listen` says
otherwise: whoever reaches the port reads the cluster with the caller's credentials.
"""

from __future__ import annotations

import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from gpudra.errors import ClusterError, ConfigError
from gpudra.gpu_map_page import GpuMapPage
from gpudra.kube import client as kube
from gpudra.model.claim import read_claim
from gpudra.scheduling import gpu_map

SURVEY_SECONDS = 5.0
DEFAULT_LISTEN = "127.0.0.1:8090"


def serve(
    *,
    kubeconfig: str | None,
    driver: str,
    idle_after_seconds: float,
    listen: str,
    context: str | None = None,
    ready: Callable[[str], None] = lambda url: None,
) -> int:
    """Serve the map until interrupted (exit 0). `ready` gets the page's URL once it is bound."""
    address, port = listen_address(listen)
    api = kube.Kube(kube.connect(kube.kubeconfig_path(kubeconfig), context), report_skipped=_warn)
    surveys = _Surveys(api, driver=driver, idle_after_seconds=idle_after_seconds)
    server_class = _Server6 if ":" in address else _Server
    try:
        server = make_server(
            address, port, GpuMapPage(surveys.get).app, server_class=server_class, handler_class=_Quiet
        )
    except OSError as err:
        raise ConfigError(f"cannot listen on {listen}: {err.strerror or err}", field="--listen") from None
    host = f"[{address}]" if ":" in address else address
    url = f"http://{host}:{server.server_port}/"
    print(f"gpudra status: the GPU map at {url} (read-only, as your kubeconfig sees it; Ctrl-C stops)")
    sys.stdout.flush()
    ready(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def listen_address(text: str) -> tuple[str, int]:
    """HOST:PORT ([HOST]:PORT for IPv6); ConfigError naming --listen otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"{text!r} is not HOST:PORT (e.g. {DEFAULT_LISTEN}; port 0 picks a free one)", field="--listen"
        )
    return host, int(port)


class _Surveys:
    """The cluster read with the caller's credentials, at most once per SURVEY_SECONDS."""

    def __init__(self, api: kube.Kube, *, driver: str, idle_after_seconds: float) -> None:
        self.api = api
        self.driver = driver
        self.idle_after_seconds = idle_after_seconds
        self._lock = threading.Lock()
        self._cached: tuple[float, gpu_map.Survey] | None = None

    def get(self) -> gpu_map.Survey:
        with self._lock:  # one reading at a time: tabs refreshing together share it
            if self._cached is not None and time.monotonic() - self._cached[0] < SURVEY_SECONDS:
                return self._cached[1]
            notes = []
            slices = [
                s for s in self.api.list_all_slices() if (s.get("spec") or {}).get("driver") == self.driver
            ]
            classes = self.api.list_device_classes()
            try:
                claims = [read_claim(obj) for obj in self.api.list_all_claims()]
            except ClusterError as err:
                claims = []
                notes.append(f"the GPUs are shown without their claims: {err}")
            found = gpu_map.survey(
                driver=self.driver,
                slices=slices,
                claims=claims,
                classes=classes,
                now=datetime.now(UTC),
                idle_after_seconds=self.idle_after_seconds,
                notes=notes,
            )
            self._cached = (time.monotonic(), found)
            return found


def _warn(line: str) -> None:
    """An object left out of the map (beyond gpudra.bounded_json's bounds): the rest is shown."""
    print(f"gpudra status: warning: {line}", file=sys.stderr)


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """The page refreshes every 10 seconds: no access log on the caller's terminal."""
