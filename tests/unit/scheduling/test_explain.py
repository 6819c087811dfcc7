"""gpudra explain (gpudra.scheduling.explain, .allocator; its text, gpudra.cli.explain_text): the scheduler's
allocation rules and the reasons given, on slices gpudra's own device model publishes for hand-built nodes."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudra.cli.explain import claims_to_explain
from gpudra.cli.explain_text import render_text
from gpudra.errors import ConfigError
from gpudra.model.claim import read_claim, read_spec
from gpudra.model.devices import build_devices
from gpudra.model.slices import build_slices
from gpudra.scheduling.explain import ClaimToExplain, Explanation, device_classes, explain
from gpudra.scheduling.pools import ClusterInventory
from tests.unit import inventories as inv

DRIVER = "gpu.gpudra.io"
A = f'device.attributes["{DRIVER}"]'
REPO = Path(__file__).resolve().parents[3]
CLASSES = device_classes(
    yaml.safe_load_all((REPO / "deploy" / "manifests" / "deviceclasses.yaml").read_text())
)


def slices(node: str, inventory: Any) -> list[dict[str, Any]]:
    model = build_devices(inventory, mig_mode="partitionable")
    return [
        dict(s) for s in build_slices(model, driver=DRIVER, node_name=node, generation=1, server_minor=36)
    ]


H100 = slices("node-h100", inv.node(*(inv.h100(m) for m in range(2))))  # two H100s, MIG off, switchable
MIXED = slices("node-mixed", inv.mixed_node())  # two L4s, two T4s
INVENTORY = ClusterInventory(H100 + MIXED)


def request(name: str, device_class: str = "gpu.gpudra.io", *selectors: str, **extra: Any) -> dict[str, Any]:
    exactly = {
        "deviceClassName": device_class,
        "selectors": [{"cel": {"expression": s}} for s in selectors],
        **extra,
    }
    return {"name": name, "exactly": exactly}


def claim(
    *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None, name: str = "ns/c"
) -> ClaimToExplain:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return ClaimToExplain(name, read_spec({"devices": devices}))


def held(name: str, *results: dict[str, Any]) -> dict[str, Any]:
    """A ResourceClaim `namespace/name` allocated `results`."""
    namespace, _, claim_name = name.partition("/")
    return {
        "metadata": {"namespace": namespace, "name": claim_name},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def result(device: str, pool: str = "node-h100", **extra: Any) -> dict[str, Any]:
    return {"request": "r", "driver": DRIVER, "pool": pool, "device": device, **extra}


def run(
    *claims: ClaimToExplain, allocated: Sequence[dict[str, Any]] = (), inventory: ClusterInventory = INVENTORY
) -> Explanation:
    return explain(
        list(claims), classes=CLASSES, inventory=inventory, allocated=[read_claim(c) for c in allocated]
    )


def node(explanation: Explanation, name: str) -> Any:
    return next(n for n in explanation.nodes if n.node == name)


# --- fits ----------------------------------------------------------------------------------------


def test_a_fitting_claim_gets_the_first_device_of_the_first_node_and_the_other_nodes_are_named() -> None:
    answer = run(claim(request("gpu")))
    assert answer.fits
    assert answer.verdict == "fits on node-h100: gpu-0 (also on 1 more node: node-mixed)"
    h100 = node(answer, "node-h100")
    assert [d.device for d in h100.devices] == ["gpu-0"]
    [report] = h100.requests
    assert report.matching == ["gpu-0", "gpu-1"] and report.usable == ["gpu-0", "gpu-1"]
    assert report.rejected[0].selector == "class gpu.gpudra.io selector #0"


def test_no_device_with_the_product_names_the_selector_and_what_devices_publish() -> None:
    answer = run(claim(request("gpu", "gpu.gpudra.io", f'{A}.productName == "NVIDIA H200"')))
    assert not answer.fits
    assert answer.verdict == (
        'cannot fit: no device has productName == "NVIDIA H200" (request gpu, selector #0); '
        "the devices of its "
        'class publish productName: "NVIDIA H100 80GB HBM3", "NVIDIA L4", "Tesla T4"'
    )


def test_a_device_others_hold_is_skipped_and_named_when_none_is_left() -> None:
    one = run(
        claim(request("gpu", "gpu.gpudra.io", f'{A}.architecture == "Hopper"')),
        allocated=[held("a/x", result("gpu-0"))],
    )
    assert one.verdict == "fits on node-h100: gpu-1"
    both = run(
        claim(request("gpu", "gpu.gpudra.io", f'{A}.architecture == "Hopper"')),
        allocated=[held("a/x", result("gpu-0")), held("b/y", result("gpu-1"))],
    )
    assert not both.fits
    assert "gpu-0: allocated to a/x; gpu-1: allocated to b/y" in node(both, "node-h100").reason


def test_a_claim_being_explained_does_not_count_against_itself() -> None:
    mine = held("ns/c", result("gpu-0"), result("gpu-1"))
    answer = run(
        claim(request("gpus", "gpu.gpudra.io", f'{A}.architecture == "Hopper"', count=2)), allocated=[mine]
    )
    assert answer.verdict == "fits on node-h100: gpu-0, gpu-1"


# --- counters (MIG placements, a GPU and its partitions) ------------------------------------------


def test_partitions_of_a_gpu_others_hold_whole_are_out_because_its_counters_are_used_up() -> None:
    answer = run(
        claim(request("mig", "mig.gpudra.io", f'{A}.profile == "1g.10gb"', f"{A}.parentMinor == 0")),
        allocated=[held("a/whole", result("gpu-0"))],
    )
    assert not answer.fits
    assert (
        "counter" in answer.verdict
        and "of gpu-0-counters" in answer.verdict
        and "held by a/whole" in answer.verdict
    )


def test_seven_1g_partitions_fill_an_h100_and_an_eighth_request_cannot_fit() -> None:
    seven = claim(
        request("mig", "mig.gpudra.io", f'{A}.profile == "1g.10gb"', f"{A}.parentMinor == 0", count=7)
    )
    fitted = run(seven)
    assert fitted.fits and len(fitted.nodes[0].devices) == 7
    eight = claim(
        request("mig", "mig.gpudra.io", f'{A}.profile == "1g.10gb"', f"{A}.parentMinor == 0", count=8)
    )
    assert (
        run(eight).verdict
        == "cannot fit on any of 2 nodes; closest is node-h100: request mig: needs 8 devices, only 7 match"
    )


def test_requests_whose_partitions_overlap_are_told_apart_from_requests_without_devices() -> None:
    parts = [
        request(p.replace(".", ""), "mig.gpudra.io", f'{A}.profile == "{p}"', f"{A}.parentMinor == 1")
        for p in ("4g.40gb", "3g.40gb", "1g.20gb")
    ]
    answer = run(claim(*parts))
    assert "the requests together need more of the shared counters than is left" in answer.verdict
    assert "gpu-1-counters" in answer.verdict


# --- constraints ---------------------------------------------------------------------------------


def test_match_attribute_across_requests_names_the_values_the_devices_have() -> None:
    answer = run(
        claim(
            request("l4", "gpu.gpudra.io", f'{A}.productName == "NVIDIA L4"'),
            request("t4", "gpu.gpudra.io", f'{A}.productName == "Tesla T4"'),
            constraints=[{"requests": ["l4", "t4"], "matchAttribute": f"{DRIVER}/productName"}],
        )
    )
    assert answer.verdict.startswith(
        "cannot fit on any of 2 nodes; closest is node-mixed: "
        "constraint matchAttribute gpu.gpudra.io/productName "
        'over l4, t4 cannot be met (the matching devices\' productName: "NVIDIA L4": gpu-0, gpu-1; "Tesla T4"'
    )


def test_match_and_distinct_attribute_pick_devices_that_agree_or_differ() -> None:
    same = run(claim(request("a"), request("b"), constraints=[{"matchAttribute": f"{DRIVER}/productName"}]))
    assert same.verdict.startswith("fits on node-h100: gpu-0, gpu-1")
    different = run(
        claim(
            request("a", "gpu.gpudra.io", f'{A}.brand == "Nvidia"'),
            request("b"),
            constraints=[{"distinctAttribute": f"{DRIVER}/productName"}],
        ),
        inventory=ClusterInventory(MIXED),
    )
    assert different.verdict == "fits on node-mixed: gpu-0, gpu-2"  # an L4 and the first T4


def test_a_device_without_the_attribute_never_satisfies_match_attribute() -> None:
    answer = run(
        claim(
            request("gpus", "gpu.gpudra.io", f'{A}.productName == "NVIDIA L4"', count=2),
            constraints=[{"matchAttribute": f"{DRIVER}/nvlinkDomain"}],
        ),
        inventory=ClusterInventory(MIXED),
    )
    assert "nvlinkDomain: unset: gpu-0, gpu-1" in answer.verdict


# --- firstAvailable ------------------------------------------------------------------------------


def first_available(*subs: tuple[str, str]) -> dict[str, Any]:
    return {
        "name": "gpu",
        "firstAvailable": [
            {"name": name, "deviceClassName": "gpu.gpudra.io", "selectors": [{"cel": {"expression": e}}]}
            for name, e in subs
        ],
    }


def test_first_available_takes_the_first_subrequest_that_fits_and_says_what_it_tried() -> None:
    choices = first_available(
        ("h200", f'{A}.productName == "NVIDIA H200"'), ("t4", f'{A}.productName == "Tesla T4"')
    )
    answer = run(claim(choices))
    assert answer.verdict == "fits on node-mixed: gpu-2"
    mixed = node(answer, "node-mixed")
    assert mixed.devices[0].request == "gpu/t4"
    assert mixed.notes[0].startswith(
        "request gpu: t4 (2nd of 2 choices); tried first: h200: no device has productName"
    )


def test_first_available_prefers_an_earlier_subrequest_even_on_a_later_node() -> None:
    answer = run(claim(first_available(("h100", f'{A}.architecture == "Hopper"'), ("any", "true"))))
    assert node(answer, "node-h100").devices[0].request == "gpu/h100"
    assert node(answer, "node-mixed").devices[0].request == "gpu/any"


def test_no_subrequest_that_fits_lists_each() -> None:
    choices = first_available(
        ("h200", f'{A}.productName == "NVIDIA H200"'), ("b200", f'{A}.productName == "B200"')
    )
    assert "request gpu: none of its 2 choices fits: h200: no device has" in run(claim(choices)).verdict


# --- consumable capacity -------------------------------------------------------------------------


def share(memory: str, *selectors: str) -> dict[str, Any]:
    return request(
        "share",
        "gpu-shared.gpudra.io",
        f"{A}.minor == 0",
        *selectors,
        capacity={"requests": {"memory": memory}},
    )


def test_shares_add_up_within_a_devices_capacity() -> None:
    others = [
        held(
            "a/one", result("gpu-0-shared", shareID="1", consumedCapacity={"memory": "50Gi", "compute": "0"})
        )
    ]
    small = run(claim(share("20Gi")), allocated=others)
    assert small.fits and node(small, "node-h100").devices[0].device == "gpu-0-shared"
    big = run(claim(share("30Gi", f'{A}.architecture == "Hopper"')), allocated=others)
    assert not big.fits
    assert "gpu-0-shared: memory: needs 30Gi, 30359Mi of 81559Mi left (shared with a/one)" in big.verdict


def test_shares_by_count_run_out_and_explain_names_the_count() -> None:
    counted = build_devices(inv.node(inv.h100(0)), mig_mode="partitionable", shares_per_gpu=4)
    node_slices = build_slices(counted, driver=DRIVER, node_name="node-h100", generation=1, server_minor=36)
    inventory = ClusterInventory([dict(s) for s in node_slices])
    by_count = request("share", "gpu-shared.gpudra.io", capacity={"requests": {"shares": "1"}})
    answer = run(claim(by_count), inventory=inventory)
    consumed = node(answer, "node-h100").devices[0].consumed_capacity
    assert consumed == {"memory": "19Gi", "compute": "0", "shares": "1"}  # a quarter of 79Gi
    # four shares of the default size: both the count and the memory are used up
    others = [
        held(f"a/s{i}", result("gpu-0-shared", shareID=str(i), consumedCapacity=consumed)) for i in range(4)
    ]
    fifth = run(claim(by_count), allocated=others, inventory=inventory)
    assert not fifth.fits
    assert "shares: needs 1, 0 of 4 left" in fifth.verdict
    # three shares that named their memory leave memory, but one share that took two leaves no count
    small = {"memory": "1Gi", "compute": "0", "shares": "1"}
    two = {"memory": "1Gi", "compute": "0", "shares": "2"}
    held_count = [
        held("a/one", result("gpu-0-shared", shareID="1", consumedCapacity=small)),
        held("a/two", result("gpu-0-shared", shareID="2", consumedCapacity=two)),
        held("a/three", result("gpu-0-shared", shareID="3", consumedCapacity=small)),
    ]
    last = run(claim(by_count), allocated=held_count, inventory=inventory)
    assert not last.fits
    assert "gpu-0-shared: shares: needs 1, 0 of 4 left (shared with a/one, a/two, a/three)" in last.verdict
    assert "memory" not in last.verdict


def test_a_request_rounds_up_to_the_capacity_policy_and_beyond_it_is_refused() -> None:
    answer = run(claim(share("1536Mi")))
    assert node(answer, "node-h100").devices[0].consumed_capacity == {"memory": "2Gi", "compute": "0"}
    refused = run(claim(share("100Gi", f'{A}.architecture == "Hopper"')))
    assert "memory: 100Gi is outside the request policy range min 1Gi, max 79Gi, step 1Gi" in refused.verdict


def test_a_share_of_a_gpu_others_hold_whole_is_out_and_the_whole_gpu_of_one_shared_too() -> None:
    whole_taken = run(
        claim(share("1Gi", f'{A}.architecture == "Hopper"')), allocated=[held("a/w", result("gpu-0"))]
    )
    assert "counter" in whole_taken.verdict and "held by a/w" in whole_taken.verdict
    shared = [
        held("a/s", result("gpu-0-shared", shareID="1", consumedCapacity={"memory": "1Gi", "compute": "0"}))
    ]
    whole = run(
        claim(request("gpu", "gpu.gpudra.io", f"{A}.minor == 0", f'{A}.architecture == "Hopper"')),
        allocated=shared,
    )
    assert not whole.fits and "held by a/s" in whole.verdict


# --- admin access, All, taints -------------------------------------------------------------------


def test_admin_access_may_share_a_held_device_but_not_one_whose_counters_are_used_up() -> None:
    plain = ClusterInventory(
        [
            {
                "metadata": {"name": "n-0"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": "n",
                    "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "dev", "attributes": {"type": {"string": "gpu"}}}],
                },
            }
        ]
    )
    others = [held("a/x", result("dev", pool="n"))]
    assert run(claim(request("gpu", adminAccess=True)), allocated=others, inventory=plain).fits
    assert not run(claim(request("gpu")), allocated=others, inventory=plain).fits
    counted = run(
        claim(
            request(
                "gpu", "gpu.gpudra.io", f"{A}.minor == 0", f'{A}.architecture == "Hopper"', adminAccess=True
            )
        ),
        allocated=[held("a/x", result("gpu-0"))],
    )
    assert not counted.fits and "counter" in counted.verdict


def test_all_mode_needs_every_matching_device() -> None:
    t4s = request("t4s", "gpu.gpudra.io", f'{A}.productName == "Tesla T4"', allocationMode="All")
    assert run(claim(t4s)).verdict == "fits on node-mixed: gpu-2, gpu-3"
    taken = run(claim(t4s), allocated=[held("a/x", result("gpu-3", pool="node-mixed"))])
    assert "asks for all 2 matching devices, 1 cannot be allocated: gpu-3: allocated to a/x" in taken.verdict


def test_a_tainted_device_is_out_unless_the_request_tolerates_the_taint() -> None:
    tainted = copy.deepcopy(MIXED)
    for s in tainted:
        for device in s["spec"].get("devices", []):
            device["taints"] = [{"key": "gpudra.io/unhealthy", "value": "XID", "effect": "NoSchedule"}]
    inventory = ClusterInventory(tainted)
    answer = run(claim(request("gpu")), inventory=inventory)
    assert "tainted gpudra.io/unhealthy=XID:NoSchedule" in answer.verdict
    tolerant = request("gpu", tolerations=[{"key": "gpudra.io/unhealthy", "operator": "Exists"}])
    assert run(claim(tolerant), inventory=inventory).fits


# --- what stops the scheduler before devices are looked at ---------------------------------------


def test_a_selector_that_fails_on_a_device_stops_the_scheduler_with_its_words() -> None:
    answer = run(claim(request("gpu", "gpu.gpudra.io", f'{A}.profile == "1g.10gb"')))
    assert answer.verdict == (
        "cannot be scheduled: the scheduler stops with an error: claim ns/c: selector #0: CEL runtime error: "
        "no such key: profile"
    )


def test_a_selector_the_api_server_refuses_is_reported_with_its_field() -> None:
    answer = run(claim(request("gpu", "gpu.gpudra.io", "device.model == 1")))
    assert answer.verdict.startswith(
        "invalid: the API server refuses ns/c: spec.devices.requests[0].exactly.selectors[0].cel.expression: "
        'Invalid value: "device.model == 1": compilation failed: '
        "ERROR: <input>:1:7: undefined field 'model'"
    )


def test_a_class_that_does_not_exist() -> None:
    answer = run(claim(request("gpu", "nvidia.com")))
    assert answer.verdict.startswith(
        "cannot fit: request gpu: device class nvidia.com does not exist (classes: "
    )


def test_more_than_32_devices_for_one_claim() -> None:
    answer = run(claim(request("gpus", count=33)))
    assert "number of requested devices 33 exceeds the claim limit of 32" in answer.verdict


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"devices": {"requests": [{"name": "gpu"}]}}, "spec.devices.requests[0]"),
        (
            {"devices": {"requests": [{"name": "gpu", "exactly": {}}]}},
            "spec.devices.requests[0].exactly.deviceClassName",
        ),
        (
            {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x", "count": 0}}]}},
            "spec.devices.requests[0].exactly.count",
        ),
        (
            {"devices": {"requests": [request("gpu")], "constraints": [{"matchAttribute": "productName"}]}},
            "spec.devices.constraints[0].matchAttribute",
        ),
    ],
)
def test_a_malformed_claim_is_a_config_error_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        run(ClaimToExplain("ns/c", read_spec(spec)))
    assert caught.value.field == field


# --- pods, pools, nodes --------------------------------------------------------------------------


def test_the_claims_of_a_pod_are_allocated_together() -> None:
    t4 = request("t4", "gpu.gpudra.io", f'{A}.productName == "Tesla T4"', count=2)
    alone = run(claim(t4, name="ns/one"))
    assert alone.fits
    together = run(
        claim(t4, name="ns/one"),
        claim(request("t4", "gpu.gpudra.io", f'{A}.productName == "Tesla T4"'), name="ns/two"),
    )
    assert not together.fits
    assert (
        "claim ns/two" in node(together, "node-mixed").reason
        or "compete" in node(together, "node-mixed").reason
    )


def test_an_incomplete_pool_is_skipped_and_said_so() -> None:
    partial = [
        s
        for s in slices("node-big", inv.node(*(inv.h100(m) for m in range(8))))
        if not s["metadata"]["name"].endswith("-1")
    ]
    answer = run(claim(request("gpu")), inventory=ClusterInventory(partial))
    assert not answer.fits
    [report] = answer.nodes
    assert report.notes[0].startswith("pool node-big (gpu.gpudra.io) is skipped: incomplete:")


def test_devices_of_a_slice_for_all_nodes_are_seen_by_every_node() -> None:
    shared = {
        "metadata": {"name": "everywhere"},
        "spec": {
            "driver": DRIVER,
            "allNodes": True,
            "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "link", "attributes": {"type": {"string": "gpu"}}}],
        },
    }
    answer = run(
        claim(request("gpu", "gpu.gpudra.io", '!has(device.attributes["gpu.gpudra.io"].productName)')),
        inventory=ClusterInventory([*MIXED, shared]),
    )
    assert answer.verdict == "fits on node-mixed: link"


def test_claims_and_templates_are_read_from_objects() -> None:
    objects = [
        {"kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": {}}},
        {
            "kind": "List",
            "items": [{"kind": "ResourceClaimTemplate", "metadata": {"name": "t"}, "spec": {"spec": {}}}],
        },
        {"kind": "Pod", "metadata": {"name": "p"}},
    ]
    assert [(c.name, c.path) for c in claims_to_explain(objects)] == [
        ("ns/c", "spec"),
        ("template default/t", "spec.spec"),
    ]


# --- text ----------------------------------------------------------------------------------------


def test_the_text_puts_the_verdict_first_and_shows_nodes_that_read_the_same_once() -> None:
    many = ClusterInventory([s for n in range(5) for s in slices(f"node-{n}", inv.node(inv.h100(0)))])
    text = render_text(
        run(claim(request("gpu", "gpu.gpudra.io", f'{A}.productName == "NVIDIA H200"')), inventory=many)
    )
    lines = text.splitlines()
    assert lines[0].startswith('cannot fit: no device has productName == "NVIDIA H200"')
    assert "node-0 (and 4 more nodes that read the same: node-1, node-2, node-3, +1 more): cannot fit" in text
    assert '1 rejected by request selector #0: productName == "NVIDIA H200" (e.g. gpu-0)' in text


def test_an_inventory_of_slices_for_all_nodes_only_stands_for_any_node() -> None:
    everywhere = {
        "metadata": {"name": "everywhere"},
        "spec": {
            "driver": DRIVER,
            "allNodes": True,
            "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "link", "attributes": {"type": {"string": "gpu"}}}],
        },
    }
    answer = run(claim(request("gpu", "gpu.gpudra.io", "true")), inventory=ClusterInventory([everywhere]))
    assert answer.verdict == "fits on (any node): link"
