"""Which of the DRA fields gpudra relies on the API server keeps: a server-side dry run of a probe slice.
I/O: the API server, via gpudra.kube.client.

Why a dry run: a feature gate's state is published nowhere a client can read, and the API server of a
release whose gate is off answers a write with 201 and silently drops the gated fields (counter sets,
allowMultipleAllocations, capacity request policies, device taints: observed on 1.34 and 1.35). Asking
it to store one slice that carries each field, and reading what it would have stored, is the one test
that says what the scheduler will see. A dry run stores nothing, so no scheduler ever sees the probe; it
passes the same validation and admission (the chart's ValidatingAdmissionPolicy) as a real write, with
the plugin's own credentials. The probe's slices are built by the same splitter as the real ones, so a
release that wants counter sets in a slice of their own gets them there.
"""

from __future__ import annotations

from typing import Any

from gpudra.kube.client import Kube
from gpudra.model.devices import CounterSet, Device, DeviceModel
from gpudra.model.publishing import ServerFields
from gpudra.model.slices import build_slices

_COUNTERS = "probe-counters"
_PROBE_DEVICE: Device = {
    "name": "probe-0",
    "attributes": {"type": {"string": "probe"}},
    "capacity": {
        "memory": {
            "value": "2Gi",
            "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "max": "2Gi", "step": "1Gi"}},
        }
    },
    "allowMultipleAllocations": True,
    "consumesCounters": [{"counterSet": _COUNTERS, "counters": {"memory": {"value": "2Gi"}}}],
    "taints": [{"key": "gpudra.io/probe", "effect": "NoSchedule"}],
}
_PROBE_COUNTERS: CounterSet = {"name": _COUNTERS, "counters": {"memory": {"value": "2Gi"}}}


def probe(kube: Kube, *, driver: str, node_name: str, minor: int) -> ServerFields:
    """What a 1.`minor` API server keeps of a slice of `driver` on `node_name` (dry runs only)."""
    model = DeviceModel(devices=[_PROBE_DEVICE], counter_sets=[_PROBE_COUNTERS])
    stored: list[dict[str, Any]] = []
    for piece in build_slices(model, driver=driver, node_name=node_name, generation=0, server_minor=minor):
        body: dict[str, Any] = dict(piece)
        # A name of its own, made by the server: a dry run of an existing name would be refused.
        body["metadata"] = {"generateName": f"{piece['metadata']['name'][:200]}-probe-"}
        stored.append(kube.create_slice(body, dry_run=True))
    return read_fields(stored, minor=minor)


def read_fields(stored: list[dict[str, Any]], *, minor: int) -> ServerFields:
    """What of the probe the stored slices still carry. Pure."""
    counter_sets = [c for s in stored for c in (s.get("spec") or {}).get("sharedCounters") or []]
    devices = [d for s in stored for d in (s.get("spec") or {}).get("devices") or []]
    device: dict[str, Any] = next((d for d in devices if d.get("name") == _PROBE_DEVICE["name"]), {})
    memory = (device.get("capacity") or {}).get("memory") or {}
    return ServerFields(
        minor=minor,
        counters=bool(counter_sets) and bool(device.get("consumesCounters")),
        consumable_capacity=device.get("allowMultipleAllocations") is True and "requestPolicy" in memory,
        device_taints=bool(device.get("taints")),
    )
