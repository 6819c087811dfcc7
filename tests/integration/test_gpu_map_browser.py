"""The GPU map page in a real browser: headless Chromium loads it from a real `gpudra controller` and from
`gpudra status --web` on the local cluster (real API server, scheduler, kubelets and gpudra's plugins on
simulated GPUs), and the DOM its script drew is checked against the API's objects: GPUs per node, the
MIG slots of each GPU and the claim in each, the idle marker, and a pending claim with explain's reason.
The pending claim's selector carries markup, which explain quotes: the page must show it as text."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, utils
from kubernetes.client.exceptions import ApiException

from tests.localcluster import LocalCluster
from tests.localcluster.browser import Element, dump_dom
from tests.localcluster.cluster import TOKEN, free_port
from tests.localcluster.controller import NAMESPACE, ControllerProcess
from tests.localcluster.node_plugin import DRIVER, PluginProcess
from tests.localcluster.token_proxy import token_proxy

from .kube_helpers import Resources, claim_pod, claim_template, new_namespace, pod_gone, pod_running, wait_for

IDLE_AFTER = 3.0
MARKUP = "<img src=x onerror=alert(1)>"
ATTRS = f'device.attributes["{DRIVER}"]'


def _mig_template(name: str) -> dict[str, Any]:
    """One 3g.40gb partition of node-h100's gpu-1."""
    selector = f'{ATTRS}.profile == "3g.40gb" && {ATTRS}.parentMinor == 1'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "mig",
                            "exactly": {
                                "deviceClassName": "mig.gpudra.io",
                                "selectors": [{"cel": {"expression": selector}}],
                            },
                        }
                    ]
                }
            }
        },
    }


def _hostile_claim(name: str) -> dict[str, Any]:
    """A claim no GPU can satisfy, whose selector holds markup (a tenant writes selectors)."""
    selector = f'{ATTRS}.productName == "{MARKUP}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.gpudra.io",
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


class Workload:
    """Two pods and a pending claim in one namespace; the claims the scheduler made for the pods."""

    def __init__(self, namespace: str, claims: dict[str, dict[str, Any]]) -> None:
        self.namespace = namespace
        self.claims = claims  # pod -> its allocated ResourceClaim


@pytest.fixture(scope="module")
def workload(api: client.ApiClient, gpudra: dict[str, PluginProcess]) -> Iterator[Workload]:
    core = client.CoreV1Api(api)
    resources = Resources(api)
    mixed = gpudra["node-mixed"]
    mixed.stop()
    mixed.start(usage_interval=1)  # the idle marker comes from the plugin's usage reports
    namespace = new_namespace(core, "gpumap")
    try:
        utils.create_from_yaml(
            api,
            yaml_objects=[
                _mig_template("mig"),
                claim_template("one-gpu"),
                claim_pod("mig-pod", {"mig": "mig"}, "node-h100"),
                claim_pod("sleepy", {"gpu": "one-gpu"}, "node-mixed"),
            ],
            namespace=namespace,
        )
        resources.create("resourceclaims", _hostile_claim("never"), namespace)
        claims = {}
        for pod in ("mig-pod", "sleepy"):
            running = wait_for(pod, partial(pod_running, core, pod, namespace), timeout=120)
            name = running.status.resource_claim_statuses[0].resource_claim_name
            claims[pod] = resources.get("resourceclaims", name, namespace)
        yield Workload(namespace, claims)
    finally:
        core.delete_namespace(namespace)
        for pod in ("mig-pod", "sleepy"):
            wait_for("pod gone", partial(pod_gone, core, pod, namespace), timeout=120)
        mixed.stop()
        mixed.start()


@pytest.fixture(scope="module")
def controller(
    cluster: LocalCluster, workload: Workload, api: client.ApiClient
) -> Iterator[ControllerProcess]:
    # The map is served on the webhook's HTTPS port, so this replica runs the webhook too (its
    # configuration goes with it, as test_controller.py's does).
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})  # its Lease and Secret
    except ApiException as err:
        if err.status != 409:
            raise
    replica = ControllerProcess(
        cluster, "ctl-map", webhook_url_port=free_port(), idle_after_seconds=IDLE_AFTER
    )
    try:
        replica.start()
        yield replica
    finally:
        replica.stop()
        client.AdmissionregistrationV1Api(api).delete_validating_webhook_configuration("gpudra")


def _slices_by_node(resources: Resources) -> dict[str, list[dict[str, Any]]]:
    devices: dict[str, list[dict[str, Any]]] = {}
    for s in resources.list("resourceslices"):
        if s["spec"]["driver"] == DRIVER:
            devices.setdefault(s["spec"]["nodeName"], []).extend(s["spec"].get("devices", []))
    return devices


def _attr(device: dict[str, Any], name: str) -> Any:
    value = device.get("attributes", {}).get(name, {})
    return next(iter(value.values()), None)


def _gpus(devices: list[dict[str, Any]]) -> dict[str, str]:
    """The physical GPUs a node publishes, name -> UUID: whole GPUs, and the parents of MIG partitions
    (an A100 with MIG on offers only its partitions)."""
    found = {
        f"gpu-{_attr(d, 'parentMinor')}": _attr(d, "parentUUID") for d in devices if _attr(d, "type") == "mig"
    }
    for d in devices:
        if _attr(d, "type") == "gpu" and not d.get("allowMultipleAllocations"):
            found[d["name"]] = _attr(d, "uuid")
    return found


def _cards(dom: Element, node: str) -> dict[str, Element]:
    [section] = dom.find_all(lambda e: e.tag == "section" and e.attrs.get("data-node") == node)
    return {card.attrs["data-gpu"]: card for card in section.by_class("gpu")}


def _check_map(dom: Element, workload: Workload, resources: Resources) -> None:
    assert "hidden" in dom.by_id("error").attrs, dom.by_id("error").text
    assert not dom.find_all(lambda e: e.tag == "img"), "markup from the API was parsed"
    slices = _slices_by_node(resources)
    shown = {e.attrs["data-node"] for e in dom.find_all(lambda e: e.tag == "section")}
    assert shown == set(slices)
    for node, devices in slices.items():
        cards = _cards(dom, node)
        gpus = _gpus(devices)
        assert set(cards) == set(gpus), node  # every published GPU, no other
        for name, uuid in gpus.items():
            assert cards[name].attrs["data-uuid"] == uuid
            placements = [
                _attr(d, "placementStart") + _attr(d, "placementSize")
                for d in devices
                if _attr(d, "type") == "mig" and _attr(d, "parentUUID") == uuid
            ]
            slots = cards[name].by_class("slots")
            if cards[name].attrs["data-state"] == "whole":
                assert not slots
            elif placements:
                assert [s.attrs["data-slots"] for s in slots] == [str(max(placements))], (node, name)
                assert len(slots[0].by_class("slot")) == max(placements)
            else:
                assert not slots, (node, name)

    # The MIG claim sits in its placement's slots, and only there.
    mig_claim = workload.claims["mig-pod"]
    [result] = mig_claim["status"]["allocation"]["devices"]["results"]
    partition = next(d for d in slices["node-h100"] if d["name"] == result["device"])
    start, size = _attr(partition, "placementStart"), _attr(partition, "placementSize")
    held = f"{workload.namespace}/{mig_claim['metadata']['name']}"
    h100 = _cards(dom, "node-h100")
    owner = next(n for n, u in _gpus(slices["node-h100"]).items() if u == _attr(partition, "parentUUID"))
    assert h100[owner].attrs["data-state"] == "mig"
    taken = [
        int(s.attrs["data-slot"]) for s in h100[owner].by_class("slot") if s.attrs.get("data-claim") == held
    ]
    assert taken == list(range(start, start + size))

    # The whole GPU that runs nothing is marked idle; no free GPU is.
    sleepy = workload.claims["sleepy"]
    [result] = sleepy["status"]["allocation"]["devices"]["results"]
    mixed = _cards(dom, "node-mixed")
    assert mixed[result["device"]].attrs["data-idle"] == "true"
    assert mixed[result["device"]].by_class("idle")
    assert all(c.attrs["data-idle"] == "false" for c in mixed.values() if c.attrs["data-state"] == "free")

    # The pending claim, with explain's reason quoting the selector's markup as text.
    [row] = dom.find_all(
        lambda e: e.attrs.get("data-claim") == f"{workload.namespace}/never" and e.tag == "tr"
    )
    [reason] = row.by_class("reason")
    assert reason.text.startswith("cannot fit") and MARKUP in reason.text, reason.text


def _idle_and_allocated(url: str, workload: Workload) -> bool:
    dom = dump_dom(f"{url}?namespace={workload.namespace}")
    marks = [c.attrs.get("data-idle") for c in dom.by_class("gpu") if c.attrs.get("data-state") == "whole"]
    mig = [c for c in dom.by_class("gpu") if c.attrs.get("data-state") == "mig"]
    return "true" in marks and bool(mig)


def test_the_controllers_page_draws_what_the_api_holds(
    controller: ControllerProcess, workload: Workload, api: client.ApiClient
) -> None:
    # A browser sends no bearer token: the proxy adds the cluster admin's.
    with token_proxy(controller.endpoint().url, TOKEN) as base:
        _draws_what_the_api_holds(f"{base}/", workload, api)


def _draws_what_the_api_holds(url: str, workload: Workload, api: client.ApiClient) -> None:
    wait_for("the map to show the allocations and the idle GPU", lambda: _idle_and_allocated(url, workload))
    resources = Resources(api)
    _check_map(dump_dom(url), workload, resources)
    # Filtered by namespace: the nodes holding its claims, with all their GPUs.
    filtered = dump_dom(f"{url}?namespace={workload.namespace}")
    shown = {e.attrs["data-node"] for e in filtered.find_all(lambda e: e.tag == "section")}
    assert shown == {"node-h100", "node-mixed"}
    product = dump_dom(f"{url}?product=Tesla+T4")
    t4 = {
        (node, d["name"])
        for node, devices in _slices_by_node(resources).items()
        for d in devices
        if _attr(d, "productName") == "Tesla T4" and not d.get("allowMultipleAllocations")
    }
    drawn = {
        (s.attrs["data-node"], c.attrs["data-gpu"])
        for s in product.walk()
        for c in s.by_class("gpu")
        if s.tag == "section"
    }
    assert drawn == t4 and t4


@contextlib.contextmanager
def _status_web(kubeconfig: Path | str, *args: str) -> Iterator[str]:
    """`gpudra status --web` from `kubeconfig` on a free loopback port: the page's URL."""
    served = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpudra",
            "status",
            "--web",
            "--listen=127.0.0.1:0",
            f"--kubeconfig={kubeconfig}",
            f"--idle-after-seconds={IDLE_AFTER}",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert served.stdout is not None
        line = served.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:[0-9]+/", line)
        assert found, line
        yield found.group(0)
    finally:
        served.terminate()
        served.wait(timeout=30)
        if served.stdout is not None:
            served.stdout.close()


def test_status_web_serves_the_same_page_from_a_kubeconfig(
    cluster: LocalCluster, workload: Workload, api: client.ApiClient, controller: ControllerProcess
) -> None:
    with _status_web(cluster.kubeconfig) as url:
        _check_map(dump_dom(url), workload, Resources(api))


def _account_kubeconfig(
    cluster: LocalCluster, core: client.CoreV1Api, directory: Path, account: str, namespace: str
) -> Path:
    """A kubeconfig for a new ServiceAccount `account` in `namespace` (its context's namespace): the
    admin's cluster and CA, the account's token."""
    core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    token = core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token
    config = json.loads(cluster.kubeconfig.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"] = [
        {"name": "local", "context": {"cluster": "local", "user": account, "namespace": namespace}}
    ]
    path = directory / f"{account}.kubeconfig"
    path.write_text(json.dumps(config))
    return path


def _map_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}gpu-map.json", timeout=30) as reply:
        assert reply.status == 200
        document: dict[str, Any] = json.loads(reply.read())
    return document


def _holders(document: dict[str, Any]) -> set[str]:
    return {
        claim
        for node in document["nodes"]
        for gpu in node["gpus"]
        for claim in [
            *gpu["holders"],
            *(c for p in gpu["partitions"] for c in p["claims"]),
            *(s["claim"] for s in gpu["shares"]),
        ]
    }


def test_status_web_shows_only_what_the_callers_kubeconfig_may_read(
    cluster: LocalCluster, workload: Workload, api: client.ApiClient, tmp_path: Path
) -> None:
    """A ServiceAccount that may list slices and classes, and claims in its own namespace only, gets the
    page with that namespace's claims and not another's, and a note saying so; one that may read
    nothing gets an empty map that says what it could not read. No 503, no page error: the real API
    server's RBAC refuses, `gpudra status --web` draws the rest."""
    core, rbac, resources = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api), Resources(api)
    ns = workload.namespace
    other = new_namespace(core, "gpumap-other")
    resources.create("resourceclaims", _hostile_claim("elsewhere"), other)
    reader = f"gpu-map-reader-{ns}"
    team = _account_kubeconfig(cluster, core, tmp_path, "team", ns)
    bare = _account_kubeconfig(cluster, core, tmp_path, "bare", ns)
    lists = [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices", "deviceclasses"],
            "verbs": ["list"],
        }
    ]
    rbac.create_cluster_role({"metadata": {"name": reader}, "rules": lists})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": reader},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
            "subjects": [{"kind": "ServiceAccount", "name": "team", "namespace": ns}],
        }
    )
    claims_rule = [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list"]}]
    rbac.create_namespaced_role(ns, {"metadata": {"name": "claims"}, "rules": claims_rule})
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "team-lists-claims"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "claims"},
            "subjects": [{"kind": "ServiceAccount", "name": "team", "namespace": ns}],
        },
    )
    ours = {f"{ns}/{c['metadata']['name']}" for c in workload.claims.values()}
    try:
        with _status_web(cluster.kubeconfig) as url:  # the admin's map shows the other namespace's
            assert (other, "elsewhere") in {(p["namespace"], p["name"]) for p in _map_json(url)["pending"]}
        with _status_web(team) as url:
            # RBAC's caches take a moment to see the new bindings: the map is rebuilt every few seconds.
            wait_for("the team's claims on the map", lambda: _holders(_map_json(url)) == ours, timeout=60)
            document = _map_json(url)
            assert [(p["namespace"], p["name"]) for p in document["pending"]] == [(ns, "never")]
            assert other not in document["namespaces"]
            [note] = document["notes"]
            assert note.startswith(f"only namespace {ns}'s claims are shown: your kubeconfig may not list")
            assert "403" in note, note
            dom = dump_dom(url)
            assert "hidden" in dom.by_id("error").attrs, dom.by_id("error").text
            assert [li.text for li in dom.by_id("notes").find_all(lambda e: e.tag == "li")] == [note]
            assert {e.attrs["data-node"] for e in dom.find_all(lambda e: e.tag == "section")} == {
                "node-h100",
                "node-a100",
                "node-mixed",
            }
            assert not dom.find_all(lambda e: e.attrs.get("data-claim") == f"{other}/elsewhere")
        with _status_web(bare) as url:
            document = _map_json(url)
            assert document["nodes"] == [] and document["pending"] == []
            assert [n.split(":")[0] for n in document["notes"]] == [
                "no GPUs are shown",
                "no pending claims are shown",
                "the GPUs are shown without their claims",
            ]
            assert f"nor in namespace {ns}" in document["notes"][2]
    finally:
        rbac.delete_cluster_role_binding(reader)
        rbac.delete_cluster_role(reader)
        core.delete_namespace(other)
