"""What each fake node of the cluster-scale benchmark publishes, and what its pods ask. Pure.

Every node is a DGX H100 as the simulator describes it (eight H100 80GB HBM3 on NVSwitch), and its slices
are built by gpudra's own device model and slice splitter, so the benchmark measures exactly what the
plugin would publish with each option:

- `whole-gpus` (the reference): MIG off on every GPU, whole GPUs only. This is also gpudra's default on
  such a node (`--mig-mode static`, `--shares off`), which is the point: the default costs the scheduler
  what whole GPUs cost.
- `static-mig`: gpudra's default on a node whose administrator partitioned half the GPUs (seven 1g.10gb
  each) — also NVIDIA's default shape (whole GPUs and static MIG devices, no counter sets).
- `shares`: `--shares on`; `mig-profiles`: `--mig-mode partitionable --mig-profiles 1g.10gb,3g.40gb`;
  `mig-profiles-minimal`: the same with `--partition-attributes minimal`;
  `everything`: `--mig-mode partitionable --shares on` (every profile x placement: the old default).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gpudra.model import devices, slices
from gpudra.model.inventory import Inventory, MigDevice
from gpudra.model.publishing import Publishing

DRIVER = "gpu.gpudra.io"
STATIC_PROFILE = "1g.10gb"


@dataclass(frozen=True)
class Layout:
    name: str
    publishing: Publishing
    static_mig_gpus: int = 0  # how many GPUs (the last ones) carry seven existing 1g.10gb devices
    note: str = ""


LAYOUTS = {
    layout.name: layout
    for layout in (
        Layout("whole-gpus", Publishing(), note="reference; gpudra's default, MIG off"),
        Layout("static-mig", Publishing(), static_mig_gpus=4, note="gpudra's default, 4 GPUs as 7x 1g.10gb"),
        Layout("shares", Publishing(shares=True), note="--shares on"),
        Layout(
            "mig-profiles",
            Publishing(mig_mode="partitionable", mig_profiles=frozenset({"1g.10gb", "3g.40gb"})),
            note="--mig-mode partitionable --mig-profiles 1g.10gb,3g.40gb",
        ),
        Layout(
            "mig-profiles-minimal",
            Publishing(
                mig_mode="partitionable",
                mig_profiles=frozenset({"1g.10gb", "3g.40gb"}),
                partition_attributes="minimal",
            ),
            note="--mig-mode partitionable --mig-profiles 1g.10gb,3g.40gb --partition-attributes minimal",
        ),
        Layout(
            "everything",
            Publishing(mig_mode="partitionable", shares=True),
            note="--mig-mode partitionable --shares on (the old default)",
        ),
    )
}
REFERENCE = "whole-gpus"


def node_inventory(dgx: Inventory, layout: Layout) -> Inventory:
    """`dgx` (the simulator's DGX H100, MIG on at boot) as the layout's administrator left it."""
    gpus = []
    for gpu in sorted(dgx.gpus, key=lambda g: g.minor):
        static = gpu.minor >= len(dgx.gpus) - layout.static_mig_gpus
        gpus.append(
            dataclasses.replace(gpu, mig_enabled=static, mig_devices=_seven_small(gpu) if static else ())
        )
    return dataclasses.replace(dgx, gpus=tuple(gpus))


def _seven_small(gpu: Any) -> tuple[MigDevice, ...]:
    profile = next(p for p in gpu.mig_profiles if p.name == STATIC_PROFILE)
    return tuple(
        MigDevice(
            uuid=f"MIG-{gpu.uuid[4:]}-{index}",
            profile_id=profile.id,
            profile_name=profile.name,
            placement=placement,
            gpu_instance_id=index + 1,
            compute_instance_id=0,
            memory_mib=profile.memory_mib,
            multiprocessors=profile.multiprocessors,
        )
        for index, placement in enumerate(profile.placements)
    )


@dataclass(frozen=True)
class NodeShape:
    """One node's slices for a layout (the node name filled in per node) and what they hold."""

    model: devices.DeviceModel
    server_minor: int

    @property
    def devices(self) -> int:
        return len(self.model.devices)

    @property
    def counter_sets(self) -> int:
        return len(self.model.counter_sets)

    @property
    def has_mig(self) -> bool:
        return any(d["attributes"]["type"].get("string") == "mig" for d in self.model.devices)

    @property
    def has_shares(self) -> bool:
        return any(d.get("allowMultipleAllocations") for d in self.model.devices)

    def slices_for(self, node: str) -> list[dict[str, Any]]:
        built = slices.build_slices(
            self.model, driver=DRIVER, node_name=node, generation=1, server_minor=self.server_minor
        )
        return [dict(piece) for piece in built]


def shape(dgx: Inventory, layout: Layout, *, server_minor: int) -> NodeShape:
    model = devices.publish(node_inventory(dgx, layout), layout.publishing)
    return NodeShape(model=model, server_minor=server_minor)


# --- what the pods ask -----------------------------------------------------------------------------


WORKLOADS = ("whole", "mig-1g", "share", "unschedulable")


def claim(name: str, namespace: str, workload: str) -> dict[str, Any]:
    """A ResourceClaim asking for one device of `workload`'s kind."""
    exactly: dict[str, Any] = {"deviceClassName": "gpu.gpudra.io", "allocationMode": "ExactCount", "count": 1}
    if workload == "mig-1g":
        exactly["deviceClassName"] = "mig.gpudra.io"
        exactly["selectors"] = [_cel(f'device.attributes["{DRIVER}"].profile == "{STATIC_PROFILE}"')]
    elif workload == "share":
        exactly["deviceClassName"] = "gpu-shared.gpudra.io"
        exactly["capacity"] = {"requests": {"memory": "10Gi", "compute": "10"}}
    elif workload == "unschedulable":
        # Fits no node: every node's every device is looked at, and turned down, on each attempt.
        exactly["selectors"] = [_cel(f'device.attributes["{DRIVER}"].productName == "NVIDIA B300"')]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _cel(expression: str) -> dict[str, Any]:
    return {"cel": {"expression": expression}}


def pod(name: str, namespace: str, claim_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "pause", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        },
    }


def runs(shape_: NodeShape, workload: str) -> bool:
    """Whether the layout offers what `workload` asks (an unschedulable pod is tried on every layout)."""
    if workload == "mig-1g":
        return shape_.has_mig
    if workload == "share":
        return shape_.has_shares
    return True
