"""The chart's values.schema.json is the CLI's options (scripts/gen_chart_schema.py), and the chart's
values, versions and option names agree with the code."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "deploy" / "helm" / "gpudra"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_chart_schema", REPO / "scripts" / "gen_chart_schema.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def test_the_committed_schema_is_the_generated_one() -> None:
    assert (CHART / "values.schema.json").read_text() == GEN.render(), "run: make chart-schema"


@pytest.mark.parametrize("command", ["kubelet-plugin", "controller"])
def test_every_cli_option_is_settable_or_set_by_the_chart(command: str) -> None:
    cli_options = set(GEN.options(command))
    owned = set(GEN.CHART_OWNED[command])
    assert owned <= cli_options, f"CHART_OWNED names options the CLI lacks: {owned - cli_options}"
    key = {"kubelet-plugin": "kubeletPlugin", "controller": "controller"}[command]
    settable = set(GEN.schema()["properties"][key]["properties"]["options"]["properties"])
    assert settable == {GEN.camel(o) for o in cli_options - owned}


@pytest.mark.parametrize("command", ["kubelet-plugin", "controller"])
def test_the_chart_sets_every_option_it_owns(command: str) -> None:
    """An option the schema leaves out because the chart sets it must really be set by a template
    (as GPUDRA_<OPTION>), or be one the container does not need (in-cluster config, chart-given URL)."""
    template = {"kubelet-plugin": "kubelet-plugin.yaml", "controller": "controller.yaml"}[command]
    text = (CHART / "templates" / template).read_text()
    unset_on_purpose = {"kubeconfig", "state-dir", "webhook-url", "metrics-address", "webhook-address"}
    for option in set(GEN.CHART_OWNED[command]) - unset_on_purpose:
        assert f"GPUDRA_{option.upper().replace('-', '_')}" in text, option


def test_the_default_values_use_only_known_options() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = GEN.schema()["properties"]
    for key in ("kubeletPlugin", "controller"):
        known = set(schema[key]["properties"]["options"]["properties"])
        assert set(values[key]["options"]) <= known
        assert set(values[key]) <= set(schema[key]["properties"])


def test_the_chart_versions_are_gpudras() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version == chart["version"]


def test_the_schema_gives_types_and_allowed_values() -> None:
    plugin = GEN.schema()["properties"]["kubeletPlugin"]["properties"]["options"]["properties"]
    assert plugin["migMode"]["enum"] == ["partitionable", "static", None]
    assert plugin["resyncSeconds"]["type"] == ["number", "null"]
    assert plugin["nvml"]["enum"][:2] == ["real", "sim:dgx-a100"]
    assert plugin["sharesPerGpu"]["anyOf"] == [
        {"type": "integer", "minimum": 2, "maximum": 64},
        {"const": 0},
        {"type": "null"},
    ]
    json.dumps(GEN.schema())  # serializable as written
