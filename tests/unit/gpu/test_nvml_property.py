"""Property: no sequence of MIG creates and destroys (by ID or by placement) overlaps instances, and every
refusal changes nothing."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudra import errors
from gpudra.node import gpu_driver
from gpudra.sim import state

# (profile ID, placement start) pairs, valid and not, across the A100-40GB's profiles
_CREATE = st.tuples(
    st.just("create"), st.sampled_from([19, 20, 15, 14, 9, 5, 0, 8]), st.integers(min_value=0, max_value=7)
)
# index into the existing GPU instances (an unknown ID when there are none)
_DESTROY = st.tuples(st.just("destroy"), st.integers(min_value=0, max_value=14), st.just(0))
# (profile ID, placement start), whether or not an instance is there
_DESTROY_AT = st.tuples(
    st.just("destroy at"), st.sampled_from([19, 20, 15, 14, 9, 5, 0]), st.integers(min_value=0, max_value=7)
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_CREATE, _DESTROY, _DESTROY_AT), min_size=1, max_size=10))
def test_instances_never_overlap_and_refusals_change_nothing(operations: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "machine.json"
        with gpu_driver.connect("sim:dgx-a100", state_file=path) as session:
            gpu_uuid = session.inventory().gpus[0].uuid
            store = state.StateFile(path)
            for action, first, second in operations:
                before = path.read_bytes()
                existing = sorted(gi.id for gi in store.read().gpus[0].gpu_instances)
                try:
                    if action == "create":
                        session.create_mig_device(gpu_uuid=gpu_uuid, profile_id=first, placement_start=second)
                    elif action == "destroy at":
                        there = any(
                            (gi.profile_id, gi.start) == (first, second)
                            for gi in store.read().gpus[0].gpu_instances
                        )
                        destroyed = session.destroy_at_placement(
                            gpu_uuid=gpu_uuid, profile_id=first, placement_start=second
                        )
                        assert destroyed == there
                        assert (path.read_bytes() == before) != there
                    else:
                        gi_id = existing[first % len(existing)] if existing else first
                        session.destroy_mig_device(gpu_uuid=gpu_uuid, gpu_instance_id=gi_id)
                except errors.HardwareError:
                    assert path.read_bytes() == before
                instances = store.read().gpus[0].gpu_instances
                taken = [s for gi in instances for s in range(gi.start, gi.start + gi.size)]
                assert len(taken) == len(set(taken))
                assert all(len(gi.compute_instances) == 1 for gi in instances)  # nothing half-made
