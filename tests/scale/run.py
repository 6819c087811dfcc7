"""The cluster-scale benchmark: the real kube-scheduler against N fake DGX H100 nodes. I/O: processes,
the API server, /proc.

Per Kubernetes release, node count and layout, a fresh control plane (etcd, kube-apiserver,
kube-scheduler; no controller manager, no kubelets) gets N Node objects, each with the ResourceSlices
gpudra publishes for the layout (tests.scale.layouts), and gpudra's DeviceClasses. Then, per workload,
a batch of pods each with its own ResourceClaim is created at once and timed to PodScheduled; the
scheduler's CPU (utime + stime from /proc) over the batch, divided by the pods it bound, is its CPU per
pod. An unschedulable pod's cost is the scheduler's CPU per failed attempt
(`scheduler_schedule_attempts_total{result="unschedulable"}`). The reference layout runs in the same
invocation, so every ratio compares runs on the same machine, minutes apart.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from gpudra.errors import ClusterError
from tests.bench.control_plane import ControlPlane
from tests.localcluster import TOKEN
from tests.localcluster.cluster import free_port
from tests.localcluster.processes import http_get
from tests.scale import layouts

RESOURCE = ("resource.k8s.io", "v1")
NAMESPACE = "scale"
CLK_TCK = os.sysconf("SC_CLK_TCK")
THREADS = 8
UNSCHEDULABLE_PODS = 10


class SchedulingPlane(ControlPlane):
    """etcd, kube-apiserver and kube-scheduler of one release; nodes are API objects only."""

    def __init__(self, directory: Path, *, release: str | None) -> None:
        super().__init__(directory)
        self.release = release

    def start(self) -> None:
        # deploy/local/build.sh builds (once) and picks this release, optimised as the pinned one is: a
        # release is otherwise built for behaviour checks, without Go's optimiser, and this times it.
        wanted = {"K8S": self.release, "GPUDRA_K8S_OPTIMIZE": "1"} if self.release else {}
        previous = {name: os.environ.get(name) for name in wanted}
        os.environ.update({name: value for name, value in wanted.items() if value})
        try:
            super().start()
        finally:
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        self._ports["scheduler"] = free_port()
        try:
            self._start_scheduler()
        except BaseException:
            self.stop()
            raise

    def pid(self, name: str) -> int:
        return next(c.process.pid for c in self.components if c.name == name)

    def scheduler_metrics(self) -> str:
        url = f"https://127.0.0.1:{self._ports['scheduler']}/metrics"
        status, body = http_get(url, token=TOKEN, timeout=10)
        if status != 200:
            raise ClusterError(f"the scheduler's /metrics answered {status}")
        return body.decode()

    def scheduler_profile(self, seconds: int, out: Path) -> None:
        url = f"https://127.0.0.1:{self._ports['scheduler']}/debug/pprof/profile?seconds={seconds}"
        status, body = http_get(url, token=TOKEN, timeout=seconds + 30)
        if status != 200:
            raise ClusterError(f"the scheduler's pprof answered {status}")
        out.write_bytes(body)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def rss_mib(pid: int) -> float:
    """The process' peak resident set (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def attempts(metrics: str, result: str) -> float:
    pattern = re.compile(r'^scheduler_schedule_attempts_total\{[^}]*result="' + result + r'"[^}]*\} (\S+)$')
    return sum(float(m.group(1)) for line in metrics.splitlines() if (m := pattern.match(line)))


@dataclass
class Batch:
    """One workload's batch on one cluster."""

    workload: str
    pods: int
    bound: int = 0
    seconds: float = 0.0  # from the first create to the last bind (or the time limit)
    latencies: list[float] = field(default_factory=list)  # create -> PodScheduled, per bound pod
    cpu_per_pod: float | None = None  # scheduler CPU seconds per bound pod
    cpu_per_attempt: float | None = None  # unschedulable: scheduler CPU seconds per failed attempt

    @property
    def pods_per_second(self) -> float:
        return self.bound / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Run:
    release: str
    server_minor: int
    nodes: int
    layout: str
    devices_per_node: int
    counter_sets_per_node: int
    batches: list[Batch] = field(default_factory=list)
    scheduler_rss_mib: float = 0.0
    apiserver_rss_mib: float = 0.0
    populate_seconds: float = 0.0
    hot_path: str = ""  # `go tool pprof -top` of the scheduler while it placed a whole-GPU batch


class Cluster:
    """What the benchmark does on one running plane."""

    def __init__(self, plane: SchedulingPlane) -> None:
        api = config.new_client_from_config(str(plane.kubeconfig))
        api.configuration.connection_pool_maxsize = THREADS * 2
        self.plane = plane
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.pool = concurrent.futures.ThreadPoolExecutor(THREADS)

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def server_minor(self) -> int:
        info = client.VersionApi(self.core.api_client).get_code()
        return int(re.sub(r"\D", "", info.minor))

    def populate(self, nodes: int, shape: layouts.NodeShape, classes: list[dict[str, Any]]) -> None:
        for device_class in classes:
            self.custom.create_cluster_custom_object(*RESOURCE, "deviceclasses", device_class)
        self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        # No controller manager: the ServiceAccount admission plugin still wants the namespace's default.
        self.core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "default"}})
        names = [f"dgx-{i:04d}" for i in range(nodes)]
        list(self.pool.map(lambda n: self._node(n, shape), names))

    def _node(self, name: str, shape: layouts.NodeShape) -> None:
        self.core.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
        status = {
            "status": {
                "capacity": {"cpu": "224", "memory": "2Ti", "pods": "110"},
                "allocatable": {"cpu": "224", "memory": "2Ti", "pods": "110"},
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "Fake", "message": "no kubelet"}
                ],
            }
        }
        self.core.patch_node_status(name, status)
        for piece in shape.slices_for(name):
            self.custom.create_cluster_custom_object(*RESOURCE, "resourceslices", piece)

    def batch(self, workload: str, pods: int, *, limit: float, tag: str) -> Batch:
        """Create `pods` claims of `workload`, then their pods at once; wait until all are bound or
        `limit` seconds passed."""
        result = Batch(workload=workload, pods=pods)
        names = [f"{tag}-{i:04d}" for i in range(pods)]
        list(
            self.pool.map(
                lambda n: self.custom.create_namespaced_custom_object(
                    *RESOURCE, NAMESPACE, "resourceclaims", layouts.claim(n, NAMESPACE, workload)
                ),
                names,
            )
        )
        scheduler = self.plane.pid("kube-scheduler")
        cpu0, metrics0 = cpu_seconds(scheduler), self.plane.scheduler_metrics()
        created: dict[str, float] = {}

        def create(name: str) -> None:
            self.core.create_namespaced_pod(NAMESPACE, layouts.pod(name, NAMESPACE, name))
            created[name] = time.monotonic()

        start = time.monotonic()
        list(self.pool.map(create, names))
        bound: dict[str, float] = {}
        while len(bound) < pods and time.monotonic() - start < limit:
            time.sleep(0.2)
            now = time.monotonic()
            listing = self.core.list_namespaced_pod(NAMESPACE, label_selector=None)
            for item in listing.items:
                name = item.metadata.name
                if name in created and name not in bound and item.spec.node_name:
                    bound[name] = now
            if (
                workload == "unschedulable"
                and attempts(self.plane.scheduler_metrics(), "unschedulable")
                - attempts(metrics0, "unschedulable")
                >= pods
            ):
                break
        cpu = cpu_seconds(scheduler) - cpu0
        metrics1 = self.plane.scheduler_metrics()
        result.bound = len(bound)
        result.seconds = (max(bound.values()) if bound else time.monotonic()) - start
        result.latencies = [bound[n] - created[n] for n in bound]
        if workload == "unschedulable":
            failed = attempts(metrics1, "unschedulable") - attempts(metrics0, "unschedulable")
            result.cpu_per_attempt = cpu / failed if failed else None
        elif bound:
            result.cpu_per_pod = cpu / len(bound)
        self._clear(names)
        return result

    def _failed_since(self, before: str) -> float:
        return attempts(self.plane.scheduler_metrics(), "unschedulable") - attempts(before, "unschedulable")

    def _clear(self, names: list[str]) -> None:
        """Delete the batch's pods and claims, so that the next batch meets the same free cluster."""
        self.core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
        for name in names:
            try:
                self.custom.delete_namespaced_custom_object(*RESOURCE, NAMESPACE, "resourceclaims", name)
                # The scheduler's delete protection, which the claim controller (not running here) lifts
                # once no pod uses the claim: until then the claim keeps its devices allocated.
                self.custom.patch_namespaced_custom_object(
                    *RESOURCE, NAMESPACE, "resourceclaims", name, {"metadata": {"finalizers": None}}
                )
            except client.ApiException as err:
                if err.status != 404:
                    raise
        # Settled before the next batch, whose CPU window must not hold this one's deletions.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            self.core.list_namespaced_pod(NAMESPACE).items
            or self.custom.list_namespaced_custom_object(*RESOURCE, NAMESPACE, "resourceclaims")["items"]
        ):
            time.sleep(0.2)
        time.sleep(1)


def device_classes(repo: Path) -> list[dict[str, Any]]:
    text = (repo / "deploy" / "manifests" / "deviceclasses.yaml").read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def run_one(
    *,
    workdir: Path,
    repo: Path,
    release: str | None,
    nodes: int,
    layout: layouts.Layout,
    dgx: Any,
    pods: int,
    limit: float,
    workloads: tuple[str, ...],
    profile_seconds: int = 0,
) -> Run:
    """One fresh plane: populate, run each workload's batch, read the peaks, stop."""
    directory = workdir / f"{release or 'pinned'}-{nodes}-{layout.name}"
    plane = SchedulingPlane(directory, release=release)
    plane.start()
    cluster = Cluster(plane)
    try:
        minor = cluster.server_minor()
        shape = layouts.shape(dgx, layout, server_minor=minor)
        began = time.monotonic()
        cluster.populate(nodes, shape, device_classes(repo))
        run = Run(
            release=release or "pinned",
            server_minor=minor,
            nodes=nodes,
            layout=layout.name,
            devices_per_node=shape.devices,
            counter_sets_per_node=shape.counter_sets,
            populate_seconds=time.monotonic() - began,
        )
        time.sleep(2)  # the scheduler's informers catch up with the slices
        for workload in workloads:
            if not layouts.runs(shape, workload):
                continue
            # Ten pods that fit nowhere: one attempt's CPU is below /proc's 10 ms tick on small clusters.
            count = UNSCHEDULABLE_PODS if workload == "unschedulable" else pods
            if profile_seconds and workload == "whole":
                run.hot_path = _profiled(cluster, plane, directory, profile_seconds, count, limit)
            run.batches.append(cluster.batch(workload, count, limit=limit, tag=workload))
        run.scheduler_rss_mib = rss_mib(plane.pid("kube-scheduler"))
        run.apiserver_rss_mib = rss_mib(plane.pid("kube-apiserver"))
        return run
    finally:
        cluster.close()
        plane.stop()


def _profiled(
    cluster: Cluster, plane: SchedulingPlane, directory: Path, seconds: int, pods: int, limit: float
) -> str:
    """A CPU profile of the scheduler while it places a whole-GPU batch (not counted in the results);
    returns its hot path by cumulative time (Go profiles carry their symbols: the stripped binary
    is not needed)."""
    out = directory / "scheduler.pprof"
    with concurrent.futures.ThreadPoolExecutor(1) as one:
        profile = one.submit(plane.scheduler_profile, seconds, out)
        time.sleep(0.5)
        cluster.batch("whole", pods, limit=min(limit, float(seconds)), tag="profiled")
        profile.result()
    top = subprocess.run(
        ["go", "tool", "pprof", "-top", "-cum", "-nodecount=40", str(out)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GOTOOLCHAIN": "local"},
    )
    print(f"    scheduler CPU profile: {out}")
    lines = top.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("flat")), 0)
    return (
        "\n".join(lines[start:]) if top.returncode == 0 else f"(go tool pprof failed: {top.stderr.strip()})"
    )
