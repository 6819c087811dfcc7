"""`make demo`: gpudra end to end on a real local cluster with simulated GPUs, summarised for a person.
I/O: a local cluster, gpudra (processes or pods), the API server.

Three nodes (a DGX H100, a DGX A100 and a mixed L4/T4 box, all simulated) each run the real kubelet and
gpudra's kubelet plugin; `gpudra controller` runs beside them. The demo applies gpudra's DeviceClasses,
asks `gpudra explain` of every manifest in examples/ whether this cluster can serve it (on a release or
with feature gates that cannot keep shares or MIG partitions on demand, explain says which gate or
release they need, and the nodes' PublishingWithheld events say what they left out), applies them all,
shows the admission webhook refusing a bad config, waits for the pods it can serve to run and finds the
others left unscheduled, prints what was allocated, what the container runtime received and `gpudra
status`, makes a free GPU's firmware stop answering (a simulated XID 119, which NVIDIA's XID catalog
resolves with a GPU reset: tainted, or left out of the slices where the release drops device taints,
listed unhealthy by `gpudra status` either way, then reset and lifted), then
deletes the pods and shows that everything was undone. The
release is the local cluster's: `K8S=v1.35.8 make demo` (and GPUDRA_FEATURE_GATES) runs it on another
(`make compat`).

`--runtime fakecri` (the default): the plugins and the controller run as processes here and the
runtime is a fake CRI, whose record says what each container would have received.
`--runtime containerd --image ARCHIVE` (`make demo RUNTIME=containerd`, root): the nodes run containerd,
gpudra is installed with `helm install` from the image, and each example container runs and prints
what it received (tests/localcluster/demo_installs.py has both). `--runtime containerd --registry
HOST:PORT` instead: the release of pyproject.toml's version published in that plain-HTTP registry
(`make publish`), the chart from oci:// and the image pulled by each node (tests/e2e).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpudra import cli, sim
from gpudra.cli.output_format import documents
from gpudra.errors import ClusterError, GpudraError
from tests.localcluster import binaries, examples
from tests.localcluster.api import DemoApi
from tests.localcluster.cluster import TOKEN, LocalCluster
from tests.localcluster.controller import StatusEndpoint
from tests.localcluster.demo_installs import (
    ChartSource,
    Gpudra,
    HelmReleases,
    HostProcesses,
    image_of,
    table,
)
from tests.localcluster.node_plugin import DRIVER
from tests.localcluster.token_proxy import token_proxy

MACHINES = {"node-h100": "dgx-h100", "node-a100": "dgx-a100", "node-mixed": "mixed"}
FAULT_NODE = "node-mixed"  # its GPUs have no MIG partitions: one row in gpudra status
NAMESPACE = examples.NAMESPACE


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _wait(what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise GpudraError(f"timed out waiting for {what}")
        time.sleep(0.2)


def run(
    root: Path,
    *,
    runtime: str = "fakecri",
    image: Path | None = None,
    registry: str | None = None,
    gpu_map_screenshot: Path | None = None,
    gpu_map_check: Path | None = None,
) -> None:
    """The demo on a new cluster in `root`; with runtime "containerd", `image` is a `make image`
    archive, imported into every node and installed with the chart, or `registry` the plain-HTTP
    registry that serves the release. The release and its feature gates are the local cluster's (K8S,
    GPUDRA_FEATURE_GATES, GPUDRA_RUNTIME_CONFIG). `gpu_map_screenshot`: where headless Chromium saves the
    controller's GPU map page while the examples run (`make gpu-map-screenshot`), with the summary of
    what it drew beside it (`.state.json`, tests/localcluster/gpu_map_state.py); `gpu_map_check`: such
    a summary the page the demo's cluster serves must match (GpudraError naming what differs)."""
    images = (image,) if image is not None else ()
    registries = (registry,) if registry is not None else ()
    with_runtime = "a fake container runtime" if runtime == "fakecri" else "containerd, runc and CNI"
    _step(f"starting a real Kubernetes control plane and 3 kubelets ({with_runtime})")
    started = time.monotonic()
    with LocalCluster(
        root, nodes=tuple(MACHINES), runtime=runtime, images=images, registries=registries
    ) as cluster:
        print(f"cluster ready in {time.monotonic() - started:.1f}s: {cluster.server}")
        print(f"kubeconfig: {cluster.kubeconfig}")
        api = DemoApi(config.new_client_from_config(str(cluster.kubeconfig)))
        gpudra: Gpudra
        if image is not None:
            gpudra = HelmReleases(cluster, MACHINES, source=ChartSource.local(image_of(image)))
        elif registry is not None:
            version = tomllib.loads((binaries.repo_root() / "pyproject.toml").read_text())["project"][
                "version"
            ]
            gpudra = HelmReleases(cluster, MACHINES, source=ChartSource.published(registry, version))
        else:
            gpudra = HostProcesses(cluster, MACHINES)
        try:
            demo = Demo(api, gpudra, repo=binaries.repo_root(), kubeconfig=cluster.kubeconfig)
            demo.install()
            demo.apply()
            demo.show()
            if gpu_map_screenshot is not None or gpu_map_check is not None:
                _gpu_map(api, gpudra.controller(api), screenshot=gpu_map_screenshot, check=gpu_map_check)
            demo.fault()
            demo.clean_up()
        finally:
            gpudra.stop()
    # Each node's containerd content (the image unpacked, about 700 MB a node) went with the cluster's
    # stop (LocalCluster.stop); the logs stay, as with the fake CRI.
    print("\ncluster stopped; no process left running.")


@dataclass(frozen=True)
class Judged:
    """What `gpudra explain` said of one example pod before anything was applied."""

    example: str
    pod: str
    fits: bool
    needs: tuple[str, ...]  # one line per request this cluster cannot serve: the gate or release it needs
    release: tuple[str, ...]  # what this release's scheduler may do otherwise than explain's rules

    @property
    def served(self) -> bool:
        """Whether the pod is expected to run here."""
        return self.fits and not self.release


class Demo:
    """The demo's steps on a running cluster, in order: install, apply, show, clean_up. `make compat`
    runs them per Kubernetes release (tests/compat), checking the cluster between show and clean_up."""

    def __init__(self, api: DemoApi, gpudra: Gpudra, *, repo: Path, kubeconfig: Path) -> None:
        self.api = api
        self.gpudra = gpudra
        self.repo = repo
        self.kubeconfig = kubeconfig
        self.judged: dict[str, Judged] = {}  # pod -> what explain said of it
        self.withheld: dict[str, list[str]] = {}  # node -> its PublishingWithheld events
        self._mig_before = 0

    @property
    def served(self) -> list[str]:
        return [pod for pod, judged in self.judged.items() if judged.served]

    def install(self) -> None:
        api, gpudra = self.api, self.gpudra
        _step(gpudra.install_step)
        gpudra.install(api)
        rows: list[tuple[str, ...]] = [
            ("NODE", "MACHINE", "RESOURCESLICES", "DEVICES", "WHOLE GPUS", "SHARED GPUS", "MIG PARTITIONS")
        ]
        for node, profile in MACHINES.items():

            def complete(node: str = node) -> bool:
                found = api.list_slices(driver=DRIVER, node_name=node)
                return bool(found) and len(found) == found[0]["spec"]["pool"]["resourceSliceCount"]

            _wait(f"slices of {node}", complete, 60)
            found = api.list_slices(driver=DRIVER, node_name=node)
            devices = [d for s in found for d in (s["spec"].get("devices") or [])]
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
        print(table(rows))
        self._mig_before = sum(len(n.mig_devices()) for n in gpudra.nodes.values())

    def apply(self) -> None:
        """Each example judged by `gpudra explain` against the cluster as it is, then every example
        applied; the pods this release can serve are waited for, the others must stay unscheduled."""
        api, gpudra = self.api, self.gpudra
        files = examples.files(self.repo)
        _step("what this cluster can serve: gpudra explain of each example, before it is applied")
        for example in files:
            for judged in self._explain(example):
                self.judged[judged.pod] = judged
                for line in judged.needs:
                    print(f"  {example.name}: pod {judged.pod}: {line}")
                for line in judged.release:
                    print(f"  {example.name}: pod {judged.pod}: note: {line}")
        if all(j.served for j in self.judged.values()):
            print("  every example fits")
        self._withheld_report()

        _step(f"applying examples/*.yaml in namespace {NAMESPACE}")
        if gpudra.workload_note:
            print(gpudra.workload_note)
        api.create_namespace(NAMESPACE)
        _admission(api)
        for example in files:
            waits = [j.pod for j in self.judged.values() if j.example == example.name and not j.served]
            print(f"  {example.name}" + (f" (waits here: {', '.join(waits)})" if waits else ""))
            logs = examples.expected_logs(example)
            objects = [
                gpudra.workload(o, {c: e for (p, c), e in logs.items() if p == o["metadata"]["name"]})
                if o["kind"] == "Pod"
                else o
                for o in examples.objects(example)
            ]
            api.create(objects, namespace=NAMESPACE)

        served = set(self.served)

        def waiting() -> list[str]:
            pods = {p["metadata"]["name"]: p for p in api.list_pods(NAMESPACE)}
            return sorted(n for n in served if n not in pods or not gpudra.started(api, pods[n]))

        try:
            _wait("the example pods this cluster serves to run", lambda: not waiting(), 180)
        except GpudraError as err:
            raise GpudraError(f"{err}: {', '.join(waiting())} did not") from None
        gated = [pod for pod, j in self.judged.items() if j.needs]

        def all_refused() -> bool:
            pods = {p["metadata"]["name"]: p for p in api.list_pods(NAMESPACE)}
            return all(_unschedulable(pods[name]) for name in gated)

        _wait("the example pods this cluster cannot serve to be found unschedulable", all_refused, 60)
        if gated:
            print(f"left unscheduled, as explain said: {', '.join(gated)}")

    def _explain(self, example: Path) -> list[Judged]:
        """`gpudra explain EXAMPLE -o json` against the cluster: one answer per pod, in file order."""
        pods = [o["metadata"]["name"] for o in yaml.safe_load_all(example.read_text()) if o["kind"] == "Pod"]
        out = io.StringIO()
        argv = ["explain", str(example), f"--kubeconfig={self.kubeconfig}", f"-n={NAMESPACE}", "-o=json"]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            cli.main(argv)
        printed = out.getvalue()
        answers = documents(printed[printed.index("{") :]) if "{" in printed else []
        if len(answers) != len(pods):
            raise GpudraError(f"gpudra explain {example.name}: {out.getvalue()}")
        return [
            Judged(example.name, pod, a["fits"], tuple(a["needs"]), tuple(a["release"]))
            for pod, a in zip(pods, answers, strict=True)
        ]

    def _withheld_report(self) -> None:
        """What each node's plugin said it left out: its PublishingWithheld events."""
        for node in MACHINES:
            self.withheld[node] = [e["message"] for e in self.api.node_events(node, "PublishingWithheld")]
        if not any(self.withheld.values()):
            print("every node publishes all its options offer")
            return
        print("what each node's plugin left out (its PublishingWithheld events):")
        for node, messages in self.withheld.items():
            for message in messages:
                print(f"  {node}: {message.removeprefix('gpudra on this node: ')}")

    def show(self) -> None:
        api, gpudra = self.api, self.gpudra
        _step("allocated by the real scheduler, prepared by gpudra through the real kubelet")
        served = set(self.served)
        pods = {p["metadata"]["name"]: p for p in api.list_pods(NAMESPACE) if p["metadata"]["name"] in served}
        claims = {c["metadata"]["name"]: c for c in api.list_claims(NAMESPACE)}
        products = _products(api)
        rows = [("POD", "NODE", "DEVICES", "PRODUCT", gpudra.received_heading)]  # a new table
        for name, pod in sorted(pods.items()):
            node = pod["spec"]["nodeName"]
            for claim in _claims_of(pod, claims):
                results = claim["status"]["allocation"]["devices"]["results"]
                rows.append(
                    (
                        name,
                        node,
                        ",".join(r["device"] for r in results),
                        ",".join(sorted({products[(node, r["device"])] for r in results})),
                        gpudra.received(pod, claim),
                    )
                )
        print(table(rows))
        checked = gpudra.checks({n: (p, _claims_of(p, claims)) for n, p in pods.items()})
        if checked:
            print(checked)
        nodes = gpudra.nodes.values()
        slices = {uuid: level for n in nodes for uuid, level in n.timeslices().items() if level}
        print(
            f"\nGPU time-slice settings in effect: {slices or 'none'} (3 = Long from "
            "examples/time-slicing.yaml, 2 = Medium from examples/time-slicing-shared.yaml)"
        )
        prepared = sum(len(n.cdi_specs()) for n in nodes)
        print(f"CDI spec files written: {prepared} (one per claim)")
        made = sum(len(n.mig_devices()) for n in nodes) - self._mig_before
        print(f"MIG devices created for the claims: {made}")
        daemons = [d for n in nodes for d in n.mps_daemons()]
        limits = sorted(
            f"{int(d['default_active_thread_percentage'])}%/{','.join(d['default_pinned_memory_limits'].values())}"
            for d in daemons
        )
        print(
            f"MPS control daemons running for the claims: {len(daemons)} "
            f"(SM share/memory limit: {' '.join(limits)})"
        )

        _step("gpudra status: the cluster's GPUs as the controller sees them")
        endpoint = gpudra.controller(api)
        allocated = {n: c for n, c in claims.items() if (c.get("status") or {}).get("allocation")}
        _wait("the controller to see every allocation", lambda: _allocated_shown(endpoint, allocated), 30)
        shown = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpudra",
                "status",
                "--output=wide",
                *endpoint.cli_args(self.kubeconfig.parent),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        print(shown.stdout.rstrip())

    def fault(self) -> None:
        """A free GPU of FAULT_NODE stops answering: its firmware timed out (XID 119, GSP RPC timeout,
        simulated with the GPU lost to NVML): its taint, `gpudra status` and the plugin's Node event;
        then a reset brings it back and the plugin lifts the taint (the reset rule of docs/health.md;
        XID 119's catalog action is RESET_GPU). Not XID 79: a GPU off the bus needs a node reboot,
        which a reset does not replace. About one health poll (10 s) at most."""
        api, endpoint = self.api, self.gpudra.controller(self.api)
        device, gpu = _free_gpu(api, FAULT_NODE)
        sim_state = self.gpudra.nodes[FAULT_NODE].sim_state
        _step(
            f"a GPU fails: the firmware of {device} of {FAULT_NODE} stops answering (simulated XID 119, "
            "GSP RPC timeout)"
        )
        started = time.monotonic()
        sim.set_gpu_lost(state_file=sim_state, gpu_uuid=gpu, lost=True)
        sim.raise_xid(state_file=sim_state, gpu_uuid=gpu, xid=119)
        _wait(
            "gpudra status to list the GPU unhealthy",
            lambda: _unhealthy(endpoint) == [(FAULT_NODE, device)],
            30,
        )
        print(f"unhealthy in {time.monotonic() - started:.1f}s; gpudra status:")
        shown = subprocess.run(
            [sys.executable, "-m", "gpudra", "status", *endpoint.cli_args(self.kubeconfig.parent)],
            capture_output=True,
            text=True,
            check=True,
        )
        print(_section(shown.stdout, "Unhealthy GPUs"))
        print(f"Node event GpuFault: {_node_event(api, FAULT_NODE, 'GpuFault', gpu)}")
        print("the GPU is reset (simulated): the plugin sees it answer again after it was lost")
        started = time.monotonic()
        sim.set_gpu_lost(state_file=sim_state, gpu_uuid=gpu, lost=False)
        _wait("the taint to be lifted", lambda: _unhealthy(endpoint) == [], 30)
        print(f"lifted in {time.monotonic() - started:.1f}s")
        print(f"Node event GpuFaultCleared: {_node_event(api, FAULT_NODE, 'GpuFaultCleared', gpu)}")

    def clean_up(self) -> None:
        api, nodes = self.api, self.gpudra.nodes.values()
        _step("deleting the pods: the kubelet unprepares every claim")
        for pod in api.list_pods(NAMESPACE):
            api.delete_pod(NAMESPACE, pod["metadata"]["name"])
        _wait("every claim to be unprepared", lambda: all(not n.checkpoint_claims() for n in nodes), 120)
        left = sum(len(n.cdi_specs()) for n in nodes)
        reset = all(level == 0 for n in nodes for level in n.timeslices().values())
        migs = sum(len(n.mig_devices()) for n in nodes) - self._mig_before
        mps = sum(len(n.mps_daemons()) for n in nodes)
        print(
            f"CDI spec files left: {left}; GPU settings back to default: {'yes' if reset else 'NO'}; "
            f"MIG devices left: {migs}; MPS daemons left: {mps}"
        )


def _free_gpu(api: DemoApi, node: str) -> tuple[str, str]:
    """The last whole-GPU device of `node` (by name) whose GPU no claim holds, and its GPU's UUID."""
    slices = api.list_slices(driver=DRIVER, node_name=node)
    devices = [d for s in slices for d in (s["spec"].get("devices") or [])]
    uuid = {d["name"]: d["attributes"]["uuid"]["string"] for d in devices}
    held = {
        uuid[r["device"]]
        for c in api.list_claims(NAMESPACE)
        for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        if r["pool"] == node and r["device"] in uuid
    }
    free = sorted(
        d["name"]
        for d in devices
        if d["attributes"]["type"]["string"] == "gpu"
        and not d.get("allowMultipleAllocations")
        and uuid[d["name"]] not in held
    )
    if not free:
        raise GpudraError(f"no free GPU on {node} for the fault step")
    return free[-1], uuid[free[-1]]


def _unhealthy(endpoint: StatusEndpoint) -> list[tuple[str, str]]:
    return [(d["node"], d["device"]) for d in endpoint.get().get("unhealthy", [])]


def _section(text: str, heading: str) -> str:
    """The paragraph of `text` that starts with `heading`."""
    return next((p for p in text.split("\n\n") if p.startswith(heading)), text).rstrip()


def _node_event(api: DemoApi, node: str, reason: str, gpu: str) -> str:
    """The message of the plugin's `reason` event about `gpu`, once it is there (sent asynchronously)."""
    found: list[str] = []

    def posted() -> bool:
        found[:] = [e["message"] for e in api.node_events(node, reason) if gpu in e["message"]]
        return bool(found)

    _wait(f"a {reason} event", posted, 30)
    return found[-1]


def _unschedulable(pod: dict[str, Any]) -> bool:
    """Whether the scheduler gave up on the pod for now (PodScheduled False, Unschedulable)."""
    return any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
        for c in pod["status"].get("conditions") or []
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


def _allocated_shown(endpoint: StatusEndpoint, claims: dict[str, Any]) -> bool:
    devices = {
        (r["pool"], r["device"].split("-mig-")[0].removesuffix("-shared"))
        for c in claims.values()
        for r in c["status"]["allocation"]["devices"]["results"]
    }
    try:
        status = endpoint.get()
    except (OSError, ClusterError):
        return False  # the controller not reachable yet
    return sum(row["allocated"] for row in status["nodes"]) == len(devices)


def _claims_of(pod: dict[str, Any], claims: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's claims: named in its spec, or made from a template (named in its status)."""
    made = {s["name"]: s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses", [])}
    names = [c.get("resourceClaimName") or made.get(c["name"]) for c in pod["spec"].get("resourceClaims", [])]
    return [claims[name] for name in names if name]


def _products(api: DemoApi) -> dict[tuple[str, str], str]:
    return {
        (node, d["name"]): d["attributes"]["productName"]["string"]
        for node in MACHINES
        for s in api.list_slices(driver=DRIVER, node_name=node)
        for d in (s["spec"].get("devices") or [])
    }


def _gpu_map(api: DemoApi, endpoint: StatusEndpoint, *, screenshot: Path | None, check: Path | None) -> None:
    """The controller's GPU map page in headless Chromium (with the admin's token), once it drew and
    explained: saved as `screenshot` with its summary beside it, and/or compared with the summary at
    `check`."""
    from tests.localcluster import browser, gpu_map_state  # noqa: PLC0415 (only this step needs Chromium)

    _step("the GPU map page, as the controller serves it (with the admin's token)")
    names = gpu_map_state.stable_names(api.list_claims(NAMESPACE))
    with token_proxy(endpoint.url, TOKEN) as url:
        dom = browser.capture(f"{url}/", screenshot=screenshot, width=1400, height=1300)
    state = gpu_map_state.summary(dom, names)
    if state["error"]:
        raise GpudraError(f"the GPU map page did not load: {state['error']}")
    if screenshot is not None:
        sidecar = screenshot.with_suffix(".state.json")
        gpu_map_state.write(sidecar, state)
        print(f"saved {screenshot} and what it shows, {sidecar}")
    if check is not None:
        differs = gpu_map_state.mismatch(check, state)
        if differs:
            raise GpudraError(differs)
        print(f"the GPU map shows what {check} says the screenshot shows")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.localcluster.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runtime", default="fakecri", choices=["fakecri", "containerd"])
    parser.add_argument(
        "--image", type=Path, help="with containerd: the `make image` archive (deploy/image/archive.sh)"
    )
    parser.add_argument(
        "--gpu-map-screenshot", type=Path, help="save the controller's GPU map page here while the pods run"
    )
    parser.add_argument(
        "--gpu-map-check",
        type=Path,
        help="fail unless the controller's GPU map page shows what this summary (a screenshot's "
        ".state.json) says, while the pods run",
    )
    parser.add_argument(
        "--registry", help="with containerd: HOST:PORT of the plain-HTTP registry `make publish` pushed to"
    )
    args = parser.parse_args(argv)
    if args.image is not None and args.registry is not None:
        parser.error("--image and --registry: give one of them")
    if (args.runtime == "containerd") != (args.image is not None or args.registry is not None):
        parser.error("--image or --registry goes with --runtime containerd, and only with it")
    # With containerd the plugin keeps its MPS pipes under the node's kubelet directory, inside the
    # cluster's: a short root keeps their unix socket paths within 107 bytes.
    prefix = "gpudra-demo-" if args.runtime == "fakecri" else "gd-"
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        run(
            root,
            runtime=args.runtime,
            image=args.image,
            registry=args.registry,
            gpu_map_screenshot=args.gpu_map_screenshot,
            gpu_map_check=args.gpu_map_check,
        )
    except (GpudraError, ApiException) as err:
        where = "nodes/*/gpudra-plugin.log" if args.runtime == "fakecri" else "nodes/*/pod-logs"
        print(f"demo failed: {err}\nlogs: {root}/logs and {root}/{where}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
