"""Fakes of the GPU-facing parts: the simulator's tools counting every run, Sharing that fails on one GPU
or only records, and MIG hardware whose MIG mode is off."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import cast

from gpudra.errors import HardwareError
from gpudra.gpu.tools import MPS_CONTROL, GpuTools
from gpudra.model.inventory import Gpu
from gpudra.node import cdi
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import ResolvedDevice
from gpudra.node.mig import MigHardware, MigPartitions
from gpudra.node.sharing import SharingCoordinator
from tests.unit.harness.node import Node


class CountingTools(GpuTools):
    """The simulator's tools, counting every run; `refuse_start` makes `nvidia-cuda-mps-control -d`
    fail as a driver that refuses MPS does.

    It overrides GpuTools.run, where every tool process starts."""

    def __init__(self, search_path: str) -> None:
        super().__init__(search_path=search_path)
        self.runs: list[str] = []
        self.refuse_start = False

    def run(
        self,
        tool: str,
        args: Sequence[str],
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        self.runs.append(" ".join([tool, *args]))
        if self.refuse_start and tool == MPS_CONTROL and list(args) == ["-d"]:
            raise HardwareError(f"{MPS_CONTROL} -d failed (1): MPS control daemon: cannot start")
        return super().run(tool, args, stdin=stdin, env=env)


def counting_tools(node: Node) -> CountingTools:
    return CountingTools(node.tools.search_path)


class FailingOn:
    """SharingCoordinator whose apply fails on one GPU, as nvidia-smi does when a GPU falls off the bus."""

    def __init__(self, inner: SharingCoordinator, gpu_uuid: str) -> None:
        self.inner = inner
        self.gpu_uuid = gpu_uuid

    def plan(
        self, claim_uid: str, devices: Sequence[ResolvedDevice], *, others: Sequence[ckpt.ClaimEntry]
    ) -> list[ckpt.SharingRecord | None]:
        return self.inner.plan(claim_uid, devices, others=others)

    def _split(self, entry: ckpt.ClaimEntry) -> tuple[ckpt.ClaimEntry, bool]:
        """The entry without the devices of the failing GPU, and whether it had any."""
        rest = tuple(d for d in entry.devices if self.gpu_uuid not in d.gpu_uuids)
        return entry.model_copy(update={"devices": rest}), len(rest) < len(entry.devices)

    def apply(
        self, entry: ckpt.ClaimEntry, *, visible: Mapping[str, str], others: Sequence[ckpt.ClaimEntry]
    ) -> None:
        rest, fails = self._split(entry)
        self.inner.apply(rest, visible=visible, others=others)
        if fails:
            raise HardwareError(f"nvidia-smi failed on {self.gpu_uuid}")

    def undo(self, entry: ckpt.ClaimEntry, *, others: Sequence[ckpt.ClaimEntry]) -> None:
        self.inner.undo(entry, others=others)

    def answers(self, entry: ckpt.ClaimEntry) -> bool:
        return self.inner.answers(entry)

    def adopt(
        self, entry: ckpt.ClaimEntry, *, visible: Mapping[str, str], others: Sequence[ckpt.ClaimEntry]
    ) -> bool:
        return self.inner.adopt(entry, visible=visible, others=others)

    def runs_process(self, entry: ckpt.ClaimEntry) -> bool:
        return self.inner.runs_process(entry)

    def discard(self, entry: ckpt.ClaimEntry) -> None:
        self.inner.discard(entry)

    def reset(self, gpu_uuids: Sequence[str]) -> None:
        self.inner.reset(gpu_uuids)

    def stop_unrecorded(self, claims: Sequence[ckpt.ClaimEntry]) -> list[Path]:
        return self.inner.stop_unrecorded(claims)

    def rebuild(self, cdi_device: cdi.CdiDevice, *, whole_alone: bool) -> ckpt.SharingRecord | None:
        return self.inner.rebuild(cdi_device, whole_alone=whole_alone)

    def container_edits(self, device: ckpt.PreparedDevice) -> tuple[dict[str, str], tuple[cdi.Mount, ...]]:
        return self.inner.container_edits(device)


class UndoFailsOn(FailingOn):
    """SharingCoordinator whose undo fails on one GPU."""

    def apply(
        self, entry: ckpt.ClaimEntry, *, visible: Mapping[str, str], others: Sequence[ckpt.ClaimEntry]
    ) -> None:
        self.inner.apply(entry, visible=visible, others=others)

    def undo(self, entry: ckpt.ClaimEntry, *, others: Sequence[ckpt.ClaimEntry]) -> None:
        rest, fails = self._split(entry)
        if fails:
            raise HardwareError(f"nvidia-smi failed on {self.gpu_uuid}")
        self.inner.undo(rest, others=others)


class RecordingSharing:
    """A Sharing that only records, and fails the test if two claims configure one GPU at once."""

    def __init__(self, pause: float = 0.0) -> None:
        self.pause = pause
        self.busy: set[str] = set()
        self.applied: list[str] = []
        self.undone: list[str] = []
        self.overlaps: list[str] = []
        self._lock = threading.Lock()

    def plan(
        self, claim_uid: str, devices: Sequence[ResolvedDevice], *, others: Sequence[ckpt.ClaimEntry]
    ) -> list[ckpt.SharingRecord | None]:
        default = ckpt.TimeSlicingRecord(strategy="TimeSlicing", interval="Default")
        return [None if device.admin_access else default for device in devices]

    def apply(
        self, entry: ckpt.ClaimEntry, *, visible: Mapping[str, str], others: Sequence[ckpt.ClaimEntry]
    ) -> None:
        self._touch(touched(entry), self.applied)

    def undo(self, entry: ckpt.ClaimEntry, *, others: Sequence[ckpt.ClaimEntry]) -> None:
        self._touch(touched(entry), self.undone)

    def answers(self, entry: ckpt.ClaimEntry) -> bool:
        return True

    def adopt(
        self, entry: ckpt.ClaimEntry, *, visible: Mapping[str, str], others: Sequence[ckpt.ClaimEntry]
    ) -> bool:
        return False

    def runs_process(self, entry: ckpt.ClaimEntry) -> bool:
        return False

    def discard(self, entry: ckpt.ClaimEntry) -> None:
        pass

    def reset(self, gpu_uuids: Sequence[str]) -> None:
        pass

    def stop_unrecorded(self, claims: Sequence[ckpt.ClaimEntry]) -> list[Path]:
        return []

    def rebuild(self, cdi_device: cdi.CdiDevice, *, whole_alone: bool) -> ckpt.SharingRecord | None:
        return None

    def container_edits(self, device: ckpt.PreparedDevice) -> tuple[dict[str, str], tuple[cdi.Mount, ...]]:
        return {}, ()

    def _touch(self, gpu_uuids: Sequence[str], log: list[str]) -> None:
        with self._lock:
            self.overlaps += [uuid for uuid in gpu_uuids if uuid in self.busy]
            self.busy |= set(gpu_uuids)
            log += gpu_uuids
        time.sleep(self.pause)
        with self._lock:
            self.busy -= set(gpu_uuids)


def touched(entry: ckpt.ClaimEntry) -> list[str]:
    return [uuid for d in entry.devices if d.sharing is not None for uuid in d.gpu_uuids]


class MigModeOff:
    def mig_enabled(self, *, gpu_uuid: str) -> bool:
        return False


def mig_mode_off(gpus: Iterable[Gpu]) -> MigPartitions:
    """MIG prepare for `gpus` whose MIG mode is off, as far as prepare asks: GPUs that are not on the
    simulated machine, or claims prepared from several threads at once (the tests' MIG hardware opens
    the simulator per call, which threads must not do at once; the plugin keeps one session)."""
    return MigPartitions(cast(MigHardware, MigModeOff()), gpus={gpu.uuid: gpu for gpu in gpus})
