"""The unhealthy devices a node reports on its pool's first slice, for the cluster view. Pure.

Where the API server keeps device taints (DRADeviceTaints: on by default from 1.36), an unhealthy device
is published tainted, and the taint names its fault in one word. Where it does not (1.34 and 1.35 with
their default gates), the device has to leave the slices so that no claim gets it, and with it goes all
that the cluster could know of it: `gpudra status`, the GPU map and the controller's metrics would show
nothing at all. So the plugin writes the annotation `gpudra.io/unhealthy-devices` on the first slice of
its pool, on every release: a JSON list of each unhealthy GPU (and each unhealthy partition of a GPU that
is healthy itself) with the taint it has or would have, the words of its fault (the XID, its class and
what lifts it) and whether the slices carry it tainted or leave it out (`slices`). A healthy node writes
no annotation. The controller reads it beside the taints (gpudra.scheduling.cluster_view).

Bounded both ways, because a slice is written by a node and the controller's memory is shared by all of
them: at most MAX_ENTRIES entries (`more` counts those left off), every field cut to its limit, and the
reader refuses a text over MAX_BYTES or one that does not parse, with one line that says why, never a
failed view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpudra.model.devices import SHARED_SUFFIX, Device, DeviceTaint, gpu_uuid_of

ANNOTATION = "gpudra.io/unhealthy-devices"
MAX_ENTRIES = 128  # a node of 8 GPUs with every MIG partition of each unhealthy on its own needs fewer
MAX_MESSAGE = 400
MAX_TEXT = 128  # device names, UUIDs, products
MAX_BYTES = 128 * 1024  # half of what the API server allows for all of an object's annotations

# How the node's slices show the device: tainted, or left out because the server drops taints. The
# reader adds "untainted": the report says tainted, but the slice the server stored has no such taint.
Published = Literal["tainted", "left-out"]


class ReportedDevice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    device: str = Field(min_length=1, max_length=MAX_TEXT)
    kind: Literal["gpu", "mig"] = "gpu"  # a whole GPU, or one MIG partition of it
    uuid: str = Field(max_length=MAX_TEXT)  # the GPU's
    product: str = Field(default="", max_length=MAX_TEXT)
    reason: str = Field(default="", max_length=63)  # the taint's value: a label value
    effect: str = Field(default="NoSchedule", max_length=16)
    slices: Published
    message: str = Field(default="", max_length=MAX_MESSAGE)


class HealthReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    devices: list[ReportedDevice] = Field(default_factory=list, max_length=MAX_ENTRIES)
    more: int = Field(default=0, ge=0)  # unhealthy devices left off the list


def slice_annotations(
    devices: Sequence[Device],
    taints: Mapping[str, DeviceTaint],
    messages: Mapping[str, str],
    *,
    slices: Published,
) -> dict[str, str]:
    """The first slice's annotations for the unhealthy `devices` (name -> taint, with `messages`: name ->
    the fault's words); {} when none is. A GPU's shared device and its partitions follow the GPU's entry
    and are not listed; a tainted partition of an untainted GPU is, and its shared form follows it."""
    whole = {gpu_uuid_of(d) for d in devices if d["name"] in taints and _kind(d) == "gpu" and not _shared(d)}
    entries: list[ReportedDevice] = []
    for device in devices:
        taint = taints.get(device["name"])
        kind = _kind(device)
        if taint is None or _shared(device) or kind not in ("gpu", "mig"):
            continue
        uuid = gpu_uuid_of(device)
        if kind == "mig" and uuid in whole:
            continue
        entries.append(
            ReportedDevice(
                device=device["name"][:MAX_TEXT],
                kind="mig" if kind == "mig" else "gpu",
                uuid=uuid[:MAX_TEXT],
                product=_string(device, "productName")[:MAX_TEXT],
                reason=taint.get("value", "")[:63],
                effect=taint["effect"],
                slices=slices,
                message=_cut(messages.get(device["name"], "")),
            )
        )
    if not entries:
        return {}
    kept = entries[:MAX_ENTRIES]
    text = HealthReport(devices=kept, more=len(entries) - len(kept)).model_dump_json()
    while len(text.encode()) > MAX_BYTES:  # not with these limits; kept so that a change cannot break it
        kept = kept[: len(kept) // 2]
        text = HealthReport(devices=kept, more=len(entries) - len(kept)).model_dump_json()
    return {ANNOTATION: text}


def read(text: str, *, where: str) -> tuple[HealthReport, str | None]:
    """The report in an annotation's `text`, and None; or an empty one and the line that says why it was
    refused (`where`: the slice, for that line)."""
    if len(text) > MAX_BYTES:
        return HealthReport(), f"{where}: annotation {ANNOTATION} is over {MAX_BYTES} bytes; ignored"
    try:
        return HealthReport.model_validate_json(text), None
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top)"
        return HealthReport(), f"{where}: annotation {ANNOTATION}, {field}: {first['msg']}; ignored"


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"


def _kind(device: Device) -> str:
    return _string(device, "type")


def _shared(device: Device) -> bool:
    return bool(device.get("allowMultipleAllocations")) or device["name"].endswith(SHARED_SUFFIX)


def _string(device: Device, name: str) -> str:
    return str(device["attributes"].get(name, {}).get("string", ""))
