"""GpuSharing and GpuTools: what a claim's sharing config does to a simulated GPU, and tool failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpudra import sim
from gpudra.api import API_VERSION, GpuConfig, decode_config
from gpudra.errors import ConfigError, HardwareError, NvmlUnavailable
from gpudra.gpu import nvml
from gpudra.gpu.tools import GpuTools
from gpudra.model.inventory import Gpu
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import Allocated
from gpudra.node.sharing import GpuSharing
from gpudra.sim import state as sim_state
from tests.unit.claims import mps, time_slicing

CONFIG_FIELD = "status.allocation.devices.config[2].opaque.parameters"


@pytest.fixture
def machine(tmp_path: Path) -> tuple[list[Gpu], GpuTools, sim_state.StateFile]:
    state_file = tmp_path / "machine.json"
    with nvml.connect("sim:dgx-h100", state_file=state_file) as session:
        gpus = list(session.inventory().gpus)
    tools = GpuTools.with_directory_first(sim.write_tools(tmp_path / "bin", state_file=state_file))
    return gpus, tools, sim_state.StateFile(state_file)


def allocated(gpu: Gpu, parameters: dict[str, Any] | None, *, admin_access: bool = False) -> Allocated:
    config = GpuConfig() if parameters is None else decode_config(parameters)
    assert isinstance(config, GpuConfig)
    return Allocated(
        request="gpu",
        device=f"gpu-{gpu.minor}",
        kind="gpu",
        gpu=gpu,
        config=config,
        config_entry=None if parameters is None else 2,
        admin_access=admin_access,
    )


def record(interval: ckpt.TimeSliceInterval) -> ckpt.TimeSlicingRecord:
    return ckpt.TimeSlicingRecord(strategy="TimeSlicing", interval=interval)


def timeslices(store: sim_state.StateFile) -> list[int]:
    return [gpu.timeslice for gpu in store.read().gpus]


PLAIN = {"apiVersion": API_VERSION, "kind": "GpuConfig"}
PLANS: dict[str, tuple[dict[str, Any] | None, bool, ckpt.SharingRecord | None]] = {
    "no config: Default": (None, False, record("Default")),
    "no sharing: Default": (PLAIN, False, record("Default")),
    "TimeSlicing without settings: Default": (
        {**PLAIN, "sharing": {"strategy": "TimeSlicing"}}, False, record("Default")
    ),
    "Short": (time_slicing("Short"), False, record("Short")),
    "Long": (time_slicing("Long"), False, record("Long")),
    "admin access: nothing": (time_slicing("Long"), True, None),
    "admin access with MPS: nothing": (mps(), True, None),
}  # fmt: skip


@pytest.mark.parametrize(("parameters", "admin", "expected"), PLANS.values(), ids=PLANS)
def test_plan(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile],
    parameters: dict[str, Any] | None,
    admin: bool,
    expected: ckpt.SharingRecord | None,
) -> None:
    gpus, tools, _ = machine
    assert GpuSharing(tools).plan(allocated(gpus[0], parameters, admin_access=admin)) == expected


def test_plan_touches_no_gpu(machine: tuple[list[Gpu], GpuTools, sim_state.StateFile]) -> None:
    gpus, _, store = machine
    unusable = GpuTools(search_path="")  # any tool run would fail
    assert GpuSharing(unusable).plan(allocated(gpus[0], time_slicing("Long"))) == record("Long")
    assert timeslices(store) == [0] * 8


def test_mps_is_refused_naming_the_strategy_field(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile],
) -> None:
    gpus, tools, _ = machine
    with pytest.raises(ConfigError) as raised:
        GpuSharing(tools).plan(allocated(gpus[0], mps()))
    assert raised.value.field == f"{CONFIG_FIELD}.sharing.strategy"
    assert str(raised.value) == (
        f"{CONFIG_FIELD}.sharing.strategy: MPS is not supported by this gpudra version; allowed: TimeSlicing"
    )


@pytest.mark.parametrize(
    ("interval", "level"), [("Default", 0), ("Short", 1), ("Medium", 2), ("Long", 3)], ids=str
)
def test_apply_sets_the_interval_on_those_gpus_and_undo_resets_it(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile], interval: ckpt.TimeSliceInterval, level: int
) -> None:
    gpus, tools, store = machine
    sharing = GpuSharing(tools)
    targets = (gpus[1].uuid, gpus[6].uuid)
    sharing.apply(record(interval), gpu_uuids=targets)
    assert timeslices(store) == [0, level, 0, 0, 0, 0, level, 0]
    sharing.apply(record(interval), gpu_uuids=targets)  # again: same result
    assert timeslices(store) == [0, level, 0, 0, 0, 0, level, 0]
    sharing.undo(record(interval), gpu_uuids=targets)
    assert timeslices(store) == [0] * 8
    sharing.undo(record(interval), gpu_uuids=targets)
    assert timeslices(store) == [0] * 8


def test_set_timeslice_runs_the_documented_command_line(tmp_path: Path) -> None:
    seen = tmp_path / "args"
    script = tmp_path / "nvidia-smi"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}\n')
    script.chmod(0o755)
    GpuTools(search_path=str(tmp_path)).set_timeslice(gpu_uuid="GPU-1234", level=3)
    assert seen.read_text().split() == ["compute-policy", "-i", "GPU-1234", "--set-timeslice", "3"]


def test_a_missing_tool_is_nvml_unavailable(tmp_path: Path) -> None:
    with pytest.raises(NvmlUnavailable, match=f"nvidia-smi not found on PATH \\({tmp_path}\\)"):
        GpuTools(search_path=str(tmp_path)).set_timeslice(gpu_uuid="GPU-1234", level=0)


def test_a_failing_tool_is_a_hardware_error_with_its_output(
    machine: tuple[list[Gpu], GpuTools, sim_state.StateFile],
) -> None:
    _, tools, _ = machine
    with pytest.raises(HardwareError) as raised:
        tools.set_timeslice(gpu_uuid="GPU-00000000-0000-0000-0000-000000000000", level=3)
    assert str(raised.value) == (
        "nvidia-smi compute-policy -i GPU-00000000-0000-0000-0000-000000000000 --set-timeslice 3 "
        "failed (6): No devices were found"
    )


def test_a_hanging_tool_times_out(tmp_path: Path) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    with pytest.raises(HardwareError, match="did not finish in 1s"):
        GpuTools(search_path=str(tmp_path), timeout=1).set_timeslice(gpu_uuid="GPU-1234", level=0)
