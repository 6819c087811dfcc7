"""A claim's allocation, checked against this node and resolved to its hardware and config. Pure.

The state machine (gpudra.node.prepare) gets the claim from the API server (typed by gpudra.model.claim)
and hands it here; what comes back is `ResolvedDevice`, one per result of this driver. `NodeDevices` answers
the questions about the devices this node publishes (their type, their GPU, their memory) for prepare,
recovery and this reader alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from gpudra.errors import ClaimError, ConfigError
from gpudra.model.claim import AllocationResult, Claim
from gpudra.model.claim_config import resolve_configs
from gpudra.model.devices import Device
from gpudra.model.inventory import Gpu, Inventory
from gpudra.node.allocation import ClaimRef, DeviceType, ResolvedDevice
from gpudra.quantity import parse_quantity


class NodeDevices:
    """The devices this node publishes, by name, and the GPUs they are on."""

    def __init__(self, inventory: Inventory, devices: Mapping[str, Device]) -> None:
        self.devices = dict(devices)
        self.gpus = {gpu.uuid: gpu for gpu in inventory.gpus}

    def update(self, devices: Mapping[str, Device]) -> None:
        """Devices as the node publishes them now (its model fitted to another server), in place and
        without dropping one: a claim prepared with a device published before still unprepares."""
        self.devices.update(devices)

    def __contains__(self, device: object) -> bool:
        return device in self.devices

    def __getitem__(self, device: str) -> Device:
        return self.devices[device]

    def known_type(self, device: str) -> str | None:
        """The type of a device this node publishes now; None for one it no longer does."""
        published = self.devices.get(device)
        return None if published is None else published["attributes"]["type"].get("string")

    def type_of(self, device: str) -> DeviceType:
        kind = self.devices[device]["attributes"]["type"].get("string")
        if kind not in ("gpu", "mig"):
            raise ClaimError(f"device {device} has unknown type {kind!r}")
        return kind  # type: ignore[return-value]

    def gpu_of(self, device: str) -> Gpu:
        attributes = self.devices[device]["attributes"]
        uuid = (attributes.get("parentUUID") or attributes["uuid"]).get("string", "")
        return self.gpus[uuid]

    def memory_of(self, device: str) -> int | None:
        memory = self.devices[device]["capacity"].get("memory")
        return int(parse_quantity(memory["value"])) if memory is not None else None

    def published_uuid(self, device: str) -> str | None:
        """The UUID the device is published with: a GPU's, or a MIG device that exists before prepare."""
        uuid = self.devices[device]["attributes"].get("uuid")
        return uuid.get("string") if uuid is not None else None


def read_allocated(
    claim: Claim, ref: ClaimRef, *, driver: str, node_name: str, devices: NodeDevices
) -> list[ResolvedDevice]:
    """This driver's results in `claim`, checked against the kubelet's request and this node."""
    if claim.uid != ref.uid:
        raise ClaimError(
            f"ResourceClaim {ref.namespace}/{ref.name} has UID {claim.uid}, not {ref.uid} "
            "(it was deleted and created again)"
        )
    if claim.allocation is None:
        raise ClaimError(f"ResourceClaim {ref} is not allocated")
    results = claim.allocation.results_of(driver)
    if not results:
        raise ClaimError(f"ResourceClaim {ref} has no devices of driver {driver}")
    for result in results:
        if result.pool != node_name:
            raise ClaimError(
                f"device {result.device} of ResourceClaim {ref} is in pool {result.pool}, "
                f"not in this node's pool {node_name}"
            )
        if result.device not in devices:
            raise ClaimError(f"device {result.device} of ResourceClaim {ref} is not on this node")
    types = {r.device: devices.type_of(r.device) for r in results}
    configs = resolve_configs(claim.allocation, driver=driver, device_types=types)
    return [
        ResolvedDevice(
            request=c.request,
            device=c.device,
            kind=types[c.device],
            gpu=devices.gpu_of(c.device),
            config=c.config,
            config_entry=c.entry,
            admin_access=r.admin_access,
            share_id=r.share_id,
            consumed=_consumed_capacity(r, ref),
            memory_bytes=devices.memory_of(c.device),
            uuid=devices.published_uuid(c.device),
        )
        for c, r in zip(configs, results, strict=True)
    ]


def _consumed_capacity(result: AllocationResult, ref: ClaimRef) -> dict[str, Fraction]:
    """A share's consumedCapacity by unqualified name; ClaimError for an amount that is no quantity."""
    consumed = {}
    for name, amount in result.consumed_capacity.items():
        try:
            consumed[name.rsplit("/", 1)[-1]] = parse_quantity(amount)
        except ConfigError as err:
            raise ClaimError(
                f"ResourceClaim {ref}: consumedCapacity {name} of device {result.device}: {err.reason}"
            ) from err
    return consumed
