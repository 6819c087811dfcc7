"""The fault-injection layer's default timeout (tests/layers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.layers import default_timeout

# The slowest took 48 s (test_random_kills, SIGKILLs at random points of prepare and unprepare) on two
# busy cores: 300 s is more than 5 times that.
TIMEOUT = 300


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default_timeout(config, items, layer=Path(__file__).parent, seconds=TIMEOUT)
