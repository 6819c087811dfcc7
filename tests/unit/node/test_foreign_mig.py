"""MIG instances made or destroyed outside gpudra, on a simulated machine: which instances are foreign
(the checkpoint decides), the devices left out of the slices for them (partitionable: what they
overlap and the whole GPU; static: a published MIG device destroyed), reported once each way (Node
event, metric), confirmed by a second check, never changed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.gpu import nvml
from gpudra.model import devices
from gpudra.model.inventory import Inventory, MigDevice
from gpudra.model.publishing import MigMode
from gpudra.node import checkpoint as ckpt
from gpudra.node import gpu_driver
from gpudra.node.health.foreign_mig import CONFIRM_SECONDS, ForeignMig
from gpudra.node.metrics import PluginMetrics
from gpudra.sim import state as sim_state
from tests.unit.harness.kube import Events

INTERVAL = 10.0
PROFILE_3G40GB, PROFILE_1G10GB = 9, 19  # H100 80GB


class Machine:
    def __init__(self, tmp_path: Path, profile: str, mig_mode: MigMode) -> None:
        self.state_file = tmp_path / "machine.json"
        self.profile = profile
        self.mig_mode: MigMode = mig_mode
        self.claims: dict[str, ckpt.ClaimEntry] = {}
        self.events = Events()
        self.metrics = PluginMetrics()
        self.changes = 0
        self.mig_share_profiles: frozenset[str] = frozenset()

    def session(self) -> nvml.Nvml:
        return gpu_driver.connect(f"sim:{self.profile}", state_file=self.state_file)

    def start(self) -> ForeignMig:
        with self.session() as session:
            self.inventory: Inventory = session.inventory()
        self.model = devices.build_devices(
            self.inventory, mig_mode=self.mig_mode, mig_share_profiles=self.mig_share_profiles
        )
        self.hardware = self.session()
        foreign = ForeignMig(
            devices=self.model.devices,
            gpus=self.inventory.gpus,
            hardware=self.hardware,
            claims=lambda: self.claims,
            mig_mode=self.mig_mode,
            interval=INTERVAL,
            events=self.events,
            metrics=self.metrics,
        )
        foreign.subscribe(self._changed)
        return foreign

    def close(self) -> None:
        if hasattr(self, "hardware"):
            self.hardware.close()

    def _changed(self) -> None:
        self.changes += 1

    def uuid(self, minor: int) -> str:
        return next(gpu.uuid for gpu in self.inventory.gpus if gpu.minor == minor)

    def create(self, minor: int, profile_id: int, start: int) -> MigDevice:
        with self.session() as session:
            return session.create_mig_device(
                gpu_uuid=self.uuid(minor), profile_id=profile_id, placement_start=start
            )

    def destroy(self, minor: int, mig: MigDevice) -> None:
        with self.session() as session:
            session.destroy_mig_device(gpu_uuid=self.uuid(minor), gpu_instance_id=mig.gpu_instance_id)

    def claim(self, uid: str, device: str, spec: ckpt.MigSpec, live: MigDevice | None) -> None:
        record = ckpt.MigRecord(
            spec=spec,
            live=None
            if live is None
            else ckpt.MigLive(gpu_instance_id=live.gpu_instance_id, compute_instance_id=0, uuid=live.uuid),
        )
        prepared = ckpt.PreparedDevice(
            request_names=("r",),
            pool="node",
            device=device,
            cdi_device_ids=(),
            gpu_uuids=(spec.gpu_uuid,),
            mig=record,
        )
        self.claims[uid] = ckpt.ClaimEntry(
            uid=uid, namespace="ns", name=uid, state="PrepareCompleted", devices=(prepared,)
        )

    def foreign_count(self, gpu: str) -> float | None:
        return self.metrics.registry.get_sample_value("gpudra_mig_foreign_instances", {"gpu": gpu})


@pytest.fixture
def h100(tmp_path: Path) -> Iterator[Machine]:
    machine = Machine(tmp_path, "dgx-h100", "partitionable")
    yield machine
    machine.close()


def test_an_instance_made_by_hand_withholds_what_it_overlaps_until_it_is_gone(h100: Machine) -> None:
    foreign = h100.start()
    assert foreign._step() == INTERVAL and foreign.withheld() == {}
    by_hand = h100.create(0, PROFILE_3G40GB, 4)
    assert foreign._step() == CONFIRM_SECONDS  # seen once: not yet acted on
    assert foreign.withheld() == {} and h100.events.posted == []
    assert foreign._step() == INTERVAL
    withheld = foreign.withheld()
    on_gpu0 = {d["name"] for d in h100.model.devices if devices.gpu_uuid_of(d) == h100.uuid(0)}
    assert set(withheld) < on_gpu0
    assert {"gpu-0", "gpu-0-shared", "gpu-0-mig-3g40gb-4", "gpu-0-mig-1g10gb-5", "gpu-0-mig-7g80gb-0"} <= set(
        withheld
    )
    assert {"gpu-0-mig-1g10gb-0", "gpu-0-mig-3g40gb-0", "gpu-0-mig-2g20gb-2"}.isdisjoint(withheld)
    gi = by_hand.gpu_instance_id
    assert withheld["gpu-0-mig-1g10gb-5"] == f"GPU instance {gi} (3g.40gb at 4) takes its placement"
    assert withheld["gpu-0"] == f"GPU instance {gi} (3g.40gb at 4) is on its GPU"
    ((kind, reason, message),) = h100.events.posted
    assert (kind, reason) == ("Warning", "ForeignMigInstance")
    assert message.startswith(
        f"GPU {h100.uuid(0)} (gpu-0): GPU instance {gi} (3g.40gb at 4) was made outside gpudra; gpudra never "
        "destroys or adopts it; the devices it excludes are not offered while it exists: gpu-0, "
    )
    assert h100.foreign_count("gpu-0") == 1 and h100.foreign_count("gpu-1") == 0
    assert h100.changes == 1
    foreign._step()  # found again: said once
    assert len(h100.events.posted) == 1 and h100.changes == 1
    with h100.session() as session:  # left alone
        assert [d.uuid for d in session.mig_devices(gpu_uuid=h100.uuid(0))] == [by_hand.uuid]
    h100.destroy(0, by_hand)
    foreign._step()
    assert foreign.withheld() == {} and h100.changes == 2
    assert h100.events.posted[-1] == (
        "Normal",
        "ForeignMigInstanceGone",
        f"GPU {h100.uuid(0)} (gpu-0): GPU instance {gi} (3g.40gb at 4), made outside gpudra, is gone",
    )
    assert h100.foreign_count("gpu-0") == 0


def test_a_gpu_instance_without_compute_instance_is_foreign_too(h100: Machine) -> None:
    foreign = h100.start()
    with sim_state.StateFile(h100.state_file).update() as machine:  # nvidia-smi mig -cgi without -C
        gpu = next(g for g in machine.gpus if g.uuid == h100.uuid(3))
        gpu.gpu_instances.append(sim_state.GpuInstanceState(id=9, profile_id=PROFILE_1G10GB, start=6, size=1))
    foreign._step()
    foreign._step()
    assert "gpu-3-mig-1g10gb-6" in foreign.withheld() and "gpu-3-mig-1g10gb-5" not in foreign.withheld()
    assert "GPU instance 9 (1g.10gb at 6, without a compute instance)" in h100.events.posted[0][2]


def test_the_claims_own_instances_are_not_foreign(h100: Machine) -> None:
    foreign = h100.start()
    created = h100.create(1, PROFILE_3G40GB, 0)
    h100.claim(
        "done",
        "gpu-1-mig-3g40gb-0",
        ckpt.MigSpec(gpu_uuid=h100.uuid(1), profile_id=9, placement_start=0),
        created,
    )
    # a prepare in progress: the spec is recorded before the instance exists, the live ids after
    in_progress = h100.create(2, PROFILE_1G10GB, 3)
    h100.claim(
        "started",
        "gpu-2-mig-1g10gb-3",
        ckpt.MigSpec(gpu_uuid=h100.uuid(2), profile_id=19, placement_start=3),
        None,
    )
    for _ in range(3):
        assert foreign._step() == INTERVAL
    assert foreign.withheld() == {} and h100.events.posted == []
    del h100.claims["started"]  # unprepared by another tool's hand: gone from the checkpoint, still there
    foreign._step()
    foreign._step()
    assert "gpu-2-mig-1g10gb-3" in foreign.withheld()
    assert f"GPU instance {in_progress.gpu_instance_id} (1g.10gb at 3)" in h100.events.posted[0][2]


@pytest.fixture
def static_h100(tmp_path: Path) -> Iterator[Machine]:
    machine = Machine(tmp_path, "dgx-h100", "static")
    yield machine
    machine.close()


def test_static_mode_withholds_a_destroyed_device_and_reports_a_new_one(static_h100: Machine) -> None:
    machine = static_h100
    with machine.session() as session:
        gpu0 = session.inventory().gpus[0]
        session.set_mig_mode(gpu_uuid=gpu0.uuid, enabled=True)
        there = session.create_mig_device(gpu_uuid=gpu0.uuid, profile_id=PROFILE_3G40GB, placement_start=0)
        held = session.create_mig_device(gpu_uuid=gpu0.uuid, profile_id=PROFILE_1G10GB, placement_start=4)
    foreign = machine.start()
    assert {"gpu-0-mig-3g40gb-0", "gpu-0-mig-1g10gb-4"} <= {d["name"] for d in machine.model.devices}
    assert foreign._step() == INTERVAL and foreign.withheld() == {}
    machine.claim(
        "holder",
        "gpu-0-mig-1g10gb-4",
        ckpt.MigSpec(gpu_uuid=gpu0.uuid, profile_id=19, placement_start=4),
        held,
    )
    machine.destroy(0, there)
    machine.destroy(0, held)  # held by a claim: the health monitor reports that one, it stays published
    foreign._step()
    assert foreign.withheld() == {"gpu-0-mig-3g40gb-0": f"MIG device {there.uuid} no longer exists"}
    assert machine.events.posted == [
        (
            "Warning",
            "ForeignMigInstance",
            f"device gpu-0-mig-3g40gb-0: MIG device {there.uuid} no longer exists (destroyed outside "
            "gpudra); it is not offered",
        )
    ]
    new = machine.create(0, PROFILE_1G10GB, 6)
    foreign._step()
    foreign._step()
    assert machine.events.posted[-1] == (
        "Warning",
        "ForeignMigInstance",
        f"GPU {gpu0.uuid} (gpu-0): GPU instance {new.gpu_instance_id} (1g.10gb at 6) was made outside "
        "gpudra; gpudra never destroys or adopts it; it is offered once the plugin restarts (the MIG "
        "devices it publishes are read at start)",
    )
    assert set(foreign.withheld()) == {"gpu-0-mig-3g40gb-0"}
    assert machine.foreign_count("gpu-0") == 1


def test_a_shared_partition_is_withheld_only_where_the_instance_overlaps_it(h100: Machine) -> None:
    """A shareable profile publishes each placement twice; a foreign instance takes both forms of the
    placements it overlaps, and neither form of the others."""
    h100.mig_share_profiles = frozenset({"1g.10gb"})
    foreign = h100.start()
    h100.create(0, PROFILE_3G40GB, 4)
    foreign._step()
    foreign._step()
    withheld = foreign.withheld()
    assert {"gpu-0-mig-1g10gb-5", "gpu-0-mig-1g10gb-5-shared", "gpu-0-shared"} <= set(withheld)
    assert {"gpu-0-mig-1g10gb-0", "gpu-0-mig-1g10gb-0-shared"}.isdisjoint(withheld)
