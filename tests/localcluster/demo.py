"""`make demo`: gpudra end to end on a real local cluster with simulated GPUs, summarised for a person.
I/O: a local cluster, gpudra plugin processes, the API server.

Three nodes (a DGX H100, a DGX A100 and a mixed L4/T4 box, all simulated) each run the real kubelet and
gpudra's kubelet plugin; `gpudra controller` runs beside them. The demo applies gpudra's DeviceClasses
and every manifest in examples/, shows the admission webhook refusing a bad config, waits for the pods
to run, prints what was allocated, what the container runtime received and `gpudra status`, then
deletes the pods and shows that everything was undone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpudra.errors import GpudraError
from tests.localcluster import binaries
from tests.localcluster.api import DemoApi
from tests.localcluster.cluster import LocalCluster, free_port
from tests.localcluster.controller import NAMESPACE as CONTROLLER_NAMESPACE
from tests.localcluster.controller import ControllerProcess
from tests.localcluster.node_plugin import DRIVER, PluginProcess

MACHINES = {"node-h100": "dgx-h100", "node-a100": "dgx-a100", "node-mixed": "mixed"}
NAMESPACE = "demo"


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _wait(what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise GpudraError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def run(root: Path) -> None:
    repo = binaries.repo_root()
    _step("starting a real Kubernetes control plane and 3 kubelets (fake container runtime)")
    started = time.monotonic()
    with LocalCluster(root, nodes=tuple(MACHINES)) as cluster:
        print(f"cluster ready in {time.monotonic() - started:.1f}s: {cluster.server}")
        print(f"kubeconfig: {cluster.kubeconfig}")
        api = DemoApi(config.new_client_from_config(str(cluster.kubeconfig)))
        plugins = {n: PluginProcess(cluster, cluster.nodes[n], p) for n, p in MACHINES.items()}
        controller = ControllerProcess(cluster, "demo", webhook_url_port=free_port())
        try:
            _demo(api, cluster, plugins, controller, repo)
        finally:
            controller.stop()
            for plugin in plugins.values():
                plugin.stop()
    print("\ncluster stopped; no process left running.")


def _demo(
    api: DemoApi,
    cluster: LocalCluster,
    plugins: dict[str, PluginProcess],
    controller: ControllerProcess,
    repo: Path,
) -> None:
    _step(
        "installing gpudra: DeviceClasses, the kubelet plugin on every node (simulated GPUs), the controller"
    )
    api.create(
        list(yaml.safe_load_all((repo / "deploy/manifests/deviceclasses.yaml").read_text())),
        namespace="default",
    )
    for plugin in plugins.values():
        plugin.start()
    api.create_namespace(CONTROLLER_NAMESPACE)
    controller.start()
    rows: list[tuple[str, ...]] = [
        ("NODE", "MACHINE", "RESOURCESLICES", "DEVICES", "WHOLE GPUS", "SHARED GPUS", "MIG PARTITIONS")
    ]
    for node, profile in MACHINES.items():

        def complete(node: str = node) -> bool:
            found = api.list_slices(driver=DRIVER, node_name=node)
            return bool(found) and len(found) == found[0]["spec"]["pool"]["resourceSliceCount"]

        _wait(f"slices of {node}", complete, 60)
        found = api.list_slices(driver=DRIVER, node_name=node)
        devices = [d for s in found for d in s["spec"].get("devices", [])]
        kinds = [
            "shared" if d.get("allowMultipleAllocations") else d["attributes"]["type"]["string"]
            for d in devices
        ]
        rows.append(
            (
                node,
                profile,
                str(len(found)),
                str(len(devices)),
                str(kinds.count("gpu")),
                str(kinds.count("shared")),
                str(kinds.count("mig")),
            )
        )
    print(_table(rows))

    _step(f"applying examples/*.yaml in namespace {NAMESPACE}")
    api.create_namespace(NAMESPACE)
    _admission(api)
    for example in sorted((repo / "examples").glob("*.yaml")):
        print(f"  {example.name}")
        api.create(list(yaml.safe_load_all(example.read_text())), namespace=NAMESPACE)

    def all_running() -> bool:
        pods = api.list_pods(NAMESPACE)
        return bool(pods) and all(p["status"].get("phase") == "Running" for p in pods)

    _wait("the example pods to run", all_running, 180)
    _step("allocated by the real scheduler, prepared by gpudra through the real kubelet")
    pods = {p["metadata"]["name"]: p for p in api.list_pods(NAMESPACE)}
    claims = {c["metadata"]["name"]: c for c in api.list_claims(NAMESPACE)}
    products = _products(api)
    rows = [("POD", "NODE", "DEVICES", "PRODUCT", "CDI DEVICES THE RUNTIME GOT")]  # a new table
    for name, pod in sorted(pods.items()):
        node = pod["spec"]["nodeName"]
        for status in pod["status"].get("resourceClaimStatuses", []):
            claim = claims[status["resourceClaimName"]]
            results = claim["status"]["allocation"]["devices"]["results"]
            received = _runtime_devices(cluster, node, name)
            rows.append(
                (
                    name,
                    node,
                    ",".join(r["device"] for r in results),
                    ",".join(sorted({products[(node, r["device"])] for r in results})),
                    " ".join(i.replace(claim["metadata"]["uid"], "<claim>") for i in received),
                )
            )
    print(_table(rows))
    slices = {uuid: level for p in plugins.values() for uuid, level in p.timeslices().items() if level}
    print(
        f"\nGPU time-slice settings in effect: {slices or 'none'} (3 = Long from examples/time-slicing.yaml, "
        "2 = Medium from examples/time-slicing-shared.yaml)"
    )
    prepared = sum(len(p.cdi_specs()) for p in plugins.values())
    print(f"CDI spec files written: {prepared} (one per claim)")
    made = sum(len(p.mig_devices()) for p in plugins.values())
    print(f"MIG devices created for the claims: {made}")
    daemons = [d for p in plugins.values() for d in p.mps_daemons()]
    limits = sorted(
        f"{int(d['default_active_thread_percentage'])}%/{','.join(d['default_pinned_memory_limits'].values())}"
        for d in daemons
    )
    print(
        f"MPS control daemons running for the claims: {len(daemons)} "
        f"(SM share/memory limit: {' '.join(limits)})"
    )

    _step("gpudra status: the cluster's GPUs as the controller sees them")
    _wait("the controller to see every allocation", lambda: _allocated_shown(controller, claims), 30)
    shown = subprocess.run(
        [sys.executable, "-m", "gpudra", "status", "--output=wide", f"--controller-url={controller.url}"],
        capture_output=True,
        text=True,
        check=True,
    )
    print(shown.stdout.rstrip())

    _step("deleting the pods: the kubelet unprepares every claim")
    for name in pods:
        api.delete_pod(NAMESPACE, name)
    _wait(
        "every claim to be unprepared", lambda: all(not p.checkpoint_claims() for p in plugins.values()), 120
    )
    left = sum(len(p.cdi_specs()) for p in plugins.values())
    reset = all(level == 0 for p in plugins.values() for level in p.timeslices().values())
    migs = sum(len(p.mig_devices()) for p in plugins.values())
    mps = sum(len(p.mps_daemons()) for p in plugins.values())
    print(
        f"CDI spec files left: {left}; GPU settings back to default: {'yes' if reset else 'NO'}; "
        f"MIG devices left: {migs}; MPS daemons left: {mps}"
    )


def _admission(api: DemoApi) -> None:
    """A claim whose GpuConfig names a sharing strategy that does not exist: refused by the webhook."""
    bad = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "typo"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpudra.io"}}],
                "config": [
                    {
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {
                                "apiVersion": "resource.gpudra.io/v1beta1",
                                "kind": "GpuConfig",
                                "sharing": {"strategy": "TimeSlice"},
                            },
                        }
                    }
                ],
            }
        },
    }
    try:
        client.CustomObjectsApi(api.api).create_namespaced_custom_object(
            "resource.k8s.io", "v1", NAMESPACE, "resourceclaims", bad
        )
    except ApiException as err:
        message = json.loads(err.body)["message"]
        print(f"  a claim with sharing.strategy: TimeSlice is refused at admission:\n    {message}")
        return
    raise GpudraError("the admission webhook admitted a claim with a bad gpudra config")


def _allocated_shown(controller: ControllerProcess, claims: dict[str, Any]) -> bool:
    devices = {
        (r["pool"], r["device"].split("-mig-")[0].removesuffix("-shared"))
        for c in claims.values()
        for r in c["status"]["allocation"]["devices"]["results"]
    }
    return sum(row["allocated"] for row in controller.status()["nodes"]) == len(devices)


def _products(api: DemoApi) -> dict[tuple[str, str], str]:
    return {
        (node, d["name"]): d["attributes"]["productName"]["string"]
        for node in MACHINES
        for s in api.list_slices(driver=DRIVER, node_name=node)
        for d in s["spec"].get("devices", [])
    }


def _runtime_devices(cluster: LocalCluster, node: str, pod: str) -> list[str]:
    records: list[dict[str, Any]] = [
        json.loads(line) for line in cluster.nodes[node].cri_record.read_text().splitlines()
    ]
    return sorted(
        {
            d
            for r in records
            if r["podNamespace"] == NAMESPACE and r["podName"] == pod
            for d in r["cdiDevices"]
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.localcluster.demo", description=__doc__)
    parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="gpudra-demo-", dir="/tmp"))
    try:
        run(root)
    except (GpudraError, ApiException) as err:
        print(f"demo failed: {err}\nlogs: {root}/logs and {root}/nodes/*/gpudra-plugin.log", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
