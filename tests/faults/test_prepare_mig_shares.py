"""Shares of a MIG partition prepared on a simulated H100: the first share creates the partition, each
share gets an MPS daemon that sees the MIG device only, with its consumed capacity as limits, the
exclusive form of the placement is refused meanwhile, and the last share out destroys the partition,
counting from the checkpoint; SIGKILL at every step, then restart, leaves no orphan and destroys nothing
a share still holds."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from gpudra.errors import ClaimError
from gpudra.node import faults
from gpudra.node.allocation import ClaimRef
from gpudra.sim import state as sim_state
from tests.unit.claims import resource_claim, result
from tests.unit.harness.crash import child
from tests.unit.harness.mig import instances, mig_claim, recorded
from tests.unit.harness.mps import (
    daemons,
    kill_leftover_daemons,  # noqa: F401 (an autouse fixture: every test kills the daemons it left)
    mps_root,
)
from tests.unit.harness.node import Node, uid

SHARED = "gpu-2-mig-1g10gb-6-shared"
EXCLUSIVE = "gpu-2-mig-1g10gb-6"
SHARE_IDS = ("5f0c3a8e-1b2d-4c6e-8f90-a1b2c3d4e5f6", "6a1d4b9f-2c3e-4d7f-9a01-b2c3d4e5f6a7")


def share_claim(n: int, memory: str = "4Gi", compute: str = "30") -> dict[str, Any]:
    share = {
        **result("mig", SHARED),
        "shareID": SHARE_IDS[n - 1],
        "consumedCapacity": {"memory": memory, "compute": compute},
    }
    return resource_claim(uid(n), results=[share])


@pytest.fixture
def h100(tmp_path: Path) -> Node:
    return Node(tmp_path, "dgx-h100")


def mig_uuid(node: Node) -> str:
    [(_, uuid)] = instances(node, 2).values()
    return uuid


def test_two_shares_run_in_one_partition_with_mps_limits_and_the_last_one_out_destroys_it(
    h100: Node,
) -> None:
    state = h100.state()
    first = h100.claims.add(share_claim(1, "4Gi", "30"))
    second = h100.claims.add(share_claim(2, "5Gi", "60"))
    [one] = state.prepare(first)
    assert one.mig is not None and one.mig.live is not None and one.share_id == SHARE_IDS[0]
    created = one.mig.live
    assert instances(h100, 2) == {6: (one.mig.spec.profile_id, created.uuid)}
    [two] = state.prepare(second)
    assert two.mig is not None and two.mig.live == created  # joined, not created again
    assert len(instances(h100, 2)) == 1

    # each share's daemon sees the MIG device only, with its consumed capacity as its limits
    found = {d.pipe_directory: d for d in daemons(h100)}
    for n, (threads, limit) in ((1, (30.0, 4 * 2**30)), (2, (60.0, 5 * 2**30))):
        daemon = found[str(mps_root(h100, uid(n)) / "pipe")]
        assert daemon.visible_devices == created.uuid
        assert daemon.default_active_thread_percentage == threads
        assert daemon.default_pinned_memory_limits == {created.uuid: f"{limit // 2**20}M"}

    # the exclusive form of the placement is refused while shares hold it
    exclusive = h100.claims.add(mig_claim(3, EXCLUSIVE))
    with pytest.raises(ClaimError, match=f"{EXCLUSIVE} \\(its placement is prepared as {SHARED}\\)"):
        state.prepare(exclusive)

    state.unprepare(first)
    assert instances(h100, 2) == {6: (one.mig.spec.profile_id, created.uuid)}  # the second still runs
    assert [d.pipe_directory for d in daemons(h100)] == [str(mps_root(h100, uid(2)) / "pipe")]
    # a restart counts from the checkpoint: the partition stays for the share that holds it
    restarted = h100.state()
    assert instances(h100, 2) == recorded(h100, 2)
    restarted.unprepare(second)
    assert instances(h100, 2) == {} and h100.entries() == {} and daemons(h100) == []
    restarted.prepare(exclusive)  # the placement is free again, for either form
    assert len(instances(h100, 2)) == 1


def test_a_share_whose_partition_vanished_is_refused(h100: Node) -> None:
    state = h100.state()
    first = h100.claims.add(share_claim(1))
    state.prepare(first)
    uuid = mig_uuid(h100)
    with sim_state.StateFile(h100.state_file).update() as machine:
        gpu = next(g for g in machine.gpus if g.uuid == h100.uuid(2))
        gpu.gpu_instances.clear()
    with pytest.raises(ClaimError, match=f"MIG device {uuid}, which another share of this partition created"):
        state.prepare(h100.claims.add(share_claim(2)))


def _two_shares(node: Node) -> tuple[ClaimRef, ClaimRef]:
    return node.claims.add(share_claim(1)), node.claims.add(share_claim(2))


@pytest.mark.parametrize("step", faults.PREPARE_STEPS)
@pytest.mark.parametrize("which", ["first", "second"])
def test_a_crash_preparing_a_share_leaves_no_orphan_and_keeps_the_other_share(
    h100: Node, step: str, which: str
) -> None:
    first, second = _two_shares(h100)
    if which == "second":
        h100.state().prepare(first)
    crashing = first if which == "first" else second
    crashed = child(h100, "prepare", crashing, step)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    restarted = h100.state()
    if which == "second" or step == "prepare-completed":
        assert len(instances(h100, 2)) == 1 and instances(h100, 2) == recorded(h100, 2)
    else:
        assert instances(h100, 2) == {} and h100.entries() == {}  # rolled back, nothing orphaned
    restarted.prepare(crashing)  # the kubelet's retry completes
    restarted.prepare(first)
    assert len(instances(h100, 2)) == 1 and instances(h100, 2) == recorded(h100, 2)
    restarted.unprepare(first)
    restarted.unprepare(second)
    assert instances(h100, 2) == {} and h100.entries() == {} and daemons(h100) == []


@pytest.mark.parametrize("step", faults.UNPREPARE_STEPS)
@pytest.mark.parametrize("which", ["not-last", "last"])
def test_a_crash_unpreparing_a_share_destroys_the_partition_only_with_the_last(
    h100: Node, step: str, which: str
) -> None:
    first, second = _two_shares(h100)
    state = h100.state()
    state.prepare(first)
    state.prepare(second)
    if which == "last":
        state.unprepare(second)
    crashed = child(h100, "unprepare", first, step)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    # never destroyed while the other share holds it, whatever step the crash hit
    assert (len(instances(h100, 2)) == 1) == (which == "not-last" or step in faults.UNPREPARE_STEPS[:2])

    restarted = h100.state()  # finishes the unprepare
    assert uid(1) not in h100.entries()
    if which == "not-last":
        assert len(instances(h100, 2)) == 1 and instances(h100, 2) == recorded(h100, 2)
        restarted.unprepare(second)
    assert instances(h100, 2) == {} and h100.entries() == {} and daemons(h100) == []
