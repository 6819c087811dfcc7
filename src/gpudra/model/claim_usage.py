"""Whether the devices of a prepared ResourceClaim are in use: the entries the node plugin writes into
the claim's `status.devices`, and how a reader gets the idle streaks back out. Pure.

This is the contract between gpudra's kubelet plugin (the writer, `gpudra.node.usage`) and its
controller (a reader, from its claim watch). The plugin writes one entry per device it prepared for the
claim (resource.k8s.io/v1 `status.devices`, feature gate DRAResourceClaimDeviceStatus), keyed as the
API keys that list: driver, pool, device and, for a share of a device allocated to several claims,
shareID. Each entry carries one condition, of type `Idle`:

    {"driver": "gpu.gpudra.io", "pool": "node-1", "device": "gpu-0",
     "conditions": [{"type": "Idle", "status": "True", "reason": "NoActivity",
                     "message": "no kernel ran on the GPU since 2026-11-23T08:00:00Z",
                     "lastTransitionTime": "2026-11-23T08:00:00Z"}]}

| status  | reason        | means                                                                    |
|---------|---------------|--------------------------------------------------------------------------|
| True    | NoActivity    | no activity in any sample since lastTransitionTime (the streak's start) |
| False   | Active        | activity in the latest sample; lastTransitionTime is when that started  |
| Unknown | NotMeasurable | NVML could not measure the device (the message says why)                |

Activity is what NVML can tell per device: on a whole GPU a utilization above 0 (a kernel ran during
the driver's last sample period); on a MIG device, for which NVML reports no utilization, at least
one compute process. A GPU shared by several claims (time-slicing, MPS) shows the GPU's activity on
each of them. The plugin samples every `--usage-interval-seconds` and writes only when a device's
status changes, so lastTransitionTime is exact to within one interval. An entry is absent until the
plugin's first sample of the claim, for devices prepared with admin access (they watch a device
another claim holds), and with the plugin's usage reporting off.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from gpudra.model.claim import Claim, Condition

CONDITION_TYPE = "Idle"
NO_ACTIVITY, ACTIVE, NOT_MEASURABLE = "NoActivity", "Active", "NotMeasurable"
# metav1.Condition allows 32 KiB of message; the controller shows it in one line.
MAX_MESSAGE = 256

Status = Literal["True", "False", "Unknown"]
_STATUSES: dict[str, Status] = {"True": "True", "False": "False", "Unknown": "Unknown"}
# (pool, device, shareID or None): what identifies an entry among a claim's status.devices.
DeviceKey = tuple[str, str, str | None]


@dataclass(frozen=True)
class Idleness:
    """One device's Idle condition. `since` is its lastTransitionTime, whole seconds in UTC."""

    status: Status
    reason: str
    message: str
    since: datetime


def no_activity(since: datetime, *, mig: bool) -> Idleness:
    """Idle=True: nothing ran on the device in any sample since `since`."""
    since = _whole_seconds(since)
    what = "no compute process on the MIG device" if mig else "no kernel ran on the GPU"
    return Idleness("True", NO_ACTIVITY, f"{what} since {format_time(since)}", since)


def active(since: datetime, *, mig: bool) -> Idleness:
    """Idle=False: the latest sample saw activity. The message names no figure: the entry is written
    only when the status changes, so a figure in it would go stale (the metrics have the figures)."""
    what = "compute processes run on the MIG device" if mig else "kernels run on the GPU"
    return Idleness("False", ACTIVE, what, _whole_seconds(since))


def not_measurable(since: datetime, why: str) -> Idleness:
    """Idle=Unknown: NVML could not say; `why` is its error."""
    return Idleness("Unknown", NOT_MEASURABLE, why[:MAX_MESSAGE], _whole_seconds(since))


def device_entry(*, driver: str, key: DeviceKey, idleness: Idleness) -> dict[str, Any]:
    """The `status.devices` entry of one device."""
    pool, device, share_id = key
    condition = {
        "type": CONDITION_TYPE,
        "status": idleness.status,
        "reason": idleness.reason,
        "message": idleness.message,
        "lastTransitionTime": format_time(idleness.since),
    }
    entry: dict[str, Any] = {"driver": driver, "pool": pool, "device": device}
    if share_id is not None:
        entry["shareID"] = share_id
    entry["conditions"] = [condition]
    return entry


def device_idleness(claim: Claim, *, driver: str) -> dict[DeviceKey, Idleness]:
    """The Idle condition of each of `driver`'s entries in the claim's `status.devices`. Entries
    without one, or with one that is malformed (anyone may write the status), are left out."""
    found: dict[DeviceKey, Idleness] = {}
    for entry in claim.devices:
        if entry.driver != driver or not entry.pool or not entry.device:
            continue
        for condition in entry.conditions:
            idleness = _idleness(condition)
            if idleness is not None:
                found[(entry.pool, entry.device, entry.share_id)] = idleness
    return found


def idle_since(claim: Claim, *, driver: str) -> dict[tuple[str, str], datetime]:
    """(pool, device) -> the start of the current idle streak, for each of `driver`'s devices of the
    claim that is Idle=True. A device shared within the claim under several share IDs reports the
    same GPU for each; the longest streak is kept.

    The start is the node's clock, written by the plugin; a node clock that runs behind would date it
    before the claim existed. It is bounded by the claim's creation time, which the API server's clock
    stamped: no device is idle for longer than its claim has existed."""
    since: dict[tuple[str, str], datetime] = {}
    for (pool, device, _), idleness in device_idleness(claim, driver=driver).items():
        if idleness.status == "True":
            key = (pool, device)
            start = idleness.since if claim.created is None else max(idleness.since, claim.created)
            since[key] = min(since.get(key, start), start)
    return since


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC to the second, as metav1.Time is written: 2026-11-23T08:00:00Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _whole_seconds(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(microsecond=0)


def _idleness(condition: Condition) -> Idleness | None:
    status = _STATUSES.get(condition.status)
    if condition.type != CONDITION_TYPE or status is None:
        return None
    try:
        since = datetime.fromisoformat(condition.last_transition_time)
    except ValueError:
        return None
    if since.tzinfo is None:  # RFC 3339 requires an offset; a stamp without one is not ours
        return None
    return Idleness(status, condition.reason, condition.message, since.astimezone(UTC))
