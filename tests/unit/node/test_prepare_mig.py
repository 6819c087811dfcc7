"""MIG partitions prepared per claim on simulated H100 and A100 machines: create, destroy, MIG mode,
CDI, refusals and crash safety (SIGKILL at every step, then restart)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gpudra import sim
from gpudra.api import API_VERSION
from gpudra.errors import ClaimError
from gpudra.model.publishing import PartitionAttributes
from gpudra.node import cdi, faults, gpu_driver
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import ClaimRef
from gpudra.node.metrics import PluginMetrics
from gpudra.sim import state as sim_state
from tests.unit.claims import DRIVER, from_claim, resource_claim, result, whole_gpus
from tests.unit.harness.crash import child
from tests.unit.harness.mig import instances, mig_claim, recorded
from tests.unit.harness.node import BOOT, Node, uid, write_checkpoint

CAPS_MAJOR = 508  # what the simulator's /proc/devices gives nvidia-caps


def mig_mode(node: Node, minor: int) -> int:
    gpus = sim_state.StateFile(node.state_file).read().gpus
    return next(g.mig_mode for g in gpus if g.uuid == node.uuid(minor))


def cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """/proc/driver/nvidia-caps/mig-minors as the driver lays it out: 9 minors per GI, from 3."""
    base = 3 + (gpu_minor * 15 + gi) * 9
    return base if ci is None else base + 1 + ci


@pytest.fixture
def h100(tmp_path: Path) -> Node:
    return Node(tmp_path, "dgx-h100")


# --- create and destroy ---------------------------------------------------------------------------


@pytest.mark.parametrize("attributes", ["full", "minimal"])
def test_a_partition_is_created_at_its_placement_and_destroyed_on_unprepare(
    h100: Node, attributes: PartitionAttributes
) -> None:
    """With minimal partition attributes too: prepare needs only the profile, placement and parent."""
    state = h100.state(partition_attributes=attributes)
    claim = h100.claims.add(mig_claim(1, "gpu-2-mig-3g40gb-4"))
    [device] = state.prepare(claim)

    assert device.cdi_device_ids == (f"{DRIVER}/claim={uid(1)}-gpu-2-mig-3g40gb-4",)
    assert device.mig is not None and device.mig.live is not None
    assert device.mig.spec == ckpt.MigSpec(gpu_uuid=h100.uuid(2), profile_id=9, placement_start=4)
    assert device.sharing is None  # a time-slice is a whole-GPU setting: never touched for a partition
    live = device.mig.live
    assert instances(h100, 2) == {4: (9, live.uuid)} == recorded(h100, 2)

    spec = cdi.read_spec(h100.spec_path(uid(1)))
    [cdi_device] = spec.devices
    edits = cdi_device.container_edits
    assert f"NVIDIA_VISIBLE_DEVICES={live.uuid}" in edits.env
    gi_cap = cap_minor(2, live.gpu_instance_id)
    ci_cap = cap_minor(2, live.gpu_instance_id, live.compute_instance_id)
    assert [(n.path, n.major, n.minor) for n in edits.device_nodes] == [
        ("/dev/nvidia2", None, None),
        (f"/dev/nvidia-caps/nvidia-cap{gi_cap}", CAPS_MAJOR, gi_cap),
        (f"/dev/nvidia-caps/nvidia-cap{ci_cap}", CAPS_MAJOR, ci_cap),
    ]

    state.unprepare(claim)
    assert instances(h100, 2) == {} == recorded(h100, 2)
    assert not h100.spec_path(uid(1)).exists()
    assert uid(1) not in h100.entries()


def test_time_slicing_a_partition_sets_nothing_and_posts_a_warning_event(h100: Node) -> None:
    events: list[tuple[str, str, str]] = []
    state = h100.state()
    state.post_event = lambda type_, reason, message: events.append((type_, reason, message))
    config = {
        "apiVersion": API_VERSION,
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    claim = h100.claims.add(
        mig_claim(1, "gpu-2-mig-3g40gb-4", config=[from_claim(config, "mig")], name="ts", namespace="ml")
    )
    [device] = state.prepare(claim)

    assert device.mig is not None and device.mig.live is not None
    assert device.sharing is None  # no record, so no tool runs and nothing is undone
    assert set(h100.timeslices().values()) == {0}  # the GPU's time-slice untouched: nvidia-smi never ran
    assert events == [
        (
            "Warning",
            "MigTimeSliceNotSet",
            "ResourceClaim ml/ts, device gpu-2-mig-3g40gb-4: "
            "status.allocation.devices.config[0].opaque.parameters.sharing.strategy: TimeSlicing on a MIG "
            "device sets nothing: the claim's containers share the partition; interval Long is not applied "
            "(the time-slice is the whole GPU's)",
        )
    ]
    state.prepare(claim)  # answered from the checkpoint: no second event
    assert len(events) == 1

    state.unprepare(claim)
    assert instances(h100, 2) == {}
    h100.assert_nothing_left(uid(1))


def test_seven_1g_partitions_fill_one_h100_with_distinct_placements(h100: Node) -> None:
    state = h100.state()
    claims = [h100.claims.add(mig_claim(n, f"gpu-0-mig-1g10gb-{n}")) for n in range(7)]
    for claim in claims:
        state.prepare(claim)
        assert instances(h100, 0) == recorded(h100, 0)
    assert sorted(instances(h100, 0)) == list(range(7))
    assert len({uuid for _, uuid in instances(h100, 0).values()}) == 7

    state.unprepare(claims[3])
    assert sorted(instances(h100, 0)) == [0, 1, 2, 4, 5, 6] and instances(h100, 0) == recorded(h100, 0)
    again = h100.claims.add(mig_claim(9, "gpu-0-mig-1g10gb-3"))
    state.prepare(again)
    assert sorted(instances(h100, 0)) == list(range(7)) and instances(h100, 0) == recorded(h100, 0)


def test_a_repeated_prepare_creates_nothing_twice(h100: Node) -> None:
    state = h100.state()
    claim = h100.claims.add(mig_claim(1, "gpu-1-mig-2g20gb-2"))
    first = state.prepare(claim)
    assert state.prepare(claim) == first
    assert len(instances(h100, 1)) == 1


def test_a_claim_with_several_partitions_and_a_whole_gpu(h100: Node) -> None:
    state = h100.state()
    claim = h100.claims.add(
        resource_claim(
            uid(1),
            results=[
                result("big", "gpu-5-mig-4g40gb-0"),
                result("small", "gpu-5-mig-1g10gb-6"),
                result("whole", "gpu-6"),
            ],
        )
    )
    devices = state.prepare(claim)
    assert [d.device for d in devices] == ["gpu-5-mig-4g40gb-0", "gpu-5-mig-1g10gb-6", "gpu-6"]
    assert sorted(instances(h100, 5)) == [0, 6]
    assert mig_mode(h100, 6) == 0  # the whole GPU needed MIG off: H100 switches without a reset
    state.unprepare(claim)
    assert instances(h100, 5) == {}


# --- MIG mode ---------------------------------------------------------------------------------------


def test_h100_switches_mig_mode_to_what_the_claim_needs(h100: Node) -> None:
    state = h100.state()
    assert mig_mode(h100, 3) == 1  # the simulated DGX boots with MIG on
    whole = h100.claims.add(whole_gpus(uid(1), "gpu-3"))
    state.prepare(whole)
    assert mig_mode(h100, 3) == 0
    state.unprepare(whole)
    assert mig_mode(h100, 3) == 0  # not switched back eagerly: the next claim may want the same

    part = h100.claims.add(mig_claim(2, "gpu-3-mig-7g80gb-0"))
    state.prepare(part)
    assert mig_mode(h100, 3) == 1 and sorted(instances(h100, 3)) == [0]


def test_mig_mode_is_not_switched_while_a_process_uses_the_gpu(h100: Node) -> None:
    state = h100.state()
    sim.attach_process(state_file=h100.state_file, device_uuid=h100.uuid(4), pid=4242)
    busy = h100.claims.add(whole_gpus(uid(1), "gpu-4"))
    with pytest.raises(ClaimError) as refused:
        state.prepare(busy)
    message = str(refused.value)
    assert h100.uuid(4) in message and "pids 4242" in message and "idle GPU" in message
    assert mig_mode(h100, 4) == 1
    assert uid(1) not in h100.entries() and not h100.spec_path(uid(1)).exists()

    other = h100.claims.add(whole_gpus(uid(2), "gpu-5"))  # other claims proceed
    state.prepare(other)
    sim.detach_process(state_file=h100.state_file, pid=4242)
    state.prepare(busy)  # the kubelet's retry
    assert mig_mode(h100, 4) == 0


def test_mig_mode_is_not_switched_off_under_existing_mig_devices(h100: Node) -> None:
    with gpu_driver.connect("sim:dgx-h100", state_file=h100.state_file) as session:
        by_hand = session.create_mig_device(gpu_uuid=h100.uuid(1), profile_id=19, placement_start=0)
    state = h100.state()
    with pytest.raises(ClaimError, match=rf"MIG devices still exist on it: {by_hand.uuid} \(1g.10gb at 0\)"):
        state.prepare(h100.claims.add(whole_gpus(uid(1), "gpu-1")))
    assert instances(h100, 1) == {0: (19, by_hand.uuid)}


def test_a100_never_switches_mig_mode(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-a100")
    sim.set_mig_mode(state_file=node.state_file, gpu_uuid=node.uuid(0), enabled=False)  # after the start
    state = node.state()
    claim = node.claims.add(mig_claim(1, "gpu-0-mig-1g5gb-0"))
    with pytest.raises(ClaimError) as refused:
        state.prepare(claim)
    message = str(refused.value)
    assert "never switches it on this GPU" in message and "Ampere" in message and node.uuid(0) in message
    assert mig_mode(node, 0) == 0 and uid(1) not in node.entries()


# --- what gpudra did not create -------------------------------------------------------------------


def test_a_placement_taken_by_hand_is_refused_and_left_alone(h100: Node) -> None:
    with gpu_driver.connect("sim:dgx-h100", state_file=h100.state_file) as session:
        by_hand = session.create_mig_device(gpu_uuid=h100.uuid(7), profile_id=14, placement_start=4)
    state = h100.state()
    claim = h100.claims.add(mig_claim(1, "gpu-7-mig-1g10gb-5"))
    with pytest.raises(ClaimError) as refused:
        state.prepare(claim)
    message = str(refused.value)
    for part in ("1g.10gb at placement 5", h100.uuid(7), by_hand.uuid, "did not create", "never destroys"):
        assert part in message
    assert instances(h100, 7) == {4: (14, by_hand.uuid)}
    assert uid(1) not in h100.entries()
    state.unprepare(ClaimRef(uid(1), "default", f"claim-{uid(1)}"))
    assert instances(h100, 7) == {4: (14, by_hand.uuid)}


def bare_gpu_instance(node: Node, minor: int, *, gi: int, profile_id: int, start: int, size: int) -> None:
    """A GPU instance made by hand without a compute instance (nvidia-smi mig -cgi without -C)."""
    with sim_state.StateFile(node.state_file).update() as machine:
        gpu = next(g for g in machine.gpus if g.uuid == node.uuid(minor))
        gpu.gpu_instances.append(
            sim_state.GpuInstanceState(id=gi, profile_id=profile_id, start=start, size=size)
        )


@pytest.mark.parametrize("device", ["gpu-1-mig-4g40gb-0", "gpu-1-mig-1g10gb-2"], ids=["exact", "overlapping"])
def test_a_gpu_instance_made_by_hand_without_compute_instance_is_neither_adopted_nor_destroyed(
    h100: Node, device: str
) -> None:
    """Issue 29, item 6: one at exactly a claim's profile and placement was taken over at prepare and
    destroyed at unprepare. Only the checkpoint makes an instance gpudra's: this one is refused,
    named, and left alone by the start-up, the prepare, its rollback and the unprepare."""
    bare_gpu_instance(h100, 1, gi=6, profile_id=5, start=0, size=4)
    state = h100.state()  # recover() at start-up: no entry names it
    claim = h100.claims.add(mig_claim(1, device))
    with pytest.raises(ClaimError) as refused:
        state.prepare(claim)
    message = str(refused.value)
    for part in (
        f"device {device}",
        h100.uuid(1),
        "taken by GPU instance 6 (4g.40gb at 0, without a compute instance), which gpudra did not create",
        "never destroys or adopts it",
        "nvidia-smi mig -dci/-dgi -gi 6 -i 1",
    ):
        assert part in message
    assert uid(1) not in h100.entries() and not h100.spec_path(uid(1)).exists()
    assert instances(h100, 1) == {0: (5, "")}
    state.unprepare(claim)  # the kubelet unprepares the pod's claims when it goes
    h100.state()  # and a restart
    assert instances(h100, 1) == {0: (5, "")}

    with sim_state.StateFile(h100.state_file).update() as machine:  # the administrator removes it
        next(g for g in machine.gpus if g.uuid == h100.uuid(1)).gpu_instances.clear()
    state.prepare(claim)
    assert instances(h100, 1) == recorded(h100, 1) and len(instances(h100, 1)) == 1


def test_unprepare_destroys_its_gpu_instance_left_without_compute_instance_but_not_another(
    h100: Node,
) -> None:
    """A crash inside destroy leaves the claim's GPU instance without its compute instance: unprepare
    destroys it (the recorded id, profile and placement). One made by hand in its place after the
    claim's device vanished has another id and is not the claim's."""
    state = h100.state()
    first, second = (
        h100.claims.add(mig_claim(1, "gpu-1-mig-4g40gb-0")),
        h100.claims.add(mig_claim(2, "gpu-2-mig-4g40gb-0")),
    )
    [mine] = state.prepare(first)
    [gone] = state.prepare(second)
    assert mine.mig is not None and mine.mig.live is not None
    assert gone.mig is not None and gone.mig.live is not None
    with sim_state.StateFile(h100.state_file).update() as machine:
        gpus = {g.uuid: g for g in machine.gpus}
        gpus[h100.uuid(1)].gpu_instances[0].compute_instances.clear()  # the crash inside destroy
        gpus[h100.uuid(2)].gpu_instances.clear()  # vanished, and then made again by hand:
    bare_gpu_instance(h100, 2, gi=gone.mig.live.gpu_instance_id + 1, profile_id=5, start=0, size=4)
    state.unprepare(first)
    state.unprepare(second)
    assert instances(h100, 1) == {}
    assert instances(h100, 2) == {0: (5, "")}
    assert h100.entries() == {}


def test_a_mig_device_in_use_fails_unprepare_until_it_is_free(h100: Node) -> None:
    state = h100.state()
    claim = h100.claims.add(mig_claim(1, "gpu-0-mig-1g10gb-0"))
    [device] = state.prepare(claim)
    assert device.mig is not None and device.mig.live is not None
    sim.attach_process(state_file=h100.state_file, device_uuid=device.mig.live.uuid, pid=77)
    with pytest.raises(ClaimError) as refused:
        state.unprepare(claim)
    assert "1g.10gb at placement 0" in str(refused.value) and h100.uuid(0) in str(refused.value)
    assert h100.entries()[uid(1)].state == "UnprepareStarted"
    sim.detach_process(state_file=h100.state_file, pid=77)
    state.unprepare(claim)
    assert instances(h100, 0) == {} and uid(1) not in h100.entries()


# --- crash safety ----------------------------------------------------------------------------------


@pytest.mark.parametrize("step", faults.PREPARE_STEPS)
def test_a_crash_during_mig_prepare_is_rolled_back_at_restart(h100: Node, step: str) -> None:
    claim = h100.claims.add(mig_claim(1, "gpu-2-mig-2g20gb-4", "gpu-2-mig-1g10gb-0"))
    h100.state()
    crashed = child(h100, "prepare", claim, step)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    entry = h100.entries()[uid(1)]
    assert all(d.mig is not None for d in entry.devices)  # the specs were recorded before NVML was touched
    if step != "prepare-started":
        assert instances(h100, 2) == recorded(h100, 2)  # live ids were recorded once created
        assert len(instances(h100, 2)) == 2

    restarted = h100.state()
    if step == "prepare-completed":
        assert instances(h100, 2) == recorded(h100, 2) and len(instances(h100, 2)) == 2
    else:
        assert instances(h100, 2) == {} and uid(1) not in h100.entries()
        assert not h100.spec_path(uid(1)).exists()
    restarted.prepare(claim)  # the kubelet's retry completes
    assert sorted(instances(h100, 2)) == [0, 4] and instances(h100, 2) == recorded(h100, 2)
    restarted.unprepare(claim)
    assert instances(h100, 2) == {} and h100.entries() == {} and not h100.spec_path(uid(1)).exists()


@pytest.mark.parametrize("step", faults.UNPREPARE_STEPS)
def test_a_crash_during_mig_unprepare_is_finished_at_restart(h100: Node, step: str) -> None:
    claim = h100.claims.add(mig_claim(1, "gpu-3-mig-3g40gb-0"))
    h100.state().prepare(claim)
    crashed = child(h100, "unprepare", claim, step)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert h100.entries()[uid(1)].state == "UnprepareStarted"
    gone = step in ("unprepare-mig-destroyed", "unprepare-cdi-deleted")
    assert (instances(h100, 3) == {}) == gone

    restarted = h100.state()
    assert instances(h100, 3) == {} and h100.entries() == {} and not h100.spec_path(uid(1)).exists()
    restarted.unprepare(claim)  # the kubelet's retry
    assert instances(h100, 3) == {}


def test_a_gpu_instance_left_without_compute_instance_is_destroyed_at_restart(h100: Node) -> None:
    """A crash inside create, between the GPU instance and its compute instance."""
    h100.state()
    claim = h100.claims.add(mig_claim(1, "gpu-1-mig-4g40gb-0"))
    entry = ckpt.ClaimEntry(
        uid=uid(1),
        namespace="default",
        name=f"claim-{uid(1)}",
        state="PrepareStarted",
        devices=(
            ckpt.PreparedDevice(
                request_names=("mig",),
                pool="node-a",
                device="gpu-1-mig-4g40gb-0",
                cdi_device_ids=(),
                gpu_uuids=(h100.uuid(1),),
                mig=ckpt.MigRecord(spec=ckpt.MigSpec(gpu_uuid=h100.uuid(1), profile_id=5, placement_start=0)),
            ),
        ),
    )
    ckpt.save(h100.checkpoint_path, ckpt.Checkpoint.empty(BOOT).with_claim(entry))
    with sim_state.StateFile(h100.state_file).update() as machine:
        gpu = next(g for g in machine.gpus if g.uuid == h100.uuid(1))
        gpu.gpu_instances.append(sim_state.GpuInstanceState(id=1, profile_id=5, start=0, size=4))
    h100.state()  # the restart
    assert instances(h100, 1) == {} and h100.entries() == {}
    h100.state().prepare(claim)
    assert sorted(instances(h100, 1)) == [0]


# --- static MIG ------------------------------------------------------------------------------------


def test_static_mig_devices_are_handed_out_and_never_destroyed(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-a100")
    with gpu_driver.connect("sim:dgx-a100", state_file=node.state_file) as session:
        made = session.create_mig_device(gpu_uuid=node.uuid(0), profile_id=9, placement_start=4)
        node.inventory = session.inventory()
    state = node.state(mig_mode="static")
    claim = node.claims.add(mig_claim(1, "gpu-0-mig-3g20gb-4"))
    [device] = state.prepare(claim)
    assert device.mig is None
    [cdi_device] = cdi.read_spec(node.spec_path(uid(1))).devices
    assert f"NVIDIA_VISIBLE_DEVICES={made.uuid}" in cdi_device.container_edits.env
    assert f"/dev/nvidia-caps/nvidia-cap{cap_minor(0, made.gpu_instance_id)}" in [
        n.path for n in cdi_device.container_edits.device_nodes
    ]
    state.unprepare(claim)
    assert instances(node, 0) == {4: (9, made.uuid)}


def test_a_static_mig_device_that_vanished_is_a_clear_error(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-a100")
    with gpu_driver.connect("sim:dgx-a100", state_file=node.state_file) as session:
        made = session.create_mig_device(gpu_uuid=node.uuid(0), profile_id=19, placement_start=2)
        node.inventory = session.inventory()
        session.destroy_mig_device(gpu_uuid=node.uuid(0), gpu_instance_id=made.gpu_instance_id)
    state = node.state(mig_mode="static")
    with pytest.raises(ClaimError, match=f"MIG device {made.uuid} no longer exists on GPU {node.uuid(0)}"):
        state.prepare(node.claims.add(mig_claim(1, "gpu-0-mig-1g5gb-2")))
    assert uid(1) not in node.entries()


# --- admin access and rebuilt checkpoints ------------------------------------------------------------


def test_admin_access_to_a_partition_reaches_the_device_another_claim_created(h100: Node) -> None:
    state = h100.state()
    owner = h100.claims.add(mig_claim(1, "gpu-4-mig-1g20gb-2"))
    [device] = state.prepare(owner)
    assert device.mig is not None and device.mig.live is not None
    admin = h100.claims.add(
        resource_claim(uid(2), results=[result("watch", "gpu-4-mig-1g20gb-2", admin_access=True)])
    )
    [watched] = state.prepare(admin)
    assert watched.mig is None  # it created nothing, so its unprepare destroys nothing
    [cdi_device] = cdi.read_spec(h100.spec_path(uid(2))).devices
    assert f"NVIDIA_VISIBLE_DEVICES={device.mig.live.uuid}" in cdi_device.container_edits.env
    state.unprepare(admin)
    assert sorted(instances(h100, 4)) == [2]


def test_a_damaged_checkpoint_rebuilds_partitions_with_their_live_ids(h100: Node) -> None:
    state = h100.state()
    claim = h100.claims.add(mig_claim(1, "gpu-6-mig-2g20gb-0"))
    [device] = state.prepare(claim)
    h100.checkpoint_path.write_text("garbage")
    rebuilt = h100.state()
    [again] = rebuilt.prepared_claims()[uid(1)].devices
    assert again.mig == device.mig  # spec from the device name, live ids from the spec's MIG UUID
    [completed] = rebuilt.prepare(claim)  # the kubelet's retry completes it from the claim, in place
    assert completed.mig == device.mig and completed.request_names == ("mig",)
    rebuilt.unprepare(claim)
    assert instances(h100, 6) == {}


def test_a_version_1_checkpoint_with_a_mig_record_is_corrupt(tmp_path: Path) -> None:
    data = ckpt.Checkpoint.empty("boot-1").model_dump(mode="json")
    data["version"] = 1
    data["claims"] = {
        "u": {
            "uid": "u",
            "namespace": "n",
            "name": "c",
            "state": "PrepareCompleted",
            "devices": [
                {
                    "request_names": ["r"],
                    "pool": "p",
                    "device": "gpu-0-mig-1g10gb-0",
                    "cdi_device_ids": [],
                    "gpu_uuids": ["GPU-1"],
                    "mig": {"spec": {"gpu_uuid": "GPU-1", "profile_id": 19, "placement_start": 0}},
                }
            ],
        }
    }
    path = tmp_path / "checkpoint.json"
    write_checkpoint(path, data)
    with pytest.raises(ckpt.CheckpointCorrupt, match="a version 1 checkpoint holds no MIG or MPS record"):
        ckpt.load(path, boot_id="boot-1")


# --- the room left --------------------------------------------------------------------------------


def test_the_largest_placeable_profile_follows_the_prepared_partitions(h100: Node) -> None:
    state = h100.state()
    assert state.mig_room()["gpu-2"] == ("7g.80gb", 7)
    part = h100.claims.add(mig_claim(1, "gpu-2-mig-3g40gb-4"))
    state.prepare(part)
    assert state.mig_room()["gpu-2"] == ("4g.40gb", 4)
    whole = h100.claims.add(whole_gpus(uid(2), "gpu-3"))
    state.prepare(whole)
    assert state.mig_room()["gpu-3"] == ("", 0)

    metrics = PluginMetrics()
    metrics.track_mig_room(state.mig_room)
    text = generate_latest(metrics.registry).decode()
    assert 'gpudra_mig_largest_placeable_slices{gpu="gpu-2",profile="4g.40gb"} 4.0' in text
    assert 'gpudra_mig_largest_placeable_slices{gpu="gpu-3",profile=""} 0.0' in text
    state.unprepare(part)
    assert state.mig_room()["gpu-2"] == ("7g.80gb", 7)
