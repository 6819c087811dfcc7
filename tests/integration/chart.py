"""gpudra's Helm chart as release `chart` in namespace `gpudra-chart`: rendered with the Helm this
checkout builds, and applied server-side as Helm 4 installs. The chart's tests against the API server
(test_chart.py) and the support matrix (tests/compat) install it so."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml
from kubernetes.dynamic import DynamicClient

from .conftest import REPO

CHART = REPO / "deploy" / "helm" / "gpudra"
RELEASE, NAMESPACE = "chart", "gpudra-chart"
VALUES_EXAMPLES = sorted((CHART / "ci").glob("*.yaml"))
MANAGER = "gpudra-chart-test"


def helm() -> str:
    built = subprocess.run(
        ["bash", str(REPO / "deploy" / "local" / "build-helm.sh")], capture_output=True, text=True, check=True
    )
    return built.stdout.strip()


def render(*args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [helm(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def apply(dynamic: DynamicClient, obj: dict[str, Any], *, dry_run: bool = False) -> Any:
    """Server-side apply, as Helm 4 installs (the object may exist or not)."""
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    namespace = obj["metadata"].get("namespace") if resource.namespaced else None
    return resource.server_side_apply(
        body=obj,
        name=obj["metadata"]["name"],
        namespace=namespace,
        field_manager=MANAGER,
        force_conflicts=True,
        dry_run="All" if dry_run else None,
    )
