"""One simulated GPU node's files, and the claims the fault suite prepares on it. I/O: files, the simulator.

A node is a directory: the simulator's machine state (`sim/machine.json`, shared by every process that
opens it, like a real card), the CDI root (`cdi/`), the checkpoint (`state/checkpoint.json`) and the
claims the fake API server holds (`claims.json`). Everything the fault tests need survives in these files,
so a process started on the same directory is the plugin restarted on the same node.

`CLAIMS` mixes whole-GPU claims with and without time-slicing, claims of two devices, an admin-access
claim, MIG partitions, MPS on a whole GPU and on a share, and claims allocated a GPU another claim
also has, which the plugin must refuse while that claim holds it. MPS claims need the node's
`gpudra mps-host` (`mps_host`), as the chart runs it. This module imports no pytest: the worker
process imports it and starts quickly.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpudra import sim
from gpudra.errors import ClaimError, HardwareError
from gpudra.gpu.tools import GpuTools
from gpudra.model import devices
from gpudra.model.claim import Claim, read_claim
from gpudra.model.inventory import Inventory
from gpudra.node import cdi, gpu_driver
from gpudra.node import checkpoint as ckpt
from gpudra.node import recovery as node_recovery
from gpudra.node.allocation import ClaimRef
from gpudra.node.prepare import DeviceState
from gpudra.node.sharing import SharingCoordinator
from gpudra.sim import nvidia_smi
from gpudra.sim import state as sim_state
from tests.sim_nvml import mig_partitions
from tests.unit.claims import DRIVER, NODE, from_claim, mps, resource_claim, result, time_slicing

PROFILE = "dgx-h100"
BOOT = "5c1d7e9a-2b3f-4a6c-8d0e-9f1a2b3c4d5e"


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012x}"


def _claims() -> list[dict[str, Any]]:
    long_, medium, short = (from_claim(time_slicing(i)) for i in ("Long", "Medium", "Short"))
    return [
        resource_claim(uid(1), results=[result("gpu", "gpu-0")], config=[long_]),
        resource_claim(uid(2), results=[result("gpu", "gpu-0")]),  # competes with 1
        resource_claim(uid(3), results=[result("a", "gpu-1"), result("b", "gpu-2")], config=[medium]),
        resource_claim(uid(4), results=[result("gpu", "gpu-2")], config=[short]),  # competes with 3
        resource_claim(uid(5), results=[result("gpu", "gpu-3")]),
        resource_claim(
            uid(6),
            results=[result("a", "gpu-4"), result("b", "gpu-5")],
            config=[from_claim(time_slicing("Long"), "a"), from_claim(time_slicing("Short"), "b")],
        ),
        resource_claim(uid(7), results=[result("gpu", "gpu-5")], config=[medium]),  # competes with 6
        resource_claim(uid(8), results=[result("monitor", "gpu-0", admin_access=True)]),  # shares freely
        resource_claim(uid(9), results=[result("gpu", "gpu-7")], config=[medium]),
        # MIG partitions created on demand on gpu-6, and claims that compete with them for the
        # partition (11) or for the whole GPU (12), whose prepare switches MIG mode off.
        resource_claim(
            uid(10), results=[result("big", "gpu-6-mig-3g40gb-4"), result("small", "gpu-6-mig-1g10gb-0")]
        ),
        resource_claim(uid(11), results=[result("mig", "gpu-6-mig-1g10gb-0")]),
        resource_claim(uid(12), results=[result("gpu", "gpu-6")]),
        # MPS: a whole GPU (compute mode EXCLUSIVE_PROCESS while prepared) that competes with 5, and a
        # share of gpu-7 (a daemon with the share's limits) that competes with 9's whole GPU. Their
        # daemons run in the node's `gpudra mps-host`, which the kills do not reach.
        resource_claim(uid(13), results=[result("gpu", "gpu-3")], config=[from_claim(mps(40))]),
        resource_claim(
            uid(14),
            results=[
                {
                    **result("gpu", "gpu-7"),
                    "shareID": "5f0c3a8e-1b2d-4c6e-8f90-a1b2c3d4e5f6",
                    "consumedCapacity": {"memory": "20Gi", "compute": "25"},
                }
            ],
        ),
    ]


CLAIMS: list[dict[str, Any]] = _claims()


def ref(claim: Mapping[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])


REFS: dict[str, ClaimRef] = {claim["metadata"]["uid"]: ref(claim) for claim in CLAIMS}


def non_admin_devices(claim: Mapping[str, Any]) -> set[str]:
    """What a claim holds, as sets whose overlap means two claims cannot be prepared at once: its
    devices, and for a partition its whole GPU (the plugin refuses a partition of a GPU another claim
    holds whole, and the reverse). This also makes two partitions of one GPU conflict, which is right
    for CLAIMS: its only claims with partitions of one GPU ask for the same partition."""
    results = claim["status"]["allocation"]["devices"]["results"]
    held = {r["device"] for r in results if not r.get("adminAccess")}
    return held | {name.split("-mig-")[0] for name in held}


class ClaimFile:
    """The fake API server: a ClaimSource over a JSON list of ResourceClaims."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, claims: Sequence[Mapping[str, Any]]) -> None:
        self.path.write_text(json.dumps(list(claims)))

    def get(self, *, namespace: str, name: str, uid: str) -> Claim:
        for claim in json.loads(self.path.read_text()):
            meta = claim["metadata"]
            if (meta["namespace"], meta["name"]) == (namespace, name):
                return read_claim(claim)
        raise ClaimError(f"ResourceClaim {namespace}/{name} not found")


class InProcessTools(GpuTools):
    """GpuTools that runs the simulator's stand-in `nvidia-smi` in this process instead of exec'ing it.

    The same command line reaches the same stand-in code and the same state file; only the fork and
    the interpreter start (130 ms a call) are saved, which lets the disk-full test inject a failure at
    every one of its writes in seconds. Not thread-safe (it swaps stdout and the environment)."""

    def __init__(self, state_file: Path) -> None:
        super().__init__(search_path="")
        self.state_file = state_file

    def run(
        self,
        tool: str,
        args: Sequence[str],
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        assert tool == "nvidia-smi" and stdin is None and env is None, tool
        out, err = io.StringIO(), io.StringIO()
        saved = os.environ.get(sim_state.ENVIRONMENT)
        os.environ[sim_state.ENVIRONMENT] = str(self.state_file)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = nvidia_smi.main(list(args))
        finally:
            if saved is None:
                del os.environ[sim_state.ENVIRONMENT]
            else:
                os.environ[sim_state.ENVIRONMENT] = saved
        if code != 0:
            raise HardwareError(f"{tool} {' '.join(args)} failed ({code}): {err.getvalue().strip()}")
        return out.getvalue()


class SimNode:
    """The files of one simulated node (see the module docstring)."""

    def __init__(
        self, root: Path, *, inventory: Inventory | None = None, in_process_tools: bool = False
    ) -> None:
        self.root = root
        self.profile = PROFILE
        self.state_file = root / "sim" / "machine.json"
        if inventory is None:
            with gpu_driver.connect(f"sim:{PROFILE}", state_file=self.state_file) as session:
                inventory = session.inventory()
        self.inventory = inventory
        self.device_model = {
            device["name"]: device
            for device in devices.build_devices(inventory, mig_mode="partitionable").devices
        }
        self.in_process_tools = in_process_tools
        self.tools: GpuTools = (
            InProcessTools(self.state_file)
            if in_process_tools
            else GpuTools.with_directory_first(sim.write_tools(root / "bin", state_file=self.state_file))
        )
        self.cdi_root = root / "cdi"
        self.state_dir = root / "state"
        self.checkpoint_path = self.state_dir / "checkpoint.json"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.cdi_root.mkdir(parents=True, exist_ok=True)
        self.claims = ClaimFile(root / "claims.json")
        if not self.claims.path.exists():
            self.claims.write(CLAIMS)

    def state(self, *, recover: bool = True) -> DeviceState:
        """A DeviceState as the plugin builds it at start-up (recover() included unless told)."""
        device_state = DeviceState(
            driver=DRIVER,
            node_name=NODE,
            inventory=self.inventory,
            devices=self.device_model,
            claims=self.claims,
            sharing=SharingCoordinator(self.tools, mps_root=self.root / "mps", mps_host=self.mps_host),
            mig=mig_partitions(f"sim:{PROFILE}", self.state_file, self.inventory.gpus),
            cdi_root=self.cdi_root,
            checkpoint_path=self.checkpoint_path,
            boot_id=BOOT,
            toolkit=cdi.ToolkitSpecs([self.root / "toolkit"]),
        )
        if recover:
            node_recovery.recover(device_state)
        return device_state

    @property
    def mps_host(self) -> Path | None:
        """The socket of the node's `gpudra mps-host`, once one was started on it."""
        socket = self.root / "mps-host" / "mps-host.sock"
        return socket if socket.exists() else None

    def copy(self, root: Path) -> SimNode:
        """This node's files as they are now, in `root`: the same machine, the same disk, run apart."""
        shutil.copytree(self.root, root, ignore=shutil.ignore_patterns("bin", "*.lock"))
        return SimNode(root, inventory=self.inventory, in_process_tools=self.in_process_tools)

    def entries(self) -> dict[str, ckpt.ClaimEntry]:
        """The claims in the checkpoint file (raises if it does not load)."""
        return ckpt.load(self.checkpoint_path, boot_id=BOOT).checkpoint.claims

    def timeslices(self) -> dict[str, int]:
        return {gpu.uuid: gpu.timeslice for gpu in sim_state.StateFile(self.state_file).read().gpus}

    def gpu_uuid(self, device: str) -> str:
        return self.device_model[device]["attributes"]["uuid"]["string"]

    def spec_path(self, claim_uid: str) -> Path:
        return cdi.spec_path(self.cdi_root, driver=DRIVER, claim_uid=claim_uid)

    def specs(self) -> set[str]:
        return set(cdi.list_claim_specs(self.cdi_root, driver=DRIVER))
