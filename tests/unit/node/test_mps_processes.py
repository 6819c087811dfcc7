"""The /proc pass that finds claims' MPS daemons, on the simulator's fake /proc with thousands of processes,
some of them hostile (any container's processes are visible with `hostPID`): one pass answers for every
claim, reads a bounded head of each environment, and skips what vanished or reads as nonsense."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudra.gpu.tools import GpuTools
from gpudra.node.sharing import mps_daemons, mps_processes
from gpudra.node.sharing.mps_daemons import Daemon, MpsDaemons
from gpudra.node.sharing.mps_processes import ENVIRON_BYTES, DaemonMark
from gpudra.node.sharing.trash import Trash
from gpudra.sim import procfs

CLAIMS = 40
BYSTANDERS = 3000


def mark_of(claim: int, root: Path) -> DaemonMark:
    return DaemonMark(root / f"{claim:012x}" / "pipe", f"{claim:032x}")


def environ(*variables: str, tail: bytes = b"") -> bytes:
    return b"".join(os.fsencode(v) + b"\0" for v in variables) + tail


def marked(mark: DaemonMark) -> tuple[str, str]:
    assert mark.token is not None
    return f"{mps_processes.PIPE_VARIABLE}={mark.pipe}", f"{mps_processes.TOKEN_VARIABLE}={mark.token}"


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A fake /proc: CLAIMS daemons each with an MPS server, BYSTANDERS ordinary processes, and the hostile
    ones below (pids from 100000)."""
    root = tmp_path / "proc"
    mps = tmp_path / "mps"
    junk = b"KUBERNETES_SERVICE_PORT=443\0" * 20000  # a pod's service links: ~560 KiB
    for claim in range(CLAIMS):
        mark = mark_of(claim, mps)
        daemon = 10000 + 2 * claim
        procfs.write_process(root, daemon, environ=environ(*marked(mark), tail=junk), start_time=500 + claim)
        procfs.write_process(
            root, daemon + 1, environ=environ(*marked(mark)), comm=b"nvidia-cuda-mps", parent=daemon
        )
    for pid in range(20000, 20000 + BYSTANDERS):
        procfs.write_process(root, pid, environ=environ("PATH=/usr/bin", "HOME=/root"))
    hostile = mark_of(0, mps)
    pipe, token = marked(hostile)
    # A command name that closes its parenthesis, opens another and holds bytes that are no UTF-8.
    procfs.write_process(root, 100000, environ=environ(pipe), comm=b"x) Z 1 2 (\xff\n", start_time=1)
    # The claim's pipe and a forged token; the claim's pipe and token after more than the bound.
    procfs.write_process(root, 100001, environ=environ(pipe, f"{mps_processes.TOKEN_VARIABLE}={'f' * 32}"))
    procfs.write_process(root, 100002, environ=b"A=" + b"a" * ENVIRON_BYTES + b"\0" + environ(pipe, token))
    procfs.write_process(root, 100003, environ=environ(pipe, token), state="Z")  # exited, not reaped
    (root / "100004").mkdir()  # listed, then gone before its files were read
    procfs.write_process(root, 100005, environ=environ(pipe, token))
    (root / "100005" / "stat").write_bytes(b"100005 (garbage")  # no fields after the name
    return root


def test_one_pass_finds_every_claims_daemon_and_none_of_the_hostile_processes(
    tmp_path: Path, proc: Path
) -> None:
    survey = mps_processes.survey(proc)
    for claim in range(CLAIMS):
        found = survey.find(mark_of(claim, tmp_path / "mps"))
        daemon = 10000 + 2 * claim
        assert [p.pid for p in found] == [daemon, daemon + 1]
        assert mps_processes.daemon(found) == found[0] and found[0].start_time == 500 + claim
    assert mps_processes.find(mark_of(CLAIMS, tmp_path / "mps"), proc) == []


def test_a_process_is_read_only_as_far_as_the_bound(tmp_path: Path, proc: Path) -> None:
    """Its environment past ENVIRON_BYTES is never read (a tenant's process may hold megabytes there)."""
    hostile = mark_of(0, tmp_path / "mps")
    assert not mps_processes.carries(hostile, 100002, proc)
    assert mps_processes.carries(hostile, 10000, proc)  # the daemon's mark is first, before 560 KiB
    assert not mps_processes.carries(hostile, 100004, proc)  # gone


def test_a_round_over_every_claim_costs_one_pass(
    tmp_path: Path, proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes: list[Path] = []
    survey = mps_processes.survey

    def counted(root: Path = mps_processes.PROC) -> mps_processes.ProcSurvey:
        passes.append(root)
        return survey(root)

    monkeypatch.setattr(mps_processes, "survey", counted)
    monkeypatch.setattr(mps_daemons, "_SURVEY_REUSE_S", 3600.0)
    daemons = MpsDaemons(GpuTools(search_path=""), trash=Trash(tmp_path / "mps-trash"), proc=proc)
    claims = [Daemon(tmp_path / "mps" / f"{c:012x}", f"{c:032x}") for c in range(CLAIMS + 5)]

    running = {daemon: daemons.running(daemon) for daemon in claims}
    assert len(passes) == 1
    assert [p.pid for d, p in running.items() if p is not None] == [10000 + 2 * c for c in range(CLAIMS)]
    # Found ones are pinned: the next round reads one stat each, no pass at all for them.
    monkeypatch.setattr(mps_daemons, "_SURVEY_REUSE_S", 0.0)
    assert [daemons.running(d) for d in claims[:CLAIMS]] == [running[d] for d in claims[:CLAIMS]]
    assert len(passes) == 1
