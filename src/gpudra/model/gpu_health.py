"""GPU faults and what they do to a GPU's devices: the XID classification, the marks faults leave, the
rules that lift them, and the device taints that follow. Pure.

NVML reports faults as events (gpudra.gpu.nvml): an XID critical error carries the XID number, a
double-bit ECC event none; either may name the GPU instance it hit. Each XID falls in one class:

- `ignore`: an application error. The application that caused it has to restart; the GPU is fine.
  Counted (`gpudra_gpu_xid_errors_total`), never tainted.
- `recoverable`: the GPU may recover by itself. Its devices are tainted, and the taint is lifted once
  no fault of a tainting class has been seen on it for the recovery time (`clean_seconds`).
- `reset`: the GPU needs a reset (or the node a reboot). Its devices are tainted until a reset is
  observed or an operator clears it; never because no new event came.
- `reboot`: the node needs a reboot (the catalog's RESTART_BM: a GPU that fell off the bus). Its devices
  are tainted until the node's boot ID changes or an operator clears it; a GPU reset observed does not
  lift it.

The defaults (`DEFAULT_XIDS`, `DEFAULT_UNLISTED`) follow the immediate action ("resolution bucket") of
NVIDIA's XID catalog, each rule naming it (`XidRule.catalog`): RESTART_APP and IGNORE are `ignore` (the
application, not the GPU, needs restarting), RESET_GPU and the workflows that end in one `reset`,
RESTART_BM `reboot` (docs/health.md has the table and the sources). `--health-xids` overrides them
entry by entry (`parse_xid_classes`). A double-bit ECC event is `reset`: the memory behind it is retired
or remapped only by a reset.

A fault with a GPU instance marks that MIG partition only; one without marks the whole GPU, and with
it its shared device and every partition of it. A mark is lifted (`expire`, `observe_reachable`,
`observe_annotation`) when
- the node rebooted since it was made (the boot ID changed): the GPU was reset with it;
- (`reset`) the GPU was seen unreachable after the fault (fell off the bus, reset in progress) and
  answers again: a reset was observed;
- (any class) the Node's annotation `gpudra.io/clear-health` names the GPU (or says `all`) with a value
  other than the one read first after the fault: an operator's word, after a reset out of band, that
  the GPU is fine. A value that was there before the fault never clears it, so a stale annotation
  cannot hide a new fault;
- (`recoverable`) `clean_seconds` passed since its last fault.

Besides events, each health poll reads conditions that no event reports (`GpuConditions`): a row
remapping pending (Ampere and later) or a page retirement pending (before Ampere) — memory the driver
repairs only at the next reset — a row remapping that failed, and an NVLink that was up and is down.
Each is a fault of the `reset` class when it appears (`condition_fault`), named by its own reason
(`RowRemapPending`, `RetiredPagesPending`, `RowRemapFailure`, `NvLinkDown`). Besides the rules above,
a condition's mark is lifted when a later poll reads the condition gone and no other fault hit the GPU
since (`observe_cleared`): a pending repair is applied only by a reset, and a link trains again only
after one. A failed remapping is of the `reboot` class: it never reads gone (NVML keeps it across
resets) and an observed reset does not lift it: only the annotation or a reboot does, and it comes back
at the next boot — the GPU needs replacing.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpudra.errors import ConfigError
from gpudra.model.devices import SHARED_SUFFIX, UNHEALTHY_TAINT_KEY, DeviceTaint, label_value

CLEAR_ANNOTATION = "gpudra.io/clear-health"
CLEAR_ALL = "all"
XIDS_FIELD = "--health-xids"
# NoSchedule keeps new claims off a tainted device; NoExecute also has the device-taint eviction
# controller delete the pods using it. A lost GPU, and every fault but the `reset` class, taint
# NoSchedule only: one failed NVML read (a transient error, a driver hiccup) must not kill workloads,
# and running pods learn of it from their allocatedResourcesStatus. NoExecute for `reset` is an option.
TAINT_EFFECTS = ("NoSchedule", "NoExecute")
DOUBLE_BIT_ECC = "DoubleBitEcc"


class XidClass(enum.StrEnum):
    """In order of severity: a later class wins over an earlier one on the same GPU."""

    IGNORE = "ignore"
    RECOVERABLE = "recoverable"
    RESET = "reset"
    REBOOT = "reboot"


# The classes whose taint takes `--health-reset-effect` and that quiet time never lifts.
NEEDS_INTERVENTION = frozenset({XidClass.RESET, XidClass.REBOOT})


@dataclass(frozen=True)
class XidRule:
    xid: int
    xid_class: XidClass
    what: str  # NVIDIA's name for it, short
    catalog: str  # the catalog's immediate action ("resolution bucket") for it


DEFAULT_XIDS: tuple[XidRule, ...] = (
    # The catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) gives each XID an
    # immediate action; the class follows it (docs/health.md has the table and where each was read).
    # The application, not the GPU, needs restarting (RESTART_APP), or nothing is needed (IGNORE).
    XidRule(13, XidClass.IGNORE, "graphics engine exception", "RESTART_APP"),
    XidRule(31, XidClass.IGNORE, "GPU memory page fault", "RESTART_APP"),
    XidRule(43, XidClass.IGNORE, "GPU stopped processing (the application's channel was reset)", "IGNORE"),
    XidRule(45, XidClass.IGNORE, "preemptive cleanup after earlier errors", "WORKFLOW_XID_45"),
    XidRule(68, XidClass.IGNORE, "video decoder exception", "RESTART_APP"),
    # A row remapping or page retirement recorded: applied at the next reset, new work unaffected (the
    # memory error management guide). The reset it waits for is the polled RowRemapPending /
    # RetiredPagesPending condition's, lifted when the poll reads it applied.
    XidRule(63, XidClass.IGNORE, "row remapping or page retirement recorded, pending a reset", "IGNORE"),
    XidRule(92, XidClass.IGNORE, "high single-bit ECC error rate", "IGNORE"),  # corrected errors
    # Contained: only the application that touched the memory is stopped; the GPU keeps running.
    XidRule(94, XidClass.IGNORE, "contained ECC error", "RESTART_APP"),
    # The GPU needs a reset: RESET_GPU, or a workflow whose end is one (48: a double-bit error, retired
    # or remapped only by a reset; 74: "a GPU reset or node reboot is needed to clear this error").
    XidRule(48, XidClass.RESET, "double-bit ECC error", "WORKFLOW_XID_48"),
    XidRule(64, XidClass.RESET, "row remapping or page retirement failed", "RESET_GPU"),
    XidRule(74, XidClass.RESET, "NVLink error", "WORKFLOW_NVLINK_ERR"),
    XidRule(95, XidClass.RESET, "uncontained ECC error", "RESET_GPU"),
    # NVIDIA's device plugin skips 109 as an application error; the catalog resets the GPU.
    XidRule(109, XidClass.RESET, "context switch timeout", "RESET_GPU"),
    XidRule(119, XidClass.RESET, "GSP RPC timeout", "RESET_GPU"),
    XidRule(120, XidClass.RESET, "GSP error", "RESET_GPU"),
    # The node needs a reboot (RESTART_BM): a GPU reset does not bring back a GPU off the bus.
    XidRule(79, XidClass.REBOOT, "GPU has fallen off the bus", "RESTART_BM"),
)
# Any other XID (999 is NVML's "unknown"): tainted, as NVIDIA's device plugin does for every XID off its
# skip list, but lifted after the recovery time rather than held until a reset.
DEFAULT_UNLISTED = XidClass.RECOVERABLE
_DEFAULT_WHAT = {rule.xid: rule.what for rule in DEFAULT_XIDS}


@dataclass(frozen=True)
class Classification:
    """XID -> class; `unlisted` for XIDs the table does not name."""

    xids: Mapping[int, XidClass]
    unlisted: XidClass

    def of(self, xid: int) -> XidClass:
        return self.xids.get(xid, self.unlisted)

    def describe(self) -> str:
        """One line for the log: each class and its XIDs."""
        by_class = {c: sorted(x for x, found in self.xids.items() if found == c) for c in XidClass}
        listed = "; ".join(f"{c}: {', '.join(map(str, xids)) or '-'}" for c, xids in by_class.items())
        return f"{listed}; other XIDs: {self.unlisted}"


DEFAULT_CLASSIFICATION = Classification(
    xids={rule.xid: rule.xid_class for rule in DEFAULT_XIDS}, unlisted=DEFAULT_UNLISTED
)
_CLASSES = ", ".join(XidClass)
_FORMAT = f"comma-separated <xid>=<class> or default=<class>, class one of {_CLASSES}"


def parse_xid_classes(text: str, *, field: str = XIDS_FIELD) -> Classification:
    """The defaults with `text`'s entries on top: "31=reset,109=recoverable,default=ignore".

    Each entry names an XID (0 to 2^32-1) or `default` (XIDs no entry names) and a class; one
    ConfigError names the first bad entry, the field and what is allowed."""
    xids = dict(DEFAULT_CLASSIFICATION.xids)
    unlisted = DEFAULT_CLASSIFICATION.unlisted
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        key, sep, value = (part.strip() for part in entry.partition("="))
        if not sep or value not in XidClass.__members__.values():
            raise ConfigError(f"{entry!r} is not {_FORMAT}", field=field)
        if key == "default":
            unlisted = XidClass(value)
        elif key.isdigit() and int(key) < 2**32:
            xids[int(key)] = XidClass(value)
        else:
            raise ConfigError(f"{entry!r}: {key!r} is not an XID (0 to 4294967295) or default", field=field)
    return Classification(xids=xids, unlisted=unlisted)


# --- faults and marks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One fault NVML reported, attributed to a GPU, or to one of its partitions (`device`)."""

    gpu_uuid: str
    device: str | None  # the partition device a GPU instance's fault hit; None: the whole GPU
    xid: int | None  # None for a double-bit ECC event and for a polled condition
    xid_class: XidClass
    condition: str | None = None  # a polled condition's reason (CONDITIONS)
    detail: str = ""  # a polled condition, for people

    @property
    def reason(self) -> str:
        """The taint's value: `Xid79`, `DoubleBitEcc`, `RowRemapPending`."""
        if self.condition is not None:
            return self.condition
        return DOUBLE_BIT_ECC if self.xid is None else f"Xid{self.xid}"

    @property
    def what(self) -> str:
        """For people: "XID 79 (GPU has fallen off the bus)", "a double-bit ECC error"."""
        if self.condition is not None:
            return self.detail
        if self.xid is None:
            return "a double-bit ECC error"
        name = _DEFAULT_WHAT.get(self.xid)
        return f"XID {self.xid} ({name})" if name else f"XID {self.xid}"


def target(gpu_uuid: str, device: str | None) -> str:
    """What a fault hit, for people: "GPU GPU-…", "GPU GPU-… partition gpu-0-mig-3g40gb-4"."""
    return f"GPU {gpu_uuid}" + (f" partition {device}" if device else "")


def classify_xid(classification: Classification, *, gpu_uuid: str, device: str | None, xid: int) -> Fault:
    return Fault(gpu_uuid=gpu_uuid, device=device, xid=xid, xid_class=classification.of(xid))


def double_bit_ecc(*, gpu_uuid: str, device: str | None) -> Fault:
    return Fault(gpu_uuid=gpu_uuid, device=device, xid=None, xid_class=XidClass.RESET)


# --- polled conditions ---------------------------------------------------------------------------

ROW_REMAP_PENDING = "RowRemapPending"
ROW_REMAP_FAILURE = "RowRemapFailure"
RETIRED_PAGES_PENDING = "RetiredPagesPending"
NVLINK_DOWN = "NvLinkDown"
CONDITIONS = (ROW_REMAP_PENDING, ROW_REMAP_FAILURE, RETIRED_PAGES_PENDING, NVLINK_DOWN)
# What may hold a GPU's clocks down, as gpudra names NVML's clocks event reasons (GpuConditions).
CLOCK_SLOWDOWNS = (
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
_CLEARED_WHY = {
    ROW_REMAP_PENDING: "the pending row remapping was applied: the GPU was reset",
    RETIRED_PAGES_PENDING: "the pending page retirement was applied: the GPU was reset",
    NVLINK_DOWN: "every NVLink that was up is up again",
}


@dataclass(frozen=True)
class GpuConditions:
    """One poll's reading of a GPU's memory repairs and NVLinks (`Nvml.gpu_conditions`); None where the
    GPU does not report it (the architecture has no such thing, MIG instances hide the remapped rows,
    the GPU has no NVLink)."""

    row_remap_pending: bool | None = None
    row_remap_failed: bool | None = None
    retired_pages_pending: bool | None = None
    nvlinks_up: frozenset[int] | None = None
    # What holds the clocks down now (power cap, thermal or hardware slowdown): shown, never a fault
    # (a hot or power-capped GPU is slow, not broken).
    clock_slowdowns: frozenset[str] | None = None

    def reported(self) -> set[str]:
        """The conditions this reading can tell present or absent."""
        fields = {
            ROW_REMAP_PENDING: self.row_remap_pending,
            ROW_REMAP_FAILURE: self.row_remap_failed,
            RETIRED_PAGES_PENDING: self.retired_pages_pending,
            NVLINK_DOWN: self.nvlinks_up,
        }
        return {reason for reason, value in fields.items() if value is not None}

    def present(self, links_expected: Iterable[int]) -> dict[str, str]:
        """Condition -> what it is, for people; `links_expected`: the links seen up before."""
        found = {}
        if self.row_remap_pending:
            found[ROW_REMAP_PENDING] = "a row remapping is pending: the GPU needs a reset to apply it"
        if self.row_remap_failed:
            found[ROW_REMAP_FAILURE] = "a row remapping failed: the GPU's memory cannot be repaired"
        if self.retired_pages_pending:
            found[RETIRED_PAGES_PENDING] = "a page retirement is pending: the GPU needs a reset to apply it"
        if self.nvlinks_up is not None:
            down = sorted(set(links_expected) - self.nvlinks_up)
            if down:
                found[NVLINK_DOWN] = f"NVLink {', '.join(map(str, down))} down (was up)"
        return found


def condition_fault(*, gpu_uuid: str, condition: str, what: str) -> Fault:
    """A condition needs a reset; a failed remapping, which a reset does not undo, is of the `reboot`
    class: only a reboot (which finds it again) or the annotation lifts it."""
    xid_class = XidClass.REBOOT if condition == ROW_REMAP_FAILURE else XidClass.RESET
    return Fault(
        gpu_uuid=gpu_uuid, device=None, xid=None, xid_class=xid_class, condition=condition, detail=what
    )


def observe_cleared(
    marks: Mapping[tuple[str, str | None], Mark], cleared: Mapping[str, Iterable[str]]
) -> tuple[Marks, list[Lifted]]:
    """After a poll: `cleared` names per GPU the conditions read present before and absent now. The
    GPU's mark is lifted when a cleared condition made it and no fault came after it."""
    kept: Marks = {}
    lifted = []
    for key, mark in marks.items():
        gone = set(cleared.get(mark.gpu_uuid, ()))
        if (
            mark.device is None
            and mark.reason in gone
            and mark.reason in _CLEARED_WHY
            and mark.last_seen == mark.first_seen
        ):
            lifted.append(Lifted(mark, _CLEARED_WHY[mark.reason]))
        else:
            kept[key] = mark
    return kept, lifted


@dataclass(frozen=True)
class Mark:
    """What a tainting fault left on a GPU or partition until a rule lifts it (module docstring)."""

    gpu_uuid: str
    device: str | None
    reason: str  # the taint's value, of the worst fault so far
    xid_class: XidClass  # RECOVERABLE or RESET: the worst so far
    what: str
    first_seen: float  # Unix seconds
    last_seen: float
    boot_id: str
    unreachable_seen: bool = False  # the GPU was seen unreachable after the last fault
    # The names in the annotation as first read after the last fault, sorted and comma-separated ("" when
    # absent); None before a read.
    annotation_baseline: str | None = None

    @property
    def key(self) -> tuple[str, str | None]:
        return self.gpu_uuid, self.device

    @property
    def target(self) -> str:
        return target(self.gpu_uuid, self.device)


@dataclass(frozen=True)
class Lifted:
    mark: Mark
    why: str


Marks = dict[tuple[str, str | None], Mark]


def record(marks: Mapping[tuple[str, str | None], Mark], fault: Fault, *, now: float, boot_id: str) -> Marks:
    """`marks` after `fault`: an ignored fault changes nothing; another marks its GPU or partition
    (again), restarting its recovery time and voiding earlier evidence of a reset (and, for a worse
    fault, the annotation's baseline: read again after it)."""
    result = dict(marks)
    if fault.xid_class == XidClass.IGNORE:
        return result
    key = (fault.gpu_uuid, fault.device)
    before = marks.get(key)
    worse = before is None or _rank(fault.xid_class) > _rank(before.xid_class)  # else the first names it
    result[key] = Mark(
        gpu_uuid=fault.gpu_uuid,
        device=fault.device,
        reason=fault.reason if worse or before is None else before.reason,
        xid_class=fault.xid_class if worse or before is None else before.xid_class,
        what=fault.what if worse or before is None else before.what,
        first_seen=now if before is None else before.first_seen,
        last_seen=now,
        boot_id=boot_id,
        # A repeat keeps what the annotation was read as after the mark was made: an operator's word
        # written since still lifts it (the read after a repeat would take that word as the baseline,
        # so it lifted nothing, and the operator had to write it again). A worse fault is a new mark.
        annotation_baseline=None if before is None or worse else before.annotation_baseline,
    )
    return result


def same_in_substance(
    before: Mapping[tuple[str, str | None], Mark], after: Mapping[tuple[str, str | None], Mark]
) -> bool:
    """Whether `after` holds the marks of `before`, changed in nothing but what every repeat of a fault
    refreshes: when each was last seen, and the annotation's baseline (read again after each fault)."""
    if before.keys() != after.keys():
        return False
    return all(
        dataclasses.replace(
            after[key], last_seen=mark.last_seen, annotation_baseline=mark.annotation_baseline
        )
        == mark
        for key, mark in before.items()
    )


def expire(
    marks: Mapping[tuple[str, str | None], Mark], *, now: float, boot_id: str, clean_seconds: float
) -> tuple[Marks, list[Lifted]]:
    """Lifts marks made before the node's last boot, and recoverable ones quiet for `clean_seconds`."""
    kept: Marks = {}
    lifted = []
    for key, mark in marks.items():
        if mark.boot_id != boot_id:
            lifted.append(Lifted(mark, "the node rebooted since"))
        elif mark.xid_class == XidClass.RECOVERABLE and now - mark.last_seen >= clean_seconds:
            lifted.append(Lifted(mark, f"no fault for {clean_seconds:g} s"))
        else:
            kept[key] = mark
    return kept, lifted


def observe_reachable(
    marks: Mapping[tuple[str, str | None], Mark], reachable: Mapping[str, bool]
) -> tuple[Marks, list[Lifted]]:
    """After a probe: `reachable` says per GPU whether it answered (False: lost, needs a reset, gone;
    GPUs that could not be probed are absent). A GPU seen unreachable and then answering was reset: its
    marks are lifted, but those of the `reboot` class."""
    kept: Marks = {}
    lifted = []
    for key, mark in marks.items():
        answered = reachable.get(mark.gpu_uuid)
        if answered is False and not mark.unreachable_seen:
            kept[key] = dataclasses.replace(mark, unreachable_seen=True)
        elif answered and mark.unreachable_seen and mark.xid_class != XidClass.REBOOT:
            lifted.append(Lifted(mark, "a GPU reset was observed: it was unreachable and answers again"))
        else:
            kept[key] = mark
    return kept, lifted


def observe_annotation(
    marks: Mapping[tuple[str, str | None], Mark], value: str
) -> tuple[Marks, list[Lifted]]:
    """After reading the Node's `gpudra.io/clear-health` (`value`, "" when absent)."""
    named = set(value.replace(",", " ").split())
    normal = ",".join(sorted(named))  # what the annotation says, however it is spelt
    kept: Marks = {}
    lifted = []
    for key, mark in marks.items():
        if mark.annotation_baseline is None:
            kept[key] = dataclasses.replace(mark, annotation_baseline=normal)
        elif normal != mark.annotation_baseline and (mark.gpu_uuid in named or CLEAR_ALL in named):
            lifted.append(Lifted(mark, f"the Node's annotation {CLEAR_ANNOTATION} names it"))
        else:
            kept[key] = mark
    return kept, lifted


def baseline_read(
    before: Mapping[tuple[str, str | None], Mark], after: Mapping[tuple[str, str | None], Mark]
) -> bool:
    """Whether some mark of `after` has its annotation baseline read where `before` had none yet."""
    return any(
        mark.annotation_baseline is not None
        and (previous := before.get(key)) is not None
        and previous.annotation_baseline is None
        for key, mark in after.items()
    )


def _rank(xid_class: XidClass) -> int:
    return list(XidClass).index(xid_class)


# --- taints ------------------------------------------------------------------------------------------


def taint_effect(xid_class: XidClass, reset_effect: str) -> str:
    """The taint effect of a mark of `xid_class`: `reset_effect` where a reset or a reboot is needed."""
    return reset_effect if xid_class in NEEDS_INTERVENTION else "NoSchedule"


def needs(xid_class: XidClass) -> str:
    """What the GPU needs, for people: "needs a GPU reset"."""
    if xid_class == XidClass.REBOOT:
        return "needs a node reboot"
    return "needs a GPU reset" if xid_class == XidClass.RESET else "tainted until it stays quiet"


def lifted_when(xid_class: XidClass, *, gpu_uuid: str, clean_seconds: float) -> str:
    """What lifts a mark of `xid_class`, for the Node event (docs/health.md, Recovery)."""
    annotation = f"the Node is annotated {CLEAR_ANNOTATION}={gpu_uuid}"
    if xid_class == XidClass.REBOOT:
        return f"the node reboots (a GPU reset does not lift it) or {annotation}"
    if xid_class == XidClass.RESET:
        return f"a GPU reset is observed, the node reboots, or {annotation}"
    return f"no fault for {clean_seconds:g} s"


def device_taints(
    *,
    device_gpus: Mapping[str, str],
    lost: Mapping[str, str],
    marks: Iterable[Mark],
    reset_effect: str = "NoSchedule",
) -> dict[str, DeviceTaint]:
    """Device name -> its unhealthy taint: every device of a `lost` GPU (UUID -> NVML error) and of a
    GPU with a mark, and each marked partition. Marks of the `reset` and `reboot` classes get
    `reset_effect`, all else
    NoSchedule (a transient NVML error must not evict workloads). One taint per device: the most severe
    effect, the GPU's own reason before a partition's."""
    found: dict[str, tuple[int, str, str]] = {}  # device -> (severity, reason, effect)

    def add(device: str, reason: str, effect: str, severity: int) -> None:
        if device not in found or severity > found[device][0]:
            found[device] = (severity, reason, effect)

    ordered = sorted(marks, key=lambda m: m.device is not None)  # a GPU's marks before its partitions'
    for mark in ordered:
        effect = taint_effect(mark.xid_class, reset_effect)
        severity = 2 * TAINT_EFFECTS.index(effect) + (mark.device is None)
        for device, gpu in device_gpus.items():
            # A partition's mark taints its shared form too (`<partition>-shared`): one MIG device.
            if gpu == mark.gpu_uuid and mark.device in (None, device, device.removesuffix(SHARED_SUFFIX)):
                add(device, mark.reason, effect, severity)
    for device, gpu in device_gpus.items():
        if gpu in lost:
            add(device, lost[gpu], "NoSchedule", 1)
    return {
        device: {"key": UNHEALTHY_TAINT_KEY, "value": label_value(reason), "effect": effect}
        for device, (_, reason, effect) in found.items()
    }
