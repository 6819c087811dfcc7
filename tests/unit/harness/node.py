"""A simulated node's files and the DeviceState the plugin builds on them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gpudra import sim
from gpudra.gpu.tools import GpuTools
from gpudra.model import devices
from gpudra.model.inventory import Inventory
from gpudra.model.publishing import MigMode, PartitionAttributes
from gpudra.node import cdi, gpu_driver
from gpudra.node import checkpoint as ckpt
from gpudra.node import recovery as node_recovery
from gpudra.node.allocation import Sharing
from gpudra.node.mig import MigPartitions
from gpudra.node.prepare import DeviceState
from gpudra.node.sharing import SharingCoordinator
from gpudra.sim import state as sim_state
from tests.sim_nvml import mig_partitions
from tests.unit.claims import DRIVER, NODE
from tests.unit.harness.kube import Claims

BOOT = "3f0b4e2a-6d1c-4c55-9d0e-1b2a3c4d5e6f"
MIG_SHARE_PROFILES = frozenset({"1g.10gb"})


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012x}"


def write_checkpoint(path: Path, data: Any, *, checksum: str | None = None) -> None:
    """Write `data` as a checkpoint file with its checksum (or `checksum` instead): the file format,
    written without gpudra.node.checkpoint so that a change to that format shows."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode()).hexdigest() if checksum is None else checksum
    path.write_text(json.dumps({"checksum": digest, "data": data}))


def queued_edits(state: DeviceState) -> int:
    """How many checkpoint edits wait behind the save that runs (the claim store's group commit)."""
    return state.store.queued_edits()


class Node:
    """One simulated node's files: the machine state, stand-in tools, CDI root, checkpoint and claims."""

    def __init__(self, root: Path, profile: str) -> None:
        self.root = root
        self.profile = profile
        self.state_file = root / "sim" / "machine.json"
        with gpu_driver.connect(f"sim:{profile}", state_file=self.state_file) as session:
            self.inventory: Inventory = session.inventory()
        self.tools = GpuTools.with_directory_first(sim.write_tools(root / "bin", state_file=self.state_file))
        self.cdi_root = root / "cdi"
        self.checkpoint_path = root / "state" / "checkpoint.json"
        self.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        self.toolkit_dir = root / "toolkit"
        self.claims = Claims(root / "claims.json")

    @property
    def mps_host(self) -> Path | None:
        """The socket of the node's `gpudra mps-host`, when one was started (`harness.mps.MpsHost`): the
        plugin's MPS daemons then run there."""
        socket = self.root / "mps-host" / "mps-host.sock"
        return socket if socket.exists() else None

    def sharing(self) -> SharingCoordinator:
        return SharingCoordinator(self.tools, mps_root=self.root / "mps", mps_host=self.mps_host)

    def uuid(self, minor: int) -> str:
        return next(gpu.uuid for gpu in self.inventory.gpus if gpu.minor == minor)

    def state(
        self,
        *,
        boot_id: str = BOOT,
        sharing: Sharing | None = None,
        inventory: Inventory | None = None,
        recover: bool = True,
        mig_mode: MigMode = "partitionable",
        mig: MigPartitions | None = None,
        partition_attributes: PartitionAttributes = "full",
        mig_share_profiles: frozenset[str] = MIG_SHARE_PROFILES,
    ) -> DeviceState:
        """A DeviceState as the plugin builds it at start-up (recover() included unless told). Its
        1g.10gb partitions are shareable too (their shared devices only add names; the crash child
        builds the same devices)."""
        inventory = inventory or self.inventory
        model = devices.build_devices(
            inventory,
            mig_mode=mig_mode,
            partition_attributes=partition_attributes,
            mig_share_profiles=mig_share_profiles,
        )
        device_state = DeviceState(
            driver=DRIVER,
            node_name=NODE,
            inventory=inventory,
            devices={device["name"]: device for device in model.devices},
            claims=self.claims,
            sharing=sharing or self.sharing(),
            mig=mig or mig_partitions(f"sim:{self.profile}", self.state_file, inventory.gpus),
            cdi_root=self.cdi_root,
            checkpoint_path=self.checkpoint_path,
            boot_id=boot_id,
            toolkit=cdi.ToolkitSpecs([self.toolkit_dir]),
        )
        if recover:
            node_recovery.recover(device_state)
        return device_state

    def timeslices(self) -> dict[str, int]:
        return {gpu.uuid: gpu.timeslice for gpu in sim_state.StateFile(self.state_file).read().gpus}

    def set_timeslice(self, uuid: str, level: int) -> None:
        with sim_state.StateFile(self.state_file).update() as machine:
            next(gpu for gpu in machine.gpus if gpu.uuid == uuid).timeslice = level

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_root / f"{DRIVER}-claim_{claim_uid}.json"

    def entries(self) -> dict[str, ckpt.ClaimEntry]:
        return ckpt.load(self.checkpoint_path, boot_id=BOOT).checkpoint.claims

    def assert_nothing_left(self, claim_uid: str) -> None:
        assert not self.spec_path(claim_uid).exists()
        assert claim_uid not in self.entries()
        assert set(self.timeslices().values()) == {0}
