"""The committed JSON Schemas under api/ are what the models generate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudra.api import write_schemas

API = Path(__file__).resolve().parents[3] / "api"
FILES = ["gpuconfig.schema.json", "migdeviceconfig.schema.json"]


def test_write_schemas_writes_one_file_per_kind(tmp_path: Path) -> None:
    assert [path.name for path in write_schemas(tmp_path / "out")] == FILES


@pytest.mark.parametrize("name", FILES)
def test_committed_schema_is_in_sync(tmp_path: Path, name: str) -> None:
    write_schemas(tmp_path)
    assert (API / name).read_text() == (tmp_path / name).read_text(), "run `make schemas` and commit api/"


@pytest.mark.parametrize(
    ("name", "kind", "sharing", "strategy"),
    [
        ("gpuconfig.schema.json", "GpuConfig", "GpuSharing", {"enum": ["TimeSlicing", "MPS"]}),
        (
            "migdeviceconfig.schema.json",
            "MigDeviceConfig",
            "MigDeviceSharing",
            {"enum": ["TimeSlicing", "MPS"]},  # TimeSlicing sets nothing on a MIG device, with a warning
        ),
    ],
    ids=["GpuConfig", "MigDeviceConfig"],
)
def test_schema_states_the_contract(name: str, kind: str, sharing: str, strategy: dict[str, object]) -> None:
    schema = json.loads((API / name).read_text())
    assert schema["required"] == ["apiVersion", "kind"]
    assert schema["properties"]["kind"]["const"] == kind
    assert strategy.items() <= schema["$defs"][sharing]["properties"]["strategy"].items()
    mps = schema["$defs"]["MpsConfig"]["properties"]
    assert mps["defaultActiveThreadPercentage"]["anyOf"][0] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 100,
    }
    assert schema["additionalProperties"] is False
    assert all(definition["additionalProperties"] is False for definition in schema["$defs"].values())


def test_module_entry_point(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "gpudra.api.schema", str(tmp_path)], check=True, capture_output=True
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == FILES
