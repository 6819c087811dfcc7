"""`gpudra status`: the cluster's GPU picture. I/O: the API server, or one HTTP GET to the controller.

With a kubeconfig (the default) the command lists this driver's ResourceSlices, the ResourceClaims and
the DeviceClasses and builds the view with the controller's own code (`gpudra.scheduling.cluster_view`):
it needs no network path to the controller and works while none runs, with the user's own
permissions. An object beyond gpudra.bounded_json's bounds is left out of the view, with a warning on
stderr naming it. With `--controller-url` it reads the view the controller serves at `/status` instead:
over HTTPS, with a bearer token (`--token`, else the kubeconfig's), checked by the controller with the
API server (TokenReview, SubjectAccessReview: each caller sees the claims RBAC lets it list); the
server's certificate verified against `--certificate-authority`, else (the kubeconfig's token sent) the
kubeconfig's CA when the URL is the kubeconfig's own server, else the system's CAs, for the URL's host
or `--tls-server-name`. A 401 or 403 ends in one line saying which it was.
"""

from __future__ import annotations

import http.client
import json
import ssl
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from gpudra.cli.output_format import dump
from gpudra.cli.status_text import render
from gpudra.errors import ClusterError, ConfigError
from gpudra.kube import client as kube
from gpudra.model.claim import read_claim
from gpudra.scheduling import cluster_view
from gpudra.scheduling.cluster_view import ClusterView

URL_TIMEOUT_SECONDS = 10.0


def fetch(
    *,
    kubeconfig: str | None,
    driver: str,
    idle_after_seconds: float,
    controller_url: str | None,
    context: str | None = None,
    token: str | None = None,
    certificate_authority: str | None = None,
    tls_server_name: str | None = None,
) -> ClusterView:
    if not controller_url:
        api = kube.Kube(kube.connect(kube.kubeconfig_path(kubeconfig), context), report_skipped=_warn)
        return cluster_view.build(
            driver=driver,
            slices=[s for s in api.list_all_slices() if (s.get("spec") or {}).get("driver") == driver],
            claims=[read_claim(obj) for obj in api.list_all_claims()],
            classes=api.list_device_classes(),
            now=datetime.now(UTC),
            idle_after_seconds=idle_after_seconds,
        )
    if token is None:
        found = kube.credentials(kube.kubeconfig_path(kubeconfig), context)
        token = found.token
        if certificate_authority is None and _origin(found.server) == _origin(controller_url):
            certificate_authority = found.ca_file
    if not token:
        raise ConfigError(
            "the controller's /status needs a bearer token: the kubeconfig's user has none "
            "(client certificates); give --token (e.g. $(kubectl create token NAME))",
            field="--token",
        )
    document = _get(controller_url.rstrip("/") + "/status", token, certificate_authority, tls_server_name)
    try:
        return ClusterView.model_validate(document)
    except ValidationError as err:
        raise ClusterError(f"the controller sent a status this gpudra cannot read: {err}") from err


def _warn(line: str) -> None:
    """What was left out of the view: an object nested too deeply to decode (a tenant's claim, see
    gpudra.bounded_json), or what the controller's view cut to the token's rights leaves out."""
    print(f"gpudra status: warning: {line}", file=sys.stderr)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


_REFUSALS = {
    401: "the controller did not accept the token (401: not valid, or expired)",
    403: "the token's user may list resourceclaims in no namespace, nor resourceslices "
    "(403; ask for list on resourceclaims)",
}


def _get(url: str, token: str, ca_file: str | None, server_name: str | None) -> Any:
    if urlsplit(url).scheme != "https":
        raise ConfigError(
            "must be https://: the controller serves /status on its webhook port, with TLS, so that the "
            "token is not sent in the clear",
            field="--controller-url",
        )
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"cannot be loaded: {err}", field=f"--certificate-authority {ca_file}") from err
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with _opener(context, server_name).open(request, timeout=URL_TIMEOUT_SECONDS) as response:
            # What the controller left out of a view cut to the caller's rights (299 warnings).
            for warning in response.headers.get_all("Warning") or []:
                _warn(_warning_text(warning))
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        detail = _REFUSALS.get(err.code) or f"HTTP {err.code}: {_error_text(err.read())}"
        raise ClusterError(f"reading {url}: {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ClusterError(f"reading {url}: {err}") from err


def _warning_text(header: str) -> str:
    """The text of a Warning header `299 - "text"`; the header as sent when it is not of that form."""
    code, _, rest = header.strip().partition(" ")
    agent, _, text = rest.partition(" ")
    if code.isdigit() and agent and len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return header.strip()


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


def _opener(context: ssl.SSLContext, server_name: str | None) -> urllib.request.OpenerDirector:
    """An opener over `context`; with `server_name`, the certificate is checked for that name instead
    of the URL's host (kubectl's --tls-server-name: a port-forward, or an address the certificate does
    not name)."""
    if not server_name:
        return urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))

    class _Named(http.client.HTTPSConnection):
        def connect(self) -> None:
            http.client.HTTPConnection.connect(self)  # TCP only; TLS for server_name below
            self.sock = context.wrap_socket(self.sock, server_hostname=server_name)

    class _NamedHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(_Named, req)

    return urllib.request.build_opener(_NamedHandler(context=context))


def show(view: ClusterView, *, output: str) -> str:
    if output == "json":
        return view.model_dump_json(by_alias=True, indent=2) + "\n"
    if output == "yaml":
        return dump(view.model_dump(mode="json", by_alias=True), "yaml")
    return render(view, wide=output == "wide")
