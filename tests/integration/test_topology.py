"""A GPU beside another driver's device, by the standard attributes (examples/topology/gpu-nic.yaml): a
NIC driver stood in by its DeviceClass and a ResourceSlice on node-h100 (what a NIC driver's plugin
would publish), and the real scheduler allocating a GPU and a NIC that share a PCIe root, or a NUMA
node, from gpudra's `resource.kubernetes.io/pcieRoot` and `resource.kubernetes.io/numaNode`."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, utils
from kubernetes.client.exceptions import ApiException

from tests.localcluster import examples
from tests.localcluster.node_plugin import DRIVER, PluginProcess

from .kube_helpers import Resources, new_namespace, pod_gone, pool_devices, wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "topology" / "gpu-nic.yaml"
NODE = "node-h100"
NIC_DRIVER = "nic.example.com"
ROOT = "resource.kubernetes.io/pcieRoot"
NUMA = "resource.kubernetes.io/numaNode"


def _value(device: dict[str, Any], name: str) -> object:
    (value,) = device["attributes"][name].values()
    return value


@pytest.fixture
def nic_driver(
    api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> Iterator[dict[str, dict[str, Any]]]:
    """The NIC driver's class and slice: nic-0 under the PCIe root of one of the node's GPUs, nic-1
    under a root no GPU shares but on the NUMA node of another GPU. Yields the NICs by name."""
    gpus = [d for d in pool_devices(api, node=NODE, driver=DRIVER).values() if _value(d, "type") == "gpu"]
    near = gpus[0]
    far = next(g for g in gpus if _value(g, NUMA) != _value(near, NUMA))
    nics = {
        "nic-0": {ROOT: {"string": _value(near, ROOT)}, NUMA: {"int": _value(near, NUMA)}},
        "nic-1": {ROOT: {"string": "pci0000:fe"}, NUMA: {"int": _value(far, NUMA)}},
    }
    resources = Resources(api)
    resources.create(
        "deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": NIC_DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{NIC_DRIVER}"'}}]},
        },
    )
    resources.create(
        "resourceslices",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-nics"},
            "spec": {
                "driver": NIC_DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": name, "attributes": attributes} for name, attributes in nics.items()],
            },
        },
    )
    try:
        yield {name: {"attributes": attributes} for name, attributes in nics.items()}
    finally:
        for plural, name in (("resourceslices", f"{NODE}-nics"), ("deviceclasses", NIC_DRIVER)):
            try:
                resources.delete(plural, name)
            except ApiException as err:
                if err.status != 404:
                    raise


def test_a_gpu_and_another_drivers_nic_are_paired_by_pcie_root_and_by_numa_node(
    api: client.ApiClient, gpudra: dict[str, PluginProcess], nic_driver: dict[str, dict[str, Any]]
) -> None:
    core = client.CoreV1Api(api)
    resources = Resources(api)
    namespace = new_namespace(core, "topology")
    objects = examples.objects(EXAMPLE, namespace=namespace)
    (pod,) = [o for o in objects if o["kind"] == "Pod"]
    templates = [o for o in objects if o["kind"] != "Pod"]
    utils.create_from_yaml(api, yaml_objects=templates, namespace=namespace)
    gpus = pool_devices(api, node=NODE, driver=DRIVER)
    prepared: set[str] = set()  # the pairs' claims
    try:
        for template, attribute, nic in (
            ("gpu-nic-pcie-root", ROOT, "nic-0"),
            ("gpu-nic-numa", NUMA, "nic-1"),
        ):
            # One at a time: the PCIe-root pair can only take nic-0, which a NUMA pair could take first.
            this = copy.deepcopy(pod)
            this["metadata"]["name"] = template
            this["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template
            utils.create_from_yaml(api, yaml_objects=[this], namespace=namespace)

            def allocation(name: str = template) -> list[dict[str, Any]] | None:
                claims = resources.list("resourceclaims", namespace)
                for claim in claims:
                    owners = claim["metadata"].get("ownerReferences") or []
                    if any(o["name"] == name for o in owners):
                        prepared.add(claim["metadata"]["uid"])
                        results = (claim.get("status", {}).get("allocation") or {}).get("devices", {})
                        return results.get("results") or None
                return None

            results = wait_for(f"{template}'s claim allocated", allocation, timeout=90)
            by_request = {r["request"]: r for r in results}
            assert (by_request["nic"]["driver"], by_request["nic"]["device"]) == (NIC_DRIVER, nic)
            assert by_request["gpu"]["driver"] == DRIVER and by_request["gpu"]["pool"] == NODE
            gpu = gpus[by_request["gpu"]["device"]]
            assert _value(gpu, attribute) == _value(nic_driver[nic], attribute), (template, gpu["name"])
            assert core.read_namespaced_pod(template, namespace).spec.node_name == NODE
    finally:
        for template in ("gpu-nic-pcie-root", "gpu-nic-numa"):
            try:
                core.delete_namespaced_pod(template, namespace, grace_period_seconds=0)
            except ApiException as err:
                if err.status != 404:
                    raise
        for template in ("gpu-nic-pcie-root", "gpu-nic-numa"):
            wait_for(f"{template} gone", functools.partial(pod_gone, core, template, namespace), timeout=60)
        # Whatever gpudra prepared of each pair (the kubelet asks each driver for its own devices, and
        # the NIC's has no plugin here) is unprepared with the pod.
        wait_for(
            "gpudra's part of the pairs unprepared",
            lambda: not prepared & set(gpudra[NODE].checkpoint_claims()),
            timeout=60,
        )
        core.delete_namespace(namespace)
