"""How a prepared device is shared: time-slicing and MPS, one module per strategy. I/O: through them.

`SharingCoordinator` is what the state machine (gpudra.node.prepare) and recovery (gpudra.node.recovery) call.
It picks the strategy of each device (the first in `strategies` that wants it; a device none wants, or
one held for admin access, gets no record and no tool runs), and hands each strategy its own devices.
What a strategy does is in its module (`time_slicing`, `mps`); the protocol is in `strategy`.

`plan` decides, per claim and without touching the GPU, what each device gets, so the checkpoint holds
the records before `apply` runs; `apply` and `undo` are idempotent, so a crash between any two of their
calls is settled by calling again. Strategies apply in list order and undo in reverse (MPS daemons stop
before time-slices are put back).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpudra.gpu.tools import GpuTools
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import ResolvedDevice
from gpudra.node.cdi import CdiDevice, Mount
from gpudra.node.sharing.mps import Mps
from gpudra.node.sharing.mps_daemons import Tampering
from gpudra.node.sharing.strategy import Strategy
from gpudra.node.sharing.time_slicing import TimeSlicing

# Every strategy's class, by the `strategy` value of its records: what a record alone is enough for.
_CLASSES: dict[str, type[TimeSlicing] | type[Mps]] = {TimeSlicing.name: TimeSlicing, Mps.name: Mps}


class SharingCoordinator:
    def __init__(
        self,
        tools: GpuTools,
        *,
        mps_root: Path,
        mps_host: Path | None = None,
        on_tampering: Callable[[Tampering], None] | None = None,
        on_shared_pipe: Callable[[Path], None] | None = None,
    ) -> None:
        """`mps_host`: the socket of `gpudra mps-host`, which then runs the MPS daemons (None: this
        process does). `on_tampering` hears of what a tenant changed in an MPS pipe directory,
        `on_shared_pipe` of each command sent to a daemon through its shared pipe directory (see
        `mps_daemons`)."""
        self.tools = tools
        self.mps_root = mps_root
        self.mps = Mps(
            tools,
            mps_root=mps_root,
            mps_host=mps_host,
            on_tampering=on_tampering,
            on_shared_pipe=on_shared_pipe,
        )
        # Time-slicing first: a share asking for it gets it instead of MPS, a share's default.
        self.strategies: tuple[Strategy, ...] = (TimeSlicing(tools), self.mps)

    def plan(
        self, claim_uid: str, devices: Sequence[ResolvedDevice], *, others: Sequence[ckpt.ClaimEntry]
    ) -> list[ckpt.SharingRecord | None]:
        """What each of the claim's devices gets. ConfigError naming the field for a config that this
        device cannot take; `others` are the other claims prepared on this node."""
        records: list[ckpt.SharingRecord | None] = [None] * len(devices)
        for strategy in self.strategies:
            taken = [
                (i, d)
                for i, d in enumerate(devices)
                if records[i] is None and not d.admin_access and strategy.wants(d)
            ]
            if not taken:
                continue
            planned = strategy.plan(claim_uid, [d for _, d in taken], claim=devices, others=others)
            for (i, _), record in zip(taken, planned, strict=True):
                records[i] = record
        return records

    def apply(
        self, entry: ckpt.ClaimEntry, *, visible: Mapping[str, str], others: Sequence[ckpt.ClaimEntry]
    ) -> None:
        """Set up what the entry's records say; `visible` maps each device to the UUID CUDA sees,
        `others` are the other claims prepared on this node (what the GPUs run with now)."""
        for strategy, devices in self._split(entry):
            strategy.apply(devices, visible=visible, others=others)

    def undo(self, entry: ckpt.ClaimEntry, *, others: Sequence[ckpt.ClaimEntry]) -> None:
        """Undo the entry's records, strategies in reverse order."""
        for strategy, devices in reversed(self._split(entry)):
            strategy.undo(devices, others=others)

    def answers(self, entry: ckpt.ClaimEntry) -> bool:
        """Whether every process the entry's sharing runs answers (True for an entry without one)."""
        return all(strategy.answers(devices) for strategy, devices in self._split(entry))

    def adopt(
        self, entry: ckpt.ClaimEntry, *, visible: Mapping[str, str], others: Sequence[ckpt.ClaimEntry]
    ) -> bool:
        """After a plugin restart, or when a check finds a daemon gone: False when what the entry runs
        answers (it was adopted as it is); True when it had died and was set up again from the records."""
        if self.answers(entry):
            return False
        self.apply(entry, visible=visible, others=others)
        return True

    def runs_process(self, entry: ckpt.ClaimEntry) -> bool:
        """Whether the entry's sharing runs a process that can die while the claim runs (an MPS daemon)."""
        return any(strategy.runs_process for strategy, _ in self._split(entry))

    def discard(self, entry: ckpt.ClaimEntry) -> None:
        """Remove the files a claim's records left, after a reboot reset its GPUs."""
        for strategy, devices in self._split(entry):
            strategy.discard(devices)

    def reset(self, gpu_uuids: Sequence[str]) -> None:
        """Put every strategy's setting of the GPUs back to its default (GPUs of claims rebuilt from
        their CDI specs, whose records do not say it)."""
        for strategy in self.strategies:
            strategy.reset(gpu_uuids)

    def stop_unrecorded(self, claims: Sequence[ckpt.ClaimEntry]) -> list[Path]:
        """Stop whatever a strategy runs that no record of `claims` names; the directories of what was
        stopped."""
        return [stopped for strategy in self.strategies for stopped in strategy.stop_unrecorded(claims)]

    @staticmethod
    def container_edits(device: ckpt.PreparedDevice) -> tuple[dict[str, str], tuple[Mount, ...]]:
        """The env and mounts a container needs for the device's sharing (the MPS pipe and shm)."""
        if device.sharing is None:
            return {}, ()
        return _CLASSES[device.sharing.strategy].container_edits(device.sharing)

    @staticmethod
    def rebuild(cdi_device: CdiDevice, *, whole_alone: bool) -> ckpt.SharingRecord | None:
        """The record a device had, as far as its CDI spec tells (the first strategy that recognises it)."""
        for cls in _CLASSES.values():
            record = cls.rebuild(cdi_device, whole_alone=whole_alone)
            if record is not None:
                return record
        return None

    def _split(self, entry: ckpt.ClaimEntry) -> list[tuple[Strategy, list[ckpt.PreparedDevice]]]:
        """The entry's devices with a record, grouped by strategy, in the strategies' order."""
        split = []
        for strategy in self.strategies:
            devices = [
                d for d in entry.devices if d.sharing is not None and d.sharing.strategy == strategy.name
            ]
            if devices:
                split.append((strategy, devices))
        return split
