"""The chart's values.schema.json refuses every option value the binaries refuse: each bad value below
is refused by `helm template` (the schema, generated from the options' types by
scripts/gen_chart_schema.py) and by the binary that would get it as its GPUDRA_* variable. Without the
first, `helm install` succeeds and the pods crash-loop. Needs only the helm binary (built once from its
Go module by deploy/local/build-helm.sh), no cluster."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from gpudra import cli

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpudra"
SECTIONS = {"kubeletPlugin": "kubelet-plugin", "controller": "controller"}

BAD: list[tuple[str, str, Any]] = [
    # the three, each of which crash-looped the pods
    ("kubeletPlugin", "logLevel", "verbose"),
    ("controller", "leaseSeconds", 1),
    ("kubeletPlugin", "nvml", "sim:dgx-h200"),
    # and one of every other kind of rule
    ("controller", "logLevel", "LOUD"),
    ("kubeletPlugin", "logFormat", "xml"),
    ("kubeletPlugin", "resyncSeconds", 0),
    ("kubeletPlugin", "resyncSeconds", "abc"),
    ("kubeletPlugin", "healthIntervalSeconds", -1),
    ("kubeletPlugin", "healthRecoverySeconds", "soon"),
    ("kubeletPlugin", "usageIntervalSeconds", -0.5),
    ("kubeletPlugin", "mpsCheckIntervalSeconds", "x"),
    ("kubeletPlugin", "healthResetEffect", "Evict"),
    ("kubeletPlugin", "healthXids", "31=boom"),
    ("kubeletPlugin", "healthXids", "gpu=reset"),
    ("kubeletPlugin", "migMode", "dynamic"),
    ("kubeletPlugin", "migProfiles", "big one"),
    ("kubeletPlugin", "shares", "yes"),
    ("kubeletPlugin", "toolkitCdiDirs", "etc/cdi"),
    ("kubeletPlugin", "devRoot", "run/nvidia/driver"),
    ("kubeletPlugin", "nvml", "fake"),
    ("controller", "failurePolicy", "Maybe"),
    ("controller", "idleAfterSeconds", -5),
    ("controller", "leaseSeconds", "abc"),
]


def _helm() -> str:
    built = subprocess.run(
        ["bash", str(REPO / "deploy" / "local" / "build-helm.sh")], capture_output=True, text=True, check=True
    )
    return built.stdout.strip()


@pytest.fixture(scope="module")
def helm() -> str:
    return _helm()


def _template(helm: str, *sets: str) -> subprocess.CompletedProcess[str]:
    args = [a for s in sets for a in ("--set-json", s)]
    return subprocess.run(
        [helm, "template", "x", str(CHART), *args], capture_output=True, text=True, check=False, timeout=120
    )


def _binary_refuses(section: str, key: str, value: Any) -> bool:
    """Whether the binary refuses `value` as the chart passes it (GPUDRA_<KEY>, the value as text)."""
    variable = "GPUDRA_" + "".join(f"_{c}" if c.isupper() else c for c in key).upper()
    command = SECTIONS[section]
    with mock.patch.dict(os.environ, {variable: str(value)}):
        try:
            cli.build_parser().parse_args(
                [command, "--node-name=n"] if command == "kubelet-plugin" else [command]
            )
        except SystemExit as refused:
            return refused.code == cli.EXIT_USAGE
    return False


@pytest.mark.parametrize(("section", "key", "value"), BAD, ids=[f"{s}.{k}={v}" for s, k, v in BAD])
def test_a_value_the_binary_refuses_is_refused_by_the_chart(
    helm: str, section: str, key: str, value: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _binary_refuses(section, key, value)
    capsys.readouterr()
    refused = _template(helm, f"{section}.options.{key}={json.dumps(value)}")
    assert refused.returncode != 0
    assert f"/{section}/options/{key}" in refused.stderr, refused.stderr


def test_mig_profiles_without_partitions_is_refused_by_the_chart_as_by_the_plugin(helm: str) -> None:
    refused = _template(helm, 'kubeletPlugin.options.migProfiles="1g.10gb"')
    assert refused.returncode != 0 and "/kubeletPlugin/options/migMode" in refused.stderr
    allowed = _template(
        helm, 'kubeletPlugin.options.migProfiles="1g.10gb"', 'kubeletPlugin.options.migMode="partitionable"'
    )
    assert allowed.returncode == 0, allowed.stderr


@pytest.mark.parametrize(
    "value",
    [
        'kubeletPlugin.options.logLevel="debug"',
        'kubeletPlugin.options.nvml="sim:vm-h200"',
        "controller.options.leaseSeconds=3",
    ],
)
def test_good_values_render(helm: str, value: str) -> None:
    rendered = _template(helm, value)
    assert rendered.returncode == 0, rendered.stderr
