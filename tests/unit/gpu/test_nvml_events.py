"""gpudra.gpu.nvml's health events on a simulated machine: the event watch registers what each GPU
offers and reads XIDs and double-bit ECC errors, with their GPU instance; GPUs without events are left
to polling, a lost one is named; the uncorrected ECC count."""

from __future__ import annotations

from pathlib import Path

from gpudra import sim
from gpudra.node import gpu_driver


def test_the_watch_registers_every_gpu_and_reads_its_events(tmp_path: Path) -> None:
    state_file = tmp_path / "machine.json"
    with gpu_driver.connect("sim:dgx-h100", state_file=state_file) as session:
        gpus = [gpu.uuid for gpu in session.inventory().gpus]
        mig = session.create_mig_device(gpu_uuid=gpus[2], profile_id=9, placement_start=4)
        watch = session.watch_events(gpus)
        try:
            assert watch.xid_events == watch.ecc_events == frozenset(gpus)
            assert watch.failed == {}
            assert watch.wait(0.05) is None
            sim.raise_xid(state_file=state_file, gpu_uuid=gpus[1], xid=79)
            sim.raise_xid(
                state_file=state_file,
                gpu_uuid=gpus[2],
                xid=94,
                gpu_instance_id=mig.gpu_instance_id,
                compute_instance_id=mig.compute_instance_id,
            )
            sim.raise_double_bit_ecc(state_file=state_file, gpu_uuid=gpus[3])
            got = [watch.wait(1) for _ in range(4)]
        finally:
            watch.close()
        assert [(e.gpu_uuid, e.xid, e.gpu_instance_id, e.compute_instance_id) for e in got if e] == [
            (gpus[1], 79, None, None),
            (gpus[2], 94, mig.gpu_instance_id, mig.compute_instance_id),
            (gpus[3], None, None, None),
            (gpus[3], 48, None, None),
        ]
        assert session.uncorrected_ecc_errors(gpu_uuid=gpus[3]) == 1


def test_a_gpu_without_events_is_left_to_polling_and_a_lost_one_is_named(tmp_path: Path) -> None:
    with gpu_driver.connect("sim:no-sharing", state_file=tmp_path / "a.json") as session:
        (gpu,) = [g.uuid for g in session.inventory().gpus]
        watch = session.watch_events([gpu])
        assert (watch.xid_events, watch.ecc_events, watch.failed) == (frozenset(), frozenset(), {})
        watch.close()
        assert session.uncorrected_ecc_errors(gpu_uuid=gpu) == 0
    state_file = tmp_path / "b.json"
    with gpu_driver.connect("sim:mixed", state_file=state_file) as session:
        gpus = [g.uuid for g in session.inventory().gpus]
        sim.set_gpu_lost(state_file=state_file, gpu_uuid=gpus[0], lost=True)
        watch = session.watch_events(gpus)
        assert set(watch.failed) == {gpus[0]} and "GPU is lost" in watch.failed[gpus[0]]
        assert watch.xid_events == frozenset(gpus[1:])
        watch.close()
