"""Two instances of the kubelet plugin on one node (a rolling update with maxSurge): --instance-id, the
node lock around prepare, unprepare and recovery, catching up with the checkpoint the other instance
saved, and publishing in turn.

An instance is a DeviceState (or a PublisherTurn) of its own over the same files: flock locks belong to
the open file, so two of them in one test process exclude each other exactly as two processes do; one
test checks that against a real second process too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpudra import cli
from gpudra.errors import ClaimError, GpudraError
from gpudra.gpu.tools import GpuTools
from gpudra.node import checkpoint as ckpt
from gpudra.node import daemon
from gpudra.node.instances import NodeLock, PublisherTurn
from gpudra.node.options import PluginOptions
from gpudra.node.recovery import Recovery, recover
from gpudra.node.sharing import SharingCoordinator
from tests.unit.claims import from_claim, time_slicing, whole_gpus
from tests.unit.harness.kube import FakeSliceKube
from tests.unit.harness.node import Node, uid, write_checkpoint
from tests.unit.harness.slices import MODELS, Model, builder, controller, generations, wait_until

# --- --instance-id ---------------------------------------------------------------------------------


def _plugin_options(monkeypatch: pytest.MonkeyPatch, *args: str) -> PluginOptions:
    seen: list[PluginOptions] = []
    monkeypatch.setattr(daemon, "run", lambda options, stop: seen.append(options))
    monkeypatch.setattr(cli, "_run_daemon", lambda args, run: run(threading.Event()) or 0)
    assert cli.main(["kubelet-plugin", "--node-name=node-a", *args]) == 0
    [options] = seen
    return options


def test_the_instance_id_comes_from_the_option_or_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPUDRA_INSTANCE_ID", raising=False)
    assert _plugin_options(monkeypatch).instance_id is None  # the shared socket names, as before
    uid_ = "0b5a2c1e-7f3d-4e8a-9c6b-1d2e3f4a5b6c"
    assert _plugin_options(monkeypatch, f"--instance-id={uid_}").instance_id == uid_
    monkeypatch.setenv("GPUDRA_INSTANCE_ID", uid_)  # the chart: the pod's metadata.uid
    assert _plugin_options(monkeypatch).instance_id == uid_
    monkeypatch.setenv("GPUDRA_INSTANCE_ID", "")  # an empty variable is no ID
    assert _plugin_options(monkeypatch).instance_id is None


@pytest.mark.parametrize("value", ["a/b", ".hidden", "-a", "a b", "x" * 64, "ü"])
def test_a_bad_instance_id_is_a_clear_error(capsys: pytest.CaptureFixture[str], value: str) -> None:
    assert cli.main(["kubelet-plugin", "--node-name=node-a", f"--instance-id={value}"]) == 2
    assert capsys.readouterr().err == (
        f"gpudra kubelet-plugin: argument --instance-id: {value!r} is not an instance ID: 1 to 63 letters, "
        "digits, '-', '_' and '.', starting with a letter or digit (empty: <driver>-reg.sock and dra.sock) "
        "(see gpudra kubelet-plugin --help)\n"
    )


# --- NodeLock --------------------------------------------------------------------------------------


def test_the_threads_of_one_process_share_the_node_lock_and_another_process_waits(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json.lock"
    ours, theirs = NodeLock(path), NodeLock(path)  # two open files: two processes, as flock sees it
    taken: list[str] = []
    inside, leave = threading.Event(), threading.Event()

    def first() -> None:
        with ours.held(lambda: taken.append("ours")):
            inside.set()
            leave.wait(10)

    def other_process() -> None:
        with theirs.held(lambda: taken.append("theirs")):
            pass

    with ThreadPoolExecutor(3) as pool:
        holding = pool.submit(first)
        assert inside.wait(10)
        with ours.held(lambda: taken.append("ours again")):  # a second thread: no wait, no catching up
            pass
        waiting = pool.submit(other_process)
        time.sleep(0.3)
        assert not waiting.done() and taken == ["ours"]
        leave.set()
        holding.result(10)
        waiting.result(10)
    assert taken == ["ours", "theirs"]


def test_a_failed_catch_up_gives_the_node_lock_up(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json.lock"
    lock = NodeLock(path)

    def fail() -> None:
        raise ClaimError("the file cannot be used")

    with pytest.raises(ClaimError), lock.held(fail):
        pass
    with NodeLock(path).held():  # not held any more: another process takes it at once
        pass


def test_the_node_lock_excludes_another_process(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json.lock"
    script = (
        "import time; from pathlib import Path; from gpudra.node.instances import NodeLock\n"
        f"with NodeLock(Path({str(path)!r})).held():\n"
        "    print('held', flush=True); time.sleep(1)\n"
    )
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        started = time.monotonic()
        with NodeLock(path).held():
            waited = time.monotonic() - started
    assert waited > 0.5


def test_an_unusable_lock_file_is_a_clear_error(tmp_path: Path) -> None:
    lock = NodeLock(tmp_path / "missing" / "x.lock")
    with (
        pytest.raises(GpudraError, match=r"cannot open the lock file .*missing/x.lock: No such file"),
        lock.held(),
    ):
        pass


# --- two DeviceStates over one node's files ------------------------------------------------------


@pytest.fixture
def h100(tmp_path: Path) -> Node:
    return Node(tmp_path, "dgx-h100")


class HeldSharing(SharingCoordinator):
    """SharingCoordinator whose `apply` waits for `release`: a prepare caught in flight."""

    def __init__(self, tools: GpuTools, *, mps_root: Path) -> None:
        super().__init__(tools, mps_root=mps_root)
        self.entered, self.release = threading.Event(), threading.Event()

    def apply(
        self, entry: ckpt.ClaimEntry, *, visible: Mapping[str, str], others: Sequence[ckpt.ClaimEntry]
    ) -> None:
        self.entered.set()
        assert self.release.wait(10)
        super().apply(entry, visible=visible, others=others)


def test_a_new_instance_s_recovery_waits_for_the_old_one_s_prepare_in_flight(h100: Node) -> None:
    """Without the lock, the new instance's recovery would take the old one's PrepareStarted entry for
    a crash's leftover and roll it back under the running prepare."""
    held = HeldSharing(h100.tools, mps_root=h100.root / "mps")
    old = h100.state(sharing=held)
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-0", config=[from_claim(time_slicing("Long"))]))
    new = h100.state(recover=False)
    with ThreadPoolExecutor(2) as pool:
        preparing = pool.submit(old.prepare, claim)
        assert held.entered.wait(10)
        assert h100.entries()[uid(1)].state == "PrepareStarted"
        recovering = pool.submit(recover, new)
        time.sleep(0.3)
        assert not recovering.done()
        held.release.set()
        devices = preparing.result(10)
        assert recovering.result(10) == Recovery()
    assert h100.entries()[uid(1)].state == "PrepareCompleted"
    assert h100.spec_path(uid(1)).exists() and h100.timeslices()[h100.uuid(0)] == 3
    spec = h100.spec_path(uid(1)).stat().st_ino
    assert new.prepare(claim) == devices  # answered from the old one's work, not prepared again
    assert h100.spec_path(uid(1)).stat().st_ino == spec


def test_each_instance_decides_from_what_the_other_saved(h100: Node) -> None:
    old = h100.state()
    first = h100.claims.add(whole_gpus(uid(1), "gpu-0", config=[from_claim(time_slicing("Long"))]))
    old.prepare(first)
    new = h100.state()  # the update's new pod: recovery loads what the old one prepared
    second = h100.claims.add(whole_gpus(uid(2), "gpu-1"))
    new.prepare(second)
    new.unprepare(first)  # the kubelet unprepares the old instance's claim through the new one
    assert not h100.spec_path(uid(1)).exists() and h100.timeslices()[h100.uuid(0)] == 0

    # The old instance's memory still holds claim 1 and lacks claim 2: every call catches up first.
    assert set(old.prepared_claims()) == {uid(2)}  # readers read the file too
    with pytest.raises(
        ClaimError, match=rf"gpu-1 is already prepared for ResourceClaim default/claim-{uid(2)}"
    ):
        old.prepare(h100.claims.add(whole_gpus(uid(3), "gpu-1")))
    fourth = h100.claims.add(whole_gpus(uid(4), "gpu-0"))  # free again: claim 1 is gone
    devices = old.prepare(fourth)
    old.unprepare(first)  # a late retry of the unprepare: nothing left to undo, nothing undone
    assert set(h100.entries()) == {uid(2), uid(4)}
    assert h100.spec_path(uid(2)).exists() and h100.spec_path(uid(4)).exists()

    spec = h100.spec_path(uid(4)).stat().st_ino
    assert new.prepare(fourth) == devices  # the new one does not prepare the old one's claim twice
    assert h100.spec_path(uid(4)).stat().st_ino == spec
    new.unprepare(fourth)
    old.unprepare(second)
    assert h100.entries() == {} and h100.timeslices()[h100.uuid(0)] == 0
    assert new.prepared_claims() == old.prepared_claims() == {}


def test_a_checkpoint_only_this_instance_saved_is_not_read_again(
    h100: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = h100.state()
    parsed: list[Path] = []
    parse = ckpt.parse

    def counting(content: bytes | None, *, source: Path, boot_id: str) -> ckpt.LoadedCheckpoint:
        parsed.append(source)
        return parse(content, source=source, boot_id=boot_id)

    monkeypatch.setattr(ckpt, "parse", counting)
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-0", config=[from_claim(time_slicing("Long"))]))
    state.prepare(claim)
    state.prepare(claim)
    assert set(state.prepared_claims()) == {uid(1)} and state.mig_room() and state.prepared_partitions() == {}
    state.unprepare(claim)
    assert parsed == []


def test_a_checkpoint_a_newer_gpudra_converted_fails_calls_and_is_left_alone(h100: Node) -> None:
    old = h100.state()
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-0"))
    devices = old.prepare(claim)
    data = json.loads(h100.checkpoint_path.read_text())["data"]
    data["version"] = ckpt.VERSION + 1  # the new pod's gpudra writes a newer format
    write_checkpoint(h100.checkpoint_path, data)
    newer = h100.checkpoint_path.read_bytes()

    for call in (old.prepare, old.unprepare):
        with pytest.raises(ClaimError, match=r"changed behind this plugin instance .* newer gpudra"):
            call(claim)
    assert h100.checkpoint_path.read_bytes() == newer and h100.spec_path(uid(1)).exists()
    assert [d.device for d in old.prepared_claims()[uid(1)].devices] == [d.device for d in devices]


def test_a_deleted_checkpoint_fails_calls_instead_of_forgetting_claims(h100: Node) -> None:
    state = h100.state()
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-0"))
    state.prepare(claim)
    h100.checkpoint_path.unlink()
    with pytest.raises(ClaimError, match="it was deleted; restart the plugin to rebuild it"):
        state.unprepare(claim)
    assert h100.spec_path(uid(1)).exists()


# --- publishing in turn ----------------------------------------------------------------------------


def test_a_second_instance_stands_by_until_the_first_gives_its_turn_up(tmp_path: Path) -> None:
    lock = tmp_path / "publisher.lock"
    started: list[str] = []

    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

        def start(self) -> None:
            started.append(f"start {self.name}")

        def stop(self, timeout: float) -> None:
            started.append(f"stop {self.name}")

    first = PublisherTurn(lock, [Named("a1"), Named("a2")], poll_seconds=0.05)
    second = PublisherTurn(lock, [Named("b")], poll_seconds=0.05)
    first.start()
    assert first.active.wait(5)
    second.start()
    time.sleep(0.3)
    assert second.standing_by and not first.standing_by
    assert started == ["start a1", "start a2"]
    first.stop(5)
    assert second.active.wait(5) and not second.standing_by
    assert started == ["start a1", "start a2", "stop a2", "stop a1", "start b"]
    second.stop(5)
    assert started[-1] == "stop b"

    holder = PublisherTurn(lock, [Named("c")], poll_seconds=0.05)
    holder.start()
    assert holder.active.wait(5)
    waiting = PublisherTurn(lock, [Named("d")], poll_seconds=0.05)
    waiting.start()
    time.sleep(0.2)
    assert waiting.standing_by
    waiting.stop(5)  # a standing-by instance stops at once and never started its services
    holder.stop(5)
    assert started[-2:] == ["start c", "stop c"]


@pytest.mark.parametrize(
    ("new_model", "rewritten"),
    [("h100", False), ("h100 newer driver", True)],
    ids=["same-slices", "changed-slices"],
)
def test_two_instances_never_fight_over_the_pool(tmp_path: Path, new_model: str, rewritten: bool) -> None:
    """Both publishing at once would rewrite the pool at ever newer generations for as long as both
    run (each takes the other's rewrite for damage), even with the same slices: measured, about 30
    writes a second against the fake API server. In turn: the new one writes nothing while the old one
    runs, adopts the pool when it takes over, and rewrites it once only if its slices differ."""
    kube, lock = FakeSliceKube(), tmp_path / "publisher.lock"
    old_slices, old_writes = controller(kube, Model(MODELS["h100"]), resync_seconds=0.1)
    old = PublisherTurn(lock, [old_slices], poll_seconds=0.05)
    old.start()
    assert old_slices.synced.wait(5)
    count = len(builder(MODELS["h100"])(1))
    new_slices, new_writes = controller(kube, Model(MODELS[new_model]), resync_seconds=0.1)
    new = PublisherTurn(lock, [new_slices], poll_seconds=0.05)
    new.start()
    try:
        time.sleep(1)  # ten resyncs of each
        assert new.standing_by and new_writes == [] and old_writes == ["create"] * count
        old.stop(5)
        assert new_slices.synced.wait(5)
        wait_until(lambda: kube.consumed == len(kube.events))
        settled = len(new_writes)
        time.sleep(1)
        assert len(new_writes) == settled
        assert new_writes == (["update"] * count if rewritten else [])
        assert generations(kube) == ({2} if rewritten else {1})
    finally:
        old.stop(5)
        new.stop(5)
