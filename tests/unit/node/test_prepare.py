"""DeviceState: prepare and unprepare on a simulated node, claim checks, conflicts, crash safety, threads.

Every test runs the real checkpoint and CDI files in a temporary directory, the real device model of a
simulated machine, and SharingCoordinator driving the simulator's stand-in `nvidia-smi`, so a time-slice
asserted here is what the stand-in wrote to the simulated card. Crash tests run prepare or unprepare
in a child process (`python -m tests.unit.harness.crash`) that SIGKILLs itself at one step.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gpudra.errors import ClaimError, ConfigError, GpudraError, HardwareError
from gpudra.gpu.tools import GpuTools
from gpudra.node import cdi, faults
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import ClaimRef
from gpudra.node.prepare import DeviceState
from gpudra.node.recovery import recover
from gpudra.node.sharing import SharingCoordinator
from tests.unit import inventories
from tests.unit.claims import (
    DRIVER,
    NODE,
    from_claim,
    from_class,
    mps,
    resource_claim,
    result,
    time_slicing,
    whole_gpus,
)
from tests.unit.harness.crash import child
from tests.unit.harness.kube import ref
from tests.unit.harness.node import BOOT, Node, queued_edits, uid
from tests.unit.harness.tools import FailingOn, RecordingSharing, UndoFailsOn, mig_mode_off

OTHER_BOOT = "8a7b6c5d-4e3f-4a1b-8c9d-0e1f2a3b4c5d"
LONG = ckpt.TimeSlicingRecord(strategy="TimeSlicing", interval="Long")


@pytest.fixture
def h100(tmp_path: Path) -> Node:
    return Node(tmp_path, "dgx-h100")


# --- whole GPUs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "device", "minor"),
    [("dgx-h100", "gpu-3", 3), ("mixed", "gpu-4", 4)],
    ids=["h100", "mixed-t4-minor-differs-from-index"],
)
def test_prepare_whole_gpu(tmp_path: Path, profile: str, device: str, minor: int) -> None:
    node = Node(tmp_path, profile)
    claim = resource_claim(uid(1), results=[result("gpus/fast", device)])
    answer = node.state().prepare(node.claims.add(claim))

    cdi_id = f"{DRIVER}/claim={uid(1)}-{device}"
    assert answer == (
        ckpt.PreparedDevice(
            request_names=("gpus",),
            pool=NODE,
            device=device,
            cdi_device_ids=(cdi_id,),
            gpu_uuids=(node.uuid(minor),),
            sharing=None,  # no sharing config: the GPU is left as it is
        ),
    )
    spec = json.loads(node.spec_path(uid(1)).read_text())
    assert spec["kind"] == f"{DRIVER}/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{uid(1)}-{device}"]
    edits = spec["devices"][0]["containerEdits"]
    assert edits["env"] == [f"NVIDIA_VISIBLE_DEVICES={node.uuid(minor)}"]
    assert edits["deviceNodes"] == [{"path": f"/dev/nvidia{minor}"}]
    entry = node.entries()[uid(1)]
    assert (entry.state, entry.namespace, entry.name, entry.devices) == (
        "PrepareCompleted",
        "default",
        f"claim-{uid(1)}",
        answer,
    )


def test_prepare_several_devices_and_requests(h100: Node) -> None:
    claim = resource_claim(
        uid(1), results=[result("a", "gpu-0"), result("b/sub", "gpu-5"), result("b/sub", "gpu-6")]
    )
    answer = h100.state().prepare(h100.claims.add(claim))
    assert [(d.request_names, d.device) for d in answer] == [
        (("a",), "gpu-0"),
        (("b",), "gpu-5"),
        (("b",), "gpu-6"),
    ]
    spec = json.loads(h100.spec_path(uid(1)).read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{uid(1)}-gpu-{n}" for n in (0, 5, 6)]


def test_prepare_lists_the_toolkit_device_after_its_own(h100: Node) -> None:
    h100.toolkit_dir.mkdir()
    toolkit = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": h100.uuid(2)}]}
    (h100.toolkit_dir / "nvidia.json").write_text(json.dumps(toolkit))
    [device] = h100.state().prepare(h100.claims.add(whole_gpus(uid(1), "gpu-2")))
    assert device.cdi_device_ids == (f"{DRIVER}/claim={uid(1)}-gpu-2", f"nvidia.com/gpu={h100.uuid(2)}")


def test_repeated_prepare_answers_the_same_without_side_effects(h100: Node) -> None:
    state = h100.state()
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-0", config=[from_claim(time_slicing("Long"))]))
    first = state.prepare(claim)
    spec, checkpoint = h100.spec_path(uid(1)).stat(), h100.checkpoint_path.stat()
    h100.set_timeslice(h100.uuid(0), 2)  # a second apply would set it back to 3
    h100.claims.clear()  # a second prepare must not need the claim

    assert state.prepare(claim) == first
    assert h100.spec_path(uid(1)).stat().st_ino == spec.st_ino  # both are replaced by rename when written
    assert h100.checkpoint_path.stat().st_ino == checkpoint.st_ino
    assert h100.state().prepare(claim) == first  # after a restart too
    assert h100.timeslices()[h100.uuid(0)] == 2


def test_unprepare_removes_the_spec_the_entry_and_the_timeslice(h100: Node) -> None:
    state = h100.state()
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-1", config=[from_claim(time_slicing("Long"))]))
    state.prepare(claim)
    assert h100.timeslices()[h100.uuid(1)] == 3
    h100.claims.clear()  # the claim object is gone before the kubelet unprepares

    state.unprepare(claim)
    h100.assert_nothing_left(uid(1))
    assert state.prepared_claims() == {}
    state.unprepare(claim)  # again
    h100.assert_nothing_left(uid(1))


def test_unprepare_of_a_claim_never_prepared_removes_a_leftover_spec(h100: Node) -> None:
    state = h100.state()
    leftover = cdi.build_claim_spec(
        driver=DRIVER,
        claim_uid=uid(9),
        devices=[cdi.ClaimDevice(name="gpu-1", gpu_minor=1, uuid=h100.uuid(1))],
    )
    cdi.write_spec(h100.cdi_root, leftover, claim_uid=uid(9))
    state.unprepare(ClaimRef(uid=uid(9), namespace="default", name="never"))
    assert not h100.spec_path(uid(9)).exists()
    state.unprepare(ClaimRef(uid=uid(9), namespace="default", name="never"))
    assert state.prepared_claims() == {}


def test_unprepare_leaves_other_claims_alone(h100: Node) -> None:
    state = h100.state()
    first = h100.claims.add(whole_gpus(uid(1), "gpu-0", config=[from_claim(time_slicing("Long"))]))
    second = h100.claims.add(whole_gpus(uid(2), "gpu-1", config=[from_claim(time_slicing("Short"))]))
    state.prepare(first)
    state.prepare(second)
    state.unprepare(first)
    assert set(h100.entries()) == {uid(2)}
    assert h100.spec_path(uid(2)).exists()
    assert h100.timeslices()[h100.uuid(1)] == 1


# --- claim checks ------------------------------------------------------------------------------

LONG_ON_A = from_claim(time_slicing("Long"), "a")


def _bad_config(parameters: dict[str, Any]) -> dict[str, Any]:
    return resource_claim(
        uid(1), results=[result("a", "gpu-0"), result("b", "gpu-1")], config=[from_claim(parameters)]
    )


BAD_CLAIMS: dict[str, tuple[dict[str, Any], type[GpudraError], str]] = {
    "uid mismatch": (
        whole_gpus(uid(2), "gpu-0", name=f"claim-{uid(1)}"),
        ClaimError,
        f"ResourceClaim default/claim-{uid(1)} has UID {uid(2)}, not {uid(1)} "
        "(it was deleted and created again)",
    ),
    "not allocated": (
        resource_claim(uid(1), results=None),
        ClaimError,
        f"ResourceClaim default/claim-{uid(1)} ({uid(1)}) is not allocated",
    ),
    "no results for this driver": (
        resource_claim(uid(1), results=[result("a", "gpu-0", driver="other.example.com")]),
        ClaimError,
        f"ResourceClaim default/claim-{uid(1)} ({uid(1)}) has no devices of driver {DRIVER}",
    ),
    "another node's pool": (
        resource_claim(uid(1), results=[result("a", "gpu-0"), result("b", "gpu-1", pool="node-b")]),
        ClaimError,
        f"device gpu-1 of ResourceClaim default/claim-{uid(1)} ({uid(1)}) is in pool node-b, "
        f"not in this node's pool {NODE}",
    ),
    "device not on this node": (
        resource_claim(uid(1), results=[result("a", "gpu-0"), result("b", "gpu-8")]),
        ClaimError,
        f"device gpu-8 of ResourceClaim default/claim-{uid(1)} ({uid(1)}) is not on this node",
    ),
    "bad interval": (
        _bad_config(time_slicing("Forever")),
        ConfigError,
        "status.allocation.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval: "
        "must be one of: Default, Short, Medium, Long",
    ),
    "unknown field": (
        _bad_config({**time_slicing("Long"), "replicas": 4}),
        ConfigError,
        "status.allocation.devices.config[0].opaque.parameters.replicas: unknown field; "
        "the fields here are: apiVersion, kind, sharing",
    ),
    "bad source": (
        resource_claim(
            uid(1),
            results=[result("a", "gpu-0")],
            config=[{**from_claim(time_slicing("Long")), "source": "FromNowhere"}],
        ),
        ConfigError,
        "status.allocation.devices.config[0].source: must be one of: FromClass, FromClaim",
    ),
    "MPS limit above the device": (
        resource_claim(
            uid(1),
            results=[result("a", "gpu-0"), result("b", "gpu-1")],
            config=[
                LONG_ON_A,
                from_claim(
                    {
                        **mps(),
                        "sharing": {
                            "strategy": "MPS",
                            "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "100Gi"},
                        },
                    },
                    "b",
                ),
            ],
        ),
        ConfigError,
        "status.allocation.devices.config[1].opaque.parameters.sharing.mpsConfig."
        "defaultPinnedDeviceMemoryLimit: "
        "100Gi is above the 81559Mi of memory of gpu-1; allowed: 1Mi to 81559Mi",
    ),
    "MPS devices of one claim with different thread percentages": (
        resource_claim(
            uid(1),
            results=[result("a", "gpu-0"), result("b", "gpu-1")],
            config=[from_claim(mps(50), "a"), from_claim(mps(25), "b")],
        ),
        ConfigError,
        "status.allocation.devices.config[1].opaque.parameters.sharing.mpsConfig."
        "defaultActiveThreadPercentage: "
        "the claim's MPS devices share one control daemon, whose active thread percentage is one value; "
        "they ask 50 for gpu-0, 25 for gpu-1: give them the same",
    ),
}


@pytest.mark.parametrize(("claim", "error", "message"), BAD_CLAIMS.values(), ids=BAD_CLAIMS)
def test_bad_claims_fail_with_a_clear_message_and_leave_nothing(
    h100: Node, claim: dict[str, Any], error: type[GpudraError], message: str
) -> None:
    state = h100.state()
    h100.claims.add(claim)
    with pytest.raises(error) as raised:
        state.prepare(ClaimRef(uid=uid(1), namespace="default", name=f"claim-{uid(1)}"))
    assert str(raised.value) == message
    h100.assert_nothing_left(uid(1))
    assert state.prepared_claims() == {}


def test_a_config_error_names_the_field(h100: Node) -> None:
    h100.claims.add(_bad_config(time_slicing("Forever")))
    with pytest.raises(ConfigError) as raised:
        h100.state().prepare(ClaimRef(uid=uid(1), namespace="default", name=f"claim-{uid(1)}"))
    field = "status.allocation.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval"
    assert raised.value.field == field


def test_a_claim_that_is_gone_is_an_error(h100: Node) -> None:
    with pytest.raises(ClaimError, match="not found"):
        h100.state().prepare(ClaimRef(uid=uid(1), namespace="default", name="gone"))


def test_a_failing_apply_rolls_back_the_devices_already_applied(h100: Node) -> None:
    state = h100.state(
        sharing=FailingOn(SharingCoordinator(h100.tools, mps_root=h100.root / "mps"), h100.uuid(1))
    )
    claim = h100.claims.add(
        resource_claim(
            uid(1),
            results=[result("a", "gpu-0"), result("b", "gpu-1")],
            config=[from_claim(time_slicing("Long"))],
        )
    )
    with pytest.raises(HardwareError, match="nvidia-smi failed"):
        state.prepare(claim)
    h100.assert_nothing_left(uid(1))


# --- devices held by other claims ---------------------------------------------------------------


def test_a_device_prepared_for_another_claim_is_refused(h100: Node) -> None:
    state = h100.state()
    state.prepare(h100.claims.add(whole_gpus(uid(1), "gpu-0", name="first")))
    second = h100.claims.add(
        resource_claim(uid(2), name="second", results=[result("a", "gpu-1"), result("b", "gpu-0")])
    )
    with pytest.raises(ClaimError) as raised:
        state.prepare(second)
    assert str(raised.value) == f"device gpu-0 is already prepared for ResourceClaim default/first ({uid(1)})"
    assert set(h100.entries()) == {uid(1)}
    assert not h100.spec_path(uid(2)).exists()

    state.unprepare(ref(h100.claims.objects[("default", "first")]))
    state.prepare(second)  # free again
    assert set(h100.entries()) == {uid(2)}


@pytest.mark.parametrize("admin_first", [False, True], ids=["user-then-admin", "admin-then-user"])
def test_admin_access_does_not_conflict(h100: Node, admin_first: bool) -> None:
    state = h100.state()
    user = whole_gpus(uid(1), "gpu-0", config=[from_claim(time_slicing("Long"))])
    admin = resource_claim(uid(2), results=[result("monitor", "gpu-0", admin_access=True)])
    for claim in (admin, user) if admin_first else (user, admin):
        state.prepare(h100.claims.add(claim))
    assert set(h100.entries()) == {uid(1), uid(2)}
    [admin_device] = h100.entries()[uid(2)].devices
    assert admin_device.admin_access and admin_device.sharing is None
    assert h100.timeslices()[h100.uuid(0)] == 3  # the admin claim leaves the user's setting alone

    state.unprepare(ref(admin))
    assert h100.timeslices()[h100.uuid(0)] == 3
    another = h100.claims.add(whole_gpus(uid(3), "gpu-0"))
    with pytest.raises(ClaimError, match=f"already prepared for ResourceClaim default/claim-{uid(1)}"):
        state.prepare(another)


# --- time-slicing --------------------------------------------------------------------------------

TIMESLICE_CASES = {
    "claim Long": ([from_claim(time_slicing("Long"))], {0: 3, 1: 3}),
    "class Medium": ([from_class(time_slicing("Medium"))], {0: 2, 1: 2}),
    "claim overrides class": (
        [from_class(time_slicing("Short")), from_claim(time_slicing("Long"))],
        {0: 3, 1: 3},
    ),
    "claim overrides class for one request": (
        [from_class(time_slicing("Short")), from_claim(time_slicing("Long"), "b")],
        {0: 1, 1: 3},
    ),
    "later claim entry wins": (
        [from_claim(time_slicing("Long"), "a"), from_claim(time_slicing("Medium"))],
        {0: 2, 1: 2},
    ),
    "no config": ([], {0: 0, 1: 0}),
}


@pytest.mark.parametrize(("config", "expected"), TIMESLICE_CASES.values(), ids=TIMESLICE_CASES)
def test_time_slicing_sets_the_gpu_through_nvidia_smi(
    h100: Node, config: list[dict[str, Any]], expected: dict[int, int]
) -> None:
    state = h100.state()
    claim = h100.claims.add(
        resource_claim(uid(1), results=[result("a", "gpu-0"), result("b", "gpu-1")], config=config)
    )
    state.prepare(claim)
    others = {h100.uuid(minor): 0 for minor in range(2, 8)}
    assert h100.timeslices() == {h100.uuid(0): expected[0], h100.uuid(1): expected[1], **others}
    state.unprepare(claim)
    assert set(h100.timeslices().values()) == {0}


def test_a_gpu_without_sharing_config_runs_no_tool_and_saves_the_checkpoint_once(
    h100: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Any tool run would fail; every checkpoint write is counted.
    state = h100.state(sharing=SharingCoordinator(GpuTools(search_path=""), mps_root=h100.root / "mps"))
    saves: list[Path] = []
    real_save = ckpt.save

    def counted_save(path: Path, checkpoint: ckpt.Checkpoint) -> None:
        saves.append(path)
        real_save(path, checkpoint)

    monkeypatch.setattr(ckpt, "save", counted_save)
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-4"))
    state.prepare(claim)
    assert (h100.entries()[uid(1)].state, len(saves)) == ("PrepareCompleted", 1)
    assert h100.spec_path(uid(1)).exists()
    state.unprepare(claim)
    assert len(saves) == 2
    h100.assert_nothing_left(uid(1))


def test_the_time_slice_of_a_previous_claim_is_reset_at_its_unprepare(h100: Node) -> None:
    state = h100.state()
    first = h100.claims.add(whole_gpus(uid(1), "gpu-4", config=[from_claim(time_slicing("Long"))]))
    state.prepare(first)
    state.unprepare(first)
    state.prepare(h100.claims.add(whole_gpus(uid(2), "gpu-4")))
    assert h100.timeslices()[h100.uuid(4)] == 0


# --- crash safety ------------------------------------------------------------------------------


# step -> (checkpoint state, CDI spec present, time-slice) as the crash leaves them
CRASH_LEAVES: dict[str, tuple[str, bool, int]] = {
    "prepare-started": ("PrepareStarted", False, 0),
    "prepare-mig-created": ("PrepareStarted", False, 0),  # a whole GPU: no MIG device to create
    "prepare-applied": ("PrepareStarted", False, 3),
    "prepare-cdi-written": ("PrepareStarted", True, 3),
    "prepare-completed": ("PrepareCompleted", True, 3),
    "unprepare-started": ("UnprepareStarted", True, 3),
    "unprepare-undone": ("UnprepareStarted", True, 0),
    "unprepare-mig-destroyed": ("UnprepareStarted", True, 0),
    "unprepare-cdi-deleted": ("UnprepareStarted", False, 0),
}


def test_every_crash_step_is_covered() -> None:
    assert set(CRASH_LEAVES) == set(faults.STEPS)


@pytest.mark.parametrize("step", faults.PREPARE_STEPS)
def test_crash_during_prepare_is_rolled_back_at_restart(h100: Node, step: str) -> None:
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-2", config=[from_claim(time_slicing("Long"))]))
    h100.state()  # the checkpoint file exists, as after the plugin's first start
    crashed = child(h100, "prepare", claim, step)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    state, spec, timeslice = CRASH_LEAVES[step]
    [device] = h100.entries()[uid(1)].devices
    assert h100.entries()[uid(1)].state == state
    assert device.sharing == LONG  # recorded before the GPU changed, so a rollback knows what to undo
    assert h100.spec_path(uid(1)).exists() == spec
    assert h100.timeslices()[h100.uuid(2)] == timeslice

    restarted = h100.state()
    if step == "prepare-completed":  # done before the crash: kept, and the kubelet's retry gets it
        assert restarted.prepared_claims()[uid(1)].state == "PrepareCompleted"
        assert h100.spec_path(uid(1)).exists()
    else:
        h100.assert_nothing_left(uid(1))
    [device] = restarted.prepare(claim)
    assert device.cdi_device_ids == (f"{DRIVER}/claim={uid(1)}-gpu-2",)
    assert h100.entries()[uid(1)].state == "PrepareCompleted"
    assert h100.spec_path(uid(1)).exists()
    assert h100.timeslices()[h100.uuid(2)] == 3


@pytest.mark.parametrize("step", faults.UNPREPARE_STEPS)
def test_crash_during_unprepare_is_finished_at_restart(h100: Node, step: str) -> None:
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-2", config=[from_claim(time_slicing("Long"))]))
    h100.state().prepare(claim)
    crashed = child(h100, "unprepare", claim, step)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    state, spec, timeslice = CRASH_LEAVES[step]
    assert h100.entries()[uid(1)].state == state
    assert h100.spec_path(uid(1)).exists() == spec
    assert h100.timeslices()[h100.uuid(2)] == timeslice

    restarted = h100.state()
    h100.assert_nothing_left(uid(1))
    assert restarted.prepared_claims() == {}
    restarted.unprepare(claim)  # the kubelet's retry
    h100.assert_nothing_left(uid(1))


@pytest.mark.parametrize("step", faults.STEPS)
def test_a_claim_that_changes_no_gpu_survives_a_crash_at_any_step(h100: Node, step: str) -> None:
    """Its one checkpoint save is the completion (prepare) or the forgetting (unprepare): a crash before
    it leaves at most a spec no entry names, which the restart deletes; after it, the claim is settled."""
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-2"))
    h100.state()
    if step.startswith("unprepare"):
        h100.state().prepare(claim)
    crashed = child(h100, "unprepare" if step.startswith("unprepare") else "prepare", claim, step)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    restarted = h100.state()
    if step == "prepare-completed":
        assert restarted.prepared_claims()[uid(1)].state == "PrepareCompleted"
        assert h100.spec_path(uid(1)).exists()
    elif step in ("unprepare-started", "unprepare-undone", "unprepare-mig-destroyed"):
        assert restarted.prepared_claims()[uid(1)].state == "PrepareCompleted"  # not begun: the retry does it
        assert h100.spec_path(uid(1)).exists()
    else:  # for unprepare-cdi-deleted: the spec was gone, the entry not yet; the restart forgot it
        h100.assert_nothing_left(uid(1))
    restarted.prepare(claim)
    assert h100.spec_path(uid(1)).exists()
    restarted.unprepare(claim)
    h100.assert_nothing_left(uid(1))


def test_recover_removes_a_half_written_spec_that_no_write_will_clean(h100: Node) -> None:
    """A claim that changes no GPU, killed inside its spec's write: no entry, no spec, only the temp file."""
    h100.cdi_root.mkdir(parents=True, exist_ok=True)
    leftover = h100.cdi_root / f".{DRIVER}-claim_{uid(1)}.json.x1y2z3.tmp"
    leftover.write_text("{")
    other = h100.cdi_root / ".other-vendor-spec.json.a.tmp"  # not gpudra's
    other.write_text("{")
    h100.state()
    assert not leftover.exists() and other.exists()


def test_a_repeated_prepare_writes_a_lost_spec_again(h100: Node) -> None:
    """An unprepare that deleted the spec and then could not forget the claim (a full disk) leaves a
    completed entry without its spec: a repeated prepare must not answer with a spec that is gone."""
    state = h100.state()
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-2"))
    state.prepare(claim)
    h100.spec_path(uid(1)).unlink()
    [device] = state.prepare(claim)
    assert device.cdi_device_ids == (f"{DRIVER}/claim={uid(1)}-gpu-2",)
    assert h100.spec_path(uid(1)).exists()
    assert h100.entries()[uid(1)].state == "PrepareCompleted"


def test_the_crash_child_runs_to_the_end_without_a_crash_step(h100: Node) -> None:
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-2"))
    h100.state()
    finished = child(h100, "prepare", claim, "")
    assert finished.returncode == 0, finished.stderr
    assert h100.entries()[uid(1)].state == "PrepareCompleted"


def test_a_claim_that_cannot_be_settled_at_start_up_does_not_stop_the_plugin(h100: Node) -> None:
    """One broken GPU must not keep the plugin from starting: its claim waits for the kubelet's retry."""
    first = h100.claims.add(whole_gpus(uid(1), "gpu-2", config=[from_claim(time_slicing("Long"))]))
    second = h100.claims.add(whole_gpus(uid(2), "gpu-3", config=[from_claim(time_slicing("Long"))]))
    state = h100.state()
    state.prepare(first)
    state.prepare(second)
    interrupted = ckpt.Checkpoint.empty(BOOT)  # as a crash of both before PrepareCompleted leaves it
    for entry in h100.entries().values():
        interrupted = interrupted.with_claim(entry.with_state("PrepareStarted"))
    ckpt.save(h100.checkpoint_path, interrupted)

    sharing = UndoFailsOn(SharingCoordinator(h100.tools, mps_root=h100.root / "mps"), h100.uuid(2))
    restarted = h100.state(sharing=sharing)
    assert not h100.spec_path(uid(2)).exists() and h100.timeslices()[h100.uuid(3)] == 0
    assert set(restarted.prepared_claims()) == {uid(1)}
    assert restarted.prepared_claims()[uid(1)].state == "UnprepareStarted"
    assert h100.entries()[uid(1)].state == "UnprepareStarted"
    with pytest.raises(
        ClaimError, match=f"gpu-2 is already prepared for ResourceClaim default/claim-{uid(1)}"
    ):
        restarted.prepare(h100.claims.add(whole_gpus(uid(3), "gpu-2")))

    sharing.gpu_uuid = "GPU-healed"
    restarted.unprepare(first)  # the kubelet's retry, once the GPU answers again
    h100.assert_nothing_left(uid(1))


def test_specs_of_an_earlier_boot_are_removed_at_recover(h100: Node) -> None:
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-0"))
    h100.state(boot_id=OTHER_BOOT).prepare(claim)
    assert h100.spec_path(uid(1)).exists()

    rebooted = h100.state(boot_id=BOOT)
    assert rebooted.prepared_claims() == {}
    assert not h100.spec_path(uid(1)).exists()
    saved = ckpt.load(h100.checkpoint_path, boot_id=BOOT)
    assert (saved.checkpoint.boot_id, saved.checkpoint.claims, saved.stale_claims) == (BOOT, {}, {})
    rebooted.prepare(claim)
    assert h100.spec_path(uid(1)).exists()


def test_a_corrupt_checkpoint_is_copied_aside_and_claims_are_rebuilt_from_their_cdi_specs(h100: Node) -> None:
    """A damaged checkpoint must not forget running claims: their CDI specs stay (their containers
    can restart) and their GPUs stay taken until the kubelet unprepares them."""
    state = h100.state()
    running = h100.claims.add(whole_gpus(uid(1), "gpu-0", "gpu-1"))
    state.prepare(running)
    garbage = h100.checkpoint_path.read_bytes()[:-40]
    h100.checkpoint_path.write_bytes(garbage)

    restarted = h100.state()
    [moved] = h100.checkpoint_path.parent.glob("checkpoint.json.corrupt-*")
    assert moved.read_bytes() == garbage
    assert h100.spec_path(uid(1)).exists()
    rebuilt = restarted.prepared_claims()[uid(1)]
    assert rebuilt.state == "PrepareCompleted"
    assert [d.device for d in rebuilt.devices] == ["gpu-0", "gpu-1"]
    assert set(h100.entries()) == {uid(1)}  # and it is durable

    with pytest.raises(ClaimError, match=r"gpu-0 is already prepared .*recovered from its CDI spec"):
        restarted.prepare(h100.claims.add(whole_gpus(uid(2), "gpu-0")))
    restarted.prepare(h100.claims.add(whole_gpus(uid(3), "gpu-2")))  # a free GPU is fine

    # a repeated prepare of the running claim reads it again and records it in full
    devices = restarted.prepare(running)
    assert [d.request_names for d in devices] == [("gpu",), ("gpu",)]
    restarted.unprepare(running)
    assert not h100.spec_path(uid(1)).exists()
    restarted.prepare(h100.claims.add(whole_gpus(uid(2), "gpu-0")))
    assert set(h100.entries()) == {uid(2), uid(3)}


def test_an_unreadable_checkpoint_refuses_claims_until_it_is_fixed(h100: Node) -> None:
    running = h100.claims.add(whole_gpus(uid(1), "gpu-0"))
    h100.state().prepare(running)
    saved = h100.checkpoint_path.read_bytes()
    h100.checkpoint_path.unlink()
    h100.checkpoint_path.mkdir()  # e.g. a hostPath mount gone wrong

    state = h100.state(recover=False)
    recovery = recover(state)

    assert recovery.refused is not None
    assert re.search(r"cannot read the checkpoint .*checkpoint.json: Is a directory", recovery.refused)
    assert state.refusal == recovery.refused
    for call in (state.prepare, state.unprepare):
        with pytest.raises(ClaimError, match=r"not preparing or unpreparing claims on this node: cannot"):
            call(h100.claims.add(whole_gpus(uid(2), "gpu-1")))
        with pytest.raises(ClaimError, match="not preparing"):
            call(running)  # not even the running claim: nothing is known about it
    assert h100.spec_path(uid(1)).exists()
    assert h100.checkpoint_path.is_dir()

    # the operator puts the file back; the next recover() (the plugin retries it) serves again
    h100.checkpoint_path.rmdir()
    h100.checkpoint_path.write_bytes(saved)
    assert recover(state).refused is None
    assert state.refusal is None
    state.unprepare(running)
    assert not h100.spec_path(uid(1)).exists()


def test_a_state_that_has_not_recovered_yet_refuses_claims(h100: Node) -> None:
    state = h100.state(recover=False)
    with pytest.raises(ClaimError, match="the checkpoint has not been loaded yet"):
        state.prepare(h100.claims.add(whole_gpus(uid(1), "gpu-0")))


def test_a_failed_save_changes_nothing_in_memory(h100: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """Disk full at the first checkpoint write: no phantom entry may refuse the next claim."""
    state = h100.state()

    def disk_full(path: Path, checkpoint: ckpt.Checkpoint) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        state.prepare(h100.claims.add(whole_gpus(uid(1), "gpu-0")))
    assert state.prepared_claims() == {}
    monkeypatch.undo()
    state.prepare(h100.claims.add(whole_gpus(uid(2), "gpu-0")))
    assert set(state.prepared_claims()) == {uid(2)}


def test_stray_specs_of_unknown_claims_are_removed_at_recover(h100: Node) -> None:
    h100.state().prepare(h100.claims.add(whole_gpus(uid(1), "gpu-0")))
    stray = cdi.build_claim_spec(
        driver=DRIVER,
        claim_uid=uid(7),
        devices=[cdi.ClaimDevice(name="gpu-1", gpu_minor=1, uuid=h100.uuid(1))],
    )
    cdi.write_spec(h100.cdi_root, stray, claim_uid=uid(7))
    other_driver = h100.cdi_root / f"other.example.com-claim_{uid(8)}.json"
    other_driver.write_text("{}")
    toolkit = h100.cdi_root / "nvidia.yaml"
    toolkit.write_text("kind: nvidia.com/gpu\n")

    h100.state()
    assert not h100.spec_path(uid(7)).exists()
    assert h100.spec_path(uid(1)).exists()
    assert other_driver.exists() and toolkit.exists()


# --- concurrency -------------------------------------------------------------------------------


def _all_at_once(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run `calls` from as many threads, released together; each call's return value or exception."""
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        start.wait()
        try:
            return call()
        except GpudraError as err:
            return err

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


@pytest.fixture
def big(tmp_path: Path) -> Iterator[tuple[Node, RecordingSharing, DeviceState]]:
    node = Node(tmp_path, "mixed")  # files only: the GPUs come from a hand-built inventory
    sharing = RecordingSharing(pause=0.002)
    inventory = inventories.node(*(inventories.h100(minor) for minor in range(56)))
    # These GPUs are not on the simulated machine: their MIG mode is off, as far as prepare asks.
    yield node, sharing, node.state(sharing=sharing, inventory=inventory, mig=mig_mode_off(inventory.gpus))


def test_fifty_claims_on_different_devices_prepare_at_once(
    big: tuple[Node, RecordingSharing, DeviceState],
) -> None:
    node, sharing, state = big
    claims = [node.claims.add(whole_gpus(uid(n), f"gpu-{n}")) for n in range(50)]
    answers = _all_at_once([lambda c=c: state.prepare(c) for c in claims])  # type: ignore[misc]
    assert [a[0].device for a in answers] == [f"gpu-{n}" for n in range(50)]
    assert sharing.overlaps == []
    entries = node.entries()
    assert set(entries) == {uid(n) for n in range(50)}
    assert {e.state for e in entries.values()} == {"PrepareCompleted"}
    assert set(cdi.list_claim_specs(node.cdi_root, driver=DRIVER)) == set(entries)

    assert _all_at_once([lambda c=c: state.unprepare(c) for c in claims]) == [None] * 50  # type: ignore[misc]
    assert node.entries() == {}
    assert cdi.list_claim_specs(node.cdi_root, driver=DRIVER) == {}
    assert sorted(sharing.undone) == sorted(sharing.applied)


def test_two_claims_for_one_device_at_once_exactly_one_wins(
    big: tuple[Node, RecordingSharing, DeviceState],
) -> None:
    node, sharing, state = big
    for round_ in range(25):
        device = f"gpu-{round_ % 8}"
        pair = [node.claims.add(whole_gpus(uid(2 * round_ + i), device)) for i in range(2)]
        outcomes = _all_at_once([lambda c=c: state.prepare(c) for c in pair])  # type: ignore[misc]
        failed = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, ClaimError)]
        assert len(failed) == 1, outcomes
        winner, loser = pair[1 - failed[0]], pair[failed[0]]
        assert str(outcomes[failed[0]]) == (
            f"device {device} is already prepared for ResourceClaim default/{winner.name} ({winner.uid})"
        )
        assert set(node.entries()) == {winner.uid}
        assert not node.spec_path(loser.uid).exists()
        state.unprepare(winner)
    assert sharing.overlaps == []


def test_the_same_claim_prepared_twice_at_once_is_prepared_once(
    big: tuple[Node, RecordingSharing, DeviceState],
) -> None:
    node, sharing, state = big
    claim = node.claims.add(whole_gpus(uid(1), "gpu-7", "gpu-3"))
    first, second = _all_at_once([lambda: state.prepare(claim), lambda: state.prepare(claim)])
    assert first == second
    assert sorted(sharing.applied) == sorted(uuid for device in first for uuid in device.gpu_uuids)
    assert len(sharing.applied) == 2


def _threaded(node: Node) -> DeviceState:
    """A state for claims prepared from several threads at once (the tests' MIG hardware opens the
    simulator per call, which threads must not do at once; the plugin keeps one session)."""
    return node.state(mig=mig_mode_off(node.inventory.gpus))


def _held_first_save(
    state: DeviceState, monkeypatch: pytest.MonkeyPatch, *, waiting: int, fails: bool = False
) -> list[set[str]]:
    """Make the first checkpoint save wait until `waiting` more edits queue behind it; every save's
    claims are noted (a save that `fails` raises disk full instead, after noting them)."""
    saves: list[set[str]] = []
    real_save = ckpt.save

    def held_save(path: Path, checkpoint: ckpt.Checkpoint) -> bytes:
        if not saves:
            deadline = time.monotonic() + 10
            while queued_edits(state) < waiting and time.monotonic() < deadline:
                time.sleep(0.001)
        saves.append(set(checkpoint.claims))
        if fails:
            raise ckpt.CheckpointNotSaved(f"cannot save the checkpoint {path}: No space left on device")
        return real_save(path, checkpoint)

    monkeypatch.setattr(ckpt, "save", held_save)
    return saves


def test_claims_saved_while_a_save_runs_share_the_next_save(
    h100: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, state = h100, _threaded(h100)  # whole GPUs without config: one save per prepare
    claims = [node.claims.add(whole_gpus(uid(n), f"gpu-{n}")) for n in range(8)]
    saves = _held_first_save(state, monkeypatch, waiting=7)
    answers = _all_at_once([lambda c=c: state.prepare(c) for c in claims])  # type: ignore[misc]
    assert [a[0].device for a in answers] == [f"gpu-{n}" for n in range(8)]
    # The first claim's save, then one save for the seven that queued meanwhile: each returned only
    # once a save holding its entry was done.
    assert len(saves) == 2
    assert saves[1] == {uid(n) for n in range(8)}
    assert set(node.entries()) == {uid(n) for n in range(8)}
    assert set(state.prepared_claims()) == {uid(n) for n in range(8)}


def test_a_failed_save_fails_every_claim_it_held(h100: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    node, state = h100, _threaded(h100)
    claims = [node.claims.add(whole_gpus(uid(n), f"gpu-{n}")) for n in range(4)]
    saves = _held_first_save(state, monkeypatch, waiting=3, fails=True)
    outcomes = _all_at_once([lambda c=c: state.prepare(c) for c in claims])  # type: ignore[misc]
    assert [type(outcome) for outcome in outcomes] == [ckpt.CheckpointNotSaved] * 4
    assert all("No space left on device" in str(outcome) for outcome in outcomes)
    assert len(saves) == 2  # the first claim's, then the other three's together
    assert state.prepared_claims() == {}
    assert cdi.list_claim_specs(node.cdi_root, driver=DRIVER) == {}  # each rolled its spec back
    monkeypatch.undo()
    assert [a[0].device for a in map(state.prepare, claims)] == [f"gpu-{n}" for n in range(4)]


# --- recover() when the checkpoint is damaged, missing or cannot be saved -----------------------------


def test_a_missing_checkpoint_with_claim_specs_on_disk_rebuilds_instead_of_deleting(h100: Node) -> None:
    """Someone deleted the checkpoint: the specs may belong to running claims, so they stay."""
    running = h100.claims.add(whole_gpus(uid(1), "gpu-0"))
    h100.state().prepare(running)
    h100.checkpoint_path.unlink()

    state = h100.state(recover=False)
    recovery = recover(state)

    assert recovery.damage is not None and "missing but 1 claim spec(s)" in recovery.damage
    assert recovery.rebuilt == 1 and recovery.copied_to is None
    assert h100.spec_path(uid(1)).exists()
    with pytest.raises(ClaimError, match="already prepared"):
        state.prepare(h100.claims.add(whole_gpus(uid(2), "gpu-0")))


def test_a_damaged_checkpoint_rebuilds_admin_claims_as_admin(h100: Node) -> None:
    user = h100.claims.add(whole_gpus(uid(1), "gpu-0", config=[from_claim(time_slicing("Long"))]))
    admin = h100.claims.add(resource_claim(uid(2), results=[result("monitor", "gpu-0", admin_access=True)]))
    state = h100.state()
    state.prepare(user)
    state.prepare(admin)
    spec = json.loads(h100.spec_path(uid(2)).read_text())
    assert spec["cdiVersion"] == "0.6.0"  # annotations need 0.6.0; specs without them stay 0.5.0
    assert spec["devices"][0]["annotations"] == {"gpudra.io/admin-access": "true"}
    assert json.loads(h100.spec_path(uid(1)).read_text())["cdiVersion"] == "0.5.0"
    h100.checkpoint_path.write_bytes(b"garbage")

    restarted = h100.state()

    rebuilt = restarted.prepared_claims()
    assert [d.admin_access for d in rebuilt[uid(2)].devices] == [True]
    assert [d.admin_access for d in rebuilt[uid(1)].devices] == [False]
    # A spec does not say the user's interval: the rebuild put the GPU back to Default, which is what the
    # rebuilt entry (no time-slice record) says.
    assert [d.sharing for d in rebuilt[uid(1)].devices] == [None]
    assert h100.timeslices()[h100.uuid(0)] == 0
    restarted.prepare(user)  # the kubelet's repeated prepare: not refused by the admin claim
    restarted.unprepare(admin)
    restarted.unprepare(user)
    h100.assert_nothing_left(uid(1))


def test_a_crash_between_copying_and_replacing_a_damaged_checkpoint_rebuilds_again(
    h100: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    h100.state().prepare(h100.claims.add(whole_gpus(uid(1), "gpu-0")))
    h100.checkpoint_path.write_bytes(b"garbage")

    def disk_full(path: Path, checkpoint: ckpt.Checkpoint) -> None:
        raise ckpt.CheckpointNotSaved(f"cannot save the checkpoint {path}: No space left on device")

    monkeypatch.setattr(ckpt, "save", disk_full)  # the save of the rebuilt checkpoint fails
    state = h100.state(recover=False)
    recovery = recover(state)
    assert recovery.refused is not None and "No space left on device" in recovery.refused
    assert h100.checkpoint_path.read_bytes() == b"garbage"  # still in place: the next start sees it
    assert h100.spec_path(uid(1)).exists()
    with pytest.raises(ClaimError, match="not preparing"):
        state.prepare(h100.claims.add(whole_gpus(uid(2), "gpu-1")))

    monkeypatch.undo()
    recovery = recover(state)  # what the plugin's retry loop does
    assert recovery.refused is None and recovery.rebuilt == 1
    assert set(h100.entries()) == {uid(1)} and h100.spec_path(uid(1)).exists()
    assert len(list(h100.checkpoint_path.parent.glob("checkpoint.json.corrupt-*"))) == 2


def test_a_disk_that_fills_up_during_a_prepare_leaves_nothing_set_up(
    h100: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first save succeeds, then the disk is full: neither PrepareCompleted nor the rollback's
    UnprepareStarted can be saved. The time-slice and the spec are undone anyway; the entry stays
    PrepareStarted (memory equal to disk) and the kubelet's retry completes once there is room."""
    state = h100.state()
    save = ckpt.save
    saves = []

    def fills_up(path: Path, checkpoint: ckpt.Checkpoint) -> None:
        saves.append(checkpoint)
        if len(saves) > 1:
            raise ckpt.CheckpointNotSaved(f"cannot save the checkpoint {path}: No space left on device")
        save(path, checkpoint)

    monkeypatch.setattr(ckpt, "save", fills_up)
    claim = h100.claims.add(whole_gpus(uid(1), "gpu-0", config=[from_claim(time_slicing("Long"))]))
    with pytest.raises(ckpt.CheckpointNotSaved, match="No space left") as raised:
        state.prepare(claim)
    assert any("rolling back also failed" in note for note in raised.value.__notes__)
    assert not h100.spec_path(uid(1)).exists()
    assert h100.timeslices()[h100.uuid(0)] == 0
    assert {u: e.state for u, e in state.prepared_claims().items()} == {uid(1): "PrepareStarted"}
    assert state.prepared_claims() == h100.entries()

    monkeypatch.undo()
    state.prepare(claim)
    assert h100.entries()[uid(1)].state == "PrepareCompleted"
    assert h100.timeslices()[h100.uuid(0)] == 3
