"""JSON Schemas of the config kinds, generated from the pydantic models. I/O: writes the schema files.

The committed files under api/ are this module's output; a unit test keeps them in sync.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpudra.api.v1beta1 import KINDS, GpuConfig, MigDeviceConfig

_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def json_schema(model: type[GpuConfig] | type[MigDeviceConfig]) -> dict[str, Any]:
    """The JSON Schema of one kind's documents (JSON names, validation view)."""
    return {"$schema": _DIALECT, **model.model_json_schema(by_alias=True, mode="validation")}


def write_schemas(directory: Path) -> list[Path]:
    """Write `<kind lower-cased>.schema.json` for every kind into `directory`; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, model in KINDS.items():
        path = directory / f"{kind.lower()}.schema.json"
        path.write_text(json.dumps(json_schema(model), indent=2) + "\n")
        written.append(path)
    return written
