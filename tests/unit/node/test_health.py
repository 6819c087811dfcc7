"""Device health: the NVML probe, the monitor on a simulated machine, and the kubelet's health stream."""

from __future__ import annotations

import itertools
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pynvml
import pytest

from gpudra import errors, sim
from gpudra._proto import (
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from gpudra.gpu import nvml
from gpudra.model import devices
from gpudra.model.gpu_health import GpuConditions
from gpudra.model.inventory import MigDevice
from gpudra.model.publishing import MigMode
from gpudra.node import gpu_driver
from gpudra.node.allocation import ClaimRef
from gpudra.node.health.monitor import (
    DeviceHealth,
    GpuHealth,
    Health,
    HealthMonitor,
    Snapshot,
    device_gpus,
    devices_health,
    gpu_health,
    kubelet_timeout_seconds,
    tainted_gpus,
)
from gpudra.node.kubelet_grpc import KubeletServer
from tests.unit import inventories

PROFILE = "dgx-h100"
POOL = "node-a"
DRIVER = "gpu.gpudra.io"
INTERVAL = 0.05
pb = dra_health_v1alpha1_pb2


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "sim" / "machine.json"


@pytest.fixture
def model(state_file: Path) -> devices.DeviceModel:
    with gpu_driver.connect(f"sim:{PROFILE}", state_file=state_file) as session:
        return devices.build_devices(session.inventory(), mig_mode="partitionable")


@pytest.fixture
def gpu_uuids(model: devices.DeviceModel) -> dict[str, str]:
    """Whole-GPU device name -> GPU UUID."""
    return {
        d["name"]: str(d["attributes"]["uuid"]["string"]) for d in model.devices if "uuid" in d["attributes"]
    }


def _monitor(state_file: Path, model: devices.DeviceModel, interval: float = INTERVAL) -> HealthMonitor:
    return HealthMonitor(
        pool=POOL,
        devices=model.devices,
        open_nvml=lambda: gpu_driver.connect(f"sim:{PROFILE}", state_file=state_file),
        interval=interval,
    )


@pytest.fixture
def monitor(state_file: Path, model: devices.DeviceModel) -> Iterator[HealthMonitor]:
    running = _monitor(state_file, model)
    running.start()
    yield running
    running.stop()


def _next(monitor: HealthMonitor, after: int) -> Snapshot:
    snapshot = monitor.wait(after=after, timeout=10)
    assert snapshot is not None, "no snapshot within 10 s"
    return snapshot


def _until(monitor: HealthMonitor, done: Callable[[Snapshot], bool]) -> Snapshot:
    snapshot = _next(monitor, 0)
    deadline = time.monotonic() + 10
    while not done(snapshot):
        assert time.monotonic() < deadline, f"health never reached the expected state: {snapshot}"
        snapshot = _next(monitor, snapshot.generation)
    return snapshot


def _of(snapshot: Snapshot) -> dict[str, Health]:
    return {d.device: d.health for d in snapshot.devices}


def _on_gpu(device: str, gpu: str) -> bool:
    return device in (gpu, f"{gpu}-shared") or device.startswith(f"{gpu}-mig-")


# --- the probe ------------------------------------------------------------------------------------


def test_probe_of_a_healthy_and_a_lost_gpu(state_file: Path, gpu_uuids: dict[str, str]) -> None:
    lost, fine = gpu_uuids["gpu-0"], gpu_uuids["gpu-1"]
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=lost, lost=True)
    with gpu_driver.connect(f"sim:{PROFILE}", state_file=state_file) as session:
        assert session.gpu_health(gpu_uuid=fine) == (True, "")
        assert session.gpu_health(gpu_uuid=lost) == (False, "NVMLError_GpuIsLost")
        sim.set_gpu_lost(state_file=state_file, gpu_uuid=lost, lost=False)
        assert session.gpu_health(gpu_uuid=lost) == (True, "")


@pytest.mark.parametrize(
    ("code", "answer"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, (False, "NVMLError_GpuIsLost")),
        (pynvml.NVML_ERROR_RESET_REQUIRED, (False, "NVMLError_ResetRequired")),
        (pynvml.NVML_ERROR_UNKNOWN, (False, "NVMLError_Unknown")),
        (pynvml.NVML_ERROR_GPU_NOT_FOUND, (False, "NVMLError_GpuNotFound")),
        (pynvml.NVML_ERROR_NOT_FOUND, (False, "NVMLError_NotFound")),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, (True, "")),
        (pynvml.NVML_ERROR_NO_PERMISSION, errors.HardwareError),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, errors.NvmlUnavailable),
    ],
    ids=[
        "lost",
        "reset required",
        "unknown",
        "gpu not found",
        "not found",
        "not supported",
        "no permission",
        "no driver",
    ],
)
def test_probe_error_classes(
    state_file: Path,
    gpu_uuids: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    code: int,
    answer: tuple[bool, str] | type[errors.HardwareError],
) -> None:
    def nvmlDeviceGetMemoryInfo(handle: Any) -> Any:
        raise pynvml.NVMLError(code)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", nvmlDeviceGetMemoryInfo)
    with gpu_driver.connect(f"sim:{PROFILE}", state_file=state_file) as session:
        if isinstance(answer, tuple):
            assert session.gpu_health(gpu_uuid=gpu_uuids["gpu-3"]) == answer
        else:
            with pytest.raises(answer) as raised:
                session.gpu_health(gpu_uuid=gpu_uuids["gpu-3"])
            assert raised.value.nvml_error == type(pynvml.NVMLError(code)).__name__
            assert gpu_uuids["gpu-3"] in str(raised.value)


# --- pure helpers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mig_mode", ["partitionable", "static"])
def test_every_device_maps_to_its_gpu(mig_mode: MigMode) -> None:
    inventory = inventories.node(
        inventories.h100(0),
        inventories.h100(1, mig_enabled=True, layout=[("1g.10gb", 0), ("3g.40gb", 4)]),
        inventories.plain(2, "l4"),
    )
    model = devices.build_devices(inventory, mig_mode=mig_mode)
    by_minor = {f"gpu-{gpu.minor}": gpu.uuid for gpu in inventory.gpus}
    mapping = device_gpus(model.devices)
    assert list(mapping) == [d["name"] for d in model.devices]
    assert any("-mig-" in name for name in mapping)
    for name, uuid in mapping.items():
        assert uuid == by_minor["-".join(name.split("-")[:2])], name


@pytest.mark.parametrize(
    ("healthy", "reason", "expected"),
    [
        (True, "", GpuHealth(Health.HEALTHY, "")),
        (
            False,
            "NVMLError_GpuIsLost",
            GpuHealth(Health.UNHEALTHY, "GPU GPU-1: NVMLError_GpuIsLost", "NVMLError_GpuIsLost"),
        ),
    ],
    ids=["healthy", "lost"],
)
def test_gpu_health_message_names_the_gpu(healthy: bool, reason: str, expected: GpuHealth) -> None:
    assert gpu_health(gpu_uuid="GPU-1", healthy=healthy, reason=reason) == expected


def test_devices_take_their_gpus_health_in_device_order() -> None:
    lost = GpuHealth(Health.UNHEALTHY, "GPU GPU-1: NVMLError_GpuIsLost")
    fine = GpuHealth(Health.HEALTHY, "")
    mapping = {"gpu-1": "GPU-1", "gpu-0": "GPU-0", "gpu-1-mig-1g10gb-0": "GPU-1"}
    assert devices_health(pool=POOL, device_gpus=mapping, gpus={"GPU-0": fine, "GPU-1": lost}) == (
        DeviceHealth(POOL, "gpu-1", Health.UNHEALTHY, lost.message),
        DeviceHealth(POOL, "gpu-0", Health.HEALTHY, ""),
        DeviceHealth(POOL, "gpu-1-mig-1g10gb-0", Health.UNHEALTHY, lost.message),
    )


_FINE = GpuHealth(Health.HEALTHY, "")
_LOST = GpuHealth(Health.UNHEALTHY, "GPU G: NVMLError_GpuIsLost", "NVMLError_GpuIsLost")
_RESET = GpuHealth(Health.UNHEALTHY, "GPU G: NVMLError_ResetRequired", "NVMLError_ResetRequired")
_UNKNOWN = GpuHealth(Health.UNKNOWN, "GPU G could not be probed: Timeout")


@pytest.mark.parametrize(
    ("before", "now", "tainted"),
    [
        ({}, _FINE, {}),
        ({}, _LOST, {"G": "NVMLError_GpuIsLost"}),
        ({"G": "NVMLError_GpuIsLost"}, _FINE, {}),
        ({"G": "NVMLError_GpuIsLost"}, _RESET, {"G": "NVMLError_ResetRequired"}),
        ({}, _UNKNOWN, {}),
        ({"G": "NVMLError_GpuIsLost"}, _UNKNOWN, {"G": "NVMLError_GpuIsLost"}),
    ],
    ids=["healthy", "lost", "back", "other-reason", "unknown-untainted", "unknown-keeps-taint"],
)
def test_unhealthy_taints_healthy_lifts_unknown_keeps(
    before: dict[str, str], now: GpuHealth, tainted: dict[str, str]
) -> None:
    assert tainted_gpus(before, {"G": now, "H": _FINE}) == tainted


def test_gpus_no_longer_probed_are_not_tainted() -> None:
    assert tainted_gpus({"gone": "NVMLError_GpuIsLost"}, {"G": _UNKNOWN}) == {}


@pytest.mark.parametrize(
    ("interval", "timeout"),
    [(10, 30), (0.05, 30), (10.1, 31), (60, 180)],
    ids=["default", "short", "fraction", "long"],
)
def test_kubelet_timeout_covers_three_polls_and_never_undercuts_the_kubelet(
    interval: float, timeout: int
) -> None:
    assert kubelet_timeout_seconds(interval) == timeout


# --- the monitor ----------------------------------------------------------------------------------


def test_first_snapshot_lists_every_device_healthy(
    monitor: HealthMonitor, model: devices.DeviceModel
) -> None:
    before = time.time()
    first = _next(monitor, 0)
    assert first.generation >= 1
    assert [d.device for d in first.devices] == [d["name"] for d in model.devices]
    assert {(d.pool, d.health, d.message) for d in first.devices} == {(POOL, Health.HEALTHY, "")}
    assert before - 1 <= first.checked_at <= time.time()


def test_every_poll_is_a_new_snapshot_even_without_change(monitor: HealthMonitor) -> None:
    first = _next(monitor, 0)
    second = _next(monitor, first.generation)
    assert second.generation > first.generation
    assert second.checked_at >= first.checked_at
    assert second.devices == first.devices


def test_a_device_whose_mps_clients_lost_their_daemon_is_unhealthy_while_reported(
    state_file: Path, model: devices.DeviceModel
) -> None:
    """gpudra.node.mps_keeper reports the devices of a claim whose daemon was started again under it."""
    reported = {"gpu-3": "the MPS control daemon of ResourceClaim a/b (u) stopped and was started again"}
    monitor = HealthMonitor(
        pool=POOL,
        devices=model.devices,
        open_nvml=lambda: gpu_driver.connect(f"sim:{PROFILE}", state_file=state_file),
        interval=INTERVAL,
        interrupted=lambda: dict(reported),
    )
    monitor.start()
    try:
        unhealthy = _until(monitor, lambda s: _of(s)["gpu-3"] == Health.UNHEALTHY)
        assert [d.message for d in unhealthy.devices if d.device == "gpu-3"] == [reported["gpu-3"]]
        assert {d.device for d in unhealthy.devices if d.health != Health.HEALTHY} == {"gpu-3"}
        assert monitor.taints() == {}  # the GPU itself is fine: nothing to keep the scheduler away from
        reported.clear()  # the claim was unprepared
        _until(monitor, lambda s: _of(s)["gpu-3"] == Health.HEALTHY)
    finally:
        monitor.stop()


def test_wait_gives_up_after_its_timeout(state_file: Path, model: devices.DeviceModel) -> None:
    idle = _monitor(state_file, model)  # never started: no snapshot ever comes
    started = time.monotonic()
    assert idle.wait(after=0, timeout=0.2) is None
    # Not before its timeout; the upper bound only tells "gave up" from "waited on", 50 times over.
    assert 0.15 < time.monotonic() - started < 10


def test_subscribers_see_a_gpu_lost_and_back(
    monitor: HealthMonitor, state_file: Path, gpu_uuids: dict[str, str]
) -> None:
    seen: list[list[dict[str, Health]]] = [[], []]

    def subscribe(log: list[dict[str, Health]]) -> None:
        generation, deadline = 0, time.monotonic() + 20
        while time.monotonic() < deadline:
            snapshot = monitor.wait(after=generation, timeout=1)
            if snapshot is None:
                continue
            generation = snapshot.generation
            log.append(_of(snapshot))
            if len(log) > 1 and log[-1]["gpu-0"] == Health.HEALTHY and Health.UNHEALTHY in log[-2].values():
                return

    subscribers = [threading.Thread(target=subscribe, args=(log,)) for log in seen]
    for thread in subscribers:
        thread.start()
    _next(monitor, 0)
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=gpu_uuids["gpu-0"], lost=True)
    lost = _until(monitor, lambda s: _of(s)["gpu-0"] == Health.UNHEALTHY)
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=gpu_uuids["gpu-0"], lost=False)
    _until(monitor, lambda s: _of(s)["gpu-0"] == Health.HEALTHY)
    for thread in subscribers:
        thread.join(20)

    for device in lost.devices:
        if _on_gpu(device.device, "gpu-0"):
            assert (device.health, device.message) == (
                Health.UNHEALTHY,
                f"GPU {gpu_uuids['gpu-0']}: NVMLError_GpuIsLost",
            )
        else:
            assert (device.health, device.message) == (Health.HEALTHY, ""), device
    assert any(_on_gpu(d.device, "gpu-0") and "-mig-" in d.device for d in lost.devices)
    for log in seen:
        states = [entry["gpu-0"] for entry in log]
        assert states[0] == Health.HEALTHY and states[-1] == Health.HEALTHY
        assert Health.UNHEALTHY in states


def test_on_change_fires_once_per_change_of_the_unhealthy_gpus(
    state_file: Path, model: devices.DeviceModel, gpu_uuids: dict[str, str]
) -> None:
    seen: list[dict[str, str]] = []
    watched = HealthMonitor(
        pool=POOL,
        devices=model.devices,
        open_nvml=lambda: gpu_driver.connect(f"sim:{PROFILE}", state_file=state_file),
        interval=INTERVAL,
        on_change=lambda: seen.append(watched.unhealthy_gpus()),
    )
    first, second = gpu_uuids["gpu-0"], gpu_uuids["gpu-3"]
    lost = "NVMLError_GpuIsLost"
    watched.start()
    try:
        healthy = _next(watched, 0)
        assert watched.unhealthy_gpus() == {}
        sim.set_gpu_lost(state_file=state_file, gpu_uuid=first, lost=True)
        one = _until(watched, lambda s: _of(s)["gpu-0"] == Health.UNHEALTHY)
        assert watched.unhealthy_gpus() == {first: lost}
        sim.set_gpu_lost(state_file=state_file, gpu_uuid=second, lost=True)
        both = _until(watched, lambda s: _of(s)["gpu-3"] == Health.UNHEALTHY)
        _next(watched, _next(watched, both.generation).generation)  # two more polls, nothing new
        sim.set_gpu_lost(state_file=state_file, gpu_uuid=first, lost=False)
        sim.set_gpu_lost(state_file=state_file, gpu_uuid=second, lost=False)
        back = _until(watched, lambda s: Health.UNHEALTHY not in _of(s).values())
        _next(watched, back.generation)
    finally:
        sim.set_gpu_lost(state_file=state_file, gpu_uuid=first, lost=False)
        sim.set_gpu_lost(state_file=state_file, gpu_uuid=second, lost=False)
        watched.stop()
    assert healthy.generation < one.generation
    assert watched.unhealthy_gpus() == {}
    # both may come back in one poll or in two, but no poll without a change calls back
    assert seen[:2] == [{first: lost}, {first: lost, second: lost}]
    assert seen[-1] == {} and 3 <= len(seen) <= 4
    assert all(a != b for a, b in itertools.pairwise(seen))


def test_a_gpu_that_cannot_be_probed_keeps_its_taint_until_a_probe_says_healthy(
    state_file: Path, model: devices.DeviceModel, gpu_uuids: dict[str, str]
) -> None:
    lost = gpu_uuids["gpu-2"]
    broken = threading.Event()
    calls: list[None] = []

    class Probe:
        def __init__(self) -> None:
            self.session = gpu_driver.connect(f"sim:{PROFILE}", state_file=state_file)

        def gpu_health(self, *, gpu_uuid: str) -> tuple[bool, str]:
            if broken.is_set():
                raise errors.HardwareError(
                    "nvmlDeviceGetMemoryInfo failed: Timeout", nvml_error="NVMLError_Timeout"
                )
            return self.session.gpu_health(gpu_uuid=gpu_uuid)

        def mig_devices(self, *, gpu_uuid: str) -> tuple[MigDevice, ...]:
            return self.session.mig_devices(gpu_uuid=gpu_uuid)

        def close(self) -> None:
            self.session.close()

    monitor = HealthMonitor(
        pool=POOL,
        devices=model.devices,
        open_nvml=Probe,
        interval=INTERVAL,
        on_change=lambda: calls.append(None),
    )
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=lost, lost=True)
    monitor.start()
    try:
        _until(monitor, lambda s: _of(s)["gpu-2"] == Health.UNHEALTHY)
        broken.set()
        unknown = _until(monitor, lambda s: set(_of(s).values()) == {Health.UNKNOWN})
        later = _next(monitor, unknown.generation)
        assert monitor.unhealthy_gpus() == {lost: "NVMLError_GpuIsLost"}
        sim.set_gpu_lost(state_file=state_file, gpu_uuid=lost, lost=False)
        _next(monitor, _next(monitor, later.generation).generation)
        assert monitor.unhealthy_gpus() == {lost: "NVMLError_GpuIsLost"}  # still no probe
        broken.clear()
        _until(monitor, lambda s: set(_of(s).values()) == {Health.HEALTHY})
    finally:
        sim.set_gpu_lost(state_file=state_file, gpu_uuid=lost, lost=False)
        monitor.stop()
    assert monitor.unhealthy_gpus() == {}
    assert len(calls) == 2  # tainted, lifted; the unknown polls in between changed nothing


def test_a_change_is_logged_once(
    monitor: HealthMonitor, state_file: Path, gpu_uuids: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpudra.node.health.monitor")
    uuid = gpu_uuids["gpu-0"]
    _next(monitor, 0)
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=uuid, lost=True)
    lost = _until(monitor, lambda s: _of(s)["gpu-0"] == Health.UNHEALTHY)
    _next(monitor, _next(monitor, lost.generation).generation)  # two more polls, still lost
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=uuid, lost=False)
    back = _until(monitor, lambda s: _of(s)["gpu-0"] == Health.HEALTHY)
    _next(monitor, back.generation)
    assert [(r.levelname, r.getMessage(), getattr(r, "gpu", None)) for r in caplog.records] == [
        ("WARNING", "GPU unhealthy", uuid),
        ("INFO", "GPU healthy", uuid),
    ]
    assert caplog.records[0].__dict__["error"] == f"GPU {uuid}: NVMLError_GpuIsLost"


_FAILURES = {
    "gpudra error": errors.NvmlUnavailable("no libnvidia-ml.so.1", nvml_error="NVMLError_LibraryNotFound"),
    "bug": RuntimeError("no libnvidia-ml.so.1"),
}


@pytest.mark.parametrize("failure", _FAILURES.values(), ids=_FAILURES.keys())
def test_nvml_that_cannot_be_opened_is_unknown_and_retried(
    state_file: Path, model: devices.DeviceModel, failure: Exception
) -> None:
    attempts = []

    def open_nvml() -> nvml.Nvml:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise failure
        return gpu_driver.connect(f"sim:{PROFILE}", state_file=state_file)

    monitor = HealthMonitor(pool=POOL, devices=model.devices, open_nvml=open_nvml, interval=INTERVAL)
    monitor.start()
    try:
        first = _next(monitor, 0)
        assert {(d.health, d.message) for d in first.devices} == {
            (Health.UNKNOWN, "NVML unavailable: no libnvidia-ml.so.1")
        }
        later = _until(monitor, lambda s: Health.UNKNOWN not in _of(s).values())
        assert set(_of(later).values()) == {Health.HEALTHY}
    finally:
        monitor.stop()
    assert len(attempts) == 2  # one session once it opened, kept for every later poll


class _FlakyProbe:
    """A real session whose probe of one GPU fails with `failure`."""

    def __init__(self, session: nvml.Nvml, broken: str, failure: Exception) -> None:
        self.session = session
        self.broken = broken
        self.failure = failure

    def gpu_health(self, *, gpu_uuid: str) -> tuple[bool, str]:
        if gpu_uuid == self.broken:
            raise self.failure
        return self.session.gpu_health(gpu_uuid=gpu_uuid)

    def mig_devices(self, *, gpu_uuid: str) -> tuple[MigDevice, ...]:
        return self.session.mig_devices(gpu_uuid=gpu_uuid)

    def uncorrected_ecc_errors(self, *, gpu_uuid: str) -> int | None:
        return self.session.uncorrected_ecc_errors(gpu_uuid=gpu_uuid)

    def gpu_conditions(self, *, gpu_uuid: str) -> GpuConditions:
        return self.session.gpu_conditions(gpu_uuid=gpu_uuid)

    def close(self) -> None:
        self.session.close()


_PROBE_FAILURES = {
    "gpudra error": errors.HardwareError(
        "nvmlDeviceGetMemoryInfo failed: Timeout", nvml_error="NVMLError_Timeout"
    ),
    "bug": KeyError("nvmlDeviceGetMemoryInfo failed: Timeout"),
}


@pytest.mark.parametrize("failure", _PROBE_FAILURES.values(), ids=_PROBE_FAILURES.keys())
def test_a_gpu_that_cannot_be_probed_is_unknown_and_the_others_are_not(
    state_file: Path,
    model: devices.DeviceModel,
    gpu_uuids: dict[str, str],
    failure: Exception,
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = gpu_uuids["gpu-2"]
    monitor = HealthMonitor(
        pool=POOL,
        devices=model.devices,
        open_nvml=lambda: _FlakyProbe(
            gpu_driver.connect(f"sim:{PROFILE}", state_file=state_file), broken, failure
        ),
        interval=INTERVAL,
    )
    monitor.start()
    try:
        first = _next(monitor, 0)
    finally:
        monitor.stop()
    for device in first.devices:
        if _on_gpu(device.device, "gpu-2"):
            assert (device.health, device.message) == (
                Health.UNKNOWN,
                f"GPU {broken} could not be probed: {failure}",
            )
        else:
            assert device.health == Health.HEALTHY
    probe_failures = [r for r in caplog.records if r.getMessage().startswith("GPU health probe failed")]
    assert probe_failures and all(getattr(r, "gpu", None) == broken for r in probe_failures)
    # a bug gets its traceback, a hardware answer does not
    assert all((r.exc_info is not None) == isinstance(failure, KeyError) for r in probe_failures)


def test_stop_ends_the_thread_and_closes_its_nvml_session(monitor: HealthMonitor) -> None:
    _next(monitor, 0)
    assert sim.installed(pynvml)
    monitor.stop()
    assert not sim.installed(pynvml)
    last = _next(monitor, 0).generation
    assert monitor.wait(after=last, timeout=INTERVAL * 4) is None


# --- the kubelet's health stream ------------------------------------------------------------------


class _NoClaims:
    def prepared(self, ref: ClaimRef) -> tuple[Any, ...] | None:
        raise AssertionError("not called")

    def prepare_from_claim(self, ref: ClaimRef) -> tuple[Any, ...]:
        raise AssertionError("not called")

    def unprepare(self, ref: ClaimRef) -> None:
        raise AssertionError("not called")


@pytest.fixture
def sockets() -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer
    root = Path(tempfile.mkdtemp(prefix="gd-", dir="/tmp"))
    yield root
    shutil.rmtree(root)


def _server(sockets: Path, health: HealthMonitor | None) -> KubeletServer:
    return KubeletServer(
        driver=DRIVER,
        backend=_NoClaims(),
        registry_dir=sockets / "registry",
        plugin_dir=sockets / "plugin",
        health=health,
    )


@pytest.fixture
def server(sockets: Path, monitor: HealthMonitor) -> Iterator[KubeletServer]:
    running = _server(sockets, monitor)
    running.start()
    yield running
    running.stop(timeout=1)


def _watch(server: KubeletServer, timeout: float = 30) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(f"unix://{server.dra_socket}")
    stub = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel)
    return channel, stub.NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=timeout)


def _health(message: Any) -> dict[str, tuple[int, str]]:
    return {d.device.device_name: (d.health, d.message) for d in message.devices}


def _advertised(server: KubeletServer) -> list[str]:
    with grpc.insecure_channel(f"unix://{server.registration_socket}") as channel:
        info = pluginregistration_v1_pb2_grpc.RegistrationStub(channel).GetInfo(
            pluginregistration_v1_pb2.InfoRequest(), timeout=10
        )
    return list(info.supported_versions)


def test_health_service_is_advertised_after_the_dra_versions(server: KubeletServer) -> None:
    assert _advertised(server) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]


def test_without_a_monitor_there_is_no_health_service(sockets: Path) -> None:
    plain = _server(sockets, None)
    plain.start()
    try:
        assert _advertised(plain) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        channel, stream = _watch(plain)
        with pytest.raises(grpc.RpcError) as refused:
            next(stream)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        channel.close()
    finally:
        plain.stop(timeout=1)


def test_first_message_lists_every_device_healthy(server: KubeletServer, model: devices.DeviceModel) -> None:
    before = int(time.time())
    channel, stream = _watch(server)
    first = next(stream)
    channel.close()
    assert [(d.device.pool_name, d.device.device_name) for d in first.devices] == [
        (POOL, d["name"]) for d in model.devices
    ]
    assert {(d.health, d.message, d.health_check_timeout_seconds) for d in first.devices} == {
        (pb.HEALTHY, "", 30)
    }
    assert all(before - 1 <= d.last_updated_time <= time.time() for d in first.devices)


def test_a_lost_gpu_is_unhealthy_with_its_partitions_until_it_is_back(
    server: KubeletServer, state_file: Path, gpu_uuids: dict[str, str]
) -> None:
    channel, stream = _watch(server)
    assert set(_health(next(stream)).values()) == {(pb.HEALTHY, "")}
    sim.set_gpu_lost(state_file=state_file, gpu_uuid=gpu_uuids["gpu-0"], lost=True)
    try:
        lost = next(m for m in stream if _health(m)["gpu-0"][0] == pb.UNHEALTHY)
    finally:
        sim.set_gpu_lost(state_file=state_file, gpu_uuid=gpu_uuids["gpu-0"], lost=False)
    back = next(m for m in stream if _health(m)["gpu-0"][0] == pb.HEALTHY)
    channel.close()

    reason = f"GPU {gpu_uuids['gpu-0']}: NVMLError_GpuIsLost"
    unhealthy = {name for name, (health, _) in _health(lost).items() if health == pb.UNHEALTHY}
    assert unhealthy == {name for name in _health(lost) if _on_gpu(name, "gpu-0")}
    assert len(unhealthy) > 1  # the GPU and its MIG partitions
    assert {_health(lost)[name][1] for name in unhealthy} == {reason}
    assert set(_health(back).values()) == {(pb.HEALTHY, "")}


def test_stop_ends_open_streams_at_once(server: KubeletServer) -> None:
    channel, stream = _watch(server)
    next(stream)
    started = time.monotonic()
    server.stop(timeout=60)
    # A stream that held the stop would take the whole 60 s grace: half of it tells the two apart on
    # however loaded a machine.
    assert time.monotonic() - started < 30
    for _ in stream:  # ends cleanly (status OK) after what was already on its way
        pass
    channel.close()


def test_cancelled_streams_give_their_worker_back(
    sockets: Path, state_file: Path, model: devices.DeviceModel
) -> None:
    idle = _monitor(state_file, model, interval=60)  # after the first message a stream only waits
    idle.start()
    server = KubeletServer(
        driver=DRIVER,
        backend=_NoClaims(),
        registry_dir=sockets / "registry",
        plugin_dir=sockets / "plugin",
        health=idle,
        workers=2,
    )
    server.start()
    try:
        for _ in range(4):
            channel, stream = _watch(server)
            next(stream)
            stream.cancel()
            channel.close()
        channel, stream = _watch(server, timeout=5)  # queued for ever if the workers were still held
        assert len(next(stream).devices) == len(model.devices)
        channel.close()
    finally:
        server.stop(timeout=1)
        idle.stop()
