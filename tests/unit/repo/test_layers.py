"""Every test layer has its own default timeout (tests/layers.py), and a test's own timeout wins."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any, cast

import pytest

from tests.layers import default_timeout
from tests.unit.conftest import TIMEOUT as UNIT_TIMEOUT

TESTS = Path(__file__).resolve().parents[2]


def layer_timeouts() -> dict[str, int]:
    """Each folder of tests/ holding tests (in it or in its subfolders) -> the TIMEOUT its conftest.py gives
    default_timeout."""
    found: dict[str, int] = {}
    for layer in sorted({TESTS / path.relative_to(TESTS).parts[0] for path in TESTS.glob("*/**/test_*.py")}):
        conftest = layer / "conftest.py"
        assert conftest.exists(), f"tests/{layer.name} has tests but no conftest.py setting their timeout"
        tree = ast.parse(conftest.read_text())
        hooks = [
            n
            for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.name == "pytest_collection_modifyitems"
        ]
        calls = [
            call
            for hook in hooks
            for call in ast.walk(hook)
            if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "default_timeout"
        ]
        assert calls, (
            f"tests/{layer.name}/conftest.py: pytest_collection_modifyitems calls no default_timeout"
        )
        [seconds] = [
            node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and [getattr(target, "id", None) for target in node.targets] == ["TIMEOUT"]
            and isinstance(node.value, ast.Constant)
        ]
        assert isinstance(seconds, int), f"tests/{layer.name}/conftest.py: TIMEOUT is not a number of seconds"
        found[layer.name] = seconds
    return found


def test_every_layer_sets_its_own_default_timeout_and_unit_tests_have_the_shortest() -> None:
    timeouts = layer_timeouts()
    assert {"unit", "faults", "integration", "e2e", "compat", "gpu"} <= set(timeouts)
    assert timeouts["unit"] == UNIT_TIMEOUT == min(timeouts.values())
    # What cannot be timed on a developer's machine keeps what every test had before (pyproject.toml).
    assert all(timeouts[layer] >= 600 for layer in ("integration", "e2e", "compat", "gpu"))


def _asked_when_run(config: pytest.Config) -> bool:
    return config.getoption("timeout", None) is not None or bool(os.environ.get("PYTEST_TIMEOUT"))


def test_a_unit_test_without_a_timeout_of_its_own_gets_the_unit_layer_s(
    request: pytest.FixtureRequest,
) -> None:
    if _asked_when_run(request.config):
        pytest.skip("a timeout was asked for when pytest was run: it wins over the layer's")
    [marker] = request.node.iter_markers("timeout")
    assert marker.args == (UNIT_TIMEOUT,)


@pytest.mark.timeout(UNIT_TIMEOUT + 7)
def test_a_test_s_own_timeout_wins_over_the_layer_s(request: pytest.FixtureRequest) -> None:
    [marker] = request.node.iter_markers("timeout")
    assert marker.args == (UNIT_TIMEOUT + 7,)


class _Item:
    """What default_timeout reads of a pytest.Item."""

    def __init__(self, path: Path, *marks: pytest.MarkDecorator) -> None:
        self.path = path
        self.markers = [mark.mark for mark in marks]

    def get_closest_marker(self, name: str) -> Any:
        return next((marker for marker in self.markers if marker.name == name), None)

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.markers.append(mark.mark)


class _Config:
    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout

    def getoption(self, name: str, default: Any = None) -> Any:
        return self.timeout if name == "timeout" else default


@pytest.mark.parametrize("asked", [None, 0, 5], ids=["nothing-asked", "timeout-0-asked", "timeout-5-asked"])
def test_only_the_layer_s_tests_without_a_timeout_get_its_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: float | None
) -> None:
    monkeypatch.delenv("PYTEST_TIMEOUT", raising=False)
    layer = tmp_path / "unit"
    plain, own, elsewhere = (
        _Item(layer / "test_a.py"),
        _Item(layer / "test_b.py", pytest.mark.timeout(3)),
        _Item(tmp_path / "faults" / "test_c.py"),
    )
    items = cast(list[pytest.Item], [plain, own, elsewhere])
    default_timeout(cast(pytest.Config, _Config(asked)), items, layer=layer, seconds=60)
    assert [m.args for m in plain.markers] == ([] if asked is not None else [(60,)])
    assert [m.args for m in own.markers] == [(3,)]
    assert elsewhere.markers == []


def test_a_timeout_in_the_environment_wins_over_the_layer_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_TIMEOUT", "900")
    plain = _Item(tmp_path / "test_a.py")
    default_timeout(
        cast(pytest.Config, _Config(None)), cast(list[pytest.Item], [plain]), layer=tmp_path, seconds=60
    )
    assert plain.markers == []
