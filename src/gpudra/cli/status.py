"""`gpudra status`: the cluster's GPU picture. I/O: the API server, or one HTTP GET to the controller.

With a kubeconfig (the default) the command lists this driver's ResourceSlices, the ResourceClaims and
the DeviceClasses and builds the view with the controller's own code (`gpudra.scheduling.cluster_view`):
it needs no network path to the controller and works while none runs, with the user's own
permissions. An object beyond gpudra.bounded_json's bounds is left out of the view, with a warning on
stderr naming it. With `--controller-url` it reads the view the controller serves at `/status` instead.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from gpudra.cli.output_format import dump
from gpudra.cli.status_text import render
from gpudra.errors import ClusterError
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
    document = _get(controller_url.rstrip("/") + "/status")
    try:
        return ClusterView.model_validate(document)
    except ValidationError as err:
        raise ClusterError(f"the controller sent a status this gpudra cannot read: {err}") from err


def _warn(line: str) -> None:
    """An object left out of the view (a tenant's claim nested too deeply to decode, see
    gpudra.bounded_json): the rest of the cluster is shown."""
    print(f"gpudra status: warning: {line}", file=sys.stderr)


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=URL_TIMEOUT_SECONDS) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ClusterError(f"reading {url}: {err}") from err


def show(view: ClusterView, *, output: str) -> str:
    if output == "json":
        return view.model_dump_json(by_alias=True, indent=2) + "\n"
    if output == "yaml":
        return dump(view.model_dump(mode="json", by_alias=True), "yaml")
    return render(view, wide=output == "wide")
