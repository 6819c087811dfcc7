"""DeviceState with MPS and shares on a simulated node: daemons, compute modes, CDI edits, restarts, crashes.

The simulator's stand-in `nvidia-cuda-mps-control` runs real daemon processes, registered in the machine's
state file; every test checks them there and in /proc, and kills whatever one of them left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudra.errors import ClaimError, ConfigError, HardwareError
from gpudra.model.devices import build_devices
from gpudra.node import checkpoint as ckpt
from gpudra.node import faults
from gpudra.node.allocation import ClaimRef
from gpudra.node.prepare import DeviceState
from gpudra.node.sharing import SharingCoordinator
from gpudra.node.sharing.mps_daemons import PID_FILE
from gpudra.sim import state as sim_state
from tests.unit.claims import DRIVER, from_claim, mps, resource_claim, result, time_slicing, whole_gpus
from tests.unit.harness.crash import child
from tests.unit.harness.mps import (
    MpsHost,
    answers,
    assert_no_daemon,
    daemon_of,
    daemons,
    environment,
    kill_leftover_daemons,  # noqa: F401 (an autouse fixture: every test kills what it left)
    mps_claim,
    mps_config,
    mps_host,  # noqa: F401 (a fixture)
    mps_root,
    reporting_sharing,
    returns_in_time,
)
from tests.unit.harness.node import BOOT, Node, uid

SHARES = (
    "5f0c3a8e-1b2d-4c6e-8f90-a1b2c3d4e5f6",
    "6a1d4b9f-2c3e-4d7f-9a01-b2c3d4e5f6a7",
    "7b2e5c0a-3d4f-4e80-8b12-c3d4e5f6a7b8",
)
CONFIG_FIELD = "status.allocation.devices.config[0].opaque.parameters"


def share(device: str, share_id: str, memory: str, compute: str) -> dict[str, Any]:
    return {
        **result("gpu", device),
        "shareID": share_id,
        "consumedCapacity": {"memory": memory, "compute": compute},
    }


def compute_modes(node: Node) -> dict[str, int]:
    return {gpu.uuid: gpu.compute_mode for gpu in sim_state.StateFile(node.state_file).read().gpus}


@pytest.fixture(params=["plugin", "mps-host"])
def h100(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    mps_host: Callable[[Node], MpsHost],  # noqa: F811 (the fixture imported above)
) -> Node:
    """A node whose MPS daemons the plugin runs itself, or `gpudra mps-host` runs (as the chart does)."""
    node = Node(tmp_path, "dgx-h100")
    if request.param == "mps-host":
        mps_host(node)
    return node


# --- MPS on whole GPUs -------------------------------------------------------------------------------


def test_mps_on_a_whole_gpu_runs_a_daemon_with_the_limits_and_unprepare_stops_it(h100: Node) -> None:
    config = [from_claim(mps_config(50, "10Gi"))]
    claim = h100.claims.add(resource_claim(uid(1), results=[result("gpu", "gpu-2")], config=config))
    state = h100.state()
    booted = compute_modes(h100)
    [device] = state.prepare(claim)

    gpu, root = h100.uuid(2), mps_root(h100, uid(1))
    [daemon] = daemons(h100)
    assert daemon.pipe_directory == str(root / "pipe")
    assert daemon.visible_devices == gpu
    assert daemon.default_active_thread_percentage == 50.0
    assert daemon.default_pinned_memory_limits == {gpu: "10240M"}
    assert compute_modes(h100) == {**booted, gpu: 3}
    [spec_device] = json.loads(h100.spec_path(uid(1)).read_text())["devices"]
    edits = spec_device["containerEdits"]
    assert edits["env"] == [f"NVIDIA_VISIBLE_DEVICES={gpu}", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]
    assert [(m["hostPath"], m["containerPath"]) for m in edits["mounts"]] == [
        (str(root / "pipe"), "/tmp/nvidia-mps"),
        (str(root / "shm"), "/dev/shm"),
    ]
    # The daemon's mark, recorded before it was started (see gpudra.node.sharing.mps_processes).
    assert isinstance(device.sharing, ckpt.MpsRecord) and device.sharing.token is not None
    assert environment(daemon.pid)["GPUDRA_MPS_DAEMON_TOKEN"] == device.sharing.token
    record = ckpt.MpsRecord(
        strategy="MPS",
        root=root,
        token=device.sharing.token,
        active_thread_percentage=50,
        pinned_memory_limit=10 * 2**30,
        restore_compute_mode=0,
    )
    assert device.sharing == record
    assert [d.sharing for d in h100.entries()[uid(1)].devices] == [record]

    state.unprepare(claim)
    assert_no_daemon(h100, uid(1), [daemon.pid])
    assert compute_modes(h100) == {**booted, gpu: 0}
    h100.assert_nothing_left(uid(1))


def test_a_claim_with_two_mps_gpus_gets_one_daemon_that_sees_both(h100: Node) -> None:
    claim = h100.claims.add(mps_claim(uid(1), "gpu-1", "gpu-4", threads=30))
    state = h100.state()
    prepared = state.prepare(claim)

    [daemon] = daemons(h100)
    assert daemon.visible_devices == ",".join(sorted([h100.uuid(1), h100.uuid(4)]))
    assert daemon.default_active_thread_percentage == 30.0
    assert {d.sharing.root for d in prepared if isinstance(d.sharing, ckpt.MpsRecord)} == {
        mps_root(h100, uid(1))
    }
    assert [compute_modes(h100)[h100.uuid(n)] for n in (1, 4)] == [3, 3]
    state.unprepare(claim)
    assert_no_daemon(h100, uid(1), [daemon.pid])
    assert [compute_modes(h100)[h100.uuid(n)] for n in (1, 4)] == [0, 0]


def test_a_plugin_restart_adopts_the_running_daemons(h100: Node) -> None:
    first = h100.claims.add(mps_claim(uid(1), "gpu-0"))
    second = h100.claims.add(mps_claim(uid(2), "gpu-1"))
    state = h100.state()
    answered = state.prepare(first)
    state.prepare(second)
    pids = {Path(d.pipe_directory).parent: d.pid for d in daemons(h100)}
    assert set(pids) == {mps_root(h100, uid(1)), mps_root(h100, uid(2))}

    restarted = h100.state()
    assert {Path(d.pipe_directory).parent: d.pid for d in daemons(h100)} == pids  # adopted, not restarted
    assert restarted.prepared_claims()[uid(1)].state == "PrepareCompleted"
    assert restarted.prepare(first) == answered

    restarted.unprepare(first)
    assert_no_daemon(h100, uid(1), [pids[mps_root(h100, uid(1))]])
    assert [d.pid for d in daemons(h100)] == [pids[mps_root(h100, uid(2))]]
    assert mps_root(h100, uid(2)).is_dir()
    restarted.unprepare(second)
    assert_no_daemon(h100, uid(2), [pids[mps_root(h100, uid(2))]])


# --- crash safety ------------------------------------------------------------------------------------

# How many daemons of the claim run when the crash comes, per step of an MPS prepare.
DAEMONS_AT_CRASH = {
    "prepare-started": 0,
    "prepare-mig-created": 0,
    "prepare-mps-directories": 0,
    "prepare-mps-started": 1,
    "prepare-applied": 1,
    "prepare-cdi-written": 1,
    "prepare-completed": 1,
}


def test_every_mps_prepare_step_is_covered() -> None:
    assert set(DAEMONS_AT_CRASH) == set(faults.PREPARE_STEPS + faults.MPS_PREPARE_STEPS)


@pytest.mark.parametrize("step", faults.PREPARE_STEPS + faults.MPS_PREPARE_STEPS)
def test_a_crash_during_an_mps_prepare_is_rolled_back_at_restart(h100: Node, step: str) -> None:
    claim = h100.claims.add(mps_claim(uid(1), "gpu-2"))
    h100.state()  # the checkpoint file exists, as after the plugin's first start
    crashed = child(h100, "prepare", claim, step)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    started = [d.pid for d in daemons(h100)]
    assert len(started) == DAEMONS_AT_CRASH[step]
    assert h100.entries()[uid(1)].state == (
        "PrepareCompleted" if step == "prepare-completed" else "PrepareStarted"
    )

    restarted = h100.state()
    if step == "prepare-completed":  # done before the crash: kept with its daemon, the retry gets it
        assert restarted.prepared_claims()[uid(1)].state == "PrepareCompleted"
        assert [d.pid for d in daemons(h100)] == started
    else:
        assert_no_daemon(h100, uid(1), started)
        h100.assert_nothing_left(uid(1))
        assert compute_modes(h100)[h100.uuid(2)] == 0
    [device] = restarted.prepare(claim)  # the kubelet's retry
    assert isinstance(device.sharing, ckpt.MpsRecord)
    [daemon] = daemons(h100)
    assert daemon.pipe_directory == str(mps_root(h100, uid(1)) / "pipe")
    assert h100.entries()[uid(1)].state == "PrepareCompleted"
    assert h100.spec_path(uid(1)).exists()
    assert compute_modes(h100)[h100.uuid(2)] == 3

    restarted.unprepare(claim)
    assert_no_daemon(h100, uid(1), [daemon.pid])
    h100.assert_nothing_left(uid(1))


@pytest.mark.parametrize("step", faults.UNPREPARE_STEPS + faults.MPS_UNPREPARE_STEPS)
def test_a_crash_during_an_mps_unprepare_is_finished_at_restart(h100: Node, step: str) -> None:
    claim = h100.claims.add(mps_claim(uid(1), "gpu-2"))
    h100.state().prepare(claim)
    [daemon] = daemons(h100)
    crashed = child(h100, "unprepare", claim, step)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert h100.entries()[uid(1)].state == "UnprepareStarted"

    restarted = h100.state()
    assert restarted.prepared_claims() == {}
    assert_no_daemon(h100, uid(1), [daemon.pid])
    assert compute_modes(h100)[h100.uuid(2)] == 0
    h100.assert_nothing_left(uid(1))
    restarted.unprepare(claim)  # the kubelet's retry
    h100.assert_nothing_left(uid(1))


# --- shares ------------------------------------------------------------------------------------------


def test_shares_of_one_gpu_each_get_a_daemon_with_their_consumed_capacity(h100: Node) -> None:
    state = h100.state()
    amounts = [("10Gi", "10", "10240M"), ("20Gi", "20", "20480M"), ("40Gi", "40", "40960M")]
    shares = []
    for n, ((memory, compute, _), share_id) in enumerate(zip(amounts, SHARES, strict=True), start=1):
        claim = h100.claims.add(
            resource_claim(uid(n), results=[share("gpu-0-shared", share_id, memory, compute)])
        )
        [device] = state.prepare(claim)
        name = f"{uid(n)}-gpu-0-shared-{share_id}"
        assert device.share_id == share_id
        assert device.cdi_device_ids[0] == f"{DRIVER}/claim={name}"
        assert [d["name"] for d in json.loads(h100.spec_path(uid(n)).read_text())["devices"]] == [name]
        shares.append(claim)

    gpu = h100.uuid(0)
    assert {
        d.pipe_directory: (
            d.visible_devices,
            d.default_active_thread_percentage,
            d.default_pinned_memory_limits,
        )
        for d in daemons(h100)
    } == {
        str(mps_root(h100, uid(n)) / "pipe"): (gpu, float(compute), {gpu: limit})
        for n, (_, compute, limit) in enumerate(amounts, start=1)
    }
    assert compute_modes(h100)[gpu] == 0  # several daemons share the GPU in DEFAULT mode

    whole = h100.claims.add(whole_gpus(uid(4), "gpu-0"))
    with pytest.raises(ClaimError) as raised:
        state.prepare(whole)
    assert str(raised.value) == (
        f"device gpu-0 (its GPU is prepared as gpu-0-shared) is already prepared for ResourceClaim "
        f"default/claim-{uid(1)} ({uid(1)})"
    )
    assert uid(4) not in h100.entries()

    for claim in shares:
        state.unprepare(claim)
    assert daemons(h100) == []
    [device] = state.prepare(whole)
    assert device.sharing is None
    state.unprepare(whole)
    h100.assert_nothing_left(uid(4))


def test_shares_by_count_each_get_1_nth_of_the_memory_as_their_pinned_limit(h100: Node) -> None:
    # What the scheduler allocates a share that asks `shares: 1` and no memory on a GPU published with
    # --shares-per-gpu 4: the request policy's defaults (gpudra.model.devices).
    counted = build_devices(h100.inventory, mig_mode="partitionable", shares_per_gpu=4)
    policy = next(d for d in counted.devices if d["name"] == "gpu-0-shared")["capacity"]
    memory = policy["memory"]["requestPolicy"]["default"]
    assert memory == "19Gi"  # 79 whole GiB / 4
    state = h100.state()
    claims = []
    for n in range(1, 5):
        result_ = {
            **result("gpu", "gpu-0-shared"),
            "shareID": f"{n}f0c3a8e-1b2d-4c6e-8f90-a1b2c3d4e5f6",
            "consumedCapacity": {"memory": memory, "compute": "0", "shares": "1"},
        }
        claims.append(h100.claims.add(resource_claim(uid(n), results=[result_])))
        state.prepare(claims[-1])

    gpu = h100.uuid(0)
    assert (
        sorted((d.default_pinned_memory_limits, d.default_active_thread_percentage) for d in daemons(h100))
        == [({gpu: "19456M"}, 100.0)] * 4
    )  # no SM cap: compute 0 asks none, MPS keeps its 100
    for claim in claims:
        state.unprepare(claim)
    assert daemons(h100) == []


def test_a_share_that_asks_more_memory_than_it_was_allocated_fails_and_leaves_nothing(h100: Node) -> None:
    claim = h100.claims.add(
        resource_claim(
            uid(1),
            results=[share("gpu-0-shared", SHARES[0], "20Gi", "25")],
            config=[from_claim(mps_config(memory="30Gi"))],
        )
    )
    state = h100.state()
    with pytest.raises(ConfigError) as raised:
        state.prepare(claim)
    assert raised.value.field == f"{CONFIG_FIELD}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"
    assert raised.value.reason == (
        "30Gi is above the 20Gi of memory this share of gpu-0-shared was allocated; allowed: 1Mi to 20Gi"
    )
    h100.assert_nothing_left(uid(1))
    assert_no_daemon(h100, uid(1), [])


# --- recover() -----------------------------------------------------------------------------------------


def test_a_damaged_checkpoint_rebuilds_the_mps_record_from_the_cdi_spec(h100: Node) -> None:
    claim = h100.claims.add(mps_claim(uid(1), "gpu-3", threads=40))
    h100.state().prepare(claim)
    [daemon] = daemons(h100)
    h100.checkpoint_path.write_bytes(b"garbage")

    restarted = h100.state()
    rebuilt = restarted.prepared_claims()[uid(1)]
    assert rebuilt.state == "PrepareCompleted"
    assert [d.sharing for d in rebuilt.devices] == [
        ckpt.MpsRecord(strategy="MPS", root=mps_root(h100, uid(1)), restore_compute_mode=0)
    ]
    assert [d.pid for d in daemons(h100)] == [daemon.pid]  # the running daemon is kept

    restarted.unprepare(claim)
    assert_no_daemon(h100, uid(1), [daemon.pid])
    assert compute_modes(h100)[h100.uuid(3)] == 0
    h100.assert_nothing_left(uid(1))


def test_an_mps_daemon_that_no_entry_names_is_stopped_at_recover(h100: Node) -> None:
    claim = h100.claims.add(mps_claim(uid(1), "gpu-3"))
    h100.state().prepare(claim)
    [daemon] = daemons(h100)
    ckpt.save(h100.checkpoint_path, ckpt.Checkpoint.empty(BOOT))
    h100.spec_path(uid(1)).unlink()

    restarted = h100.state()
    assert restarted.prepared_claims() == {}
    assert_no_daemon(h100, uid(1), [daemon.pid])


# --- what a tenant's containers do to the pipe directory they mount read-write (issue 29) -------------
#
# Each test prepares the attacker's claim (uid 1) beside a victim's (uid 2), changes the attacker's pipe
# directory as a container that mounts it can, and unprepares the attacker's claim: it must not block,
# must stop exactly the attacker's daemon, must leave the victim's running and answering, and must report
# what it found.


def attacker_and_victim(node: Node, sharing: SharingCoordinator) -> tuple[DeviceState, ClaimRef, ClaimRef]:
    attacker = node.claims.add(mps_claim(uid(1), "gpu-2"))
    victim = node.claims.add(mps_claim(uid(2), "gpu-3", threads=20))
    state = node.state(sharing=sharing)
    state.prepare(victim)
    state.prepare(attacker)
    return state, attacker, victim


def assert_only_the_attacker_stopped(node: Node, attacker_pid: int, victim_pid: int) -> None:
    assert_no_daemon(node, uid(1), [attacker_pid])
    node.assert_nothing_left(uid(1))
    assert daemon_of(node, uid(2)).pid == victim_pid and answers(node, uid(2))


def pipe_file(node: Node, claim_uid: str, name: str) -> Path:
    return mps_root(node, claim_uid) / "pipe" / name


def replace_pid_file(node: Node, how: str) -> None:
    replace(pipe_file(node, uid(1), PID_FILE), how, victims=pipe_file(node, uid(2), PID_FILE))


def replace(entry: Path, how: str, *, victims: Path) -> None:
    """Put what a hostile container would in the place of `entry` (the victim's entry of that name is
    `victims`)."""
    entry.unlink()
    match how:
        case "fifo":  # a reader that opens it blocks until a writer comes: none does
            os.mkfifo(entry)
        case "symlink-to-the-victims":
            entry.symlink_to(victims)
        case "symlink-to-etc":  # followed, it would have gpudra read (or remove, or send to) the host's
            entry.symlink_to("/etc")
        case "directory":
            entry.mkdir()
        case "sparse-1gib":  # read whole, 1 GiB of zeros in the plugin's memory
            with entry.open("wb") as sparse:
                sparse.truncate(2**30)


PID_FILE_REPLACEMENTS = {
    "fifo": "pid-file-replaced",
    "symlink-to-the-victims": "pid-file-replaced",
    "symlink-to-etc": "pid-file-replaced",
    "directory": "pid-file-replaced",
    "sparse-1gib": "pid-file-foreign",
}


@pytest.mark.parametrize(("how", "kind"), PID_FILE_REPLACEMENTS.items(), ids=PID_FILE_REPLACEMENTS)
def test_a_pid_file_replaced_neither_blocks_nor_misleads_unprepare(h100: Node, how: str, kind: str) -> None:
    sharing, found = reporting_sharing(h100)
    state, attacker, victim = attacker_and_victim(h100, sharing)
    own, other = daemon_of(h100, uid(1)).pid, daemon_of(h100, uid(2)).pid
    replace_pid_file(h100, how)

    returns_in_time(lambda: state.unprepare(attacker))
    assert_only_the_attacker_stopped(h100, own, other)
    assert [(f.kind, f.root) for f in found] == [(kind, mps_root(h100, uid(1)))]
    assert f"pid {own}" in found[0].detail
    assert Path("/etc/passwd").exists()  # nothing was followed to be removed
    state.unprepare(victim)
    assert_no_daemon(h100, uid(2), [other])


def test_a_fifo_pid_file_does_not_block_the_recovery_that_finishes_an_unprepare(h100: Node) -> None:
    sharing, found = reporting_sharing(h100)
    _, attacker, victim = attacker_and_victim(h100, sharing)
    own, other = daemon_of(h100, uid(1)).pid, daemon_of(h100, uid(2)).pid
    replace_pid_file(h100, "fifo")
    crashed = child(h100, "unprepare", attacker, "unprepare-started")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    restarted: list[DeviceState] = []
    returns_in_time(lambda: restarted.append(h100.state(sharing=sharing)))  # recovery finishes it
    assert_only_the_attacker_stopped(h100, own, other)
    assert [f.kind for f in found] == ["pid-file-replaced"]
    restarted[0].unprepare(victim)
    assert_no_daemon(h100, uid(2), [other])


def test_another_claims_daemon_named_in_the_pid_file_is_not_killed(h100: Node) -> None:
    sharing, found = reporting_sharing(h100)
    state, attacker, victim = attacker_and_victim(h100, sharing)
    own, other = daemon_of(h100, uid(1)).pid, daemon_of(h100, uid(2)).pid
    # The victim's daemon is an MPS control daemon: the old check (`mps` in its command line) accepted it.
    pipe_file(h100, uid(1), PID_FILE).write_text(f"{other}\n")

    state.unprepare(attacker)
    assert_only_the_attacker_stopped(h100, own, other)
    assert [f.kind for f in found] == ["pid-file-foreign"]
    assert f"names '{other}'" in found[0].detail
    state.unprepare(victim)


def test_a_deleted_pid_file_still_has_its_daemon_found_and_stopped(h100: Node) -> None:
    sharing, found = reporting_sharing(h100)
    _, attacker, victim = attacker_and_victim(h100, sharing)
    own, other = daemon_of(h100, uid(1)).pid, daemon_of(h100, uid(2)).pid
    pipe_file(h100, uid(1), PID_FILE).unlink()

    restarted = h100.state(sharing=sharing)  # a plugin restart adopts it as it is
    assert daemon_of(h100, uid(1)).pid == own
    restarted.unprepare(attacker)
    assert_only_the_attacker_stopped(h100, own, other)
    assert [f.kind for f in found] == ["pid-file-removed"]
    restarted.unprepare(victim)


CONTROL_REPLACEMENTS = ["fifo", "symlink-to-etc", "directory", "sparse-1gib"]


@pytest.mark.parametrize("how", CONTROL_REPLACEMENTS)
def test_a_control_socket_replaced_is_sent_nothing_and_its_daemon_is_stopped_by_signal(
    h100: Node, how: str
) -> None:
    sharing, found = reporting_sharing(h100)
    state, attacker, victim = attacker_and_victim(h100, sharing)
    own, other = daemon_of(h100, uid(1)).pid, daemon_of(h100, uid(2)).pid
    replace(pipe_file(h100, uid(1), "control"), how, victims=pipe_file(h100, uid(2), "control"))

    returns_in_time(lambda: state.unprepare(attacker))
    assert_only_the_attacker_stopped(h100, own, other)
    assert {f.kind for f in found} == {"control-replaced"}
    assert Path("/etc/passwd").exists()
    state.unprepare(victim)


@contextlib.contextmanager
def tenants_socket(path: Path) -> Iterator[list[bytes]]:
    """A socket of the tenant's own bound at `path`: it takes connections and never answers; what it was
    sent is collected."""
    heard: list[bytes] = []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.unlink()
    listener.bind(str(path))
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        held = []
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            connection.settimeout(0.2)
            held.append(connection)  # kept open and unanswered: a client waiting for a reply waits on
            with contextlib.suppress(OSError):
                heard.append(connection.recv(4096))
        for connection in held:
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield heard
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_a_socket_of_the_tenants_own_in_the_controls_place_is_sent_nothing(h100: Node) -> None:
    """It could answer anything (limits it does not hold) or never (a tool waiting under the node lock)."""
    sharing, found = reporting_sharing(h100)
    state, attacker, victim = attacker_and_victim(h100, sharing)
    own, other = daemon_of(h100, uid(1)).pid, daemon_of(h100, uid(2)).pid
    with tenants_socket(pipe_file(h100, uid(1), "control")) as heard:
        returns_in_time(lambda: state.unprepare(attacker), seconds=20)
    assert_only_the_attacker_stopped(h100, own, other)
    assert [f.kind for f in found] == ["control-replaced"]
    assert "a socket of pid" in found[0].detail
    assert not any(heard)  # connected to, to see who listens, and closed before a word
    state.unprepare(victim)


def test_a_tenants_socket_does_not_hold_up_the_recovery_that_finishes_an_unprepare(h100: Node) -> None:
    sharing, found = reporting_sharing(h100)
    _, attacker, victim = attacker_and_victim(h100, sharing)
    own, other = daemon_of(h100, uid(1)).pid, daemon_of(h100, uid(2)).pid
    with tenants_socket(pipe_file(h100, uid(1), "control")) as heard:
        crashed = child(h100, "unprepare", attacker, "unprepare-started")
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
        restarted: list[DeviceState] = []
        returns_in_time(lambda: restarted.append(h100.state(sharing=sharing)), seconds=20)
    assert_only_the_attacker_stopped(h100, own, other)
    assert [f.kind for f in found] == ["control-replaced"] and not any(heard)
    restarted[0].unprepare(victim)
    assert_no_daemon(h100, uid(2), [other])


def test_a_control_socket_linked_to_another_claims_daemon_sends_that_daemon_nothing(h100: Node) -> None:
    sharing, found = reporting_sharing(h100)
    state, attacker, victim = attacker_and_victim(h100, sharing)
    own, other = daemon_of(h100, uid(1)).pid, daemon_of(h100, uid(2)).pid
    control = pipe_file(h100, uid(1), "control")
    control.unlink()
    control.symlink_to(pipe_file(h100, uid(2), "control"))  # a `quit` through it would stop the victim's

    state.unprepare(attacker)  # its daemon is stopped by signal instead
    assert_only_the_attacker_stopped(h100, own, other)
    assert [f.kind for f in found] == ["control-replaced"]
    state.unprepare(victim)


def test_the_daemons_servers_are_stopped_with_it(h100: Node) -> None:
    """A process that carries the daemon's mark (its MPS servers, which inherit its environment) and is
    still there once the daemon quit is killed; one that only names the pipe directory is not (with a
    token, the pipe directory alone marks nothing)."""
    claim = h100.claims.add(mps_claim(uid(1), "gpu-2"))
    state = h100.state()
    [device] = state.prepare(claim)
    assert isinstance(device.sharing, ckpt.MpsRecord) and device.sharing.token is not None
    pipe = str(mps_root(h100, uid(1)) / "pipe")
    marked = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "GPUDRA_MPS_DAEMON_TOKEN": device.sharing.token}
    server = subprocess.Popen(["sleep", "60"], env=marked)
    forged = subprocess.Popen(["sleep", "60"], env={**marked, "GPUDRA_MPS_DAEMON_TOKEN": "0" * 32})
    try:
        state.unprepare(claim)
        assert server.wait(timeout=10) == -signal.SIGKILL
        assert forged.poll() is None
    finally:
        server.kill()
        forged.kill()
        forged.wait()
    h100.assert_nothing_left(uid(1))


# --- a GPU that refuses sharing ------------------------------------------------------------------------

REFUSED = {
    "MPS": (
        mps(50),
        "nvidia-cuda-mps-control -d failed (1): "
        "MPS control daemon: MPS is not supported on this system's GPUs",
    ),
    "TimeSlicing": (
        time_slicing("Long"),
        "nvidia-smi compute-policy -i {gpu} --set-timeslice 3 failed (3): "
        "Unable to set the timeslice for GPU 00000000:17:00.0: Not Supported",
    ),
}


@pytest.mark.parametrize(("parameters", "message"), REFUSED.values(), ids=REFUSED)
def test_a_gpu_that_refuses_sharing_fails_the_claim_with_the_tools_reason_and_leaves_nothing(
    tmp_path: Path, parameters: dict[str, Any], message: str
) -> None:
    node = Node(tmp_path, "no-sharing")
    claim = node.claims.add(whole_gpus(uid(1), "gpu-0", config=[from_claim(parameters)]))
    state = node.state()
    with pytest.raises((HardwareError, ClaimError)) as raised:
        state.prepare(claim)
    assert str(raised.value) == message.format(gpu=node.uuid(0))
    node.assert_nothing_left(uid(1))
    assert_no_daemon(node, uid(1), [])
    assert compute_modes(node) == {node.uuid(0): 0}
    assert sim_state.StateFile(node.state_file).read().mps_daemons == []


def test_a_shared_device_without_a_share_id_is_refused_beside_its_whole_gpu(h100: Node) -> None:
    """Where the API server drops allowMultipleAllocations (1.34/1.35 with default gates), a scheduler
    hands `gpu-0-shared` out as a plain device, with no share ID, while `gpu-0` is held: one GPU for two
    claims. Prepare refuses the second, whichever comes first."""
    state = h100.state()
    whole = h100.claims.add(whole_gpus(uid(1), "gpu-0"))
    state.prepare(whole)
    plain = h100.claims.add(whole_gpus(uid(2), "gpu-0-shared"))
    with pytest.raises(ClaimError, match=r"device gpu-0-shared \(its GPU is prepared as gpu-0\) is already"):
        state.prepare(plain)
    state.unprepare(whole)
    state.prepare(plain)
    again = h100.claims.add(whole_gpus(uid(3), "gpu-0"))
    with pytest.raises(ClaimError, match=r"device gpu-0 \(its GPU is prepared as gpu-0-shared\) is already"):
        state.prepare(again)
    state.unprepare(plain)
    h100.assert_nothing_left(uid(2))
