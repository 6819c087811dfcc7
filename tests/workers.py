"""How `make check` and `make test` spread the tests over pytest-xdist's workers (`--dist loadgroup`).

Each test is a work unit of its own, so that the long ones (a SIGKILL at every MPS step, a 50-pod load)
start as early as a worker is free and none waits behind another in its module, except:
- the tests of a module that defines a module- or class-scoped fixture (a controller, a browser, Kueue,
  a corpus read once) are one unit, so that the fixture is made once, not once per worker that draws one
  of its tests;
- the compat layer is one unit: its demo is one session fixture for both of its modules.
A session-scoped fixture (the integration layer's three-node cluster) is made once per worker that needs
it: each worker has its own cluster, and no test sees another's objects.

Units are handed out in collection order, so the modules whose tests take a minute or more (FIRST, from
`make test`'s --durations) are moved to the front: started last, one of them would run alone at the end
while the other workers sit idle.

pytest-xdist's own loadgroup reads `xdist_group` marks into the node id, which pytest 9 no longer lets a
plugin rewrite (`Item._nodeid` is gone): the grouping is decided here, on the controller, from the node
ids and the test modules' text.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

ROOT = Path(__file__).resolve().parents[1]
WHOLE_LAYERS = ("tests/compat/",)
# A fixture made once per module or class: `@pytest.fixture(scope="module")`, and the class form.
NARROW_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*scope\s*=\s*["'](module|class|package)["']""")


# The longest tests of make test (2026-12-02, 3 workers on 2 cores): 172, 94, 92, 79 and 76 s.
FIRST = (
    "tests/faults/test_random_kills.py",
    "tests/integration/test_apiserver_outage.py",
    "tests/integration/test_bench_smoke.py",
    "tests/integration/test_prometheus_demo.py",
    "tests/integration/test_demo.py",
)


def longest_first(nodeids: list[str]) -> list[int]:
    """The order to run the tests in: FIRST's modules' tests, then the rest as collected (stable)."""

    def rank(index: int) -> tuple[int, int]:
        module = nodeids[index].split("::", 1)[0]
        return (FIRST.index(module) if module in FIRST else len(FIRST), index)

    return sorted(range(len(nodeids)), key=rank)


@cache
def shares_a_narrow_fixture(module: str) -> bool:
    """Whether the test module at `module` (relative to the checkout) defines a fixture made once per
    module or class."""
    path = ROOT / module
    return path.is_file() and NARROW_FIXTURE.search(path.read_text()) is not None


def work_unit(nodeid: str) -> str:
    """The unit a test is scheduled in: its layer, its module, or itself (see the module's docstring)."""
    module = nodeid.split("::", 1)[0]
    for layer in WHOLE_LAYERS:
        if module.startswith(layer):
            return layer
    return module if shares_a_narrow_fixture(module) else nodeid


class FixtureScopeScheduling(LoadScopeScheduling):
    """xdist's scope scheduling (a unit goes whole to one worker) with `work_unit` as the scope."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)
