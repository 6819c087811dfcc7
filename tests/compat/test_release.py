"""gpudra on the release and gates of this run: what it can serve is allocated by the real scheduler and
prepared, what it cannot is withheld and reported, and no GPU ever goes to two claims.

The table below is the support matrix docs/install.md states; each cell is checked here on a real
control plane of that release (`make compat` runs 1.34, 1.35 and 1.37 with default gates and 1.34/1.35
with the DRA gates on; `make test` the pinned 1.36).
"""

from __future__ import annotations

import functools
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client, utils
from kubernetes.dynamic import DynamicClient

from gpudra.model.publishing import WITHHELD_FORMS
from tests.integration.kube_helpers import pod_running, unschedulable, wait_for
from tests.integration.test_chart import NAMESPACE, VALUES_EXAMPLES, render
from tests.integration.test_chart import _apply as apply
from tests.localcluster.cluster import feature_gates_from_env
from tests.localcluster.node_plugin import PluginProcess
from tests.localcluster.processes import http_get, scrape

from .conftest import REPO

# feature -> (example, node it must land on)
FEATURES = {
    "whole": ("single-gpu.yaml", None),
    "time-slicing": ("time-slicing.yaml", None),
    "mps": ("mps.yaml", None),
    "mig": ("mig-1g.yaml", "node-h100"),
    "shares": ("gpu-share.yaml", "node-h100"),
}
EVERY = frozenset(FEATURES)
BASIC = frozenset({"whole", "time-slicing", "mps"})
# (minor, DRA gates on) -> what gpudra serves there; what it withholds on node-h100 (which offers
# partitions and shares) and on node-mixed (shares).
MATRIX: dict[tuple[int, bool], tuple[frozenset[str], set[str], set[str]]] = {
    (34, False): (BASIC, {"partitions", "shares", "health-taints"}, {"shares", "health-taints"}),
    (35, False): (BASIC, {"partitions", "shares", "health-taints"}, {"shares", "health-taints"}),
    # The gates keep counter sets, but before 1.36 the scheduler does not count a share's counters.
    (34, True): (BASIC | {"mig"}, {"shares"}, {"shares"}),
    (35, True): (BASIC | {"mig"}, {"shares"}, {"shares"}),
    (36, False): (EVERY, set(), set()),
    (37, False): (EVERY, set(), set()),
}


def server_minor(api: client.ApiClient) -> int:
    return int("".join(c for c in client.VersionApi(api).get_code().minor if c.isdigit()))


@pytest.fixture(scope="module")
def cell(api: client.ApiClient) -> tuple[int, bool]:
    minor, gated = server_minor(api), bool(feature_gates_from_env())
    if (minor, gated) not in MATRIX:
        pytest.fail(f"no expectation for Kubernetes 1.{minor} with gates {'on' if gated else 'off'}: add it")
    return minor, gated


@pytest.fixture(scope="module")
def applied(api: client.ApiClient, gpudra: dict[str, PluginProcess]) -> dict[str, tuple[str, list[str]]]:
    """Every feature's example applied at once, each in a namespace of its own: feature -> (ns, pods)."""
    core = client.CoreV1Api(api)
    found = {}
    for feature, (example, _) in FEATURES.items():
        objects = [d for d in yaml.safe_load_all((REPO / "examples" / example).read_text()) if d]
        namespace = f"{feature}-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": namespace}})
        utils.create_from_yaml(api, yaml_objects=objects, namespace=namespace)
        found[feature] = (namespace, [o["metadata"]["name"] for o in objects if o["kind"] == "Pod"])
    return found


def test_what_the_release_can_serve_runs_and_the_rest_waits(
    api: client.ApiClient, applied: dict[str, tuple[str, list[str]]], cell: tuple[int, bool]
) -> None:
    core = client.CoreV1Api(api)
    served = MATRIX[cell][0]
    for feature, (namespace, pods) in applied.items():
        for name in pods:
            if feature in served:
                pod = wait_for(
                    f"{feature}: {name} Running",
                    functools.partial(pod_running, core, name, namespace),
                    timeout=90,
                )
                node = FEATURES[feature][1]
                assert node is None or pod.spec.node_name == node, feature
            else:
                wait_for(
                    f"{feature}: {name} unschedulable",
                    functools.partial(unschedulable, core, name, namespace),
                    timeout=60,
                )


def test_no_gpu_goes_to_two_claims(
    applied: dict[str, tuple[str, list[str]]], gpudra: dict[str, PluginProcess], cell: tuple[int, bool]
) -> None:
    holders: dict[str, list[tuple[str, str]]] = {}
    for plugin in gpudra.values():
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
    api: client.ApiClient, gpudra: dict[str, PluginProcess], cell: tuple[int, bool]
) -> None:
    _, on_h100, on_mixed = MATRIX[cell]
    for node, expected in (("node-h100", on_h100), ("node-mixed", on_mixed)):
        plugin = gpudra[node]
        samples = scrape(f"http://127.0.0.1:{plugin.metrics_port}/metrics", f"gpudra on {node}")
        withheld = {
            form
            for form in WITHHELD_FORMS
            if samples.get(f'gpudra_publishing_withheld{{form="{form}"}}') == 1.0
        }
        assert withheld == expected, node
        events = client.CoreV1Api(api).list_namespaced_event(
            "default",
            field_selector=f"involvedObject.kind=Node,involvedObject.name={node},reason=PublishingWithheld",
        )
        assert len(events.items) == len(expected), node
        # a gate left off is a configuration, not a fault: the plugin stays ready
        ready = scrape_status(plugin)
        assert ready == 200, node


def scrape_status(plugin: PluginProcess) -> int:
    status, _ = http_get(f"http://127.0.0.1:{plugin.metrics_port}/readyz")
    return status


def test_every_slice_is_stored_as_written(api: client.ApiClient, gpudra: dict[str, PluginProcess]) -> None:
    """Nothing published is silently cut down by the API server: what it stored carries every field."""
    found = client.CustomObjectsApi(api).list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")
    devices = [d for s in found["items"] for d in s["spec"].get("devices", [])]
    assert devices
    for device in devices:
        if device["name"].endswith("-shared"):
            assert device.get("allowMultipleAllocations") is True, device["name"]
        if "-mig-" in device["name"] and "uuid" not in device["attributes"]:  # on demand
            assert device.get("consumesCounters"), device["name"]


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
