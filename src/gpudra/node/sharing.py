"""How a prepared device is shared between the containers of its claim. I/O: GPU tools.

Time-slicing sets the GPU's time-slice interval on prepare and puts it back to Default on unprepare.
A whole GPU without a sharing config gets the same Default interval, so a GPU never keeps the setting
of a claim that used it before. A MIG partition gets no record: the interval belongs to the physical
GPU, whose other partitions may serve other claims. `plan` decides (and refuses what this version
cannot do) without touching the GPU, so the checkpoint holds the record before `apply` runs. Both
directions are idempotent: a crash between any two calls is settled by calling again.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpudra.api import MigDeviceConfig
from gpudra.api.v1beta1 import TIMESLICE
from gpudra.errors import ConfigError
from gpudra.gpu.tools import GpuTools
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import Allocated


class GpuSharing:
    def __init__(self, tools: GpuTools) -> None:
        self.tools = tools

    def plan(self, device: Allocated) -> ckpt.SharingRecord | None:
        if device.admin_access:  # monitoring access: the device belongs to someone else's claim
            return None
        if isinstance(device.config, MigDeviceConfig):
            # The time-slice is a setting of the whole physical GPU, which other claims' partitions
            # share: a partition never touches it. Its one sharing strategy, MPS, comes with MPS support.
            if device.config.sharing is not None:
                raise ConfigError(
                    "MPS on MIG devices is not supported by this gpudra version; leave sharing unset",
                    field=f"{device.config_field}.sharing.strategy",
                )
            return None
        sharing = device.config.sharing
        if sharing is not None and sharing.mps is not None:
            raise ConfigError(
                "MPS is not supported by this gpudra version; allowed: TimeSlicing",
                field=f"{device.config_field}.sharing.strategy",
            )
        interval = sharing.time_slicing if sharing is not None else None
        return ckpt.TimeSlicingRecord(
            strategy="TimeSlicing", interval=interval.interval if interval is not None else "Default"
        )

    def apply(self, record: ckpt.SharingRecord, *, gpu_uuids: Sequence[str]) -> None:
        if isinstance(record, ckpt.TimeSlicingRecord):
            for uuid in gpu_uuids:
                self.tools.set_timeslice(gpu_uuid=uuid, level=TIMESLICE[record.interval])

    def undo(self, record: ckpt.SharingRecord, *, gpu_uuids: Sequence[str]) -> None:
        if isinstance(record, ckpt.TimeSlicingRecord):
            for uuid in gpu_uuids:
                self.tools.set_timeslice(gpu_uuid=uuid, level=TIMESLICE["Default"])
