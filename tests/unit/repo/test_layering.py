"""Code rules no linter checks: log context keys, the pinned config API, a layer for every top-level module
(import rules: .importlinter), and no test module imported by another (helpers live in the harness)."""

from __future__ import annotations

import ast
import configparser
from pathlib import Path

import gpudra.api

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "src" / "gpudra"
TESTS = REPO / "tests"


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


def _test_modules_imported(path: Path, source: str) -> list[str]:
    """The test modules (tests/**/test_*.py) that the module at `path` imports, by dotted name: each
    `import`, and each `from X import Y` as X and as X.Y (Y may be a module), relative ones resolved
    from the module's package."""
    package = path.relative_to(REPO).parent.parts
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else ()
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found += [
            name
            for name in names
            if name.rsplit(".", 1)[-1].startswith("test_")
            and REPO.joinpath(*name.split(".")).with_suffix(".py").is_file()
        ]
    return found


def test_no_module_under_tests_imports_a_test_module() -> None:
    """A helper that two test modules share lives in a harness module (tests/unit/harness/,
    tests/integration/*.py without the test_ prefix, tests/localcluster/), not in one of the test
    modules: importing a test module runs its module-level setup and hands its fixtures and tests to
    the importer's namespace, and ties one test's edits to another's."""
    status_access = TESTS / "unit" / "controller" / "test_status_access.py"
    assert _test_modules_imported(status_access, "from .test_webhook import HERE") == [
        "tests.unit.controller.test_webhook"
    ]
    assert _test_modules_imported(status_access, "from tests.unit.node import test_prepare_mig") == [
        "tests.unit.node.test_prepare_mig"
    ]
    assert _test_modules_imported(status_access, "from tests.unit.harness.tls import HERE") == []
    found = {
        f"{path.relative_to(REPO)} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in _test_modules_imported(path, path.read_text())
    }
    assert found == set()
