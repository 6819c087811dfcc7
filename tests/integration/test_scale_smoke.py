"""`make bench-scale`'s harness, kept working: a few fake nodes with the richest layout, the real
scheduler binds every pod and turns down the one that fits nowhere (the figures are make bench-scale's)."""

from __future__ import annotations

from pathlib import Path

from gpudra.node import gpu_driver
from tests.localcluster.binaries import repo_root
from tests.scale import layouts, report
from tests.scale.run import run_one


def test_the_scale_benchmark_places_every_workload(tmp_path: Path) -> None:
    with gpu_driver.connect("sim:dgx-h100") as session:
        dgx = session.inventory()
    runs = [
        run_one(
            workdir=tmp_path,
            repo=repo_root(),
            release=None,
            nodes=4,
            layout=layouts.LAYOUTS[name],
            dgx=dgx,
            pods=3,
            limit=60,
            workloads=layouts.WORKLOADS,
        )
        for name in (layouts.REFERENCE, "everything")
    ]
    reference, everything = runs
    assert (reference.devices_per_node, reference.counter_sets_per_node) == (8, 0)
    assert (everything.devices_per_node, everything.counter_sets_per_node) == (216, 8)
    assert [b.workload for b in everything.batches] == list(layouts.WORKLOADS)
    for batch in everything.batches:
        if batch.workload == "unschedulable":
            assert batch.bound == 0 and batch.cpu_per_attempt is not None
        else:
            assert batch.bound == batch.pods and batch.cpu_per_pod is not None
    text = report.table(runs)
    assert text.count("\n") == 1 + len(reference.batches) + len(everything.batches)
    assert "| 1.0x |" in text  # the reference against itself
