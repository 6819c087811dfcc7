"""For every layer: the root logger as each test found it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """A command run in-process (`cli.main([...daemon...])`) configures logging as the daemon does: its
    handler replaces pytest's and its --log-level stays on the root logger. Left so, a later test in
    the same worker captures no warnings (caplog) and fails for another test's reason (seen:
    test_health's probe-failure test after test_cli_bad_input's daemon test with --log-level=ERROR)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
