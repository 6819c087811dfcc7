"""docs/architecture.md is the map of the code: every module and every crash point is on it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "src" / "gpudra"
DOC = (REPO / "docs" / "architecture.md").read_text()


def modules() -> list[str]:
    """Every module but the generated stubs and the empty `__init__.py` of a folder (the folder is named)."""
    return sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "_proto" not in path.parts and path.read_text().strip()
    )


def crash_points() -> set[str]:
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        found.update(re.findall(r'faults\.reached\("([^"]+)"\)', path.read_text()))
    return found


def test_every_module_is_on_the_map() -> None:
    missing = [module for module in modules() if f"`{module}`" not in DOC]
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"


def test_every_crash_point_is_on_the_map() -> None:
    points = crash_points()
    assert len(points) >= 10  # the scan finds them: prepare and unprepare have this many steps at least
    missing = sorted(point for point in points if f"`{point}`" not in DOC)
    assert not missing, f"docs/architecture.md does not name the crash points: {', '.join(missing)}"


def test_the_map_names_no_module_that_is_gone() -> None:
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)`", DOC))
    known = set(modules())
    gone = sorted(name for name in named if name not in known and not (REPO / name).exists())
    assert not gone, f"docs/architecture.md names modules that do not exist: {', '.join(gone)}"
