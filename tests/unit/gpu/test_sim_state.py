"""The simulated machine's state file: boot state, atomic locked updates, several processes on one card."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from gpudra import errors, sim
from gpudra.sim import hardware, machines, state

BOOT_MIG_MODES = {
    "dgx-a100": [1] * 8,
    "dgx-h100": [1] * 8,
    "mixed": [0] * 6,
    "vm-h100": [0],
    "vm-h200": [0],
    "no-sharing": [0],
}


def test_every_profile_has_a_boot_expectation() -> None:
    assert set(BOOT_MIG_MODES) == set(machines.MACHINES)


@pytest.mark.parametrize(("profile", "mig_modes"), BOOT_MIG_MODES.items(), ids=BOOT_MIG_MODES.keys())
def test_boot_state(tmp_path: Path, profile: str, mig_modes: list[int]) -> None:
    store = state.StateFile(tmp_path / "machine.json")
    store.create(machines.MACHINES[profile])
    booted = store.read()
    assert booted.machine == profile
    assert [g.mig_mode for g in booted.gpus] == mig_modes
    assert all(g.mig_mode_pending is None for g in booted.gpus)
    assert all((g.compute_mode, g.timeslice, g.gpu_instances) == (0, 0, []) for g in booted.gpus)
    assert (booted.processes, booted.mps_daemons) == ([], [])


def test_create_keeps_an_existing_state(tmp_path: Path) -> None:
    store = state.StateFile(tmp_path / "machine.json")
    store.create(machines.MIXED)
    with store.update() as machine_state:
        machine_state.gpus[0].compute_mode = 3
    store.create(machines.MIXED)
    assert store.read().gpus[0].compute_mode == 3


def test_a_read_of_an_unchanged_file_is_the_same_state_and_every_change_is_seen(tmp_path: Path) -> None:
    """read() answers from its last parse while the file is the one it parsed (one stat), and sees
    every change: another StateFile's update (a new file by rename), and a rewrite in place."""
    store, other = state.StateFile(tmp_path / "machine.json"), state.StateFile(tmp_path / "machine.json")
    store.create(machines.MIXED)
    first = store.read()
    assert store.read() is first
    for mode in (1, 2, 3):
        with other.update() as machine_state:
            machine_state.gpus[0].compute_mode = mode
        assert store.read().gpus[0].compute_mode == mode
    changed = store.path.read_text().replace('"compute_mode": 3', '"compute_mode": 0', 1)
    store.path.write_text(changed)  # same inode, new bytes
    assert store.read().gpus[0].compute_mode == 0
    os.utime(store.path)  # touched, same bytes: read again, the parse kept
    kept = store.read()
    assert store.read() is kept


def test_a_failed_update_writes_nothing(tmp_path: Path) -> None:
    store = state.StateFile(tmp_path / "machine.json")
    store.create(machines.MIXED)
    before = store.path.read_bytes()
    with pytest.raises(hardware.Refused), store.update() as machine_state:
        machine_state.gpus[0].compute_mode = 3
        raise hardware.Refused(hardware.IN_USE, "busy")
    assert store.path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["machine.json", "machine.json.lock"]


def test_unknown_fields_in_the_state_file_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "machine.json"
    path.write_text('{"machine": "mixed", "gpus": [], "extra": 1}')
    with pytest.raises(ValueError, match="extra"):
        state.StateFile(path).read()


@pytest.mark.parametrize(
    ("hook", "kwargs", "code"),
    [
        (sim.attach_process, {"device_uuid": "MIG-nope", "pid": 1}, hardware.NOT_FOUND),
        (sim.set_utilization, {"gpu_uuid": "GPU-nope", "percent": 5}, hardware.NOT_FOUND),
        (sim.set_utilization, {"gpu_uuid": "GPU-nope", "percent": 101}, hardware.INVALID_ARGUMENT),
        (sim.set_mig_mode, {"gpu_uuid": machines.MIXED.gpu_uuid(0), "enabled": True}, hardware.NOT_SUPPORTED),
        (sim.set_gpu_lost, {"gpu_uuid": "GPU-nope", "lost": True}, hardware.NOT_FOUND),
    ],
    ids=[
        "process on unknown device",
        "unknown gpu",
        "over 100 percent",
        "mig mode without mig",
        "lose unknown gpu",
    ],
)
def test_hooks_refuse_what_cannot_be(
    tmp_path: Path, hook: Callable[..., None], kwargs: dict[str, object], code: int
) -> None:
    path = tmp_path / "machine.json"
    state.StateFile(path).create(machines.MIXED)
    before = path.read_bytes()
    with pytest.raises(hardware.Refused) as refused:
        hook(state_file=path, **kwargs)
    assert refused.value.code == code
    assert path.read_bytes() == before


def test_the_mig_mode_hook_is_a_reset_that_applies_any_architecture(tmp_path: Path) -> None:
    path = tmp_path / "machine.json"
    store = state.StateFile(path)
    store.create(machines.DGX_A100)
    with store.update() as machine_state:
        status = hardware.set_mig_mode(
            model=machines.A100_SXM4_40GB,
            virtualization=machines.VIRTUALIZATION_NONE,
            machine_state=machine_state,
            index=2,
            mode=0,
        )
    assert status == hardware.RESET_REQUIRED
    assert (store.read().gpus[2].mig_mode, store.read().gpus[2].mig_mode_pending) == (1, 0)
    sim.set_mig_mode(state_file=path, gpu_uuid=machines.DGX_A100.gpu_uuid(2), enabled=False)
    assert (store.read().gpus[2].mig_mode, store.read().gpus[2].mig_mode_pending) == (0, None)


def test_a_state_file_without_a_pending_mode_still_loads(tmp_path: Path) -> None:
    """State files written before the pending mode existed keep working."""
    path = tmp_path / "machine.json"
    path.write_text('{"machine": "mixed", "gpus": [{"uuid": "GPU-1", "mig_mode": 0}]}')
    assert state.StateFile(path).read().gpus[0].mig_mode_pending is None


def test_a_state_file_for_another_machine_is_a_config_error(tmp_path: Path) -> None:
    store = state.StateFile(tmp_path / "machine.json")
    store.create(machines.DGX_A100)
    with pytest.raises(errors.ConfigError) as clash:
        store.create(machines.DGX_H100)
    assert clash.value.field == "GPUDRA_SIM_STATE"


_CREATOR = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from gpudra import errors
    from gpudra.node import gpu_driver
    made = []
    with gpu_driver.connect("sim:dgx-h100", state_file=Path(sys.argv[1])) as session:
        uuid = session.inventory().gpus[0].uuid
        for start in [int(s) for s in sys.argv[2].split(",")]:
            try:
                device = session.create_mig_device(gpu_uuid=uuid, profile_id=19, placement_start=start)
            except errors.InsufficientResources:
                continue
            made.append(device.uuid)
    print(" ".join(made))
    """
)


def test_processes_racing_for_one_gpu_never_share_a_slice(tmp_path: Path) -> None:
    path = tmp_path / "machine.json"
    orders = ["0,1,2,3,4,5,6", "6,5,4,3,2,1,0"]
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _CREATOR, str(path), order], stdout=subprocess.PIPE, text=True
        )
        for order in orders
    ]
    outputs = [racer.communicate(timeout=120)[0].split() for racer in racers]
    assert all(racer.returncode == 0 for racer in racers)
    made = [uuid for output in outputs for uuid in output]
    assert len(made) == len(set(made)) == 7
    [gpu, *_] = state.StateFile(path).read().gpus
    assert sorted(gi.start for gi in gpu.gpu_instances) == [0, 1, 2, 3, 4, 5, 6]
