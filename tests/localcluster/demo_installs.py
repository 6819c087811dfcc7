"""How `make demo` runs gpudra on its cluster, one class per container runtime. I/O: processes, Helm,
the API server, the nodes' files, container logs.

- `HostProcesses` (the fake CRI, the default): DeviceClasses from deploy/manifests, `gpudra
  kubelet-plugin` and `gpudra controller` as processes here; what the container runtime received is
  the fake CRI's record of each CreateContainer call (the CDI device IDs the kubelet passed).
- `HelmReleases` (containerd): `helm install` of deploy/helm/gpudra, the plugins and the controller in
  pods; every example container runs for real, and what it received is what it prints about itself.

Both read what the plugins left on each node from the same files (`NodeFiles`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml
from kubernetes.client.exceptions import ApiException

from gpudra.errors import ClusterError
from tests.localcluster import containerd, helm
from tests.localcluster.api import DemoApi
from tests.localcluster.cluster import LocalCluster, free_port
from tests.localcluster.controller import NAMESPACE as CONTROLLER_NAMESPACE
from tests.localcluster.controller import ControllerProcess, StatusEndpoint, webhook_ca
from tests.localcluster.examples import Expected
from tests.localcluster.node_plugin import DRIVER, NodeFiles, PluginProcess, publishing_values

Obj = dict[str, Any]


class Gpudra(Protocol):
    """gpudra on the demo's cluster, and what the demo reads back from it."""

    nodes: Mapping[str, NodeFiles]
    install_step: str  # the demo's heading for install()
    workload_note: str  # what workload() changes in the examples' pods, for the person watching
    received_heading: str  # the pod table's last column

    def install(self, api: DemoApi) -> None:
        """DeviceClasses, a kubelet plugin on every node, the controller; returns once they serve."""

    def workload(self, pod: Obj, logs: Mapping[str, Expected]) -> Obj:
        """An example's pod as this runtime can run it; `logs`: container -> what the example says
        it prints."""

    def checks(self, pods: Mapping[str, tuple[Obj, list[Obj]]]) -> str:
        """What the runtime's side shows about the running pods, checked against their claims; `pods`:
        name -> (pod, its claims)."""

    def started(self, api: DemoApi, pod: Obj) -> bool:
        """Whether the pod's containers have started (and with containerd, said what they got)."""

    def received(self, pod: Obj, claim: Obj) -> str:
        """What the container runtime gave the pod's containers for `claim`, for the pod table."""

    def controller(self, api: DemoApi) -> StatusEndpoint:
        """Where the controller serves /status."""

    def stop(self) -> None: ...


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


class HostProcesses:
    """The plugin and controller as processes on this machine beside a cluster with the fake CRI."""

    install_step = (
        "installing gpudra: DeviceClasses, the kubelet plugin on every node (simulated GPUs), the controller"
    )
    workload_note = ""
    received_heading = "CDI DEVICES THE RUNTIME GOT"

    def __init__(
        self,
        cluster: LocalCluster,
        machines: Mapping[str, str],
        *,
        metrics: bool = False,
        groups: Mapping[str, dict[str, str]] | None = None,
        usage_interval: float = 0,
        idle_after_seconds: float = 1800,
    ) -> None:
        """`metrics`: each plugin serves /metrics and /readyz on a port of its own (`metrics_port`);
        `groups`: node -> publishing options, for nodes not in their machine's NODE_GROUPS entry;
        `usage_interval`: the plugins sample claims' GPU use (0: off); `idle_after_seconds`: the
        controller's."""
        self.cluster = cluster
        self.repo = helm.chart().parents[2]
        self.metrics = metrics
        self.usage_interval = usage_interval
        self.plugins = {
            n: PluginProcess(cluster, cluster.nodes[n], p, group=(groups or {}).get(n))
            for n, p in machines.items()
        }
        self.nodes = self.plugins
        self.controller_process = ControllerProcess(
            cluster, "demo", webhook_url_port=free_port(), idle_after_seconds=idle_after_seconds
        )

    def install(self, api: DemoApi) -> None:
        classes = self.repo / "deploy" / "manifests" / "deviceclasses.yaml"
        api.create(list(yaml.safe_load_all(classes.read_text())), namespace="default")
        for plugin in self.plugins.values():
            plugin.start(metrics_port=free_port() if self.metrics else 0, usage_interval=self.usage_interval)
        api.create_namespace(CONTROLLER_NAMESPACE)
        self.controller_process.start()

    def workload(self, pod: Obj, logs: Mapping[str, Expected]) -> Obj:
        return pod  # the fake CRI pulls nothing and runs nothing: no logs

    def started(self, api: DemoApi, pod: Obj) -> bool:
        return bool(pod["status"].get("phase") == "Running")

    def checks(self, pods: Mapping[str, tuple[Obj, list[Obj]]]) -> str:
        return ""  # the table's CDI device IDs are all the fake CRI saw

    def received(self, pod: Obj, claim: Obj) -> str:
        """The CDI device IDs of the pod's CreateContainer calls, the claim's UID shown as <claim>."""
        name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
        record = self.cluster.nodes[pod["spec"]["nodeName"]].cri_record
        lines = [json.loads(line) for line in record.read_text().splitlines()]
        ids = {
            d
            for r in lines
            if r["podNamespace"] == namespace and r["podName"] == name
            for d in r["cdiDevices"]
        }
        return " ".join(sorted(i.replace(claim["metadata"]["uid"], "<claim>") for i in ids))

    def controller(self, api: DemoApi) -> StatusEndpoint:
        return self.controller_process.endpoint()

    def stop(self) -> None:
        self.controller_process.stop()
        for plugin in self.plugins.values():
            plugin.stop()


# Each example container's command with containerd: what CDI gave it, then the example's own command
# (its arguments follow the script: "$0" "$@"), which prints what the example says and sleeps.
# `[ -c ]` keeps a pattern that matched nothing out; `-S` sees the MPS daemon's socket through the mount.
SHOW = (
    'for d in /dev/nvidia[0-9]* /dev/nvidia-caps/*; do [ -c "$d" ] && echo "gpu-node $d"; done; '
    "for d in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do "
    '[ -c "$d" ] && echo "control-node $d"; done; '
    'echo "visible $NVIDIA_VISIBLE_DEVICES"; '
    '[ -S "$CUDA_MPS_PIPE_DIRECTORY/control" ] && echo "mps-pipe $CUDA_MPS_PIPE_DIRECTORY"; '
    'echo shown; exec "$0" "$@"'
)
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
RELEASE = "gpudra"
GPU_MINOR = re.compile(r"gpu-([0-9]+)")


@dataclass(frozen=True)
class ChartSource:
    """Where the chart and image come from: the checkout's chart with `make image`'s image imported into
    the nodes (`local`), or a release in an OCI registry the nodes pull from (`published`)."""

    chart: tuple[str, ...]  # helm install's chart arguments
    repository: str  # image.repository
    tag: str
    pull_policy: str
    described: str  # for the demo's heading

    @classmethod
    def local(cls, image: str) -> ChartSource:
        repository, _, tag = image.rpartition(":")
        return cls((str(helm.chart()),), repository, tag, "Never", "deploy/helm/gpudra")

    @classmethod
    def published(cls, registry: str, version: str) -> ChartSource:
        chart = f"oci://{registry}/charts/gpudra"
        return cls(
            (chart, "--version", version, "--plain-http"),
            f"{registry}/gpudra",
            version,
            "IfNotPresent",
            f"{chart} {version}",
        )

    @property
    def image(self) -> str:
        return f"{self.repository}:{self.tag}"


class HelmReleases:
    """gpudra's chart installed with Helm on the cluster with containerd, one release per node.

    The chart's DaemonSet takes one kubelet directory and one simulated machine, and here every node
    has its own of both (three kubelets on one host, a different machine each), so each node gets a
    release of its own, as docs/install.md describes for nodes that differ: the first (`gpudra`)
    with the controller and the DeviceClasses, every release with a nodeSelector for its node, that
    node's paths and its machine (`kubeletPlugin.options.nvml`)."""

    workload_note = (
        "  (every container runs in the gpudra image instead of its own, which cannot be pulled here:\n"
        "   it prints the GPU device nodes, NVIDIA_VISIBLE_DEVICES and MPS pipe it got, then runs the\n"
        "   example's own command, whose output is checked against what the example says it prints)"
    )
    received_heading = "WHAT ITS CONTAINERS FOUND IN /dev (THEIR OWN OUTPUT)"

    def __init__(
        self,
        cluster: LocalCluster,
        machines: Mapping[str, str],
        *,
        source: ChartSource,
        values: Sequence[str] = (),
        first_values: Sequence[str] = (),
    ) -> None:
        """`values`: more helm arguments for every release; `first_values`: for the controller's only."""
        self.cluster = cluster
        self.machines = machines
        self.source = source
        self.values = list(values)
        self.first_values = list(first_values)
        self.install_step = (
            f"installing gpudra with Helm ({source.described}, one release per node: its kubelet "
            "directory and simulated machine), the controller and DeviceClasses with the first"
        )
        self.nodes = {
            name: NodeFiles(
                cdi_root=cluster.nodes[name].cdi_root,
                checkpoint=cluster.nodes[name].plugins_dir / DRIVER / "checkpoint.json",
                sim_state=cluster.nodes[name].plugins_dir / DRIVER / "sim" / f"{profile}.json",
            )
            for name, profile in machines.items()
        }
        self.outputs: dict[tuple[str, str], list[str]] = {}  # (pod, container) -> its output
        self.expected: dict[tuple[str, str], Expected] = {}  # (pod, container) -> the example's word

    def releases(self) -> list[list[str]]:
        """`helm install` arguments per node, the controller's release first."""
        chart = helm.chart()  # its ci/ values, whichever chart is installed
        plugin_only = ["--set", "controller.enabled=false"]
        for kind in ("gpu", "shared", "mig", "migShared"):  # the first release owns every class
            plugin_only += ["--set", f"deviceClasses.{kind}=false"]
        found = []
        for index, (node, profile) in enumerate(self.machines.items()):
            first = index == 0
            found.append(
                [
                    "install",
                    RELEASE if first else f"{RELEASE}-{node}",
                    *self.source.chart,
                    *(["--create-namespace"] if first else plugin_only),
                    "-f",
                    str(chart / "ci" / "sim-values.yaml"),
                    "--set",
                    f"kubeletPlugin.options.nvml=sim:{profile}",
                    *publishing_values(profile),
                    "--set",
                    f"kubeletPlugin.nodeSelector.kubernetes\\.io/hostname={node}",
                    *helm.node_values(
                        self.cluster.nodes[node],
                        image_repository=self.source.repository,
                        pull_policy=self.source.pull_policy,
                    ),
                    "--set",
                    f"image.tag={self.source.tag}",
                    *self.values,
                    *(self.first_values if first else []),
                    "--wait",
                    "--timeout=240s",
                ]
            )
        return found

    def install(self, api: DemoApi) -> None:
        """Every release, each waited for (`--wait`), then gpudra's own pods: name, node, ready."""
        for args in self.releases():
            helm.helm(self.cluster.kubeconfig, *args, namespace=CONTROLLER_NAMESPACE)
            print(f"  helm install {args[1]}: deployed")
        rows: list[tuple[str, ...]] = []
        for pod in api.list_pods(CONTROLLER_NAMESPACE):
            conditions = pod["status"].get("conditions") or []
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            rows.append((pod["metadata"]["name"], pod["spec"]["nodeName"], "yes" if ready else "no"))
        print(table([("GPUDRA POD", "NODE", "READY"), *sorted(rows, key=lambda row: (row[1], row[0]))]))

    def workload(self, pod: Obj, logs: Mapping[str, Expected]) -> Obj:
        """The example's pod with every container in the gpudra image (nothing can be pulled here),
        printing what it got before it runs the example's own command; its claims, requests and
        everything else unchanged."""
        containers = []
        for container in pod["spec"]["containers"]:
            own = [*container.get("command", []), *container.get("args", [])]
            if not own:
                raise ClusterError(
                    f"pod {pod['metadata']['name']}: container {container['name']} has no command"
                )
            changed = {k: v for k, v in container.items() if k not in ("command", "args")}
            changed |= {
                "image": self.source.image,
                "imagePullPolicy": self.source.pull_policy,
                "command": ["/bin/sh", "-c", SHOW, *own],
            }
            containers.append(changed)
            self.expected[(pod["metadata"]["name"], container["name"])] = logs[container["name"]]
        return {
            **pod,
            "spec": {**pod["spec"], "containers": containers, "terminationGracePeriodSeconds": 1},
        }

    def started(self, api: DemoApi, pod: Obj) -> bool:
        """Running, and every container has printed what CDI gave it and as many lines of its own as
        its example says it prints."""
        if pod["status"].get("phase") != "Running":
            return False
        name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
        for container in pod["spec"]["containers"]:
            key = (name, container["name"])
            if key not in self.outputs:
                try:
                    output = api.pod_log(namespace, name, container["name"]).splitlines()
                except ApiException:
                    return False  # the container is starting again (its log is not there yet)
                if "shown" not in output or len(_own(output)) < len(self.expected[key].lines):
                    return False
                self.outputs[key] = output
        return True

    def _lines(self, pod: Obj, container: str, kind: str) -> list[str]:
        output = self.outputs[(pod["metadata"]["name"], container)]
        shown = output[: output.index("shown")]  # the demo's own lines, before the example's
        return [line.split(" ", 1)[1] for line in shown if line.startswith(f"{kind} ")]

    def received(self, pod: Obj, claim: Obj) -> str:
        """Per container: its GPU device nodes, its MIG capability nodes, and whether the MPS
        daemon's pipe was there; the container's name first where the pod has several."""
        parts = []
        containers = [c["name"] for c in pod["spec"]["containers"]]
        for container in containers:
            nodes = [n.removeprefix("/dev/") for n in self._lines(pod, container, "gpu-node")]
            mps = ["+ MPS pipe"] if self._lines(pod, container, "mps-pipe") else []
            seen = " ".join([*nodes, *mps]) or "no GPU"
            parts.append(f"{container}: {seen}" if len(containers) > 1 else seen)
        return "; ".join(parts)

    def checks(self, pods: Mapping[str, tuple[Obj, list[Obj]]]) -> str:
        """What every container printed, checked against its claims' allocation and CDI specs."""
        containers = [(p, c["name"]) for p, _ in pods.values() for c in p["spec"]["containers"]]
        control = sum(
            1 for pod, c in containers if set(self._lines(pod, c, "control-node")) == set(CONTROL_NODES)
        )
        visible = 0
        matching = 0
        for pod, claims in pods.values():
            specs = self.nodes[pod["spec"]["nodeName"]].cdi_specs()
            written = {
                env.removeprefix("NVIDIA_VISIBLE_DEVICES=")
                for c in claims
                for device in specs[c["metadata"]["uid"]]["devices"]
                for env in device["containerEdits"].get("env", [])
                if env.startswith("NVIDIA_VISIBLE_DEVICES=")
            }
            visible += sum(
                1 for c in pod["spec"]["containers"] if self._lines(pod, c["name"], "visible")[0] in written
            )
            allocated = {
                _gpu_node(r["device"])
                for c in claims
                for r in c["status"]["allocation"]["devices"]["results"]
            }
            seen = {
                n.removeprefix("/dev/")
                for c in pod["spec"]["containers"]
                for n in self._lines(pod, c["name"], "gpu-node")
                if not n.startswith("/dev/nvidia-caps/")
            }
            matching += seen == allocated
        of = f" of {len(containers)}"
        differ = []  # what a container printed where its example says otherwise
        for pod, c in containers:
            key = (pod["metadata"]["name"], c)
            own = _own(self.outputs[key])
            if not self.expected[key].matches(own):
                differ.append(
                    f"  {key[0]} -c {c} printed {own}, its example says {list(self.expected[key].lines)}"
                )
        restarts = sum(
            s.get("restartCount", 0)
            for p, _ in pods.values()
            for s in p["status"].get("containerStatuses") or []
        )
        return (
            "".join(f"{line}\n" for line in differ)
            + f"containers whose logs show what their example says: {len(containers) - len(differ)}{of}\n"
            f"container restarts: {restarts}\n"
            f"containers with /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia-uvm-tools: {control}{of}\n"
            f"containers whose NVIDIA_VISIBLE_DEVICES is a UUID in their claims' CDI specs: {visible}{of}\n"
            f"pods whose /dev/nvidia<N> are exactly their claims' GPUs: {matching} of {len(pods)}"
        )

    def controller(self, api: DemoApi) -> StatusEndpoint:
        """The controller's Service (kube-proxy routes its ClusterIP on this machine, as on a node), its
        webhook port, where /status is served with a token."""
        name = f"{RELEASE}-controller"
        service = api.service(CONTROLLER_NAMESPACE, name)
        port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "webhook")
        return StatusEndpoint(
            f"https://{service['spec']['clusterIP']}:{port}",
            webhook_ca(self.cluster, CONTROLLER_NAMESPACE, f"{RELEASE}-webhook-tls"),
            f"{name}.{CONTROLLER_NAMESPACE}.svc",
        )

    def stop(self) -> None:
        """Nothing: stopping the cluster stops every container."""


def _own(output: list[str]) -> list[str]:
    """What the example's own command printed: the lines after the demo's `shown`."""
    return output[output.index("shown") + 1 :]


def _gpu_node(device: str) -> str:
    """The GPU device node of a gpudra device: gpu-3, gpu-3-shared and gpu-3-mig-... are nvidia3's."""
    found = GPU_MINOR.match(device)
    if found is None:
        raise ClusterError(f"{device!r} is not a gpudra device name")
    return f"nvidia{found[1]}"


def image_of(archive: Path) -> str:
    """The chart's default image name in a `make image` archive: localhost/gpudra:<version>, the
    shorter of its two names (the other is localhost/gpudra:<version>-<commit>)."""
    return min(containerd.archive_tags(archive), key=len)
