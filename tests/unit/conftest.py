"""The unit layer's default timeout (tests/layers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.layers import default_timeout

# The slowest unit test took 14 s (test_mps_keeper's loop that retries a failed MPS daemon restart),
# the whole suite running on two busy cores: 90 s is more than 5 times that.
TIMEOUT = 90


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default_timeout(config, items, layer=Path(__file__).parent, seconds=TIMEOUT)
