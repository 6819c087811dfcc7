"""For every layer: the root logger as each test found it, and a short base for tmp_path under xdist."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workers import FixtureScopeScheduling, longest_first

# The base directory this run's xdist workers were given, removed when the run passed.
_SHORT_BASETEMP = pytest.StashKey[Path]()


@pytest.hookimpl(tryfirst=True)  # before pytest's tmp_path plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (make check, make test) each worker's tmp_path is <basetemp>/popen-gwN/<test>:
    with pytest's default base (/tmp/pytest-of-USER/pytest-N) a claim's MPS sockets under a test's state
    directory outgrow the 107 bytes of a unix socket's address, and the plugin refuses the directory
    (rightly). The controller gives its workers /tmp/gd-XXXXXXXX instead, a fresh one per run: with
    popen-gwN/ below it, still shorter than a run without xdist gets. A run that passed removes it, a
    failed one leaves it to look at."""
    if config.option.basetemp or hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    base = Path(tempfile.mkdtemp(prefix="gd-", dir="/tmp"))
    config.option.basetemp = str(base)
    config.stash[_SHORT_BASETEMP] = base


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` (make check, make test): tests/workers.py's units."""
    if config.getoption("dist") != "loadgroup":
        return None
    return FixtureScopeScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the longest tests first (tests/workers.py). Every worker sorts alike, so
    their collections stay the same, as xdist requires."""
    if hasattr(config, "workerinput"):
        order = longest_first([item.nodeid for item in items])
        items[:] = [items[i] for i in order]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    base = session.config.stash.get(_SHORT_BASETEMP, None)
    if base is not None and exitstatus == 0:
        shutil.rmtree(base, ignore_errors=True)


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
