"""The real-GPU layer's default timeout (tests/layers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.layers import default_timeout

# Real GPUs, MIG mode switches and MPS daemons on the device machine: as long as before the layers had
# their own timeouts.
TIMEOUT = 600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default_timeout(config, items, layer=Path(__file__).parent, seconds=TIMEOUT)
