"""Each test layer's default timeout, for pytest-timeout.

Every folder of tests (a layer: unit, faults, integration, e2e, compat, gpu) has a conftest.py whose
pytest_collection_modifyitems hook calls `default_timeout` with its own number of seconds:

    TIMEOUT = 90

    def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
        default_timeout(config, items, layer=Path(__file__).parent, seconds=TIMEOUT)

It gives the layer's tests a timeout marker, except where one is already there: a test's own
@pytest.mark.timeout (or its class's or module's pytestmark) wins. A timeout asked for when pytest is
run (--timeout, or PYTEST_TIMEOUT) wins too, as for a debugging session with --timeout=0. The `timeout`
in pyproject.toml stays for tests outside every layer.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest


def default_timeout(
    config: pytest.Config, items: Sequence[pytest.Item], *, layer: Path, seconds: float
) -> None:
    """Mark every test under `layer` that has no timeout of its own with `seconds`.

    The hook of each conftest.py sees every collected test of the run, not only its folder's: hence
    `layer`, the folder whose tests this layer's default is for."""
    if config.getoption("timeout", None) is not None or os.environ.get("PYTEST_TIMEOUT"):
        return
    for item in items:
        if item.path.is_relative_to(layer) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds))
