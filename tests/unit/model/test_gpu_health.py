"""The fault rules: every default XID class, the option that overrides them, the marks faults leave,
the rules that lift them (never the mere absence of events for a fault that needs a reset), and the
taints that follow, MIG partitions included."""

from __future__ import annotations

import pytest

from gpudra.errors import ConfigError
from gpudra.model.gpu_health import (
    DEFAULT_CLASSIFICATION,
    DEFAULT_XIDS,
    Classification,
    Fault,
    GpuConditions,
    Mark,
    Marks,
    XidClass,
    baseline_read,
    classify_xid,
    condition_fault,
    device_taints,
    double_bit_ecc,
    expire,
    lifted_when,
    needs,
    observe_annotation,
    observe_cleared,
    observe_reachable,
    parse_xid_classes,
    record,
    taint_effect,
)

GPU, OTHER = "GPU-aaaa", "GPU-bbbb"
BOOT = "boot-1"
# gpu-0 with its share and two partitions; gpu-1 alone
DEVICE_GPUS = {
    "gpu-0": GPU,
    "gpu-0-shared": GPU,
    "gpu-0-mig-3g40gb-0": GPU,
    "gpu-0-mig-1g10gb-4": GPU,
    "gpu-1": OTHER,
}

# Every default: the catalog's immediate action and the class that follows from it (docs/health.md has
# the table and the sources).
EXPECTED = {
    13: ("RESTART_APP", XidClass.IGNORE),
    31: ("RESTART_APP", XidClass.IGNORE),
    43: ("IGNORE", XidClass.IGNORE),
    45: ("WORKFLOW_XID_45", XidClass.IGNORE),
    63: ("IGNORE", XidClass.IGNORE),
    68: ("RESTART_APP", XidClass.IGNORE),
    92: ("IGNORE", XidClass.IGNORE),
    94: ("RESTART_APP", XidClass.IGNORE),
    48: ("WORKFLOW_XID_48", XidClass.RESET),
    64: ("RESET_GPU", XidClass.RESET),
    74: ("WORKFLOW_NVLINK_ERR", XidClass.RESET),
    95: ("RESET_GPU", XidClass.RESET),
    109: ("RESET_GPU", XidClass.RESET),
    119: ("RESET_GPU", XidClass.RESET),
    120: ("RESET_GPU", XidClass.RESET),
    79: ("RESTART_BM", XidClass.REBOOT),
}
# What each of the catalog's immediate actions asks of the GPU.
CATALOG_CLASS = {
    "RESTART_APP": XidClass.IGNORE,
    "IGNORE": XidClass.IGNORE,
    "RESET_GPU": XidClass.RESET,
    "RESTART_BM": XidClass.REBOOT,
}


@pytest.mark.parametrize(
    ("xid", "catalog", "expected"),
    [(xid, *entry) for xid, entry in EXPECTED.items()],
    ids=[f"xid-{x}" for x in EXPECTED],
)
def test_every_default_classification_entry(xid: int, catalog: str, expected: XidClass) -> None:
    assert DEFAULT_CLASSIFICATION.of(xid) == expected
    assert catalog not in CATALOG_CLASS or CATALOG_CLASS[catalog] == expected
    fault = classify_xid(DEFAULT_CLASSIFICATION, gpu_uuid=GPU, device=None, xid=xid)
    assert (fault.xid_class, fault.reason) == (expected, f"Xid{xid}")
    assert fault.what.startswith(f"XID {xid} (") and fault.what.endswith(")")


def test_the_defaults_are_exactly_the_documented_table() -> None:
    assert {rule.xid: (rule.catalog, rule.xid_class) for rule in DEFAULT_XIDS} == EXPECTED
    assert len({rule.xid for rule in DEFAULT_XIDS}) == len(DEFAULT_XIDS)


@pytest.mark.parametrize("xid", [1, 8, 154, 999, 2**32 - 1])
def test_an_xid_the_table_does_not_name_is_recoverable(xid: int) -> None:
    fault = classify_xid(DEFAULT_CLASSIFICATION, gpu_uuid=GPU, device=None, xid=xid)
    assert fault.xid_class == XidClass.RECOVERABLE
    assert fault.what == f"XID {xid}"


def test_a_double_bit_ecc_error_needs_a_reset() -> None:
    fault = double_bit_ecc(gpu_uuid=GPU, device=None)
    assert (fault.xid_class, fault.reason, fault.what) == (
        XidClass.RESET,
        "DoubleBitEcc",
        "a double-bit ECC error",
    )


def test_the_option_overrides_entries_and_the_default() -> None:
    found = parse_xid_classes(" 31=reset, 79 = recoverable,default=ignore,12345=reset ,109=reboot")
    assert found.of(31) == XidClass.RESET
    assert found.of(79) == XidClass.RECOVERABLE
    assert found.of(109) == XidClass.REBOOT
    assert found.of(12345) == XidClass.RESET
    assert found.of(48) == XidClass.RESET  # untouched defaults stay
    assert found.of(13) == XidClass.IGNORE
    assert found.of(7) == XidClass.IGNORE  # the new default
    assert parse_xid_classes("") == DEFAULT_CLASSIFICATION


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "79=fatal",
            "--health-xids: '79=fatal' is not comma-separated <xid>=<class> or default=<class>, "
            "class one of ignore, recoverable, reset, reboot",
        ),
        (
            "79",
            "--health-xids: '79' is not comma-separated <xid>=<class> or default=<class>, "
            "class one of ignore, recoverable, reset, reboot",
        ),
        ("x79=reset", "--health-xids: 'x79=reset': 'x79' is not an XID (0 to 4294967295) or default"),
        ("-1=reset", "--health-xids: '-1=reset': '-1' is not an XID (0 to 4294967295) or default"),
        (
            "4294967296=reset",
            "--health-xids: '4294967296=reset': '4294967296' is not an XID (0 to 4294967295) or default",
        ),
    ],
)
def test_a_bad_entry_is_one_line_naming_the_field_and_what_is_allowed(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as bad:
        parse_xid_classes(text)
    assert str(bad.value) == message
    assert bad.value.field == "--health-xids"
    assert "\n" not in str(bad.value)


def test_the_classification_describes_itself_in_one_line() -> None:
    described = Classification(
        xids={13: XidClass.IGNORE, 79: XidClass.RESET}, unlisted=XidClass.IGNORE
    ).describe()
    assert described == "ignore: 13; recoverable: -; reset: 79; reboot: -; other XIDs: ignore"


# --- marks -----------------------------------------------------------------------------------------


def _xid(xid: int, device: str | None = None, gpu: str = GPU) -> Fault:
    return classify_xid(DEFAULT_CLASSIFICATION, gpu_uuid=gpu, device=device, xid=xid)


def _marked(*faults: Fault, now: float = 100.0) -> Marks:
    marks: Marks = {}
    for fault in faults:
        marks = record(marks, fault, now=now, boot_id=BOOT)
    return marks


def test_an_application_error_or_one_the_catalog_ignores_leaves_no_mark() -> None:
    assert _marked(_xid(13), _xid(31), _xid(43), _xid(45), _xid(63), _xid(68), _xid(92), _xid(94)) == {}
    assert _marked(_xid(94, device="gpu-0-mig-1g10gb-4")) == {}  # contained: its application only


def test_a_fault_marks_its_gpu_or_its_partition() -> None:
    marks = _marked(_xid(79), _xid(48, device="gpu-0-mig-1g10gb-4"))
    assert set(marks) == {(GPU, None), (GPU, "gpu-0-mig-1g10gb-4")}
    assert marks[GPU, None] == Mark(
        gpu_uuid=GPU,
        device=None,
        reason="Xid79",
        xid_class=XidClass.REBOOT,
        what="XID 79 (GPU has fallen off the bus)",
        first_seen=100.0,
        last_seen=100.0,
        boot_id=BOOT,
    )


def test_the_worst_fault_names_the_mark_and_the_latest_restarts_its_clock() -> None:
    marks = record(_marked(_xid(48)), _xid(999), now=200.0, boot_id=BOOT)
    mark = marks[GPU, None]
    assert (mark.reason, mark.xid_class, mark.first_seen, mark.last_seen) == (
        "Xid48",
        XidClass.RESET,
        100,
        200,
    )
    marks = record(_marked(_xid(999)), _xid(74), now=200.0, boot_id=BOOT)
    assert (marks[GPU, None].reason, marks[GPU, None].xid_class) == ("Xid74", XidClass.RESET)
    marks = record(marks, _xid(79), now=300.0, boot_id=BOOT)  # a reboot is worse than a reset
    assert (marks[GPU, None].reason, marks[GPU, None].xid_class) == ("Xid79", XidClass.REBOOT)
    marks = record(marks, _xid(119), now=400.0, boot_id=BOOT)
    assert (marks[GPU, None].reason, marks[GPU, None].xid_class) == ("Xid79", XidClass.REBOOT)


def test_a_recoverable_mark_is_lifted_after_the_clean_time_only() -> None:
    marks = _marked(_xid(8), _xid(999, gpu=OTHER))
    kept, lifted = expire(marks, now=100.0 + 599, boot_id=BOOT, clean_seconds=600)
    assert (kept, lifted) == (marks, [])
    kept, lifted = expire(marks, now=100.0 + 600, boot_id=BOOT, clean_seconds=600)
    assert kept == {}
    assert [(done.mark.reason, done.why) for done in lifted] == [
        ("Xid8", "no fault for 600 s"),
        ("Xid999", "no fault for 600 s"),
    ]


def test_a_mark_that_needs_a_reset_or_reboot_never_expires_without_one() -> None:
    marks = _marked(_xid(79), double_bit_ecc(gpu_uuid=OTHER, device=None))
    kept, lifted = expire(marks, now=100.0 + 10**9, boot_id=BOOT, clean_seconds=600)
    assert (kept, lifted) == (marks, [])


def test_a_reboot_lifts_every_mark() -> None:
    marks = _marked(_xid(79), _xid(999, gpu=OTHER), _xid(119, device="gpu-0-mig-3g40gb-0"))
    kept, lifted = expire(marks, now=101.0, boot_id="boot-2", clean_seconds=600)
    assert kept == {}
    assert {done.why for done in lifted} == {"the node rebooted since"}


def test_a_gpu_seen_unreachable_and_back_was_reset() -> None:
    marks = _marked(_xid(119), _xid(48, device="gpu-0-mig-3g40gb-0"), _xid(74, gpu=OTHER))
    kept, lifted = observe_reachable(marks, {GPU: True, OTHER: True})  # answering all along: no reset
    assert (kept, lifted) == (marks, [])
    kept, lifted = observe_reachable(marks, {GPU: False})  # OTHER could not be probed: nothing said
    assert lifted == [] and kept[GPU, None].unreachable_seen and not kept[OTHER, None].unreachable_seen
    kept, lifted = observe_reachable(kept, {GPU: False})
    assert lifted == []
    kept, lifted = observe_reachable(kept, {GPU: True, OTHER: True})
    assert set(kept) == {(OTHER, None)}
    assert {(done.mark.device, done.why) for done in lifted} == {
        (None, "a GPU reset was observed: it was unreachable and answers again"),
        ("gpu-0-mig-3g40gb-0", "a GPU reset was observed: it was unreachable and answers again"),
    }


def test_a_gpu_off_the_bus_needs_a_reboot_a_reset_does_not_lift_it() -> None:
    """NVIDIA's XID catalog: 79's immediate action is RESTART_BM. A GPU seen lost and answering again
    (a reset) leaves the mark; a new boot ID or the operator's annotation lifts it."""
    marks = _marked(_xid(79), _xid(119, gpu=OTHER))
    seen, _ = observe_reachable(marks, {GPU: False, OTHER: False})
    kept, lifted = observe_reachable(seen, {GPU: True, OTHER: True})
    assert [done.mark.reason for done in lifted] == ["Xid119"]
    assert set(kept) == {(GPU, None)} and kept[GPU, None].xid_class == XidClass.REBOOT
    assert expire(kept, now=100.0 + 10**9, boot_id=BOOT, clean_seconds=600)[1] == []
    assert [done.why for done in expire(kept, now=101.0, boot_id="boot-2", clean_seconds=600)[1]] == [
        "the node rebooted since"
    ]
    baseline, _ = observe_annotation(kept, "")
    assert observe_annotation(baseline, GPU)[0] == {}


def test_what_a_class_needs_and_its_taint_and_what_lifts_it() -> None:
    assert [needs(c) for c in XidClass] == [
        "tainted until it stays quiet",
        "tainted until it stays quiet",
        "needs a GPU reset",
        "needs a node reboot",
    ]
    assert [taint_effect(c, "NoExecute") for c in XidClass] == [
        "NoSchedule",
        "NoSchedule",
        "NoExecute",
        "NoExecute",
    ]
    assert lifted_when(XidClass.REBOOT, gpu_uuid=GPU, clean_seconds=600) == (
        f"the node reboots (a GPU reset does not lift it) or the Node is annotated "
        f"gpudra.io/clear-health={GPU}"
    )
    assert lifted_when(XidClass.RESET, gpu_uuid=GPU, clean_seconds=600) == (
        f"a GPU reset is observed, the node reboots, or the Node is annotated gpudra.io/clear-health={GPU}"
    )
    assert lifted_when(XidClass.RECOVERABLE, gpu_uuid=GPU, clean_seconds=600) == "no fault for 600 s"


def test_a_new_fault_voids_a_reset_seen_before_it() -> None:
    marks, _ = observe_reachable(_marked(_xid(119)), {GPU: False})
    marks = record(marks, _xid(48), now=300.0, boot_id=BOOT)
    kept, lifted = observe_reachable(marks, {GPU: True})
    assert lifted == [] and not kept[GPU, None].unreachable_seen


def test_the_annotation_clears_only_when_it_changes_after_the_fault() -> None:
    marks = _marked(_xid(79), _xid(79, device="gpu-0-mig-1g10gb-4"), _xid(79, gpu=OTHER))
    # first read after the faults: the value there (a stale one, naming GPU) is the baseline
    marks, lifted = observe_annotation(marks, GPU)
    assert lifted == [] and {m.annotation_baseline for m in marks.values()} == {GPU}
    marks, lifted = observe_annotation(marks, GPU)  # unchanged: clears nothing
    assert lifted == []
    marks, lifted = observe_annotation(marks, "")  # removed: still nothing
    assert lifted == []
    marks, lifted = observe_annotation(marks, f"{GPU}, GPU-elsewhere")  # names GPU: its marks go
    assert set(marks) == {(OTHER, None)}
    assert {done.why for done in lifted} == {"the Node's annotation gpudra.io/clear-health names it"}
    marks, lifted = observe_annotation(marks, "all")
    assert marks == {} and len(lifted) == 1


def test_a_repeat_keeps_the_baseline_so_the_operators_word_written_since_lifts_it() -> None:
    """The annotation written after the mark's baseline was read lifts it, whether or not the fault
    repeated meanwhile (a GPU raising XID 79 again and again): the read after a repeat took the
    operator's word as the baseline once, and the operator had to write it again."""
    marks, _ = observe_annotation(_marked(_xid(79)), "")
    marks = record(marks, _xid(79), now=300.0, boot_id=BOOT)
    assert [m.annotation_baseline for m in marks.values()] == [""]
    marks, lifted = observe_annotation(marks, GPU)
    assert [done.mark.gpu_uuid for done in lifted] == [GPU] and not marks


def test_a_worse_fault_needs_a_new_annotation() -> None:
    marks, _ = observe_annotation(_marked(_xid(999)), "")  # recoverable (unlisted)
    marks = record(marks, _xid(79), now=300.0, boot_id=BOOT)  # worse: a node reboot
    marks, lifted = observe_annotation(marks, GPU)  # the first read after the worse fault: a baseline
    assert lifted == []
    marks, lifted = observe_annotation(marks, f"{GPU} ")
    assert lifted == [] and marks  # the same names: not a change the operator made
    marks, lifted = observe_annotation(marks, "all")
    assert not marks


def test_a_baseline_read_for_the_first_time_is_told_apart_from_a_repeat() -> None:
    marked = _marked(_xid(79))
    read, _ = observe_annotation(marked, "")
    assert baseline_read(marked, read)
    assert not baseline_read(read, record(read, _xid(79), now=300.0, boot_id=BOOT))
    assert not baseline_read({}, read)  # a new mark is news of its own


# --- taints ----------------------------------------------------------------------------------------


def _taint(value: str, effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": "gpudra.io/unhealthy", "value": value, "effect": effect}


def test_a_gpus_fault_taints_all_its_devices_and_a_partitions_only_that_partition() -> None:
    marks = _marked(_xid(79), _xid(999, device="gpu-0-mig-3g40gb-0", gpu=OTHER))
    assert device_taints(device_gpus=DEVICE_GPUS, lost={}, marks=marks.values()) == {
        "gpu-0": _taint("Xid79"),
        "gpu-0-shared": _taint("Xid79"),
        "gpu-0-mig-3g40gb-0": _taint("Xid79"),
        "gpu-0-mig-1g10gb-4": _taint("Xid79"),
    }  # the partition mark names a device of another GPU: nothing
    marks = _marked(_xid(999, device="gpu-0-mig-1g10gb-4"))
    assert device_taints(device_gpus=DEVICE_GPUS, lost={}, marks=marks.values()) == {
        "gpu-0-mig-1g10gb-4": _taint("Xid999")
    }


def test_a_partitions_fault_taints_its_shared_form_too() -> None:
    """One MIG device, two published forms (a shareable profile): both leave the scheduler's hands."""
    shared = {**DEVICE_GPUS, "gpu-0-mig-1g10gb-4-shared": DEVICE_GPUS["gpu-0-mig-1g10gb-4"]}
    marks = _marked(_xid(999, device="gpu-0-mig-1g10gb-4"))
    assert device_taints(device_gpus=shared, lost={}, marks=marks.values()) == {
        "gpu-0-mig-1g10gb-4": _taint("Xid999"),
        "gpu-0-mig-1g10gb-4-shared": _taint("Xid999"),
    }


def test_reset_and_reboot_faults_take_the_reset_effect_and_win_on_a_device() -> None:
    marks = _marked(_xid(999), _xid(48, device="gpu-0-mig-1g10gb-4"), _xid(79, gpu=OTHER))
    taints = device_taints(device_gpus=DEVICE_GPUS, lost={}, marks=marks.values(), reset_effect="NoExecute")
    assert taints["gpu-0"] == _taint("Xid999")
    assert taints["gpu-0-mig-1g10gb-4"] == _taint("Xid48", "NoExecute")
    assert taints["gpu-1"] == _taint("Xid79", "NoExecute")
    taints = device_taints(device_gpus=DEVICE_GPUS, lost={}, marks=marks.values())
    assert taints["gpu-0-mig-1g10gb-4"] == _taint("Xid999")  # the GPU's own reason before a partition's


def test_a_lost_gpu_is_tainted_no_schedule_with_its_nvml_error() -> None:
    taints = device_taints(device_gpus=DEVICE_GPUS, lost={OTHER: "NVMLError_GpuIsLost"}, marks=())
    assert taints == {"gpu-1": _taint("NVMLError_GpuIsLost")}
    marks = _marked(_xid(79, gpu=OTHER))
    taints = device_taints(
        device_gpus=DEVICE_GPUS,
        lost={OTHER: "NVMLError_GpuIsLost"},
        marks=marks.values(),
        reset_effect="NoExecute",
    )
    assert taints == {"gpu-1": _taint("Xid79", "NoExecute")}


# --- polled conditions -------------------------------------------------------------------------------


def test_a_reading_tells_only_what_the_gpu_reports() -> None:
    assert GpuConditions().reported() == set()
    hopper = GpuConditions(row_remap_pending=False, row_remap_failed=True, nvlinks_up=frozenset({0, 2}))
    assert hopper.reported() == {"RowRemapPending", "RowRemapFailure", "NvLinkDown"}
    assert hopper.present([0, 1, 2, 3]) == {
        "RowRemapFailure": "a row remapping failed: the GPU's memory cannot be repaired",
        "NvLinkDown": "NVLink 1, 3 down (was up)",
    }
    assert hopper.present([0, 2]) == {
        "RowRemapFailure": "a row remapping failed: the GPU's memory cannot be repaired"
    }
    turing = GpuConditions(retired_pages_pending=True)
    assert turing.reported() == {"RetiredPagesPending"}
    assert list(turing.present([])) == ["RetiredPagesPending"]


def test_a_condition_is_a_reset_fault_named_by_its_reason() -> None:
    fault = condition_fault(gpu_uuid=GPU, condition="NvLinkDown", what="NVLink 3 down (was up)")
    assert (fault.reason, fault.what, fault.xid_class, fault.xid) == (
        "NvLinkDown",
        "NVLink 3 down (was up)",
        XidClass.RESET,
        None,
    )


def test_a_condition_read_gone_lifts_only_the_mark_it_made_alone() -> None:
    pending = condition_fault(gpu_uuid=GPU, condition="RowRemapPending", what="pending")
    links = condition_fault(gpu_uuid=OTHER, condition="NvLinkDown", what="down")
    marks = _marked(pending, links)
    later = record(marks, _xid(48, gpu=OTHER), now=200.0, boot_id=BOOT)  # a fault after the condition
    kept, lifted = observe_cleared(later, {GPU: {"RowRemapPending"}, OTHER: {"NvLinkDown"}})
    assert [(x.mark.gpu_uuid, x.why) for x in lifted] == [
        (GPU, "the pending row remapping was applied: the GPU was reset")
    ]
    assert set(kept) == {(OTHER, None)}
    assert observe_cleared(marks, {GPU: {"NvLinkDown"}})[1] == []  # another condition than the mark's


def test_a_failed_remap_is_not_lifted_by_an_observed_reset() -> None:
    failed = _marked(condition_fault(gpu_uuid=GPU, condition="RowRemapFailure", what="failed"))
    assert failed[GPU, None].xid_class == XidClass.REBOOT
    seen, _ = observe_reachable(failed, {GPU: False})
    kept, lifted = observe_reachable(seen, {GPU: True})
    assert lifted == [] and set(kept) == {(GPU, None)}
    assert observe_cleared(kept, {GPU: {"RowRemapFailure"}})[1] == []


@pytest.mark.parametrize("xid", [74, 119, 120], ids=["nvlink-error", "gsp-rpc-timeout", "gsp-error"])
def test_nvlink_and_gsp_errors_hold_their_taint_until_a_reset(xid: int) -> None:
    """NVIDIA's XID catalog: 74 needs a GPU reset or a node reboot to clear, 119 and 120 a GPU reset
    (RESET_GPU). So quiet time never lifts them; a reset observed does."""
    fault = _xid(xid)
    assert fault.xid_class == XidClass.RESET and fault.what.endswith(")")
    marks = _marked(fault)
    kept, lifted = expire(marks, now=100.0 + 10 * 3600, boot_id=BOOT, clean_seconds=600)
    assert (kept, lifted) == (marks, [])
    kept, _ = observe_reachable(kept, {GPU: False})
    kept, lifted = observe_reachable(kept, {GPU: True})
    assert kept == {} and [done.mark.reason for done in lifted] == [f"Xid{xid}"]
