"""`gpudra status`: the cluster's GPU picture as the controller keeps it. I/O: one HTTP GET.

The controller serves its view as JSON at `/status` (every replica keeps it). The command reaches it
through the API server's service proxy with the kubeconfig's credentials (no port-forward, no network
path to the controller needed), or at `--controller-url` directly (a controller run outside the
cluster, e.g. on a laptop).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError

from gpudra.errors import ClusterError
from gpudra.kube import client as kube
from gpudra.model.cluster_view import ClusterView
from gpudra.model.cluster_view_text import render

URL_TIMEOUT_SECONDS = 10.0


def fetch(
    *, kubeconfig: str | None, namespace: str, service: str, port: str, controller_url: str | None
) -> ClusterView:
    if controller_url:
        document = _get(controller_url.rstrip("/") + "/status")
    else:
        path = (
            f"/api/v1/namespaces/{quote(namespace, safe='')}/services/"
            f"{quote(f'http:{service}:{port}', safe=':')}/proxy/status"
        )
        document = kube.Kube(kube.connect(kubeconfig)).request(
            f"reading the controller's status through service {namespace}/{service}", "GET", path
        )
    try:
        return ClusterView.model_validate(document)
    except ValidationError as err:
        raise ClusterError(f"the controller sent a status this gpudra cannot read: {err}") from err


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=URL_TIMEOUT_SECONDS) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ClusterError(f"reading {url}: {err}") from err


def show(view: ClusterView, *, output: str) -> str:
    if output == "json":
        return view.model_dump_json(by_alias=True, indent=2) + "\n"
    return render(view, wide=output == "wide")
