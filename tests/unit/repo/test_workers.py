"""How make check and make test spread tests over xdist's workers (tests/workers.py)."""

from __future__ import annotations

import pytest

from tests.workers import longest_first, shares_a_narrow_fixture, work_unit


@pytest.mark.parametrize(
    ("nodeid", "unit"),
    [
        # the compat layer's demo is one session fixture for both modules: one unit
        (
            "tests/compat/test_release.py::test_the_chart_passes_a_server_side_dry_run[sim-values]",
            "tests/compat/",
        ),
        ("tests/compat/test_quota.py::test_x", "tests/compat/"),
        # a module-scoped controller, browser or Kueue: the module is one unit
        (
            "tests/integration/test_controller.py::test_status_equals_a_hand_count",
            "tests/integration/test_controller.py",
        ),
        ("tests/integration/test_kueue.py::test_a", "tests/integration/test_kueue.py"),
        ("tests/unit/cli/test_cli_bad_input.py::test_a[x@y]", "tests/unit/cli/test_cli_bad_input.py"),
        # everything else goes test by test
        (
            "tests/faults/test_prepare_mps.py::test_a[plugin-fifo]",
            "tests/faults/test_prepare_mps.py::test_a[plugin-fifo]",
        ),
        ("tests/integration/test_shares.py::test_b", "tests/integration/test_shares.py::test_b"),
        ("tests/unit/repo/test_workers.py::test_c", "tests/unit/repo/test_workers.py::test_c"),
    ],
)
def test_each_test_is_its_own_unit_unless_it_shares_a_fixture_or_the_compat_demo(
    nodeid: str, unit: str
) -> None:
    assert work_unit(nodeid) == unit


def test_a_module_missing_from_the_checkout_is_no_group() -> None:
    assert not shares_a_narrow_fixture("tests/unit/test_no_such_module.py")


def test_the_longest_modules_go_first_and_the_rest_keep_their_order() -> None:
    nodeids = [
        "tests/compat/test_release.py::a",
        "tests/integration/test_demo.py::b",
        "tests/unit/test_x.py::c",
        "tests/faults/test_random_kills.py::d",
        "tests/unit/test_x.py::e",
    ]
    assert [nodeids[i].rsplit("::", 1)[1] for i in longest_first(nodeids)] == ["d", "b", "a", "c", "e"]
