"""The unit layer's default timeout (tests/layers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.layers import default_timeout

# Unit tests start no daemon, crash child or venv (those are tests/faults' and tests/integration's): the
# slowest took 14 s (test_validate's 100-level nesting) on two busy cores; 90 s is more than 5 times that.
TIMEOUT = 90


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default_timeout(config, items, layer=Path(__file__).parent, seconds=TIMEOUT)
