"""Which gpudra modules may import which third-party I/O libraries (DESIGN.md: one importer each)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "gpudra"

# library -> the only modules allowed to import it (generated stubs under _proto may import grpc too)
OWNERS = {
    "pynvml": {"gpudra.gpu.nvml"},
    "kubernetes": {"gpudra.kube.client"},
    "grpc": {"gpudra.node.kubelet_grpc"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def _sources() -> list[Path]:
    return [p for p in SRC.rglob("*.py") if "_proto" not in p.parts]


@pytest.mark.parametrize("library", sorted(OWNERS))
def test_library_has_one_importer(library: str) -> None:
    importers = {_module_name(p) for p in _sources() if library in _imported_roots(p)}
    assert importers <= OWNERS[library], f"{library} imported outside {OWNERS[library]}: {importers}"


def test_checker_sees_imports(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import pynvml\nfrom kubernetes import client\nfrom . import x\n")
    assert _imported_roots(sample) == {"pynvml", "kubernetes"}


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
                keys = {k.value for k in value.keys if isinstance(k, ast.Constant)}
                clashes += [f"{_module_name(path)}:{value.lineno}: {k}" for k in keys & _RESERVED]
    assert clashes == []
