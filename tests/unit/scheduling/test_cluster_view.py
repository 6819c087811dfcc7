"""The controller's cluster view (gpudra.scheduling.cluster_view, .reach; its text,
gpudra.cli.status_text) and its housekeeping rule, on slices gpudra's own device model publishes for
hand-built nodes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gpudra.cli import status
from gpudra.cli.output_format import documents
from gpudra.cli.status_text import render
from gpudra.controller.housekeeping import stale_reports
from gpudra.model import health_report
from gpudra.model.claim import read_claim, read_spec_of
from gpudra.scheduling.cluster_view import ClusterView, build, driver_classes, health_reports
from gpudra.scheduling.explain import device_classes
from gpudra.scheduling.pools import ClusterInventory
from gpudra.scheduling.reach import Reach
from tests.unit.harness.cluster import (
    CLASS_OBJECTS,
    DRIVER,
    GIB,
    GPU0_LOST,
    H100,
    H100_NODE,
    MIXED,
    NOW,
    SLICES,
    claim,
    idle_entry,
    reporting,
)


def view(
    *claims: dict[str, Any], idle_after: float = 1800, slices: list[dict[str, Any]] = SLICES
) -> ClusterView:
    return build(
        driver=DRIVER,
        slices=slices,
        claims=[read_claim(c) for c in claims],
        classes=CLASS_OBJECTS,
        now=NOW,
        idle_after_seconds=idle_after,
    )


def row(v: ClusterView, node: str) -> dict[str, int]:
    """The node's counts over all its products."""
    found = [r for r in v.nodes if r.node == node]
    return {k: sum(getattr(r, k) for r in found) for k in ("gpus", "allocated", "shared", "free", "idle")}


def test_an_empty_cluster_counts_every_gpu_free() -> None:
    v = view()
    assert row(v, "node-h100") == {"gpus": 2, "allocated": 0, "shared": 0, "free": 2, "idle": 0}
    assert {r.product for r in v.nodes if r.node == "node-mixed"} == {"NVIDIA L4", "Tesla T4"}
    assert sum(r.gpus for r in v.nodes) == 6
    assert [(m.gpu, m.largest_placeable) for m in v.mig] == [("gpu-0", "7g.80gb"), ("gpu-1", "7g.80gb")]
    assert v.pending == [] and v.idle == []


def test_whole_gpu_mig_partitions_and_shares_count_per_physical_gpu() -> None:
    v = view(
        claim("whole", ("node-h100", "gpu-0")),
        claim("mig-a", ("node-h100", "gpu-1-mig-3g40gb-0")),
        claim("mig-b", ("node-h100", "gpu-1-mig-1g10gb-4")),
        claim("share-a", ("node-mixed", "gpu-0-shared"), share=True),
        claim("share-b", ("node-mixed", "gpu-0-shared"), share=True),
        claim("two-pods", ("node-mixed", "gpu-2"), pods=("p1", "p2")),
    )
    assert row(v, "node-h100") == {"gpus": 2, "allocated": 2, "shared": 1, "free": 0, "idle": 0}
    l4 = next(r for r in v.nodes if r.node == "node-mixed" and r.product == "NVIDIA L4")
    t4 = next(r for r in v.nodes if r.node == "node-mixed" and r.product == "Tesla T4")
    assert (l4.allocated, l4.shared, l4.free) == (1, 1, 1)  # two shares of gpu-0
    assert (t4.allocated, t4.shared, t4.free) == (1, 1, 1)  # one claim, two pods
    rooms = {m.gpu: m for m in v.mig}
    assert rooms["gpu-0"].largest_placeable is None  # held whole
    assert rooms["gpu-1"].partitions_allocated == 2
    # 3g.40gb at 0-3 and 1g.10gb at 4: slices 5 and 6 are left, so a 1g.20gb or 2g.20gb fits
    assert rooms["gpu-1"].largest_placeable in ("2g.20gb", "1g.20gb")
    assert rooms["gpu-1"].largest_placeable_memory > 19 * GIB


def test_admin_access_holds_nothing() -> None:
    admin = claim("admin", ("node-h100", "gpu-0"))
    admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    assert row(view(admin), "node-h100")["allocated"] == 0


def test_pending_claims_are_those_for_this_drivers_classes() -> None:
    v = view(
        claim("waits", classes=("mig.gpudra.io",), created=NOW - timedelta(seconds=90)),
        claim("other-driver", classes=("nic.example.com",)),
    )
    assert [(p.name, p.device_classes, p.age_seconds) for p in v.pending] == [
        ("waits", ["mig.gpudra.io"], 90)
    ]
    assert driver_classes(CLASS_OBJECTS, driver=DRIVER) == {
        "gpu.gpudra.io",
        "gpu-shared.gpudra.io",
        "mig.gpudra.io",
        "mig-shared.gpudra.io",
    }


def test_idle_is_reported_after_the_idle_time_and_only_then() -> None:
    recent = claim(
        "recent", ("node-h100", "gpu-0"), usage=[idle_entry("node-h100", "gpu-0", NOW - timedelta(minutes=5))]
    )
    old = claim(
        "old", ("node-h100", "gpu-1"), usage=[idle_entry("node-h100", "gpu-1", NOW - timedelta(hours=2))]
    )
    v = view(recent, old)
    assert [(d.claim, d.device, d.pods, d.idle_seconds) for d in v.idle] == [("old", "gpu-1", ["pod"], 7200)]
    assert row(v, "node-h100")["idle"] == 1
    assert row(view(recent, old, idle_after=60), "node-h100")["idle"] == 2


def test_a_shared_gpu_is_idle_only_when_every_claim_on_it_is() -> None:
    since = NOW - timedelta(hours=1)
    idle_share = claim(
        "a",
        ("node-mixed", "gpu-0-shared"),
        share=True,
        usage=[idle_entry("node-mixed", "gpu-0-shared", since)],
    )
    busy_share = claim("b", ("node-mixed", "gpu-0-shared"), share=True)
    assert row(view(idle_share, busy_share), "node-mixed")["idle"] == 0
    assert row(view(idle_share), "node-mixed")["idle"] == 1


def test_the_view_round_trips_through_json_and_renders() -> None:
    v = view(
        claim(
            "whole",
            ("node-h100", "gpu-0"),
            usage=[idle_entry("node-h100", "gpu-0", NOW - timedelta(hours=3))],
        ),
        claim("mig", ("node-h100", "gpu-1-mig-1g10gb-0")),
        claim("waits", classes=("gpu.gpudra.io",)),
    )
    again = ClusterView.model_validate_json(v.model_dump_json(by_alias=True))
    assert again == v
    for output in ("json", "yaml"):  # gpudra status -o json|yaml: a versioned document
        shown = documents(status.show(v, output=output))[0]
        assert (shown["apiVersion"], shown["kind"]) == ("gpudra.io/v1alpha1", "ClusterStatus")
    text = render(v)
    assert "TOTAL" in text and "node-h100" in text
    assert "gpu-1" in text and "7g.80gb" not in text.split("MIG GPUs")[1].split("\n\n")[0].split("gpu-1")[0]
    assert "Allocated but idle for 30m or more" in text and "3h" in text
    assert "gpudra explain claim/NAME" in text and "waits" in text
    assert render(v, wide=True).count("\nnode-h100  gpu-") == 2  # every MIG-capable GPU


def test_requests_no_published_device_matches_are_warned_about() -> None:
    classes = device_classes(CLASS_OBJECTS)
    inventory = ClusterInventory(SLICES)
    reach = Reach(
        [d for p in inventory.pools.values() for d in p.devices],
        classes,
        driver_classes(CLASS_OBJECTS, driver=DRIVER),
    )
    product = f'device.attributes["{DRIVER}"].productName == "NVIDIA H200"'
    h200: dict[str, Any] = {
        "name": "gpu",
        "exactly": {"deviceClassName": "gpu.gpudra.io", "selectors": [{"cel": {"expression": product}}]},
    }
    h100 = {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpudra.io"}}
    claim_obj = {"kind": "ResourceClaim", "spec": {"devices": {"requests": [h200]}}}
    [warning] = reach.warnings(read_spec_of(claim_obj))
    assert warning.startswith(
        "spec.devices.requests[0] (gpu): no GPU published by any node matches class gpu.gpudra.io"
    )
    template = {"kind": "ResourceClaimTemplate", "spec": {"spec": {"devices": {"requests": [h100]}}}}
    assert reach.warnings(read_spec_of(template)) == []
    either = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "a", **h200["exactly"]},
            {"name": "b", "deviceClassName": "mig.gpudra.io"},
        ],
    }
    either_claim = {"kind": "ResourceClaim", "spec": {"devices": {"requests": [either]}}}
    assert reach.warnings(read_spec_of(either_claim)) == []
    other = {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}
    other_claim = {"kind": "ResourceClaim", "spec": {"devices": {"requests": [other]}}}
    assert reach.warnings(read_spec_of(other_claim)) == []
    assert reach.warnings(read_spec_of({"kind": "DeviceClass", "spec": {}})) == []


def test_housekeeping_removes_reports_of_pools_without_slices_only() -> None:
    gone = claim(
        "on-gone-node",
        ("node-gone", "gpu-0"),
        usage=[
            idle_entry("node-gone", "gpu-0", NOW),
            {"driver": "other.example.com", "pool": "x", "device": "y"},
        ],
    )
    here = claim("here", ("node-h100", "gpu-0"), usage=[idle_entry("node-h100", "gpu-0", NOW)])
    [(found, keep)] = stale_reports([gone, here], SLICES, driver=DRIVER)
    assert found is gone
    assert keep == [{"driver": "other.example.com", "pool": "x", "device": "y"}]


def _tainted(pieces: list[dict[str, Any]], names: dict[str, str]) -> list[dict[str, Any]]:
    """The slices with gpudra's unhealthy taint on the named devices (name -> reason), as the plugin
    publishes it (gpudra.model.gpu_health.device_taints)."""
    out = []
    for piece in pieces:
        copy = {
            **piece,
            "spec": {**piece["spec"], "devices": [dict(d) for d in piece["spec"].get("devices", [])]},
        }
        for device in copy["spec"]["devices"]:
            if device["name"] in names:
                device["taints"] = [
                    {"key": "gpudra.io/unhealthy", "value": names[device["name"]], "effect": "NoSchedule"}
                ]
        out.append(copy)
    return out


def test_unhealthy_gpus_are_listed_once_and_a_partitions_own_fault_alone() -> None:
    gpu0 = {"gpu-0": "Xid79", "gpu-0-shared": "Xid79", "gpu-0-mig-1g10gb-0": "Xid79"}
    partition = {"gpu-1-mig-3g40gb-4": "Xid95"}
    v = view(slices=_tainted(H100, gpu0 | partition) + MIXED)
    assert [(d.node, d.device, d.reason, d.effect) for d in v.unhealthy] == [
        ("node-h100", "gpu-0", "Xid79", "NoSchedule"),
        ("node-h100", "gpu-1-mig-3g40gb-4", "Xid95", "NoSchedule"),
    ]
    assert v.unhealthy[0].product == "NVIDIA H100 80GB HBM3"
    text = render(v)
    assert "Unhealthy GPUs (tainted gpudra.io/unhealthy" in text
    assert "gpu-1-mig-3g40gb-4" in text.split("Unhealthy GPUs")[1]
    assert "Unhealthy GPUs" not in render(view())
    assert ClusterView.model_validate_json(v.model_dump_json(by_alias=True)) == v


def test_an_unhealthy_gpu_left_out_of_the_slices_is_listed_from_the_nodes_report() -> None:
    pieces = reporting("node-h100", H100_NODE, GPU0_LOST | {"gpu-1-mig-3g40gb-4": "Xid95"}, taints=False)
    assert "gpu-0" not in {d["name"] for s in pieces for d in s["spec"].get("devices", [])}
    v = view(slices=pieces + MIXED)
    assert [(d.node, d.device, d.reason, d.slices) for d in v.unhealthy] == [
        ("node-h100", "gpu-0", "Xid119", "left-out"),
        ("node-h100", "gpu-1-mig-3g40gb-4", "Xid95", "left-out"),
    ]
    assert v.unhealthy[0].product == "NVIDIA H100 80GB HBM3"
    assert v.unhealthy[0].message == "gpu-0: XID 119 (GSP RPC timeout), class reset"
    assert row(v, "node-h100")["gpus"] == 1  # published: the other is not
    text = render(v)
    assert "left out (no device taints on this release)" in text
    assert "node-h100/gpu-0: gpu-0: XID 119 (GSP RPC timeout), class reset" in text


def test_a_tainted_gpu_has_the_reports_words_and_a_dropped_taint_is_shown() -> None:
    pieces = reporting("node-h100", H100_NODE, GPU0_LOST, taints=True, server_minor=36)
    v = view(slices=pieces + MIXED)
    assert [(d.device, d.slices, d.message) for d in v.unhealthy] == [
        ("gpu-0", "tainted", "gpu-0: XID 119 (GSP RPC timeout), class reset")
    ]
    dropped = [
        {**s, "spec": {**s["spec"], "devices": [{**d, "taints": []} for d in s["spec"].get("devices", [])]}}
        for s in pieces
    ]
    [shown] = view(slices=dropped + MIXED).unhealthy
    assert (shown.device, shown.slices, shown.reason) == ("gpu-0", "untainted", "Xid119")
    assert "UNTAINTED (the server dropped the taint)" in render(view(slices=dropped + MIXED))


def test_a_report_that_cannot_be_read_is_refused_with_a_line_and_the_taints_still_count() -> None:
    pieces = _tainted(H100, {"gpu-1": "Xid79"})
    for text, says in [
        ("{not json", "(top)"),
        ('{"devices": [{"device": "gpu-0", "uuid": "x", "slices": "gone"}]}', "devices.0.slices"),
        (
            '{"devices": [' + ",".join(['{"device": "d", "uuid": "x", "slices": "left-out"}'] * 129) + "]}",
            "devices",
        ),
        ("x" * (health_report.MAX_BYTES + 1), "over"),
    ]:
        first = {
            **pieces[0],
            "metadata": {**pieces[0]["metadata"], "annotations": {health_report.ANNOTATION: text}},
        }
        hostile = [first, *pieces[1:]]
        [pool] = ClusterInventory(hostile).pools.values()
        found, problems = health_reports(pool)
        assert found == {}
        assert len(problems) == 1 and says in problems[0] and health_report.ANNOTATION in problems[0], (
            problems
        )
        assert [d.device for d in view(slices=hostile + MIXED).unhealthy] == ["gpu-1"]
