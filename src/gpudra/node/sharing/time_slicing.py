"""Time-slicing: the interval at which CUDA contexts on a GPU take turns. I/O: `nvidia-smi`, through GpuTools.

- A whole GPU the claim has alone: the claim's interval is set, and put back on unprepare.
- A share (one allocation of a device several claims share) asking TimeSlicing gets the GPU's interval
  instead of MPS limits. Claims sharing one GPU must ask the same interval; the GPU returns to Default
  when the last claim that set one is unprepared.
- A MIG device: the time-slice belongs to the physical GPU, whose other partitions may serve other claims,
  so a partition never gets one. Its config may still ask TimeSlicing (NVIDIA's driver accepts it): no
  strategy wants such a device, nothing is set or recorded, the claim's containers share the partition,
  and the node posts the config's advice as an Event (gpudra.node.prepare).

gpudra owns the time-slice of the GPUs it publishes, and no tool runs for a setting already in place. The
checkpoint's records say what each GPU runs with: the interval a prepared claim's record set, else
Default, since the undo of every record that set another interval puts Default back (a reboot does too).
NVML cannot read the interval back (gpu-mechanics.md section 1.4), so this is the only way to know it
without a call to nvidia-smi, which costs tens to hundreds of milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from gpudra.api import GpuConfig
from gpudra.api.v1beta1 import TIMESLICE
from gpudra.errors import ConfigError, NotSupported
from gpudra.gpu.tools import GpuTools
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import ResolvedDevice
from gpudra.node.cdi import CdiDevice, Mount


class TimeSlicing:
    name: ClassVar[str] = "TimeSlicing"
    runs_process: ClassVar[bool] = False

    def __init__(self, tools: GpuTools) -> None:
        self.tools = tools

    def wants(self, device: ResolvedDevice) -> bool:
        config = device.config
        return (
            isinstance(config, GpuConfig)
            and config.sharing is not None
            and config.sharing.time_slicing is not None
        )

    def plan(
        self,
        claim_uid: str,
        devices: Sequence[ResolvedDevice],
        *,
        claim: Sequence[ResolvedDevice],
        others: Sequence[ckpt.ClaimEntry],
    ) -> list[ckpt.SharingRecord]:
        return [self._plan(device, others) for device in devices]

    def _plan(self, device: ResolvedDevice, others: Sequence[ckpt.ClaimEntry]) -> ckpt.TimeSlicingRecord:
        assert isinstance(device.config, GpuConfig) and device.config.sharing is not None  # see wants
        settings = device.config.sharing.time_slicing
        assert settings is not None
        interval = settings.interval
        if device.share_id is not None:
            for entry, running in _time_slices(device.gpu.uuid, others):
                if running != interval:
                    raise ConfigError(
                        f"GPU {device.gpu.uuid} runs with time-slice interval {running} for "
                        f"ResourceClaim {entry.namespace}/{entry.name}, which shares it; this claim asks "
                        f"{interval}. Claims sharing a GPU must ask the same interval; "
                        f"allowed now: {running}",
                        field=f"{device.config_field}.sharing.timeSlicingConfig.interval",
                    )
        return ckpt.TimeSlicingRecord(strategy="TimeSlicing", interval=interval)

    def apply(
        self,
        devices: Sequence[ckpt.PreparedDevice],
        *,
        visible: Mapping[str, str],
        others: Sequence[ckpt.ClaimEntry],
    ) -> None:
        for device in devices:
            record = _record(device)
            for uuid in device.gpu_uuids:
                if record.interval != _interval_now(uuid, others):
                    self._set(uuid, record.interval)

    def undo(self, devices: Sequence[ckpt.PreparedDevice], *, others: Sequence[ckpt.ClaimEntry]) -> None:
        """Put each GPU's time-slice back to the interval the claims still sharing it run with (Default
        when none)."""
        for device in devices:
            record = _record(device)
            for uuid in device.gpu_uuids:
                # What the claims still sharing the GPU run with; nothing to do when that is already it.
                wanted = _interval_kept(uuid, others)
                if record.interval != wanted or _interval_now(uuid, others) is None:
                    self._set(uuid, wanted)

    def answers(self, devices: Sequence[ckpt.PreparedDevice]) -> bool:
        return True  # nothing runs

    def discard(self, devices: Sequence[ckpt.PreparedDevice]) -> None:
        return None  # no files: a reboot put the GPU back to Default

    def reset(self, gpu_uuids: Sequence[str]) -> None:
        """Put the GPUs' time-slice to Default whatever it is now."""
        for uuid in gpu_uuids:
            self._set(uuid, "Default")

    def stop_unrecorded(self, claims: Sequence[ckpt.ClaimEntry]) -> list[Path]:
        return []

    @staticmethod
    def container_edits(record: ckpt.SharingRecord) -> tuple[dict[str, str], tuple[Mount, ...]]:
        return {}, ()

    @staticmethod
    def rebuild(cdi_device: CdiDevice, *, whole_alone: bool) -> ckpt.SharingRecord | None:
        # A spec does not say which time-slice a claim's GPU was given: recovery resets the GPUs of
        # rebuilt whole-GPU claims to Default instead (`reset`).
        return None

    def _set(self, gpu_uuid: str, interval: ckpt.TimeSliceInterval) -> None:
        try:
            self.tools.set_timeslice(gpu_uuid=gpu_uuid, level=TIMESLICE[interval])
        except NotSupported:
            # A GPU whose driver offers no time-slice setting runs with the default one: asking for
            # Default (a whole GPU without config, an undo) is then done; another interval fails.
            if interval != "Default":
                raise


def _record(device: ckpt.PreparedDevice) -> ckpt.TimeSlicingRecord:
    assert isinstance(device.sharing, ckpt.TimeSlicingRecord)  # SharingCoordinator hands over only its own
    return device.sharing


def _time_slices(
    gpu_uuid: str, claims: Sequence[ckpt.ClaimEntry]
) -> list[tuple[ckpt.ClaimEntry, ckpt.TimeSliceInterval]]:
    """(claim, interval) for each time-slice record of `claims` on GPU `gpu_uuid`."""
    return [
        (entry, held.sharing.interval)
        for entry in claims
        for held in entry.devices
        if held.gpu_uuids[:1] == (gpu_uuid,) and isinstance(held.sharing, ckpt.TimeSlicingRecord)
    ]


def _interval_kept(gpu_uuid: str, claims: Sequence[ckpt.ClaimEntry]) -> ckpt.TimeSliceInterval:
    """The interval GPU `gpu_uuid` must run with for those of `claims` that stay prepared (claims
    sharing a GPU agree on it, see `_plan`); Default when none set one."""
    kept = [
        interval for entry, interval in _time_slices(gpu_uuid, claims) if entry.state != "UnprepareStarted"
    ]
    return kept[0] if kept else "Default"


def _interval_now(gpu_uuid: str, claims: Sequence[ckpt.ClaimEntry]) -> ckpt.TimeSliceInterval | None:
    """The time-slice GPU `gpu_uuid` runs with while `claims` are prepared (`_interval_kept`). None while
    a claim with a record on it is being unprepared: its undo may have stopped half way, so only the
    tool knows."""
    if any(entry.state == "UnprepareStarted" for entry, _ in _time_slices(gpu_uuid, claims)):
        return None
    return _interval_kept(gpu_uuid, claims)
