"""What a claim asks of this node, as the state machine and its steps see it. Pure.

`ClaimRef` is what the kubelet names; `ResolvedDevice` is one allocation result resolved to this node's
hardware and config. The steps of prepare (MIG partitions, sharing) take these and sit below
the state machine in `prepare`, which sequences them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:  # types only: the kubelet's gRPC server imports ClaimRef before anything heavy loads
    from gpudra.api import GpuConfig, MigDeviceConfig
    from gpudra.model.claim import Claim
    from gpudra.model.inventory import Gpu
    from gpudra.node import cdi
    from gpudra.node import checkpoint as ckpt

DeviceType = Literal["gpu", "mig"]


@dataclass(frozen=True)
class ClaimRef:
    """What the kubelet says about a claim: enough to unprepare it after the object is gone."""

    uid: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


class ClaimSource(Protocol):
    def get(self, *, namespace: str, name: str, uid: str) -> Claim: ...


@dataclass(frozen=True)
class ResolvedDevice:
    """One of this driver's allocation results in a claim, resolved to this node's hardware."""

    request: str  # as allocated: "req" or "req/sub"
    device: str
    kind: DeviceType
    gpu: Gpu
    config: GpuConfig | MigDeviceConfig
    config_entry: int | None  # index in status.allocation.devices.config; None for the default
    admin_access: bool
    # For one share of a device several claims share: the allocation's shareID and consumed capacity
    # (capacity name, unqualified -> amount).
    share_id: str | None = None
    consumed: Mapping[str, Fraction] = field(default_factory=dict)
    memory_bytes: int | None = None  # the device's memory (a partition's own), where known
    uuid: str | None = None  # the GPU or MIG UUID, where it exists before prepare

    @property
    def config_field(self) -> str:
        """Where this device's config came from, for error messages."""
        if self.config_entry is None:
            return "(default config)"
        return f"status.allocation.devices.config[{self.config_entry}].opaque.parameters"

    @property
    def base_request(self) -> str:
        """The request name containers refer to (a subrequest's parent)."""
        return self.request.split("/", 1)[0]


class Sharing(Protocol):
    """Plans, applies and undoes how a claim's devices are shared (time-slicing, MPS): see node.sharing.

    `plan` has no side effect (it validates and says what `apply` will set), so the records are in the
    checkpoint before the GPU changes and a rollback knows what to undo; `apply` and `undo` are idempotent.
    """

    def plan(
        self, claim_uid: str, devices: Sequence[ResolvedDevice], *, others: Sequence[ckpt.ClaimEntry]
    ) -> list[ckpt.SharingRecord | None]: ...

    def apply(
        self, entry: ckpt.ClaimEntry, *, visible: Mapping[str, str], others: Sequence[ckpt.ClaimEntry]
    ) -> None: ...

    def undo(self, entry: ckpt.ClaimEntry, *, others: Sequence[ckpt.ClaimEntry]) -> None: ...

    def answers(self, entry: ckpt.ClaimEntry) -> bool: ...

    def adopt(
        self, entry: ckpt.ClaimEntry, *, visible: Mapping[str, str], others: Sequence[ckpt.ClaimEntry]
    ) -> bool: ...

    def runs_process(self, entry: ckpt.ClaimEntry) -> bool: ...

    def discard(self, entry: ckpt.ClaimEntry) -> None: ...

    def reset(self, gpu_uuids: Sequence[str]) -> None: ...

    def stop_unrecorded(self, claims: Sequence[ckpt.ClaimEntry]) -> list[Path]: ...

    def container_edits(
        self, device: ckpt.PreparedDevice
    ) -> tuple[dict[str, str], tuple[cdi.Mount, ...]]: ...

    def rebuild(self, cdi_device: cdi.CdiDevice, *, whole_alone: bool) -> ckpt.SharingRecord | None: ...
