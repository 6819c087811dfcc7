"""The health report a node writes on its first slice (gpudra.model.health_report), and what the node
puts in it: the served model's annotation on each release, and the monitor's words for each fault."""

from __future__ import annotations

import json

from gpudra.model import devices, health_report
from gpudra.model.devices import UNHEALTHY_TAINT_KEY, DeviceTaint
from gpudra.model.gpu_health import CLEAR_ANNOTATION, Mark, XidClass
from gpudra.model.publishing import Publishing, ServerFields
from gpudra.node.health.monitor import GpuHealth, Health, device_gpus, report_words
from tests.unit import inventories as inv
from tests.unit.harness.slices import served

MODEL = devices.build_devices(inv.h100_node(), mig_mode="partitionable")
GPUS = device_gpus(MODEL.devices)
GPU0 = GPUS["gpu-0"]


def taint(reason: str = "Xid119", effect: str = "NoSchedule") -> DeviceTaint:
    return {"key": UNHEALTHY_TAINT_KEY, "value": reason, "effect": effect}


def of_gpu(minor: int, reason: str = "Xid119") -> dict[str, DeviceTaint]:
    """Every device of GPU `minor` tainted: a GPU's devices follow it (gpu_health.device_taints)."""
    uuid = GPUS[f"gpu-{minor}"]
    return {name: taint(reason) for name, gpu in GPUS.items() if gpu == uuid}


def entries(annotations: dict[str, str]) -> list[dict[str, object]]:
    return list(json.loads(annotations[health_report.ANNOTATION])["devices"])


def test_a_gpu_is_listed_once_and_a_partition_of_a_healthy_gpu_alone() -> None:
    partition = next(n for n in GPUS if n.startswith("gpu-1-mig-"))
    found = of_gpu(0) | {partition: taint("Xid95"), f"{partition}-shared": taint("Xid95")}
    listed = entries(health_report.slice_annotations(MODEL.devices, found, {}, slices="left-out"))
    assert [(e["device"], e["kind"], e["reason"], e["slices"]) for e in listed] == [
        ("gpu-0", "gpu", "Xid119", "left-out"),
        (partition, "mig", "Xid95", "left-out"),
    ]
    assert listed[0]["uuid"] == GPU0 and listed[0]["product"] == "NVIDIA H100 80GB HBM3"


def test_a_healthy_node_writes_no_annotation() -> None:
    assert health_report.slice_annotations(MODEL.devices, {}, {}, slices="tainted") == {}


def test_the_report_is_bounded_and_counts_what_it_left_off() -> None:
    many = [
        {**MODEL.devices[0], "name": f"gpu-{i}", "attributes": {**MODEL.devices[0]["attributes"]}}
        for i in range(health_report.MAX_ENTRIES + 5)
    ]
    found = {d["name"]: taint() for d in many}
    words = dict.fromkeys(found, "x" * 10_000)
    text = health_report.slice_annotations(many, found, words, slices="tainted")[health_report.ANNOTATION]
    report, problem = health_report.read(text, where="slice")
    assert problem is None
    assert (len(report.devices), report.more) == (health_report.MAX_ENTRIES, 5)
    assert len(report.devices[0].message) == health_report.MAX_MESSAGE
    assert len(text.encode()) <= health_report.MAX_BYTES


def test_the_served_model_reports_left_out_devices_where_the_server_drops_taints() -> None:
    found = of_gpu(0)
    words = dict.fromkeys(found, "GPU lost")
    for keeps, slices in ((False, "left-out"), (True, "tainted")):
        model, _ = served(
            Publishing(),
            ServerFields(minor=35, counters=False, consumable_capacity=False, device_taints=keeps),
        )
        model.on_server(35)
        published = model.model(found, words)
        names = {d["name"] for d in published.devices}
        assert ("gpu-0" in names) is keeps
        [entry] = entries(dict(published.annotations))
        assert (entry["device"], entry["slices"], entry["message"]) == ("gpu-0", slices, "GPU lost")
        assert model.model({}).annotations == {}


def mark(xid_class: XidClass = XidClass.RESET, device: str | None = None) -> Mark:
    return Mark(
        gpu_uuid=GPU0,
        device=device,
        reason="Xid119",
        xid_class=xid_class,
        what="XID 119 (GSP RPC timeout)",
        first_seen=1.0,
        last_seen=1.0,
        boot_id="b",
    )


def test_the_words_of_a_fault_name_the_xid_its_class_and_what_lifts_it() -> None:
    gpus = {uuid: GpuHealth(Health.HEALTHY, "") for uuid in set(GPUS.values())}
    gpus[GPU0] = GpuHealth(Health.UNHEALTHY, f"GPU {GPU0}: NVMLError_GpuIsLost", "NVMLError_GpuIsLost")
    words = report_words(device_gpus=GPUS, taints=of_gpu(0), gpus=gpus, marks=[mark()], clean_seconds=600)
    assert words["gpu-0"] == (
        f"GPU {GPU0}: XID 119 (GSP RPC timeout), class reset; lifted when a GPU reset is observed, the node"
        f" reboots, or the Node is annotated {CLEAR_ANNOTATION}={GPU0}; NVML: NVMLError_GpuIsLost"
    )
    plain = report_words(device_gpus=GPUS, taints=of_gpu(0), gpus=gpus)
    assert plain["gpu-0"] == f"GPU {GPU0}: NVMLError_GpuIsLost"
    unknown = {**gpus, GPU0: GpuHealth(Health.UNKNOWN, "could not be probed: Timeout")}
    kept = report_words(device_gpus=GPUS, taints=of_gpu(0), gpus=unknown, previous=plain)
    assert kept["gpu-0"] == plain["gpu-0"]  # a failed probe says nothing new of the GPU
