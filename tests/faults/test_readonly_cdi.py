"""A CDI root that turns read-only under a running claim, then writable again.

The CDI root is made read-only by a real read-only bind mount of it onto itself (the test runs as root
in CI and in the dev container). Where mounting is not allowed, the same calls get EROFS injected
(`inject.py`), and the test says so in its output.

- a prepare fails with an error naming the CDI root, and is rolled back: no checkpoint entry, the
  GPU's time-slice back to Default (even though the rollback cannot unlink anything on the root);
- an unprepare whose spec cannot be deleted fails with such an error; its GPU settings are undone;
  its entry stays UnprepareStarted and keeps its devices (a spec naming them still exists), so a
  claim for them is refused; a restart in that state keeps it so;
- once the root is writable again, the kubelet's retries complete and the node is clean.
"""

from __future__ import annotations

import errno
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.errors import ClaimError, GpudraError
from tests.faults.auditor import audit
from tests.faults.inject import FileSystemFaults
from tests.faults.node import REFS, SimNode, uid

RUNNING, NEW, COMPETING = uid(1), uid(9), uid(2)  # gpu-0 Long; gpu-7 Medium; gpu-0


class ReadOnlySwitch:
    """Turns a directory read-only and back: a real bind mount when allowed, else injected EROFS."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = path
        self.mounted = _mount("--bind", str(path), str(path))
        self.how = (
            "a read-only bind mount" if self.mounted else "injected EROFS (mounting is not allowed here)"
        )
        self._faults = None if self.mounted else FileSystemFaults([path], monkeypatch, unlink=True)

    def read_only(self) -> None:
        if self._faults is None:
            assert _mount("-o", "remount,bind,ro", str(self.path))
        else:
            self._faults.arm(1, errno=errno.EROFS, persistent=True)

    def writable(self) -> None:
        if self._faults is None:
            assert _mount("-o", "remount,bind,rw", str(self.path))
        else:
            self._faults.disarm()

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.path)], check=True)


def _mount(*args: str) -> bool:
    try:
        return subprocess.run(["mount", *args], capture_output=True, check=False).returncode == 0
    except FileNotFoundError:
        return False


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode(tmp_path, in_process_tools=True)


@pytest.fixture
def switch(node: SimNode, monkeypatch: pytest.MonkeyPatch) -> Iterator[ReadOnlySwitch]:
    switch = ReadOnlySwitch(node.cdi_root, monkeypatch)
    print(f"read-only CDI root: {switch.how}")
    try:
        yield switch
    finally:
        switch.writable()
        switch.close()


def test_a_read_only_cdi_root_fails_calls_cleanly_until_it_is_writable(
    node: SimNode, switch: ReadOnlySwitch
) -> None:
    state = node.state()
    state.prepare(REFS[RUNNING])
    switch.read_only()
    names_the_root = f"in the CDI root {re.escape(str(node.cdi_root))}: Read-only file system"

    with pytest.raises(GpudraError, match=names_the_root):
        state.prepare(REFS[NEW])
    assert NEW not in state.prepared_claims() and NEW not in node.entries()  # rolled back
    assert node.timeslices()[node.gpu_uuid("gpu-7")] == 0
    assert audit(node, settled=True) == []

    with pytest.raises(GpudraError, match=names_the_root):
        state.unprepare(REFS[RUNNING])
    assert state.prepared_claims()[RUNNING].state == node.entries()[RUNNING].state == "UnprepareStarted"
    assert node.specs() == {RUNNING}  # the spec still names gpu-0, so the claim keeps it
    assert node.timeslices()[node.gpu_uuid("gpu-0")] == 0  # its settings are undone
    with pytest.raises(ClaimError, match="gpu-0 is already prepared for ResourceClaim"):
        state.prepare(REFS[COMPETING])
    assert audit(node, settled=False) == []

    restarted = node.state()  # a restart on the read-only root keeps the claim as it is
    assert restarted.prepared_claims()[RUNNING].state == "UnprepareStarted"
    assert node.specs() == {RUNNING}
    with pytest.raises(ClaimError, match="gpu-0 is already prepared for ResourceClaim"):
        restarted.prepare(REFS[COMPETING])

    switch.writable()
    restarted.unprepare(REFS[RUNNING])  # the kubelet's retries
    restarted.prepare(REFS[NEW])
    restarted.prepare(REFS[COMPETING])
    assert set(node.entries()) == node.specs() == {NEW, COMPETING}
    assert audit(node, settled=True) == []
    for claim_uid in (NEW, COMPETING):
        restarted.unprepare(REFS[claim_uid])
    assert (node.entries(), node.specs(), audit(node, settled=True)) == ({}, set(), [])
