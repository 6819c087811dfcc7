"""How a prepared device is shared between the containers of its claim. I/O: GPU tools.

Time-slicing sets the GPU's time-slice interval on prepare and puts it back to Default on unprepare.
A whole GPU without a sharing config gets the same Default interval, so a GPU never keeps the setting
of a claim that used it before. Both directions are idempotent: a crash between any two calls is
settled by calling again.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpudra import checkpoint as ckpt
from gpudra.api import GpuConfig
from gpudra.errors import ConfigError
from gpudra.gputools import GpuTools
from gpudra.prepare import Allocated

DEFAULT_TIMESLICE = 0


class GpuSharing:
    def __init__(self, tools: GpuTools) -> None:
        self.tools = tools

    def apply(self, device: Allocated, *, claim_uid: str) -> ckpt.SharingRecord | None:
        if device.admin_access:  # monitoring access: the device belongs to someone else's claim
            return None
        sharing = device.config.sharing if isinstance(device.config, GpuConfig) else None
        if sharing is not None and sharing.mps is not None:
            raise ConfigError(
                "MPS is not supported by this gpudra version; allowed: TimeSlicing",
                field=f"{device.config_field}.sharing.strategy",
            )
        interval = sharing.time_slicing if sharing is not None else None
        record = ckpt.TimeSlicingRecord(
            strategy="TimeSlicing", interval=interval.interval if interval is not None else "Default"
        )
        self.tools.set_timeslice(gpu_uuid=device.gpu.uuid, level=interval.timeslice if interval else 0)
        return record

    def undo(self, record: ckpt.SharingRecord, *, gpu_uuids: Sequence[str]) -> None:
        if isinstance(record, ckpt.TimeSlicingRecord):
            for uuid in gpu_uuids:
                self.tools.set_timeslice(gpu_uuid=uuid, level=DEFAULT_TIMESLICE)
