"""A cluster as the controller sees it, built by gpudra's own device model: the slices two hand-built
nodes publish (healthy, or with devices unhealthy), claims allocated from them, their usage reports and
the DeviceClasses gpudra installs. The cluster view's, the GPU map's and the controller metrics' unit
tests read the same cluster."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from gpudra.model import claim_usage, health_report
from gpudra.model.devices import UNHEALTHY_TAINT_KEY, build_devices, with_health_taints, without_devices
from gpudra.model.slices import build_slices
from tests.unit import inventories as inv

DRIVER = "gpu.gpudra.io"
REPO = Path(__file__).resolve().parents[3]
CLASS_OBJECTS = list(yaml.safe_load_all((REPO / "deploy" / "manifests" / "deviceclasses.yaml").read_text()))
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
GIB = 1024**3


def slices(node: str, inventory: Any) -> list[dict[str, Any]]:
    model = build_devices(inventory, mig_mode="partitionable")
    return [
        dict(s) for s in build_slices(model, driver=DRIVER, node_name=node, generation=1, server_minor=36)
    ]


H100 = slices("node-h100", inv.node(*(inv.h100(m) for m in range(2))))  # MIG-capable, MIG off
MIXED = slices("node-mixed", inv.mixed_node())  # two L4s, two T4s
SLICES = H100 + MIXED


def claim(
    name: str,
    *devices: tuple[str, str],
    pods: tuple[str, ...] = ("pod",),
    share: bool = False,
    classes: tuple[str, ...] = (),
    created: datetime = NOW - timedelta(days=1),
    usage: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A claim in `default`, allocated the (pool, device)s given, reserved by `pods`; unallocated
    (pending) with requests for `classes` when no devices are given."""
    requests = [{"name": f"r{i}", "exactly": {"deviceClassName": c}} for i, c in enumerate(classes)]
    status: dict[str, Any] = {}
    if devices:
        results = [
            {"request": "r0", "driver": DRIVER, "pool": pool, "device": device}
            | ({"shareID": f"share-{name}"} if share else {})
            for pool, device in devices
        ]
        status["allocation"] = {"devices": {"results": results}}
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]
    if usage:
        status["devices"] = usage
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "default", "name": name, "creationTimestamp": created.isoformat()},
        "spec": {"devices": {"requests": requests}},
        "status": status,
    }


def idle_entry(pool: str, device: str, since: datetime) -> dict[str, Any]:
    return claim_usage.device_entry(
        driver=DRIVER, key=(pool, device, None), idleness=claim_usage.no_activity(since, mig=False)
    )


def reporting(
    node: str, inventory: Any, unhealthy: dict[str, str], *, taints: bool, server_minor: int = 35
) -> list[dict[str, Any]]:
    """The node's slices as its plugin publishes them with the named devices unhealthy (name ->
    reason): tainted where the server keeps taints, else left out, and reported on the first slice
    either way (gpudra.node.served_model)."""
    model = build_devices(inventory, mig_mode="partitionable")
    found = {
        name: {"key": UNHEALTHY_TAINT_KEY, "value": reason, "effect": "NoSchedule"}
        for name, reason in unhealthy.items()
    }
    words = {name: f"{name}: XID 119 (GSP RPC timeout), class reset" for name in unhealthy}
    report = health_report.slice_annotations(
        model.devices, found, words, slices="tainted" if taints else "left-out"
    )
    published = with_health_taints(model, found) if taints else without_devices(model, found.keys())
    published = dataclasses.replace(published, annotations=report)
    return [
        dict(s)
        for s in build_slices(
            published, driver=DRIVER, node_name=node, generation=1, server_minor=server_minor
        )
    ]


H100_NODE = inv.node(*(inv.h100(m) for m in range(2)))
# Every device of gpu-0: its taint follows the GPU (gpudra.model.gpu_health.device_taints).
GPU0_LOST = {
    d["name"]: "Xid119"
    for d in build_devices(H100_NODE, mig_mode="partitionable").devices
    if d["name"] == "gpu-0" or d["name"].startswith("gpu-0-")
}
