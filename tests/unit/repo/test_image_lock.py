"""The image's pinned dependency set (deploy/image/requirements.lock, made by `make lock`) covers every
runtime dependency in pyproject.toml at a version pyproject.toml allows, pins each package exactly with
hashes (the Dockerfile installs it with pip --require-hashes), and holds no dev or bench tool."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[3]
LOCK = REPO / "deploy" / "image" / "requirements.lock"
# The image's interpreter: markers are evaluated for it.
IMAGE_PYTHON = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux"}


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project


def _lock() -> dict[NormalizedName, tuple[Version, list[str]]]:
    """name -> (pinned version, hashes), from pip-compile's `name==version \\ --hash=sha256:...` entries."""
    pins: dict[NormalizedName, tuple[Version, list[str]]] = {}
    for raw in LOCK.read_text().replace("\\\n", " ").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        assert not requirement.startswith("-"), f"lock holds an option, not a pin: {line}"
        req = Requirement(requirement)
        [spec] = list(req.specifier)
        assert spec.operator == "==", f"{requirement} is not an exact pin"
        assert all(opt.startswith("--hash=sha256:") for opt in options), line
        name = canonicalize_name(req.name)
        assert name not in pins, f"{name} pinned twice"
        pins[name] = (Version(spec.version), options)
    return pins


def test_every_runtime_dependency_is_pinned_at_a_version_pyproject_allows() -> None:
    pins = _lock()
    for dependency in _project()["dependencies"]:
        req = Requirement(dependency)
        if req.marker is not None and not req.marker.evaluate(IMAGE_PYTHON):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in {LOCK.name}: run make lock"
        version, _ = pins[name]
        assert req.specifier.contains(version, prereleases=True), (
            f"{LOCK.name} pins {req.name}=={version}, pyproject.toml wants {req.specifier}: run make lock"
        )


def test_every_pin_is_exact_and_hashed() -> None:
    pins = _lock()
    assert pins
    for name, (_, hashes) in pins.items():
        assert hashes, f"{name} has no --hash"


def test_no_dev_or_bench_tool_is_in_the_image() -> None:
    runtime = {canonicalize_name(Requirement(d).name) for d in _project()["dependencies"]}
    pins = _lock()
    for extra, dependencies in _project()["optional-dependencies"].items():
        for dependency in dependencies:
            name = canonicalize_name(Requirement(dependency).name)
            assert name in runtime or name not in pins, f"{name} (extra {extra}) is in {LOCK.name}"
