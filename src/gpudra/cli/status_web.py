"""`gpudra status --web`: the GPU map page (gpudra.controller.gpu_map_page) served on loopback from the
caller's kubeconfig, without the controller. I/O: the API server, one listening socket.

The page's refreshes list this driver's ResourceSlices, the ResourceClaims and the DeviceClasses with
the caller's own credentials (at most once per SURVEY_SECONDS, whatever the number of open tabs, in the
background once there is a first survey: `gpudra.controller.gpu_map_page.SurveyCache`), so the page
shows only what they may read, and says what they may not: a caller who may not list ResourceClaims
cluster-wide sees those of `--namespace` (default: the kubeconfig context's) if it may list them there,
else the GPUs without their holders; one who may not list ResourceSlices or DeviceClasses sees no GPUs
or no pending claims. Only a refusal (403) is a note on the page; an API server that cannot be reached
is the page's error. It binds 127.0.0.1 unless `--listen` says otherwise: whoever reaches the port reads
the cluster with the caller's credentials.
"""

from __future__ import annotations

import socket
import socketserver
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from gpudra.controller.gpu_map_page import GpuMapPage, Served, SurveyCache
from gpudra.errors import ClusterError, ConfigError
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
    namespace: str | None = None,
    ready: Callable[[str], None] = lambda url: None,
) -> int:
    """Serve the map until interrupted (exit 0). `ready` gets the page's URL once it is bound.
    `namespace`: whose claims to show when the caller may not list them in every namespace (default:
    the kubeconfig context's)."""
    address, port = listen_address(listen)
    path = kube.kubeconfig_path(kubeconfig)
    api = kube.Kube(kube.connect(path, context), report_skipped=_warn)
    if namespace is None and path:
        namespace = kube.context_namespace(path, context)
    surveys = _Surveys(api, driver=driver, idle_after_seconds=idle_after_seconds, namespace=namespace)
    server_class = _PageServer6 if ":" in address else _PageServer
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
    """The cluster read with the caller's credentials, at most once per SURVEY_SECONDS (SurveyCache)."""

    def __init__(
        self,
        api: kube.Kube,
        *,
        driver: str,
        idle_after_seconds: float,
        namespace: str | None = None,
        start: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.api = api
        self.driver = driver
        self.idle_after_seconds = idle_after_seconds
        self.namespace = namespace
        self.cache = SurveyCache(self.read, max_age_seconds=SURVEY_SECONDS, start=start)

    def get(self) -> Served:
        return self.cache.get()

    def read(self) -> gpu_map.Survey:
        notes: list[str] = []
        try:
            slices = [
                s for s in self.api.list_all_slices() if (s.get("spec") or {}).get("driver") == self.driver
            ]
        except kube.Forbidden as err:
            slices = []
            notes.append(f"no GPUs are shown: your kubeconfig may not list ResourceSlices ({err})")
        try:
            classes = self.api.list_device_classes()
        except kube.Forbidden as err:
            classes = []
            notes.append(
                "no pending claims are shown: your kubeconfig may not list DeviceClasses, which say "
                f"which claims ask for these GPUs ({err})"
            )
        claims = [read_claim(obj) for obj in self._claims(notes)]
        return gpu_map.survey(
            driver=self.driver,
            slices=slices,
            claims=claims,
            classes=classes,
            now=datetime.now(UTC),
            idle_after_seconds=self.idle_after_seconds,
            notes=notes,
        )

    def _claims(self, notes: list[str]) -> list[dict[str, Any]]:
        """Every namespace's claims, else those of `namespace`, with a note saying which."""
        try:
            return self.api.list_all_claims()
        except kube.Forbidden as err:
            everywhere = err
        except ClusterError as err:
            notes.append(f"the GPUs are shown without their claims: {err}")
            return []
        if self.namespace is None:
            notes.append(
                "the GPUs are shown without their claims: your kubeconfig may not list ResourceClaims "
                f"in every namespace ({everywhere}); --namespace (or the kubeconfig context's) names one "
                "it may list them in"
            )
            return []
        try:
            claims = self.api.list_claims(self.namespace)
        except ClusterError as err:
            notes.append(
                "the GPUs are shown without their claims: your kubeconfig may not list ResourceClaims "
                f"in every namespace ({everywhere}), nor in namespace {self.namespace} ({err})"
            )
            return []
        notes.append(
            f"only namespace {self.namespace}'s claims are shown: your kubeconfig may not list "
            f"ResourceClaims in every namespace ({everywhere}); a GPU held by another namespace's claim "
            "is drawn free, and other namespaces' pending claims are not listed"
        )
        return claims


def _warn(line: str) -> None:
    """An object left out of the map (beyond gpudra.bounded_json's bounds): the rest is shown."""
    print(f"gpudra status: warning: {line}", file=sys.stderr)


class _PageServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _PageServer6(_PageServer):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """The page refreshes every 10 seconds: no access log on the caller's terminal."""
