"""`gpudra explain` on a cluster whose API server cannot keep a form of the GPUs (shares, MIG partitions on
demand): the requests for that form are told the feature gate or release they need, by the rule the
kubelet plugin publishes by (gpudra.model.publishing.fit_to_server), one line per reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudra import cli
from gpudra.cli import explain as explain_cli
from gpudra.cli.output_format import documents
from gpudra.errors import ClusterError
from gpudra.kube.client import Forbidden
from gpudra.model import devices
from gpudra.model.claim import read_spec, read_spec_of
from gpudra.model.devices import build_devices
from gpudra.model.publishing import DRA_GATES, Publishing, ServerFields, fit_to_server
from gpudra.model.slices import build_slices
from gpudra.scheduling.cluster_view import driver_classes
from gpudra.scheduling.explain import ClaimToExplain, Explanation, device_classes, explain
from gpudra.scheduling.forms import class_forms, fields_seen, withheld_on
from gpudra.scheduling.pools import ClusterInventory
from gpudra.scheduling.reach import Reach
from tests.unit import inventories as inv

DRIVER = "gpu.gpudra.io"
A = f'device.attributes["{DRIVER}"]'
REPO = Path(__file__).resolve().parents[3]
CLASS_OBJECTS = list(yaml.safe_load_all((REPO / "deploy" / "manifests" / "deviceclasses.yaml").read_text()))
CLASSES = device_classes(CLASS_OBJECTS)
EVERYTHING = Publishing(mig_mode="partitionable", shares=True)
ALL_GATES = dict.fromkeys(DRA_GATES, True)

PARTITIONS_GATE = (
    "MIG partitions on demand need feature gate DRAPartitionableDevices (on by default from 1.36): "
    "the API server drops counter sets"
)
SHARES_1_36 = (
    "GPU shares are not available before Kubernetes 1.36 (feature gates DRAPartitionableDevices and "
    "DRAConsumableCapacity on by default there): the API server drops counter sets"
)


def published(fields: ServerFields, inventory: Any = None, node: str = "node-h100") -> list[dict[str, Any]]:
    """The slices a node offering partitions and shares publishes to a server that keeps `fields`."""
    fitted, _ = fit_to_server(EVERYTHING, fields)
    model = devices.publish(inventory or inv.node(inv.h100(0), inv.h100(1)), fitted)
    return [
        dict(s)
        for s in build_slices(model, driver=DRIVER, node_name=node, generation=1, server_minor=fields.minor)
    ]


def request(name: str, device_class: str, *selectors: str, **extra: Any) -> dict[str, Any]:
    exactly = {"deviceClassName": device_class, "selectors": [{"cel": {"expression": s}} for s in selectors]}
    return {"name": name, "exactly": {**exactly, **extra}}


SHARE = request("gpu", "gpu-shared.gpudra.io", capacity={"requests": {"memory": "10Gi"}})
MIG_1G = request("mig", "mig.gpudra.io", f'{A}.profile == "1g.10gb"')
WHOLE = request("whole", "gpu.gpudra.io")


def run(
    fields: ServerFields, *requests: dict[str, Any], slices: list[dict[str, Any]] | None = None
) -> Explanation:
    claim = ClaimToExplain("ns/c", read_spec({"devices": {"requests": list(requests)}}))
    return explain(
        [claim],
        classes=CLASSES,
        inventory=ClusterInventory(published(fields) if slices is None else slices),
        server=fields,
        driver=DRIVER,
    )


def test_the_form_a_class_asks_for_is_read_from_its_selectors() -> None:
    assert class_forms(CLASSES["gpu.gpudra.io"], driver=DRIVER) == {"whole"}
    assert class_forms(CLASSES["gpu-shared.gpudra.io"], driver=DRIVER) == {"shares"}
    assert class_forms(CLASSES["mig.gpudra.io"], driver=DRIVER) == {"partitions", "mig-devices"}
    # a share of a MIG partition needs what any share needs (consumable capacity and counters)
    assert class_forms(CLASSES["mig-shared.gpudra.io"], driver=DRIVER) == {"shares"}
    assert class_forms(CLASSES["gpu.gpudra.io"], driver="other.example.com") == frozenset()
    assert class_forms(
        ['device.driver == "gpu.gpudra.io" && device.allowMultipleAllocations'], driver=DRIVER
    ) == {"shares"}


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        (ServerFields.of_release(35), f"request gpu (class gpu-shared.gpudra.io): {SHARES_1_36}"),
        (ServerFields.of_release(34), f"request gpu (class gpu-shared.gpudra.io): {SHARES_1_36}"),
        (
            ServerFields.of_release(35, ALL_GATES),
            "request gpu (class gpu-shared.gpudra.io): GPU shares are not available before Kubernetes 1.36: "
            "the 1.35 scheduler does not count the counters shares consume (fixed in 1.36), so a share and "
            "its whole GPU could go to two claims",
        ),
        (
            ServerFields.of_release(37, {"DRAConsumableCapacity": False}),
            "request gpu (class gpu-shared.gpudra.io): GPU shares need feature gate DRAConsumableCapacity "
            "(on by default from 1.36): the API server drops allowMultipleAllocations",
        ),
    ],
    ids=["1.35", "1.34", "1.35-gates-on", "1.37-consumable-capacity-off"],
)
def test_a_share_on_a_server_that_cannot_keep_shares_needs_the_gate_or_release(
    fields: ServerFields, line: str
) -> None:
    answer = run(fields, SHARE)
    assert not answer.fits
    assert answer.needs == [line]
    assert answer.verdict == f"cannot fit: {line}"


def test_a_mig_partition_without_counter_sets_needs_partitionable_devices() -> None:
    answer = run(ServerFields.of_release(35), MIG_1G)
    assert answer.verdict == f"cannot fit: request mig (class mig.gpudra.io): {PARTITIONS_GATE}"
    gated = ServerFields.of_release(35, ALL_GATES)
    assert run(gated, MIG_1G).fits  # the gate on: partitions published and allocated
    assert run(gated, MIG_1G).needs == []


def test_a_mig_device_that_exists_is_served_without_the_gate() -> None:
    """Partitions withheld: the MIG devices an administrator made are published (static), and a request
    they satisfy fits with no word of gates."""
    node = inv.node(inv.h100(0, mig_enabled=True, layout=[("1g.10gb", 0)]), inv.h100(1))
    fields = ServerFields.of_release(35)
    answer = run(fields, MIG_1G, slices=published(fields, node))
    assert answer.fits and answer.needs == []
    two = request("mig", "mig.gpudra.io", f'{A}.profile == "1g.10gb"', count=2)
    answer = run(fields, two, slices=published(fields, node))  # one exists; a second needs partitions
    assert answer.needs == [f"request mig (class mig.gpudra.io): {PARTITIONS_GATE}"]


def test_whole_gpus_are_served_everywhere_and_what_else_stops_them_is_said_as_before() -> None:
    fields = ServerFields.of_release(34)
    assert run(fields, WHOLE).fits
    lacking = request("gpu", "gpu.gpudra.io", f'{A}.productName == "NVIDIA H200"')
    answer = run(fields, lacking)
    assert answer.needs == []
    assert answer.verdict.startswith('cannot fit: no device has productName == "NVIDIA H200"')


def test_each_request_that_needs_a_gate_gets_a_line_of_its_own() -> None:
    fields = ServerFields.of_release(35)
    answer = run(fields, SHARE, MIG_1G, WHOLE)
    assert answer.needs == [
        f"request gpu (class gpu-shared.gpudra.io): {SHARES_1_36}",
        f"request mig (class mig.gpudra.io): {PARTITIONS_GATE}",
    ]
    assert answer.verdict == f"cannot fit: {answer.needs[0]} (and 1 more below)"


def test_a_first_available_choice_that_is_served_keeps_the_request_from_needing_the_gate() -> None:
    share = {"name": "share", "deviceClassName": "gpu-shared.gpudra.io"}
    whole = {"name": "whole", "deviceClassName": "gpu.gpudra.io"}
    fields = ServerFields.of_release(35)
    assert run(fields, {"name": "gpu", "firstAvailable": [share, whole]}).fits
    three = {"name": "gpu", "firstAvailable": [share, {**whole, "count": 3}]}
    answer = run(fields, three)  # two GPUs: neither choice can be had
    assert answer.needs == [f"request gpu/share (class gpu-shared.gpudra.io): {SHARES_1_36}"]


def test_a_server_that_keeps_everything_adds_nothing() -> None:
    fields = ServerFields.of_release(36)
    taken = request("gpu", "gpu-shared.gpudra.io", capacity={"requests": {"memory": "100Gi"}})
    answer = run(fields, taken)
    assert not answer.fits and answer.needs == []


# --- the command ---------------------------------------------------------------------------------


def write(path: Path, *objects: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(objects))
    return path


def template(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": list(requests)}}},
    }


def test_explain_offline_takes_the_server_minor_and_gates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fields = ServerFields.of_release(35)
    nodes = write(tmp_path / "node.yaml", {"apiVersion": "v1", "kind": "List", "items": published(fields)})
    claims = write(tmp_path / "claims.yaml", template("share", SHARE), template("mig", MIG_1G))
    assert cli.main(["explain", str(claims), "--slices", str(nodes), "--server-minor=35"]) == 1
    out = capsys.readouterr().out
    assert (
        f"== template default/share ==\ncannot fit: request gpu (class gpu-shared.gpudra.io): {SHARES_1_36}\n"
        in out
    )
    assert (
        f"== template default/mig ==\ncannot fit: request mig (class mig.gpudra.io): {PARTITIONS_GATE}\n"
        in out
    )
    # the same slices, asked about a 1.35 whose DRAPartitionableDevices is on: shares still wait for 1.36
    gates = "--feature-gates=DRAPartitionableDevices=true,DRAConsumableCapacity=true"
    assert (
        cli.main(["explain", str(claims), "--slices", str(nodes), "--server-minor=35", gates, "-o", "json"])
        == 1
    )
    lines = documents(capsys.readouterr().out)
    assert lines[0]["needs"] == [
        "request gpu (class gpu-shared.gpudra.io): GPU shares are not available before Kubernetes 1.36: the "
        "1.35 scheduler does not count the counters shares consume (fixed in 1.36), so a share and its whole "
        "GPU could go to two claims"
    ]
    assert lines[1]["needs"] == []  # partitions are kept: these slices simply have none (a static node)


def test_explain_offline_defaults_to_the_newest_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = build_devices(inv.node(inv.h100(0)), mig_mode="static", shares=False)
    items = build_slices(model, driver=DRIVER, node_name="n", generation=1, server_minor=36)
    nodes = write(tmp_path / "node.yaml", {"apiVersion": "v1", "kind": "List", "items": items})
    claims = write(tmp_path / "claims.yaml", template("share", SHARE))
    assert cli.main(["explain", str(claims), "--slices", str(nodes)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("cannot fit: request gpu: no device of class gpu-shared.gpudra.io on this node")
    assert "needs:" not in out and "feature gate" not in out


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "--feature-gates=DRAPartitionableDevices",
            "--feature-gates: 'DRAPartitionableDevices' is not Gate=true",
        ),
        ("--server-minor=33", "--server-minor: 1.33 is older than 1.34"),
    ],
)
def test_explain_refuses_a_bad_release_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, message: str
) -> None:
    nodes = write(tmp_path / "node.yaml", {"apiVersion": "v1", "kind": "List", "items": []})
    claims = write(tmp_path / "claims.yaml", template("share", SHARE))
    assert cli.main(["explain", str(claims), "--slices", str(nodes), option]) == 2
    assert message in capsys.readouterr().err


MIG_PAIR = {
    "requests": [
        request("a", "mig.gpudra.io", f'{A}.profile == "2g.20gb"'),
        request("b", "mig.gpudra.io", f'{A}.profile == "2g.20gb"'),
    ],
    "constraints": [{"matchAttribute": "gpu.gpudra.io/parentUUID"}],
}


@pytest.mark.parametrize("minor", [34, 35])
def test_before_1_36_a_constraint_over_partitions_is_noted_as_the_scheduler_may_never_allocate_it(
    minor: int,
) -> None:
    """Observed with the gates on (make compat): on 1.34.12 two 2g.20gb partitions of one H100 under
    matchAttribute parentUUID stay pending for good, on 1.35.8 examples/mig-mixed.yaml in one cluster
    and not another, while gpudra's rules (and 1.36) allocate them."""
    fields = ServerFields.of_release(minor, ALL_GATES)
    claim = ClaimToExplain("ns/c", read_spec({"devices": MIG_PAIR}))
    answer = explain(
        [claim], classes=CLASSES, inventory=ClusterInventory(published(fields)), server=fields, driver=DRIVER
    )
    assert answer.fits and answer.needs == []
    assert answer.release == [
        f"the Kubernetes 1.{minor} scheduler may never allocate requests a, b together: they take MIG "
        "partitions under constraint matchAttribute gpu.gpudra.io/parentUUID over all requests, and it "
        "keeps the counters of a partition the constraint turned down reserved (kubernetes#140436); 1.36.3 "
        "and later allocate them"
    ]
    for other in (ServerFields.of_release(36), ServerFields.of_release(minor)):  # no partitions: no note
        assert (
            explain(
                [claim],
                classes=CLASSES,
                inventory=ClusterInventory(published(other)),
                server=other,
                driver=DRIVER,
            ).release
            == []
        )


# --- the controller's admission warnings -----------------------------------------------------------


def reach_on(fields: ServerFields, slices: list[dict[str, Any]]) -> Reach:
    inventory = ClusterInventory(slices)
    return Reach(
        [d for p in inventory.pools.values() for d in p.devices],
        CLASSES,
        driver_classes(CLASS_OBJECTS, driver=DRIVER),
        withheld=withheld_on(fields_seen(fields.minor, slices)),
        driver=DRIVER,
    )


def test_the_admission_warning_names_the_gate_a_share_or_partition_needs() -> None:
    fields = ServerFields.of_release(35)
    reach = reach_on(fields, published(fields))
    share = {"kind": "ResourceClaim", "spec": {"devices": {"requests": [SHARE]}}}
    assert reach.warnings(read_spec_of(share)) == [
        "spec.devices.requests[0] (gpu): no GPU published by any node matches class gpu-shared.gpudra.io; "
        "2 devices checked",
        f"spec.devices.requests[0] (gpu): {SHARES_1_36.split(': the API', maxsplit=1)[0]}",
    ]
    mig = {"kind": "ResourceClaimTemplate", "spec": {"spec": {"devices": {"requests": [MIG_1G]}}}}
    assert (
        reach.warnings(read_spec_of(mig))[1]
        == f"spec.spec.devices.requests[0] (mig): {PARTITIONS_GATE.split(': the API', maxsplit=1)[0]}"
    )
    whole = {"kind": "ResourceClaim", "spec": {"devices": {"requests": [WHOLE]}}}
    assert reach.warnings(read_spec_of(whole)) == []


def test_the_controller_sees_a_gate_turned_on_in_the_slices_the_nodes_stored() -> None:
    """No probe (its role may not create slices): the release's defaults, and what the slices carry."""
    gated = ServerFields.of_release(35, ALL_GATES)
    slices = published(gated)
    assert fields_seen(35, slices) == ServerFields(
        minor=35, counters=True, consumable_capacity=False, device_taints=False
    )
    assert fields_seen(35, []) == ServerFields.of_release(35)
    assert fields_seen(37, []) == ServerFields.of_release(37)
    reach = reach_on(gated, slices)
    mig = {"kind": "ResourceClaim", "spec": {"devices": {"requests": [MIG_1G]}}}
    assert reach.warnings(read_spec_of(mig)) == []  # partitions published and kept: nothing to warn of
    share = {"kind": "ResourceClaim", "spec": {"devices": {"requests": [SHARE]}}}
    assert (
        reach.warnings(read_spec_of(share))[1]
        == "spec.devices.requests[0] (gpu): GPU shares are not available before Kubernetes 1.36 (feature "
        "gate DRAConsumableCapacity on by default there)"
    )


# --- online: what the cluster's API server keeps ---------------------------------------------------


class Cluster:
    """The two calls explain makes to learn what the API server keeps: its version and a dry run."""

    def __init__(self, minor: int, *, refuse: bool = False) -> None:
        self.minor = minor
        self.refuse = refuse
        self.dry_runs: list[dict[str, Any]] = []

    def server_minor(self) -> int:
        return self.minor

    def create_slice(self, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        assert dry_run, "explain never stores a slice"
        if self.refuse:
            raise ClusterError("creating ResourceSlice: HTTP 403 Forbidden")
        self.dry_runs.append(body)
        return {"spec": {"devices": [{"name": "probe-0"}]}}  # a 1.35 without the gates: every field dropped


def server_of(cluster: Cluster, *options: str) -> tuple[ServerFields | None, list[str]]:
    args = cli.build_parser().parse_args(["explain", "x.yaml", *options])
    inputs = explain_cli.Inputs()
    explain_cli._server(inputs, cluster, args)  # the two calls a Kube makes
    return inputs.fields, inputs.notes


def test_online_the_server_is_probed_with_a_dry_run_as_the_plugin_probes_it() -> None:
    cluster = Cluster(35)
    assert server_of(cluster) == (
        ServerFields(minor=35, counters=False, consumable_capacity=False, device_taints=False),
        [],
    )
    assert cluster.dry_runs and cluster.dry_runs[0]["spec"]["nodeName"] == explain_cli.PROBE_NODE


def test_online_a_refused_probe_falls_back_to_the_release_defaults_and_says_so() -> None:
    fields, notes = server_of(Cluster(35, refuse=True))
    assert fields == ServerFields.of_release(35)
    assert notes == [
        "what the API server keeps is assumed from Kubernetes 1.35's default feature gates: a dry run of a "
        "probe ResourceSlice failed (creating ResourceSlice: HTTP 403 Forbidden); --feature-gates says "
        "otherwise"
    ]


def test_online_the_options_say_instead_of_a_probe() -> None:
    cluster = Cluster(35)
    gates = "--feature-gates=DRAPartitionableDevices=true"
    assert server_of(cluster, gates)[0] == ServerFields.of_release(35, {"DRAPartitionableDevices": True})
    assert server_of(cluster, "--server-minor=37")[0] == ServerFields.of_release(37)
    assert cluster.dry_runs == []


class PodLister:
    def __init__(self, pods: list[dict[str, Any]] | None) -> None:
        self.pods = pods

    def list_unfinished_pods(self) -> list[dict[str, Any]]:
        if self.pods is None:
            raise Forbidden("listing pods: HTTP 403 Forbidden: pods is forbidden")
        return self.pods


def test_online_pods_that_cannot_be_listed_leave_allocatable_only_and_a_note() -> None:
    pods = [{"metadata": {"namespace": "a", "name": "p"}}, {"metadata": {"namespace": "a", "name": "me"}}]
    inputs = explain_cli.Inputs()
    explain_cli._running_pods(inputs, PodLister(pods), ("a", "me"))
    assert inputs.running == pods[:1] and inputs.notes == []  # the pod explained is not counted
    refused = explain_cli.Inputs()
    explain_cli._running_pods(refused, PodLister(None), None)
    assert refused.running == []
    assert refused.notes == [
        "cpu, memory and pod counts are checked against allocatable only: the pods already on the nodes "
        "could not be listed (listing pods: HTTP 403 Forbidden: pods is forbidden)"
    ]
