"""The whole chain with a throwaway DRA plugin written here, so it does not depend on gpudra's plugin.

ResourceSlice + DeviceClass -> pod with a claim from a template -> the real claim controller makes the
claim -> the real scheduler allocates it (a CEL selector picks the device) and binds the pod -> the real
kubelet registers the plugin through plugins_registry and calls NodePrepareResources -> the fake CRI
receives the CDI ID -> the pod runs -> deleting the pod makes the kubelet call NodeUnprepareResources.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client

from gpudra._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from tests.localcluster import LocalCluster

from .kube_helpers import Resources, pod_gone, pod_running, wait_for

DRIVER = "smoke.example.com"


@dataclass
class Calls:
    prepared: list[str] = field(default_factory=list)
    unprepared: list[str] = field(default_factory=list)
    registered: list[bool] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, endpoint: str, calls: Calls) -> None:
        self.endpoint, self.calls = endpoint, calls

    def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(
            type="DRAPlugin", name=DRIVER, endpoint=self.endpoint, supported_versions=["v1.DRAPlugin"]
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        with self.calls.lock:
            self.calls.registered.append(request.plugin_registered)
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class Plugin(dra_v1_pb2_grpc.DRAPluginServicer):  # type: ignore[misc]
    """Prepares whatever the scheduler allocated: reads the claim, answers with one CDI ID per device."""

    def __init__(self, resources: Resources, calls: Calls) -> None:
        self.resources, self.calls = resources, calls

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = dra_v1_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            obj = self.resources.get("resourceclaims", claim.name, claim.namespace)
            result = response.claims[claim.uid]
            for r in obj["status"]["allocation"]["devices"]["results"]:
                result.devices.add(
                    request_names=[r["request"]],
                    pool_name=r["pool"],
                    device_name=r["device"],
                    cdi_device_ids=[f"{DRIVER}/dev={claim.uid}-{r['device']}"],
                )
            with self.calls.lock:
                self.calls.prepared.append(claim.uid)
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = dra_v1_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].CopyFrom(dra_v1_pb2.NodeUnprepareResourceResponse())
            with self.calls.lock:
                self.calls.unprepared.append(claim.uid)
        return response


@pytest.fixture
def plugin(cluster: LocalCluster, api: client.ApiClient) -> Iterator[Calls]:
    node = cluster.nodes["node-mixed"]
    plugin_dir = node.plugins_dir / DRIVER
    plugin_dir.mkdir(parents=True, exist_ok=True)
    dra_socket = plugin_dir / "dra.sock"
    reg_socket = node.registry_dir / f"{DRIVER}-reg.sock"
    calls = Calls()
    servers = []
    for socket_path, add in (
        (
            dra_socket,
            lambda s: dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(Plugin(Resources(api), calls), s),
        ),
        (
            reg_socket,
            lambda s: pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(
                Registration(str(dra_socket), calls), s
            ),
        ),
    ):
        socket_path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        add(server)
        server.add_insecure_port(f"unix://{socket_path}")
        server.start()
        servers.append((server, socket_path))
    wait_for("the kubelet to register the plugin", lambda: calls.registered == [True], timeout=30)
    yield calls
    for server, socket_path in servers:
        server.stop(grace=None)
        socket_path.unlink(missing_ok=True)


def test_pod_with_template_claim_runs_through_real_components(
    cluster: LocalCluster, api: client.ApiClient, plugin: Calls
) -> None:
    core = client.CoreV1Api(api)
    resources = Resources(api)
    ns = f"smoke-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    resources.create(
        "resourceslices",
        {
            "metadata": {"name": f"node-1-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "node-mixed",
                "pool": {"name": "node-mixed", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "dev-red", "attributes": {"color": {"string": "red"}}},
                    {"name": "dev-blue", "attributes": {"color": {"string": "blue"}}},
                ],
            },
        },
    )
    resources.create(
        "deviceclasses",
        {
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
    )
    resources.create(
        "resourceclaimtemplates",
        {
            "metadata": {"name": "blue"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "dev",
                                "exactly": {
                                    "deviceClassName": DRIVER,
                                    "selectors": [
                                        {
                                            "cel": {
                                                "expression": f'device.attributes["{DRIVER}"].color == "blue"'
                                            }
                                        }
                                    ],
                                },
                            }
                        ]
                    }
                }
            },
        },
        namespace=ns,
    )
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "smoke"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "d"}]},
                    }
                ],
                "resourceClaims": [{"name": "d", "resourceClaimTemplateName": "blue"}],
            },
        },
    )

    pod = wait_for("pod Running", lambda: pod_running(core, "smoke", ns), timeout=90)
    assert pod.spec.node_name == "node-mixed"
    claim_name = pod.status.resource_claim_statuses[0].resource_claim_name
    claim = resources.get("resourceclaims", claim_name, ns)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (DRIVER, "node-mixed", "dev-blue")
    uid = claim["metadata"]["uid"]
    assert plugin.prepared == [uid]

    records = [
        json.loads(line) for line in Path(cluster.nodes["node-mixed"].cri_record).read_text().splitlines()
    ]
    mine = [r for r in records if r["podNamespace"] == ns and r["container"] == "c"]
    assert mine and mine[0]["cdiDevices"] == [f"{DRIVER}/dev={uid}-dev-blue"]

    core.delete_namespaced_pod("smoke", ns, grace_period_seconds=1)
    wait_for("NodeUnprepareResources", lambda: plugin.unprepared == [uid], timeout=60)
    wait_for("pod deleted", lambda: pod_gone(core, "smoke", ns), timeout=60)
    resources.delete("deviceclasses", DRIVER)
    resources.delete("resourceslices", f"node-1-{DRIVER}")
    core.delete_namespace(ns)
