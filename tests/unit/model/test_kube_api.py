"""The Kubernetes API and releases gpudra names in one module (gpudra.model.kube_api) are the ones the chart
and the test plane name."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpudra.model import kube_api

REPO = Path(__file__).resolve().parents[3]


def test_the_chart_requires_the_oldest_minor_gpudra_supports() -> None:
    chart = yaml.safe_load((REPO / "deploy" / "helm" / "gpudra" / "Chart.yaml").read_text())
    # "-0" lets pre-release and provider builds (1.34.2-eks-...) match, as Helm compares them.
    match = re.fullmatch(r">=\s*1\.(\d+)\.0-0", chart["kubeVersion"])
    assert match, f"kubeVersion {chart['kubeVersion']!r} is not '>=1.<minor>.0-0'"
    assert int(match.group(1)) == kube_api.OLDEST_MINOR


def test_the_newest_minor_is_the_release_make_test_pins() -> None:
    go_mod = (REPO / "deploy" / "local" / "go.mod").read_text()
    match = re.search(r"^\s*k8s\.io/kubernetes v1\.(\d+)\.\d+", go_mod, re.MULTILINE)
    assert match, "deploy/local/go.mod pins no k8s.io/kubernetes release"
    assert int(match.group(1)) == kube_api.NEWEST_MINOR


def test_the_api_version_is_the_group_and_version() -> None:
    assert kube_api.API_VERSION == f"{kube_api.GROUP}/{kube_api.VERSION}" == "resource.k8s.io/v1"
    assert kube_api.OLDEST_MINOR <= kube_api.NEWEST_MINOR
