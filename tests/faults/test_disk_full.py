"""Disk full at every write of prepare and unprepare, in turn.

A scenario of prepares (competing and admin claims included) and unprepares runs on a simulated node.
Each of its calls is tried with ENOSPC injected at its 1st file-system write (see `inject.py`: file
creation, data, fsync, rename, mkdir under the CDI root and the state directory), then at its 2nd, and
so on until the call has no write left to fail. After every injected failure:

- the call fails with an error that says what could not be written and why;
- memory equals disk: `prepared_claims()` is what the checkpoint file holds;
- the auditor passes (half-done entries allowed: the kubelet retries);
- a fresh plugin started on a copy of that node's files and GPUs recovers to the same prepared claims
  and leaves nothing half done;
- once the disk has room again, the kubelet's retry of the call completes, and the call's inverse
  puts the node back as it was, for the next write to fail.

Two disks: one that stays full until the test frees it (the rollback's own writes fail too), and one
where only the k-th write fails (the rollback runs, so a failed prepare must leave nothing behind).
"""

from __future__ import annotations

import errno
import itertools
import shutil
from pathlib import Path

import pytest

from gpudra.errors import ClaimError, GpudraError
from gpudra.node.prepare import DeviceState
from tests.faults.auditor import audit
from tests.faults.inject import FileSystemFaults
from tests.faults.node import CLAIMS, REFS, SimNode, non_admin_devices, uid

DEVICES = {claim["metadata"]["uid"]: non_admin_devices(claim) for claim in CLAIMS}

# (call, claim): claim 2 competes with claim 1 for gpu-0, claim 8 is an admin claim on gpu-0
SCENARIO = [
    ("prepare", uid(1)),
    ("prepare", uid(3)),
    ("prepare", uid(2)),  # refused while 1 holds gpu-0
    ("prepare", uid(8)),
    ("unprepare", uid(1)),
    ("prepare", uid(2)),
    ("unprepare", uid(3)),
    ("unprepare", uid(2)),
    ("unprepare", uid(8)),
    ("unprepare", uid(8)),  # again: nothing to do
]
INVERSE = {"prepare": "unprepare", "unprepare": "prepare"}


def call(state: DeviceState, op: str, claim_uid: str) -> str:
    try:
        if op == "prepare":
            state.prepare(REFS[claim_uid])
        else:
            state.unprepare(REFS[claim_uid])
    except ClaimError as err:
        assert "is already prepared for ResourceClaim" in str(err), err
        return "refused"
    return "ok"


@pytest.mark.parametrize("persistent", [True, False], ids=["disk-stays-full", "one-write-fails"])
def test_disk_full_at_every_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, persistent: bool) -> None:
    node = SimNode(tmp_path / "node", in_process_tools=True)
    faults = FileSystemFaults([node.cdi_root, node.state_dir], monkeypatch)
    state = node.state()
    prepared: set[str] = set()
    injected: list[str] = []
    for op, claim_uid in SCENARIO:
        holders = {other for other in prepared - {claim_uid} if DEVICES[other] & DEVICES[claim_uid]}
        expected = "refused" if op == "prepare" and holders else "ok"
        for k in itertools.count(1):
            where = f"{op} {claim_uid}, write {k}"
            faults.arm(k, errno=errno.ENOSPC, persistent=persistent)
            try:
                outcome = call(state, op, claim_uid)
            except GpudraError as err:
                assert faults.failed, f"{where}: failed with no write failing: {err}"
                assert "No space left on device" in str(err), f"{where}: {err}"
            else:
                assert not faults.failed, f"{where}: {faults.failed} failed, yet the call returned"
                assert outcome == expected, where
                break
            finally:
                faults.disarm()
            injected.append(f"{where}: {faults.failed[0]}")
            where = f"{where} ({faults.failed[0]})"

            assert state.prepared_claims() == node.entries(), f"{where}: memory is not disk"
            assert audit(node, settled=False) == [], where
            if op == "prepare" and not persistent:  # the rollback ran: nothing of the claim is left
                assert claim_uid not in state.prepared_claims(), where
            _recovers_from(node, state, tmp_path / f"copy-{len(injected)}", where)

            assert call(state, op, claim_uid) == expected, where  # the kubelet's retry, with room again
            assert audit(node, settled=True) == [], where
            assert state.prepared_claims() == node.entries(), where
            if expected == "ok":  # back to where the call started, to fail its next write
                assert call(state, INVERSE[op], claim_uid) == "ok", where
        if expected == "ok":
            (prepared.add if op == "prepare" else prepared.discard)(claim_uid)
        assert set(state.prepared_claims()) == prepared
    assert node.entries() == {} and node.specs() == set() and audit(node, settled=True) == []
    print(f"disk full ({'stays full' if persistent else 'one write'}): {len(injected)} writes failed in turn")
    assert len(injected) > 50  # every call's writes, not just the first


def _recovers_from(node: SimNode, state: DeviceState, root: Path, where: str) -> None:
    """A plugin restarted on these files and GPUs keeps every completed claim and settles the rest: a
    claim that changes no GPU and whose spec is gone (its unprepare or rollback deleted the spec, then
    could not save) is finished too."""
    copy = node.copy(root)
    completed = {
        uid: e
        for uid, e in state.prepared_claims().items()
        if e.state == "PrepareCompleted" and (uid in node.specs() or e.changes_gpus)
    }
    assert copy.state().prepared_claims() == completed, where
    assert audit(copy, settled=True) == [], where
    shutil.rmtree(root)
