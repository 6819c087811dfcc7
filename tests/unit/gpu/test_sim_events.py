"""The simulated driver's NVML events, through pynvml itself: event sets, registration, waits and
their timeouts, what a GPU does not offer, and the faults the hooks raise (also from a shell)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpudra import sim
from gpudra.node import gpu_driver
from gpudra.sim import events, hardware

XID = pynvml.nvmlEventTypeXidCriticalError
DBE = pynvml.nvmlEventTypeDoubleBitEccError
NOT_AVAILABLE = 0xFFFFFFFF


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "machine.json"


@pytest.fixture
def h100(state_file: Path) -> Iterator[list[Any]]:
    """pynvml on a simulated DGX H100: the handles of its 8 GPUs."""
    with gpu_driver.connect("sim:dgx-h100", state_file=state_file):
        yield [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]


@pytest.fixture
def event_set(h100: list[Any]) -> Iterator[Any]:
    created = pynvml.nvmlEventSetCreate()
    yield created
    pynvml.nvmlEventSetFree(created)


def _uuid(handle: Any) -> str:
    uuid: str = pynvml.nvmlDeviceGetUUID(handle)
    return uuid


def _pointer(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def test_a_wait_without_events_times_out_after_its_timeout(event_set: Any, h100: list[Any]) -> None:
    pynvml.nvmlDeviceRegisterEvents(h100[0], XID | DBE, event_set)
    started = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 200)
    # Not before its timeout; the upper bound only tells "timed out" from "waited on", 50 times over.
    assert 0.19 <= time.monotonic() - started < 10


def test_an_xid_reaches_the_set_registered_for_its_gpu(
    event_set: Any, h100: list[Any], state_file: Path
) -> None:
    pynvml.nvmlDeviceRegisterEvents(h100[3], XID, event_set)
    sim.raise_xid(state_file=state_file, gpu_uuid=_uuid(h100[3]), xid=79)
    data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
    assert (data.eventType, data.eventData, data.gpuInstanceId, data.computeInstanceId) == (
        XID,
        79,
        NOT_AVAILABLE,
        NOT_AVAILABLE,
    )
    assert _pointer(data.device) == _pointer(h100[3])
    assert _uuid(data.device) == _uuid(h100[3])
    with pytest.raises(pynvml.NVMLError_Timeout):  # delivered once
        pynvml.nvmlEventSetWait_v2(event_set, 50)


def test_a_waiting_set_wakes_for_an_event_raised_by_another_thread(
    event_set: Any, h100: list[Any], state_file: Path
) -> None:
    pynvml.nvmlDeviceRegisterEvents(h100[0], XID, event_set)
    timer = threading.Timer(
        0.2, lambda: sim.raise_xid(state_file=state_file, gpu_uuid=_uuid(h100[0]), xid=48)
    )
    timer.start()
    started = time.monotonic()
    data = pynvml.nvmlEventSetWait_v2(event_set, 60_000)
    timer.join()
    assert data.eventData == 48
    assert time.monotonic() - started < 30  # woken by the event, not at the wait's 60 s


def test_only_the_registered_gpus_types_and_later_events_are_delivered(
    event_set: Any, h100: list[Any], state_file: Path
) -> None:
    sim.raise_xid(state_file=state_file, gpu_uuid=_uuid(h100[0]), xid=31)  # before registration
    pynvml.nvmlDeviceRegisterEvents(h100[0], DBE, event_set)
    sim.raise_xid(state_file=state_file, gpu_uuid=_uuid(h100[0]), xid=13)  # a type not registered
    sim.raise_xid(state_file=state_file, gpu_uuid=_uuid(h100[1]), xid=13)  # a GPU not registered
    sim.raise_double_bit_ecc(state_file=state_file, gpu_uuid=_uuid(h100[0]))
    data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
    assert (data.eventType, data.eventData) == (DBE, 0)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 50)


def test_every_set_gets_each_event(h100: list[Any], state_file: Path) -> None:
    first, second = pynvml.nvmlEventSetCreate(), pynvml.nvmlEventSetCreate()
    try:
        for each in (first, second):
            pynvml.nvmlDeviceRegisterEvents(h100[2], XID, each)
        sim.raise_xid(state_file=state_file, gpu_uuid=_uuid(h100[2]), xid=94)
        assert [pynvml.nvmlEventSetWait_v2(each, 1000).eventData for each in (first, second)] == [94, 94]
    finally:
        pynvml.nvmlEventSetFree(first)
        pynvml.nvmlEventSetFree(second)


def test_a_double_bit_error_counts_and_raises_its_event_and_xid_48(
    event_set: Any, h100: list[Any], state_file: Path
) -> None:
    pynvml.nvmlDeviceRegisterEvents(h100[0], XID | DBE, event_set)
    uncorrected, volatile = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
    assert pynvml.nvmlDeviceGetTotalEccErrors(h100[0], uncorrected, volatile) == 0
    sim.raise_double_bit_ecc(state_file=state_file, gpu_uuid=_uuid(h100[0]))
    got = [pynvml.nvmlEventSetWait_v2(event_set, 1000) for _ in range(2)]
    assert [(d.eventType, d.eventData) for d in got] == [(DBE, 0), (XID, 48)]
    assert pynvml.nvmlDeviceGetTotalEccErrors(h100[0], uncorrected, volatile) == 1
    assert pynvml.nvmlDeviceGetTotalEccErrors(h100[0], pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, volatile) == 0
    assert pynvml.nvmlDeviceGetTotalEccErrors(h100[1], uncorrected, volatile) == 0


def test_an_event_of_a_gpu_instance_names_it(event_set: Any, h100: list[Any], state_file: Path) -> None:
    placement = pynvml.c_nvmlGpuInstancePlacement_t(4, 4)
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h100[0], 9, ctypes.byref(placement))  # 3g.40gb
    gi_id = pynvml.nvmlGpuInstanceGetInfo(gi).id
    pynvml.nvmlDeviceRegisterEvents(h100[0], XID, event_set)
    sim.raise_xid(state_file=state_file, gpu_uuid=_uuid(h100[0]), xid=31, gpu_instance_id=gi_id)
    data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
    assert (data.eventData, data.gpuInstanceId, data.computeInstanceId) == (31, gi_id, NOT_AVAILABLE)
    with pytest.raises(hardware.Refused, match="no GPU instance 13"):
        sim.raise_xid(state_file=state_file, gpu_uuid=_uuid(h100[0]), xid=31, gpu_instance_id=13)
    pynvml.nvmlGpuInstanceDestroy(gi)


def test_events_are_registered_through_the_parent_not_a_mig_device(event_set: Any, h100: list[Any]) -> None:
    placement = pynvml.c_nvmlGpuInstancePlacement_t(0, 1)
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h100[0], 19, ctypes.byref(placement))
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    mig = pynvml.nvmlComputeInstanceGetInfo(ci).device
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(mig, XID, event_set)
    pynvml.nvmlComputeInstanceDestroy(ci)
    pynvml.nvmlGpuInstanceDestroy(gi)


def test_a_gpu_offers_the_event_types_of_its_machine(event_set: Any, h100: list[Any]) -> None:
    offered = pynvml.nvmlDeviceGetSupportedEventTypes(h100[0])
    assert offered & (XID | DBE) == XID | DBE
    with pytest.raises(pynvml.NVMLError_NotSupported):  # one type it lacks fails the registration
        pynvml.nvmlDeviceRegisterEvents(h100[0], XID | pynvml.nvmlEventTypeGpuUnavailableError, event_set)


def test_a_machine_without_events_refuses_every_registration(tmp_path: Path) -> None:
    with gpu_driver.connect("sim:no-sharing", state_file=tmp_path / "machine.json"):
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetSupportedEventTypes(handle) == 0
        created = pynvml.nvmlEventSetCreate()
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceRegisterEvents(handle, XID, created)
        with pytest.raises(pynvml.NVMLError_Timeout):  # the set stays usable
            pynvml.nvmlEventSetWait_v2(created, 10)
        pynvml.nvmlEventSetFree(created)


def test_a_freed_or_bogus_set_is_an_invalid_argument(h100: list[Any]) -> None:
    created = pynvml.nvmlEventSetCreate()
    pynvml.nvmlEventSetFree(created)
    for bogus in (created, pynvml.c_nvmlEventSet_t()):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlEventSetWait_v2(bogus, 10)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceRegisterEvents(h100[0], XID, bogus)
    again = pynvml.nvmlEventSetCreate()  # a new set never takes a freed one's handle
    assert _pointer(again) != _pointer(created)
    pynvml.nvmlEventSetFree(again)


def test_the_queue_keeps_the_newest_events(event_set: Any, h100: list[Any], state_file: Path) -> None:
    pynvml.nvmlDeviceRegisterEvents(h100[0], XID, event_set)
    for xid in range(events.KEPT + 10):
        sim.raise_xid(state_file=state_file, gpu_uuid=_uuid(h100[0]), xid=xid)
    assert pynvml.nvmlEventSetWait_v2(event_set, 1000).eventData == 10  # the 10 oldest were dropped


def test_a_lost_gpu_answers_gpu_is_lost_to_event_calls(
    event_set: Any, h100: list[Any], state_file: Path
) -> None:
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=_uuid(h100[5]), lost=True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceRegisterEvents(h100[5], XID, event_set)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetTotalEccErrors(h100[5], 1, 0)


def test_the_hooks_refuse_what_is_not_there(h100: list[Any], state_file: Path) -> None:
    with pytest.raises(hardware.Refused, match="no GPU with UUID"):
        sim.raise_xid(state_file=state_file, gpu_uuid="GPU-nope", xid=79)
    with pytest.raises(hardware.Refused, match="not within"):
        sim.raise_xid(state_file=state_file, gpu_uuid=_uuid(h100[0]), xid=-1)
    with pytest.raises(hardware.Refused, match="needs its GPU instance"):
        sim.raise_xid(state_file=state_file, gpu_uuid=_uuid(h100[0]), xid=79, compute_instance_id=0)


def test_faults_are_raised_from_a_shell(event_set: Any, h100: list[Any], state_file: Path) -> None:
    gpu = _uuid(h100[1])
    pynvml.nvmlDeviceRegisterEvents(h100[1], XID | DBE, event_set)

    def hook(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "gpudra.sim", "--state", str(state_file), *args]
        return subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)

    assert hook("xid", gpu, "79").returncode == 0
    assert hook("double-bit-ecc", gpu).returncode == 0
    assert [pynvml.nvmlEventSetWait_v2(event_set, 1000).eventData for _ in range(3)] == [79, 0, 48]
    assert hook("lost", gpu, "on").returncode == 0
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByUUID(gpu)
    assert hook("lost", gpu, "off").returncode == 0
    refused = hook("xid", "GPU-nope", "79")
    assert (refused.returncode, refused.stderr.strip()) == (
        1,
        "refused: Not Found: no GPU with UUID GPU-nope",
    )
    assert hook("--state", "/nonexistent", "xid", gpu, "1").returncode == 2


def test_memory_repairs_and_nvlinks_are_read_as_nvml_reports_them(h100: list[Any], state_file: Path) -> None:
    gpu = _uuid(h100[2])
    assert pynvml.nvmlDeviceGetRemappedRows(h100[2]) == (0, 0, 0, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # Hopper remaps rows instead
        pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h100[2])
    sim.set_memory_condition(state_file=state_file, gpu_uuid=gpu, condition="row-remap-pending", on=True)
    sim.set_memory_condition(state_file=state_file, gpu_uuid=gpu, condition="row-remap-failed", on=True)
    sim.set_nvlink_down(state_file=state_file, gpu_uuid=gpu, link=5, down=True)
    assert pynvml.nvmlDeviceGetRemappedRows(h100[2]) == (0, 0, 1, 1)
    assert pynvml.nvmlDeviceGetNvLinkState(h100[2], 5) == 0
    assert pynvml.nvmlDeviceGetNvLinkState(h100[2], 4) == 1
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=gpu, lost=True)
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=gpu, lost=False)  # the reset applies what was pending
    assert pynvml.nvmlDeviceGetRemappedRows(h100[2]) == (0, 0, 0, 1)  # a failure is kept
    assert pynvml.nvmlDeviceGetNvLinkState(h100[2], 5) == 1
    with pytest.raises(hardware.Refused, match=r"link 18: the GPU has links 0\.\.17"):
        sim.set_nvlink_down(state_file=state_file, gpu_uuid=gpu, link=18, down=True)
    with pytest.raises(hardware.Refused, match="condition 'hot'"):
        sim.set_memory_condition(state_file=state_file, gpu_uuid=gpu, condition="hot", on=True)


def test_remapped_rows_are_not_reported_while_mig_instances_exist(tmp_path: Path) -> None:
    with gpu_driver.connect("sim:dgx-h100", state_file=tmp_path / "machine.json") as session:
        gpu = session.inventory().gpus[0].uuid
        session.set_mig_mode(gpu_uuid=gpu, enabled=True)
        assert session.gpu_conditions(gpu_uuid=gpu).row_remap_pending is False  # no instance yet
        session.create_mig_device(
            gpu_uuid=gpu, profile_id=pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, placement_start=0
        )
        conditions = session.gpu_conditions(gpu_uuid=gpu)
        assert (conditions.row_remap_pending, conditions.row_remap_failed) == (None, None)
        assert conditions.nvlinks_up == frozenset(range(18))


def test_memory_and_nvlink_faults_are_raised_from_a_shell(h100: list[Any], state_file: Path) -> None:
    gpu = _uuid(h100[3])
    command = [sys.executable, "-m", "gpudra.sim", "--state", str(state_file)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *args], capture_output=True, text=True, check=False, timeout=60)

    assert run("memory", gpu, "row-remap-pending", "on").returncode == 0
    assert run("nvlink", gpu, "7", "down").returncode == 0
    assert pynvml.nvmlDeviceGetRemappedRows(h100[3])[2] == 1
    assert pynvml.nvmlDeviceGetNvLinkState(h100[3], 7) == 0
    refused = run("nvlink", gpu, "40", "down")
    assert (refused.returncode, refused.stderr.strip()) == (
        1,
        "refused: Invalid Argument: link 40: the GPU has links 0..17",
    )
