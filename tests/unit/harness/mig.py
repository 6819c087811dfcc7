"""A simulated node's MIG partitions as the card and the checkpoint have them, and a claim of MIG
devices: what the unit tests of MIG prepare and the fault tests of MIG shares both check against."""

from __future__ import annotations

from typing import Any

from gpudra.sim import state as sim_state
from tests.unit.claims import resource_claim, result
from tests.unit.harness.node import Node, uid


def mig_claim(n: int, *devices: str, request: str = "mig", **kwargs: Any) -> dict[str, Any]:
    return resource_claim(uid(n), results=[result(request, device) for device in devices], **kwargs)


def instances(node: Node, minor: int) -> dict[int, tuple[int, str]]:
    """placement start -> (GI profile ID, MIG UUID) of every GPU instance on the GPU, as the card has them."""
    gpu = next(g for g in sim_state.StateFile(node.state_file).read().gpus if g.uuid == node.uuid(minor))
    return {
        gi.start: (gi.profile_id, ",".join(ci.uuid for ci in gi.compute_instances))
        for gi in gpu.gpu_instances
    }


def recorded(node: Node, minor: int) -> dict[int, tuple[int, str]]:
    """The same, as the checkpoint records it."""
    found = {}
    for entry in node.entries().values():
        for device in entry.devices:
            if device.mig is not None and device.mig.spec.gpu_uuid == node.uuid(minor):
                live = device.mig.live
                found[device.mig.spec.placement_start] = (
                    device.mig.spec.profile_id,
                    live.uuid if live else "",
                )
    return found
