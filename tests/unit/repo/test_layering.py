"""Code rules no linter checks: log context keys, the pinned config API, a layer for every top-level module
(import rules: .importlinter)."""

from __future__ import annotations

import ast
import configparser
from pathlib import Path

import gpudra.api

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "src" / "gpudra"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> list[Path]:
    return [p for p in SRC.rglob("*.py") if "_proto" not in p.parts]


def test_the_config_api_surface_is_pinned() -> None:
    """resource.gpudra.io/v1beta1 is what users program against: a change is deliberate."""
    assert sorted(gpudra.api.__all__) == [
        "API_VERSION",
        "Advice",
        "DeviceConfig",
        "GpuConfig",
        "GpuSharing",
        "MigDeviceConfig",
        "MigDeviceSharing",
        "MpsConfig",
        "TimeSlicingConfig",
        "config_advice",
        "config_problems",
        "decode_config",
        "write_schemas",
    ]


_RESERVED = set(vars(__import__("logging").makeLogRecord({}))) | {"message", "asctime"}


def test_log_context_keys_never_collide_with_logrecord_attributes() -> None:
    """logging raises KeyError for `extra` keys such as 'name' or 'created', which would turn a log
    line into a failed gRPC call or a dead controller thread."""
    clashes = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            named_extra = (isinstance(node, ast.keyword) and node.arg == "extra") or (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "extra" for t in node.targets)
            )
            value = getattr(node, "value", None)
            if named_extra and isinstance(value, ast.Dict):
                keys = {str(k.value) for k in value.keys if isinstance(k, ast.Constant)}
                clashes += [f"{_module_name(path)}:{value.lineno}: {k}" for k in keys & _RESERVED]
    assert clashes == []


def test_every_top_level_module_has_a_layer() -> None:
    """import-linter checks only the modules its layers name: a new folder or module left out of
    .importlinter's `layers` contract could import anything."""
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    named = {
        name.strip()
        for line in config["importlinter:contract:layers"]["layers"].split("\n")
        for name in line.split("|")
        if name.strip()
    }
    top_level = {
        f"gpudra.{p.stem}"
        for p in SRC.iterdir()
        if (p.suffix == ".py" or (p / "__init__.py").exists())
        and p.stem not in ("__init__", "__main__", "_proto")
    }
    assert top_level - named == set()
    assert named - top_level == set()
