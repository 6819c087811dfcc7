"""What a sharing strategy is: the protocol every strategy module implements. Pure.

A strategy (time-slicing, MPS) owns one kind of checkpoint record (`ckpt.SharingRecord`, told apart by
its `strategy` field) and everything done with it: which devices it takes (`wants`), what it records for
them before the GPU changes (`plan`), setting that up and undoing it (`apply`, `undo`, both idempotent,
so a crash between any two calls is settled by calling again), whether a process it runs still answers,
the env and mounts a container needs, and what can be learnt back from a CDI spec after the checkpoint
was damaged. `SharingCoordinator` (this package's `__init__`) picks the strategy per device and calls these;
nothing else in the node looks inside a sharing record.

Adding a strategy: its record in gpudra.node.checkpoint (a new `strategy` value), one module here
implementing `Strategy`, its entry in `SharingCoordinator`'s list, and its tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Protocol

from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import ResolvedDevice
from gpudra.node.cdi import CdiDevice, Mount


class Strategy(Protocol):
    # The `strategy` value of the records this strategy writes.
    name: ClassVar[str]
    # Whether it runs a process per claim that can die while the claim runs (checked and restarted by
    # gpudra.node.recovery).
    runs_process: ClassVar[bool]

    def wants(self, device: ResolvedDevice) -> bool:
        """Whether this strategy shares `device` (the first strategy in `SharingCoordinator`'s list that wants
        a device gets it)."""
        ...

    def plan(
        self,
        claim_uid: str,
        devices: Sequence[ResolvedDevice],
        *,
        claim: Sequence[ResolvedDevice],
        others: Sequence[ckpt.ClaimEntry],
    ) -> list[ckpt.SharingRecord]:
        """A record per device of `devices` (those this strategy wants, of all the claim's `claim`),
        without side effects; ConfigError naming the field for a config the device cannot take.
        `others` are the other claims prepared on this node."""
        ...

    def apply(
        self,
        devices: Sequence[ckpt.PreparedDevice],
        *,
        visible: Mapping[str, str],
        others: Sequence[ckpt.ClaimEntry],
    ) -> None:
        """Set up what the records of `devices` (one claim's, this strategy's) say; `visible` maps each
        device to the UUID CUDA sees."""
        ...

    def undo(self, devices: Sequence[ckpt.PreparedDevice], *, others: Sequence[ckpt.ClaimEntry]) -> None:
        """Undo what `apply` set up for `devices`; `others` are the claims that stay or are being undone."""
        ...

    def answers(self, devices: Sequence[ckpt.PreparedDevice]) -> bool:
        """Whether what `apply` started for `devices` still runs (True when it starts nothing)."""
        ...

    def discard(self, devices: Sequence[ckpt.PreparedDevice]) -> None:
        """Remove the files the records of `devices` left, after a reboot reset the GPUs."""
        ...

    def reset(self, gpu_uuids: Sequence[str]) -> None:
        """Put the setting this strategy owns back to its default on GPUs whose setting no record says
        (claims rebuilt from their CDI specs)."""
        ...

    def stop_unrecorded(self, claims: Sequence[ckpt.ClaimEntry]) -> list[Path]:
        """Stop whatever this strategy runs that no record of `claims` names; the directories of what
        was stopped."""
        ...

    @staticmethod
    def container_edits(record: ckpt.SharingRecord) -> tuple[dict[str, str], tuple[Mount, ...]]:
        """The env and mounts a container needs for a device with `record`."""
        ...

    @staticmethod
    def rebuild(cdi_device: CdiDevice, *, whole_alone: bool) -> ckpt.SharingRecord | None:
        """The record a device had, as far as its CDI spec tells (`whole_alone`: a whole GPU the claim
        held alone); None when the spec shows nothing of this strategy."""
        ...
