"""One version, from pyproject.toml: `gpudra --version` and the `gpudra_build_info` series say it, with
the revision the image's GPUDRA_REVISION names."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpudra import build, cli
from gpudra.runtime.metrics import DaemonMetrics

REPO = Path(__file__).resolve().parents[3]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_the_version_is_pyprojects() -> None:
    assert build.version() == VERSION


def test_gpudra_version_prints_version_and_revision(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUDRA_REVISION", "0123abc")
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"gpudra {VERSION} (revision 0123abc)\n"


def test_a_build_without_revision_says_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUDRA_REVISION", raising=False)
    assert build.revision() == "unknown"
    monkeypatch.setenv("GPUDRA_REVISION", "")
    assert build.revision() == "unknown"


def test_every_daemon_exports_its_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDRA_REVISION", "0123abc")
    registry = DaemonMetrics().registry
    assert registry.get_sample_value("gpudra_build_info", {"version": VERSION, "revision": "0123abc"}) == 1
