"""The figure "`gpudra explain` over 1,000 nodes' slices" (issue 15). I/O: a temporary simulator state.

1,000 simulated 8x H100 nodes publish what `gpudra inventory --nvml sim:dgx-h100 -o yaml` would (whole
GPUs, shares and every MIG partition: 216 devices in 5 slices per node), and one claim for an H100
chosen with CEL is explained against all of them, as `gpudra explain --slices` does offline. Each run
starts cold (the compiled-selector cache cleared) and includes building the pools from the slices; the
median of the runs is reported.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from gpudra.model.claim import read_spec
from gpudra.model.devices import build_devices
from gpudra.model.slices import build_slices
from gpudra.node import gpu_driver
from gpudra.scheduling import cel
from gpudra.scheduling.explain import ClaimToExplain, device_classes, explain
from gpudra.scheduling.pools import ClusterInventory

REPO = Path(__file__).resolve().parents[2]
NODES = 1000
RUNS = 3
CLAIM = {
    "devices": {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpu.gpudra.io",
                    "selectors": [
                        {
                            "cel": {
                                "expression": 'device.attributes["gpu.gpudra.io"].productName '
                                '== "NVIDIA H100 80GB HBM3"'
                            }
                        }
                    ],
                },
            }
        ]
    }
}


def explain_over_1000_nodes() -> str:
    """The figure as the gpudra-only table shows it: median seconds, the size, and the verdict."""
    with (
        tempfile.TemporaryDirectory() as state,
        gpu_driver.connect("sim:dgx-h100", state_file=Path(state) / "sim.json") as session,
    ):
        node = session.inventory()
    one = json.dumps(
        build_slices(
            build_devices(node, mig_mode="partitionable"),
            driver="gpu.gpudra.io",
            node_name="NODE",
            generation=1,
            server_minor=36,
        )
    )
    slices = [s for i in range(NODES) for s in json.loads(one.replace("NODE", f"node-{i:04d}"))]
    devices = sum(len(s["spec"].get("devices", [])) for s in slices)
    classes_file = REPO / "deploy" / "manifests" / "deviceclasses.yaml"
    classes = device_classes(list(yaml.safe_load_all(classes_file.read_text())))
    claim = ClaimToExplain("bench/one", read_spec(CLAIM))
    seconds, verdict = [], ""
    for _ in range(RUNS):
        cel.compile_selector.cache_clear()
        started = time.perf_counter()
        answer = explain([claim], classes=classes, inventory=ClusterInventory(slices))
        seconds.append(time.perf_counter() - started)
        verdict = answer.verdict
    return (
        f"{statistics.median(seconds):.2f} s median of {RUNS} ({NODES:,} nodes, {len(slices):,} slices, "
        f"{devices:,} devices; {verdict.split(':')[0]})"
    )
