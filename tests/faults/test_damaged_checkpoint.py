"""A checkpoint damaged in every way we know of, under running claims, then a plugin restart.

Two claims run (three GPUs, time-sliced) when the checkpoint is damaged. What the restart must do is
in RELIABILITY.md:

- damaged (truncated, garbage, bad checksum, schema violation, wrong types, empty): the file is
  copied aside unchanged, and the running claims are rebuilt from their CDI specs: the specs stay,
  the GPUs keep their settings and stay taken (a claim for one of them is refused), the kubelet's
  repeated prepare of a running claim answers, and its unprepares leave the node clean;
- written by a newer gpudra (a newer version, a field this one does not know), or not a file
  (a directory at its path): nothing is changed and no claim is prepared or unprepared until the
  operator puts the right file back; then everything carries on.

Throughout, the auditor checks the node: no running claim's spec deleted, no GPU held twice.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpudra.errors import ClaimError, GpudraError
from gpudra.node import checkpoint as ckpt
from gpudra.node.prepare import DeviceState
from gpudra.node.recovery import recover
from tests.faults.auditor import audit
from tests.faults.node import REFS, SimNode, uid

RUNNING = (uid(1), uid(3))  # gpu-0 Long; gpu-1 and gpu-2 Medium
COMPETING = (uid(2), uid(4))  # gpu-0; gpu-2


def _checksum(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _edited(edit: Callable[[dict[str, Any]], None]) -> Callable[[bytes], bytes]:
    """A damage that changes `data` and signs it again: only the content is wrong."""

    def damage(good: bytes) -> bytes:
        data = json.loads(good)["data"]
        edit(data)
        return json.dumps({"checksum": _checksum(data), "data": data}).encode()

    return damage


def _bad_checksum(good: bytes) -> bytes:
    document = json.loads(good)
    document["checksum"] = "0" * 64
    return json.dumps(document).encode()


DAMAGED: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda good: good[: len(good) // 2],
    "garbage": lambda good: bytes(range(256)) * 8,
    "bad-checksum": _bad_checksum,
    "schema-violation": _edited(lambda data: data["claims"][uid(1)].update(state="Prepared")),
    "wrong-types": _edited(lambda data: data["claims"][uid(3)].update(devices="gpu-1")),
    "empty": lambda good: b"",
}
REFUSED: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "newer-version": (
        _edited(lambda data: data.update(version=ckpt.VERSION + 1)),
        "written by a newer gpudra",
    ),
    "unknown-field": (
        _edited(lambda data: data["claims"][uid(1)].update(mig_plan={"profile": "1g.10gb"})),
        "fields this gpudra does not know (claims.",
    ),
}


def _running(node: SimNode) -> tuple[DeviceState, bytes, dict[str, int]]:
    state = node.state()
    for claim_uid in RUNNING:
        state.prepare(REFS[claim_uid])
    assert audit(node, settled=True) == []
    return state, node.checkpoint_path.read_bytes(), node.timeslices()


def _still_running(node: SimNode, state: DeviceState, timeslices: dict[str, int]) -> None:
    assert node.specs() == set(RUNNING)
    assert node.timeslices() == timeslices
    assert set(state.prepared_claims()) == set(RUNNING)
    for claim_uid in COMPETING:
        with pytest.raises(ClaimError, match="is already prepared for ResourceClaim"):
            state.prepare(REFS[claim_uid])
    assert audit(node, settled=True) == []


def _unprepare_all(node: SimNode, state: DeviceState) -> None:
    for claim_uid in RUNNING:
        state.unprepare(REFS[claim_uid])
    assert (node.entries(), node.specs(), audit(node, settled=True)) == ({}, set(), [])


@pytest.mark.parametrize("damage", DAMAGED.values(), ids=DAMAGED)
def test_a_damaged_checkpoint_keeps_the_running_claims(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    node = SimNode(tmp_path, in_process_tools=True)
    _, good, timeslices = _running(node)
    damaged = damage(good)
    node.checkpoint_path.write_bytes(damaged)

    restarted = node.state()

    [moved] = node.state_dir.glob("checkpoint.json.corrupt-*")
    assert moved.read_bytes() == damaged
    # A spec does not say a claim's time-slice: the rebuild put the GPUs back to Default, which the
    # rebuilt entries (no time-slice record) say, and the repeated prepares leave them so.
    _still_running(node, restarted, dict.fromkeys(timeslices, 0))
    for claim_uid in RUNNING:  # the kubelet's repeated prepare reads the claim and records it in full
        devices = restarted.prepare(REFS[claim_uid])
        assert all(device.request_names for device in devices)
    assert node.timeslices() == dict.fromkeys(timeslices, 0)
    assert restarted.prepared_claims() == node.state().prepared_claims()  # and after another restart
    _unprepare_all(node, restarted)


@pytest.mark.parametrize(("damage", "why"), REFUSED.values(), ids=REFUSED)
def test_a_checkpoint_of_a_newer_gpudra_changes_nothing_until_it_is_replaced(
    tmp_path: Path, damage: Callable[[bytes], bytes], why: str
) -> None:
    node = SimNode(tmp_path, in_process_tools=True)
    _, good, timeslices = _running(node)
    newer = damage(good)
    node.checkpoint_path.write_bytes(newer)

    _refuses(node, why)
    assert node.checkpoint_path.read_bytes() == newer
    _operator_restores(node, good, timeslices)


def test_a_directory_at_the_checkpoint_path_changes_nothing_until_it_is_replaced(tmp_path: Path) -> None:
    node = SimNode(tmp_path, in_process_tools=True)
    _, good, timeslices = _running(node)
    node.checkpoint_path.unlink()
    node.checkpoint_path.mkdir()  # a hostPath mount gone wrong

    _refuses(node, "Is a directory")
    assert node.checkpoint_path.is_dir()
    node.checkpoint_path.rmdir()
    _operator_restores(node, good, timeslices)


def _refuses(node: SimNode, why: str) -> None:
    """The restarted plugin prepares and unprepares nothing, and changes nothing on the node."""
    specs, files = node.specs(), sorted(node.state_dir.iterdir())
    state = node.state(recover=False)
    try:
        recover(state)
    except GpudraError as err:  # refusing to start at all is a refusal too
        assert why in str(err)
    else:
        for call in (state.prepare, state.unprepare):
            with pytest.raises(GpudraError, match=re.escape(why)):
                call(REFS[uid(5)])
        with pytest.raises(GpudraError, match=re.escape(why)):
            state.unprepare(REFS[RUNNING[0]])
    assert node.specs() == specs and sorted(node.state_dir.iterdir()) == files


def _operator_restores(node: SimNode, good: bytes, timeslices: dict[str, int]) -> None:
    node.checkpoint_path.write_bytes(good)
    restarted = node.state()
    _still_running(node, restarted, timeslices)
    _unprepare_all(node, restarted)
