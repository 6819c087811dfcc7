"""`make demo` on the release and gates of this run: every example the release can serve is allocated by
the real scheduler and prepared, every one it cannot is reported as such (gpudra explain's line, the
nodes' PublishingWithheld events and gpudra_publishing_withheld) and left unscheduled, and no GPU ever
goes to two claims; never a failed install or a silent loss.

The tables below are the support matrix docs/install.md states; each cell is checked here on a real
control plane of that release (`make compat` runs 1.34, 1.35 and 1.36 with default gates and 1.34/1.35
with the DRA gates on; `make test` the pinned 1.37).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from gpudra.model.devices import UNHEALTHY_TAINT_KEY
from gpudra.model.publishing import WITHHELD_FORMS
from gpudra.sim import hooks as sim
from tests.integration.chart import NAMESPACE, VALUES_EXAMPLES, apply, render
from tests.integration.kube_helpers import wait_for
from tests.localcluster.api import DemoApi
from tests.localcluster.cluster import feature_gates_from_env
from tests.localcluster.demo import NAMESPACE as DEMO_NAMESPACE
from tests.localcluster.demo import Demo
from tests.localcluster.demo_installs import HostProcesses
from tests.localcluster.node_plugin import DRIVER
from tests.localcluster.processes import http_get, scrape

# The example pods by the form of the GPUs they ask for (examples/*.yaml).
SHARES = {"share-10gi", "share-20gi", "share-40gi", "time-sliced-a", "time-sliced-b"}  # gpu-shared class
PARTITIONS = {"mig-1g", "mig-mixed"}  # MIG profiles of an H100 that no MIG device has: made on demand
EVERY = {
    "single-gpu",
    "gpu-pair-nvlink",
    "l4-inference",
    "shared-gpu",  # time-slicing
    "mps-client-a",
    "mps-client-b",
    "mig-static-3g",  # the administrator's MIG device on node-a100 (static)
    *PARTITIONS,
    *SHARES,
}

PARTITIONS_NEED = (
    "MIG partitions on demand need feature gate DRAPartitionableDevices (on by default from 1.36)"
)
SHARES_NEED = "GPU shares are not available before Kubernetes 1.36"
SHARES_NEED_GATES = (
    f"{SHARES_NEED} (feature gates DRAPartitionableDevices and DRAConsumableCapacity on by default there)"
)
MAY_NEVER = "scheduler may never allocate requests eval, tokenizer, trainer together"


class Cell:
    """What one release with its gates serves of the demo, and how it reports the rest."""

    def __init__(
        self,
        *,
        needs: dict[str, str] | None = None,
        at_risk: dict[str, str] | None = None,
        withheld: dict[str, set[str]] | None = None,
        taints: bool,
    ) -> None:
        self.needs = needs or {}  # pod -> what explain says it needs (the start of its line's verdict)
        self.at_risk = at_risk or {}  # pod -> explain's note on what the release's scheduler may not do
        self.served = EVERY - set(self.needs) - set(self.at_risk)
        self.withheld = withheld or {}  # node -> the forms its plugin withholds
        self.taints = taints  # an unhealthy GPU tainted (else left out of the slices)


DEFAULT_1_34_1_35 = Cell(
    needs={
        **dict.fromkeys(PARTITIONS, PARTITIONS_NEED),
        **dict.fromkeys(SHARES, SHARES_NEED_GATES),
    },
    withheld={
        "node-h100": {"partitions", "shares", "health-taints"},
        "node-a100": {"shares", "health-taints"},
        "node-mixed": {"shares", "health-taints"},
    },
    taints=False,
)
GATES_ON_1_34_1_35 = Cell(
    needs=dict.fromkeys(SHARES, SHARES_NEED),
    at_risk={"mig-mixed": MAY_NEVER},
    withheld={"node-h100": {"shares"}, "node-a100": {"shares"}, "node-mixed": {"shares"}},
    taints=True,
)
MATRIX: dict[tuple[int, bool], Cell] = {
    (34, False): DEFAULT_1_34_1_35,
    (35, False): DEFAULT_1_34_1_35,
    # The gates keep counter sets, but before 1.36 the scheduler does not count a share's counters; and
    # its allocator can leave a claim of several partitions under a constraint pending for good.
    (34, True): GATES_ON_1_34_1_35,
    (35, True): GATES_ON_1_34_1_35,
    (36, False): Cell(taints=True),
    (37, False): Cell(taints=True),
}


def server_minor(api: client.ApiClient) -> int:
    return int("".join(c for c in client.VersionApi(api).get_code().minor if c.isdigit()))


@pytest.fixture(scope="module")
def cell(api: client.ApiClient) -> Cell:
    minor, gated = server_minor(api), bool(feature_gates_from_env())
    if (minor, gated) not in MATRIX:
        pytest.fail(f"no expectation for Kubernetes 1.{minor} with gates {'on' if gated else 'off'}: add it")
    return MATRIX[(minor, gated)]


def test_what_the_release_serves_is_allocated_and_prepared(
    api: client.ApiClient, demo: Demo, gpudra: HostProcesses, cell: Cell
) -> None:
    """The demo waited for the pods explain said this cluster serves; they are those the matrix says,
    each Running with its claims allocated and prepared on its node (a CDI spec per claim)."""
    assert set(demo.served) == cell.served
    core = client.CoreV1Api(api)
    claims = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "resource.k8s.io", "v1", DEMO_NAMESPACE, "resourceclaims"
    )["items"]
    by_name = {c["metadata"]["name"]: c for c in claims}
    for name in cell.served:
        pod = core.read_namespaced_pod(name, DEMO_NAMESPACE)
        assert pod.status.phase == "Running", name
        specs = gpudra.plugins[pod.spec.node_name].cdi_specs()
        for status in pod.status.resource_claim_statuses or []:
            claim = by_name[status.resource_claim_name]
            assert claim["status"]["allocation"]["devices"]["results"], name
            assert claim["metadata"]["uid"] in specs, f"{name}: claim not prepared on {pod.spec.node_name}"


def test_what_the_release_cannot_serve_is_reported_and_left_unscheduled(
    api: client.ApiClient, demo: Demo, cell: Cell
) -> None:
    """gpudra explain names the gate or release each such pod needs (one line per request), and the
    scheduler allocates nothing to it: the demo found each unschedulable."""
    gated = {pod: judged.needs for pod, judged in demo.judged.items() if judged.needs}
    assert set(gated) == set(cell.needs)
    for pod, lines in gated.items():
        assert all(cell.needs[pod] in line for line in lines), (pod, lines)
        found = client.CoreV1Api(api).read_namespaced_pod(pod, DEMO_NAMESPACE)
        assert found.spec.node_name is None, pod
    at_risk = {pod: judged.release for pod, judged in demo.judged.items() if judged.release}
    assert {pod: [cell.at_risk[pod] in line for line in lines] for pod, lines in at_risk.items()} == {
        pod: [True] for pod in cell.at_risk
    }


def test_no_gpu_goes_to_two_claims(demo: Demo, gpudra: HostProcesses) -> None:
    holders: dict[str, list[tuple[str, str]]] = {}
    for plugin in gpudra.plugins.values():
        for uid, entry in plugin.checkpoint_claims().items():
            for device in entry["devices"]:
                form = (
                    "mig" if "-mig-" in device["device"] else ("share" if device.get("share_id") else "whole")
                )
                for gpu in device["gpu_uuids"][:1]:
                    holders.setdefault(gpu, []).append((uid, form))
    assert holders, "nothing prepared"
    for gpu, held in holders.items():
        forms = {form for _, form in held}
        if "whole" in forms:
            assert len(held) == 1, f"{gpu} is held whole and by others: {held}"
        assert len(forms) == 1, f"{gpu} is held in two forms: {held}"


def test_what_is_withheld_is_reported(
    api: client.ApiClient, demo: Demo, gpudra: HostProcesses, cell: Cell
) -> None:
    """Each node's plugin reports each form it left out: gpudra_publishing_withheld{form} 1 and one
    PublishingWithheld event (which the demo printed), and stays ready: a gate left off is a
    configuration, not a fault."""
    for node, plugin in gpudra.plugins.items():
        expected = cell.withheld.get(node, set())
        samples = scrape(f"http://127.0.0.1:{plugin.metrics_port}/metrics", f"gpudra on {node}")
        withheld = {
            form
            for form in WITHHELD_FORMS
            if samples.get(f'gpudra_publishing_withheld{{form="{form}"}}') == 1.0
        }
        assert withheld == expected, node
        assert len(demo.withheld[node]) == len(expected), node
        status, _ = http_get(f"http://127.0.0.1:{plugin.metrics_port}/readyz")
        assert status == 200, node


def test_every_slice_is_stored_as_written(api: client.ApiClient, demo: Demo) -> None:
    """Nothing published is silently cut down by the API server: what it stored carries every field."""
    found = client.CustomObjectsApi(api).list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")
    devices = [d for s in found["items"] for d in s["spec"].get("devices", [])]
    assert devices
    for device in devices:
        if device["name"].endswith("-shared"):
            assert device.get("allowMultipleAllocations") is True, device["name"]
        if "-mig-" in device["name"] and "uuid" not in device["attributes"]:  # on demand
            assert device.get("consumesCounters"), device["name"]


def test_an_unhealthy_gpu_is_tainted_or_left_out(
    api: client.ApiClient, demo: Demo, gpudra: HostProcesses, cell: Cell, tmp_path: Path
) -> None:
    """A GPU that falls off the bus is tainted where the server keeps taints, else its devices leave
    the slices; either way no new claim gets it, and what a user reads shows it (`gpudra status`, as
    JSON and as text, and the controller's gpudra_cluster_gpus{state="unhealthy"}). It comes back when
    the GPU does."""
    plugin = gpudra.plugins["node-mixed"]
    held = {
        gpu
        for entry in plugin.checkpoint_claims().values()
        for d in entry["devices"]
        for gpu in d["gpu_uuids"]
    }
    devices = _devices(api, "node-mixed")
    name, uuid = next(
        (n, d["attributes"]["uuid"]["string"])
        for n, d in sorted(devices.items())
        if d["attributes"]["type"]["string"] == "gpu" and d["attributes"]["uuid"]["string"] not in held
    )
    sim.set_gpu_lost(state_file=plugin.sim_state, gpu_uuid=uuid, lost=True)
    try:
        if cell.taints:
            tainted = wait_for(
                f"{name} tainted", lambda: _taint_keys(_devices(api, "node-mixed").get(name)), timeout=60
            )
            assert tainted == [UNHEALTHY_TAINT_KEY]
        else:
            wait_for(f"{name} left out", lambda: name not in _devices(api, "node-mixed"), timeout=60)
        _assert_status_shows(gpudra, api, tmp_path, name, uuid, "tainted" if cell.taints else "left-out")
    finally:
        sim.set_gpu_lost(state_file=plugin.sim_state, gpu_uuid=uuid, lost=False)
    wait_for(
        f"{name} published untainted again",
        lambda: _healthy(_devices(api, "node-mixed").get(name)),
        timeout=60,
    )
    endpoint = gpudra.controller(DemoApi(api))
    wait_for("gpudra status to list no GPU unhealthy", lambda: endpoint.get()["unhealthy"] == [], timeout=60)


def _assert_status_shows(
    gpudra: HostProcesses, api: client.ApiClient, tmp_path: Path, name: str, uuid: str, slices: str
) -> None:
    """`gpudra status` (its JSON and its text) and the controller's metric show the GPU unhealthy, with
    how the slices show it and the node's words."""
    endpoint = gpudra.controller(DemoApi(api))

    def listed() -> list[dict[str, Any]]:
        return [d for d in endpoint.get()["unhealthy"] if (d["node"], d["device"]) == ("node-mixed", name)]

    [shown] = wait_for("gpudra status to list the GPU unhealthy", listed, timeout=60)
    assert (shown["uuid"], shown["slices"], shown["reason"]) == (uuid, slices, "NVMLError_GpuIsLost"), shown
    assert shown["message"] == f"GPU {uuid}: NVMLError_GpuIsLost", shown
    text = subprocess.run(
        [sys.executable, "-m", "gpudra", "status", *endpoint.cli_args(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split() for line in text.split("Unhealthy GPUs")[1].splitlines()[2:] if line.strip()]
    assert ["node-mixed", name] in [row[:2] for row in rows], text
    assert ("left out (no device taints on this release)" if slices == "left-out" else "tainted") in text
    unhealthy = {
        key: value
        for key, value in gpudra.controller_process.metrics().items()
        if key.startswith("gpudra_cluster_gpus{")
        and 'node="node-mixed"' in key
        and 'state="unhealthy"' in key
    }
    assert sum(unhealthy.values()) == 1, unhealthy


def _devices(api: client.ApiClient, node: str) -> dict[str, dict[str, Any]]:
    found = client.CustomObjectsApi(api).list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.driver={DRIVER},spec.nodeName={node}"
    )
    return {d["name"]: d for s in found["items"] for d in s["spec"].get("devices", [])}


def _healthy(device: dict[str, Any] | None) -> bool:
    return device is not None and not device.get("taints")


def _taint_keys(device: dict[str, Any] | None) -> list[str]:
    return [t["key"] for t in (device or {}).get("taints") or []]


@pytest.mark.parametrize(
    "values", [None, *VALUES_EXAMPLES], ids=["defaults", *(p.stem for p in VALUES_EXAMPLES)]
)
def test_the_chart_passes_a_server_side_dry_run(api: client.ApiClient, values: Path | None) -> None:
    """What Helm would install on this release is accepted by its API server (the DeviceClasses' CEL
    compiles, every field is known), with the default values and each tested example."""
    core = client.CoreV1Api(api)
    if not any(n.metadata.name == NAMESPACE for n in core.list_namespace().items):
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    dynamic = DynamicClient(api)
    refused = []
    for obj in render(*(["--values", str(values)] if values else [])):
        try:
            apply(dynamic, obj, dry_run=True)
        except client.ApiException as err:
            refused.append(f"{obj['kind']} {obj['metadata']['name']}: {err.status} {err.body}")
    assert refused == []
