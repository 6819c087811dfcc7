"""The chart, installed with Helm on a real kubelet with containerd, runs gpudra for real: the plugin in
its container registers through the mounted plugins_registry and publishes slices; the controller's
webhook, called by the API server through its Service, admits and refuses claims; a workload container
gets its GPU by CDI (NVIDIA_VISIBLE_DEVICES and the device nodes, stand-ins made by the simulator); a
rolling upgrade from the previous release's chart and image to this one keeps a plugin registered
throughout and neither loses nor repeats a prepared claim; and stopping the cluster leaves no shim,
container, mount or bridge behind.

The image and chart come from a loopback OCI registry, as a user's would (tests/e2e/conftest.py). The
tests run in file order and share one cluster and one release.
"""

from __future__ import annotations

import json
import re
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.integration.kube_helpers import Resources, pod_events, pod_gone, pod_running, wait_for
from tests.integration.procs import cluster_processes
from tests.localcluster import LocalCluster
from tests.localcluster import containerd as ctrd
from tests.localcluster.cluster import mounts_under

from .conftest import CHART, NAMESPACE, NODE, RELEASE, Published, helm, node_values

pytestmark = pytest.mark.e2e

DRIVER = "gpu.gpudra.io"
WORKLOAD_NS = "e2e"
PLUGIN_PODS = "app.kubernetes.io/component=kubelet-plugin"
MPS_HOST_PODS = "app.kubernetes.io/component=mps-host"
WHOLE_GPU = re.compile(r"gpu-[0-9]+")  # not the MIG partitions nor the shared GPUs
# The workload runs the gpudra image's shell: what CDI gave the container, then it waits to be deleted.
SHOW_GPU = (
    'echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; '
    "for d in /dev/nvidia*; do stat -c 'node %n %F %t:%T' \"$d\"; done; "
    "echo shown; exec sleep 3600"
)


def plugin_dir(cluster: LocalCluster) -> Path:
    return cluster.nodes[NODE].plugins_dir / DRIVER


def claim_specs(cluster: LocalCluster) -> dict[str, tuple[int, int]]:
    """The node's claim CDI specs: file name -> (inode, mtime): a rewritten spec changes both."""
    return {
        path.name: (path.stat().st_ino, path.stat().st_mtime_ns)
        for path in cluster.nodes[NODE].cdi_root.glob(f"{DRIVER}-claim_*.json")
    }


def checkpoint_claims(cluster: LocalCluster) -> set[str]:
    document = json.loads((plugin_dir(cluster) / "checkpoint.json").read_text())
    return set(document["data"]["claims"])


def registration_sockets(cluster: LocalCluster) -> list[str]:
    return sorted(p.name for p in cluster.nodes[NODE].registry_dir.glob(f"{DRIVER}*-reg.sock"))


def plugin_pods(core: client.CoreV1Api) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(NAMESPACE, label_selector=PLUGIN_PODS).items)


def ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def workload(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "show",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/bin/sh", "-c", SHOW_GPU],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        },
    }


def logs(core: client.CoreV1Api, name: str) -> str:
    return str(core.read_namespaced_pod_log(name, WORKLOAD_NS))


def start_workload(core: client.CoreV1Api, name: str, published: Published) -> None:
    """A pod running this release's image (the node has it: the chart's pods pulled it)."""
    core.create_namespaced_pod(WORKLOAD_NS, workload(name, f"{published.repository}:{published.version}"))


def wait_shown(core: client.CoreV1Api, name: str, *, timeout: float = 120) -> str:
    wait_for(f"pod {name} running", lambda: pod_running(core, name, WORKLOAD_NS), timeout=timeout)

    def shown() -> str | None:
        text = logs(core, name)
        return text if "shown" in text else None

    return wait_for(f"pod {name}'s output", shown)


@pytest.fixture(scope="module")
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def test_the_registry_serves_one_manifest_list_for_amd64_and_arm64(published: Published) -> None:
    index = published.registry.manifest("gpudra", published.version)
    platforms = sorted(
        f"{m['platform']['os']}/{m['platform']['architecture']}"
        for m in index["manifests"]  # type: ignore[attr-defined]
    )
    assert platforms == ["linux/amd64", "linux/arm64"], index


def test_helm_install_from_the_registry_runs_the_plugin_and_controller_in_containers(
    installed: str, cluster: LocalCluster, core: client.CoreV1Api, api: client.ApiClient, published: Published
) -> None:
    assert f"gpudra {published.version} is installed" in installed  # the chart's NOTES
    [plugin] = plugin_pods(core)
    assert ready(plugin)
    # The image came from the registry: the node's containerd pulled it (nothing was imported).
    assert plugin.spec.containers[0].image == f"{published.repository}:{published.version}"
    images = cluster.runtimes[NODE].images(cluster.runtime_bin)
    assert f"{published.repository}:{published.version}" in images, images
    assert not [name for name in images if name.startswith("localhost/gpudra")], images
    # Its start-up line names the build: pyproject.toml's version, the revision the image was built at.
    log = core.read_namespaced_pod_log(plugin.metadata.name, NAMESPACE)
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    [starting] = [line for line in lines if line.get("msg") == "starting"]
    assert starting["version"] == published.version
    assert re.fullmatch(r"[0-9a-f]{40}", starting["revision"]), starting
    # The plugin registered with the kubelet through the mounted plugins_registry, under its pod's UID.
    sockets = registration_sockets(cluster)
    assert len(sockets) == 1, sockets
    controllers = core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=controller")
    assert [ready(pod) for pod in controllers.items] == [True]
    # The simulated DGX H100's 8 GPUs are published for the node.
    resources = Resources(api)

    def gpus() -> list[str] | None:
        slices = resources.list("resourceslices", field_selector=f"spec.nodeName={NODE}")
        names = [
            d["name"] for s in slices for d in s["spec"].get("devices", []) if WHOLE_GPU.fullmatch(d["name"])
        ]
        return names if len(names) == 8 else None

    assert sorted(wait_for("8 GPUs published", gpus)) == [f"gpu-{i}" for i in range(8)]
    # The stand-in device nodes the CDI specs will name, made by the plugin in its own directory.
    assert (plugin_dir(cluster) / "sim" / "dev" / "nvidia0").is_char_device()
    # This node's driver root is not / (a directory of the cluster's, as /run/nvidia/driver with the
    # GPU Operator): the chart mounts the plugin's directory at its own path inside it, where MPS
    # daemons run, and the plugin found it there.
    assert cluster.nodes[NODE].driver_root != Path("/")
    log = core.read_namespaced_pod_log(plugin.metadata.name, NAMESPACE)
    assert "the state directory is at its own path inside the driver root: MPS can run" in log


def test_the_webhook_behind_its_service_refuses_a_bad_config(
    installed: str, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    core.create_namespace({"metadata": {"name": WORKLOAD_NS}})
    resources = Resources(api)
    bad = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "bad"},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
            "config": [{"opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "Sometimes"},
            }}}],
        }}},
    }  # fmt: skip
    with pytest.raises(ApiException) as refused:
        resources.create("resourceclaimtemplates", bad, WORKLOAD_NS)
    assert refused.value.status in (400, 422)
    assert "sharing.strategy" in str(refused.value.body), refused.value.body
    good = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu"},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
        },
    }
    resources.create("resourceclaimtemplates", good, WORKLOAD_NS)


def test_a_workload_container_gets_its_gpu_by_cdi_and_gives_it_back(
    installed: str, cluster: LocalCluster, core: client.CoreV1Api, published: Published
) -> None:
    start_workload(core, "show-gpu", published)
    output = wait_shown(core, "show-gpu")
    [visible] = [line for line in output.splitlines() if line.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible.startswith("NVIDIA_VISIBLE_DEVICES=GPU-"), output
    nodes = {line.split()[1]: line.split()[-1] for line in output.splitlines() if line.startswith("node ")}
    # One GPU's node (major 0xc3 = 195) and the control nodes, character devices as on a real node.
    gpu_nodes = [path for path in nodes if path.removeprefix("/dev/nvidia").isdigit()]
    assert len(gpu_nodes) == 1, output
    assert nodes[gpu_nodes[0]].startswith("c3:"), output
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= set(nodes), output
    assert "character special file" in output
    assert len(claim_specs(cluster)) == 1
    assert len(checkpoint_claims(cluster)) == 1

    core.delete_namespaced_pod("show-gpu", WORKLOAD_NS)
    wait_for("show-gpu deleted", lambda: pod_gone(core, "show-gpu", WORKLOAD_NS), timeout=90)
    wait_for("its claim unprepared", lambda: not claim_specs(cluster) and not checkpoint_claims(cluster))


def test_an_upgrade_from_the_previous_release_keeps_the_plugin_registered_and_every_claim_prepared_once(
    installed: str, cluster: LocalCluster, core: client.CoreV1Api, published: Published
) -> None:
    # The previous release's chart and image first (deploy/release/previous.sh), as a cluster that ran
    # it would have them, with the claims it prepared; then `helm upgrade` to this release.
    helm(
        cluster,
        "upgrade",
        RELEASE,
        published.chart,
        "--version",
        published.previous,
        "--plain-http",
        # The install's own values, not --reuse-values: those now hold keys the older schema refuses.
        "--reset-values",
        "-f",
        str(CHART / "ci" / "sim-values.yaml"),
        *node_values(cluster, published),
        # This release's image under the previous chart: the previous plugin's simulator refuses the
        # simulated GPUs' state file this release wrote (fields it does not know; real GPUs keep no such
        # file), so the step back is the chart's only.
        "--set",
        f"image.tag={published.version}",
        "--wait",
        "--timeout=240s",
    )

    def running(version: str) -> bool:
        pods = plugin_pods(core)
        return (
            len(pods) == 1
            and ready(pods[0])
            and pods[0].metadata.labels["helm.sh/chart"] == f"gpudra-{version}"
        )

    wait_for("the previous chart's plugin", partial(running, published.previous), timeout=180)
    for name in ("before-1", "before-2"):
        start_workload(core, name, published)
    for name in ("before-1", "before-2"):
        wait_shown(core, name)
    before_specs = claim_specs(cluster)
    before_claims = checkpoint_claims(cluster)
    assert len(before_specs) == len(before_claims) == 2
    [old_plugin] = plugin_pods(core)

    # Watch the registration directory through the whole upgrade: it must never be empty.
    fewest: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            fewest.append(len(registration_sockets(cluster)))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        helm(
            cluster,
            "upgrade",
            RELEASE,
            published.chart,
            "--version",
            published.version,
            "--plain-http",
            # The previous release's values, over this chart's defaults for what it adds (a plain
            # --reuse-values would leave the new keys, e.g. mpsHost, unset: docs/install.md, Upgrade).
            "--reset-then-reuse-values",
        )
        # A pod admitted while the rollout runs (both plugin pods exist: maxSurge 1).
        wait_for("a second plugin pod", lambda: len(plugin_pods(core)) == 2, timeout=60)
        start_workload(core, "during", published)

        def rolled_out() -> bool:
            pods = plugin_pods(core)
            return running(published.version) and pods[0].metadata.uid != old_plugin.metadata.uid

        wait_for("the DaemonSet rolled out", rolled_out, timeout=180)
        wait_shown(core, "during")
    finally:
        stop.set()
        sampler.join()
    assert fewest and min(fewest) >= 1, f"no registration socket at some point: {fewest}"
    assert len(registration_sockets(cluster)) == 1

    # The old claims are still prepared, by the same spec files (not prepared again), and known to the
    # new plugin; the pod admitted during the rollout got its own.
    after = claim_specs(cluster)
    assert {name: after.get(name) for name in before_specs} == before_specs
    assert before_claims < checkpoint_claims(cluster)
    assert len(after) == len(checkpoint_claims(cluster)) == 3

    # The new plugin gives back what the old one prepared.
    for name in ("before-1", "before-2", "during"):
        core.delete_namespaced_pod(name, WORKLOAD_NS)
    for name in ("before-1", "before-2", "during"):
        wait_for(f"{name} deleted", partial(pod_gone, core, name, WORKLOAD_NS), timeout=90)
    wait_for("every claim unprepared", lambda: not claim_specs(cluster) and not checkpoint_claims(cluster))


def mps_client(name: str, image: str) -> dict[str, Any]:
    """A pod of the claim `mps-gpu` running the simulator's stand-in CUDA application: it attaches to
    the claim's MPS daemon, prints `attached <daemon pid> threads=... memory=...`, and fails (never
    restarted) the moment the daemon ends, as a real client loses its MPS server."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "cuda",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    # As root: the simulated daemon's control socket is root's (a real daemon serves
                    # each client uid with a server of its own, docs/architecture.md).
                    "securityContext": {"runAsUser": 0},
                    "command": ["python3", "-m", "gpudra.sim.mps_client"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "mps-gpu"}],
        },
    }


def attached(core: client.CoreV1Api, name: str) -> str:
    """The client's line, once it printed it; a pod that ended or never ran fails with what it said and
    its events."""

    def line() -> str | None:
        pod = core.read_namespaced_pod(name, WORKLOAD_NS)
        if pod.status.phase in ("Failed", "Succeeded"):
            raise AssertionError(f"{name} ended: {logs(core, name)!r} {pod_events(core, name, WORKLOAD_NS)}")
        return (logs(core, name).strip() or None) if pod.status.phase == "Running" else None

    try:
        return wait_for(f"{name} attached", line, timeout=180)
    except AssertionError as err:
        raise AssertionError(f"{err}; events: {pod_events(core, name, WORKLOAD_NS)}") from err


def daemon_pid_files(cluster: LocalCluster) -> list[Path]:
    return list((plugin_dir(cluster) / "mps").glob("*/pipe/nvidia-cuda-mps-control.pid"))


def test_an_upgrade_and_a_container_restart_leave_the_mps_daemon_and_its_attached_client_running(
    installed: str, cluster: LocalCluster, core: client.CoreV1Api, api: client.ApiClient, published: Published
) -> None:
    resources = Resources(api)
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mps-gpu"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
            "config": [{"opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {
                    "defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "16Gi"}},
            }}}],
        }},
    }  # fmt: skip
    resources.create("resourceclaims", claim, WORKLOAD_NS)
    image = f"{published.repository}:{published.version}"
    core.create_namespaced_pod(WORKLOAD_NS, mps_client("mps-before", image))
    before = attached(core, "mps-before")
    assert re.fullmatch(r"attached [0-9]+ threads=40\.0 memory=GPU-[0-9a-f-]+=16384M", before), before
    [pid_file] = daemon_pid_files(cluster)
    daemon = (pid_file.read_text(), pid_file.stat().st_ino)
    [old_plugin] = plugin_pods(core)
    hosts = {p.metadata.uid for p in core.list_namespaced_pod(NAMESPACE, label_selector=MPS_HOST_PODS).items}
    assert len(hosts) == 1

    # A new image tag (the same image under another name, as a patch release would be): the plugin's
    # DaemonSet rolls; mps-host's (OnDelete) keeps its pod, and with it the daemon.
    tag = f"{published.version}-next"
    published.registry.tag("gpudra", published.version, tag)
    helm(
        cluster, "upgrade", RELEASE, published.chart, "--version", published.version, "--plain-http",
        "--reuse-values", "--set", f"image.tag={tag}", "--wait", "--timeout=240s",
    )  # fmt: skip

    def rolled_out() -> bool:
        pods = plugin_pods(core)
        return (
            len(pods) == 1
            and ready(pods[0])
            and pods[0].metadata.uid != old_plugin.metadata.uid
            and pods[0].spec.containers[0].image == f"{published.repository}:{tag}"
        )

    wait_for("the plugin on the new image", rolled_out, timeout=180)
    # mps-host's DaemonSet kept its installed pod template (the chart's lookup), so `--wait` completed.
    [host_set] = (
        client.AppsV1Api(api).list_namespaced_daemon_set(NAMESPACE, label_selector=MPS_HOST_PODS).items
    )
    assert host_set.spec.template.spec.containers[0].image == image
    assert {
        p.metadata.uid for p in core.list_namespaced_pod(NAMESPACE, label_selector=MPS_HOST_PODS).items
    } == (hosts)
    # A container restart: the plugin's process SIGKILLed in its container, which the kubelet starts
    # again in the same pod.
    [plugin] = plugin_pods(core)
    container = plugin.status.container_statuses[0]
    cluster.runtimes[NODE].ctr(
        cluster.runtime_bin, "task", "kill", "--signal", "SIGKILL", container.container_id.split("://")[-1]
    )

    def restarted() -> bool:
        [pod] = plugin_pods(core)
        return pod.status.container_statuses[0].restart_count > container.restart_count and ready(pod)

    wait_for("the plugin's container started again", restarted, timeout=180)
    # The client attached before is still attached (a lost daemon would have ended its only container),
    # and a client attaching after the upgrade and the restart reaches the same daemon, with its limits.
    core.create_namespaced_pod(WORKLOAD_NS, mps_client("mps-after", image))
    assert attached(core, "mps-after") == before
    assert pod_running(core, "mps-before", WORKLOAD_NS)
    status = core.read_namespaced_pod("mps-before", WORKLOAD_NS).status
    assert status.container_statuses[0].restart_count == 0
    assert logs(core, "mps-before").strip() == before
    assert daemon_pid_files(cluster) == [pid_file]
    assert (pid_file.read_text(), pid_file.stat().st_ino) == daemon

    # The upgraded plugin gives the claim back: exactly that daemon stopped.
    for name in ("mps-before", "mps-after"):
        core.delete_namespaced_pod(name, WORKLOAD_NS)
    for name in ("mps-before", "mps-after"):
        wait_for(f"{name} deleted", partial(pod_gone, core, name, WORKLOAD_NS), timeout=90)
    resources.delete("resourceclaims", "mps-gpu", WORKLOAD_NS)
    wait_for("the claim unprepared", lambda: not claim_specs(cluster) and not checkpoint_claims(cluster))
    wait_for("its daemon stopped", lambda: not daemon_pid_files(cluster))


def test_stopping_the_cluster_leaves_nothing_behind(cluster: LocalCluster) -> None:
    sockets = [runtime.socket for runtime in cluster.runtimes.values()]
    bridges = [runtime.bridge for runtime in cluster.runtimes.values()]
    assert any(ctrd.shim_pids(socket) for socket in sockets)  # the chart's pods are running
    cluster.stop()
    assert [ctrd.shim_pids(socket) for socket in sockets] == [[] for _ in sockets]
    assert cluster_processes(str(cluster.directory)) == []
    assert mounts_under(cluster.directory) == []
    assert [ctrd.bridge_exists(bridge) for bridge in bridges] == [False for _ in bridges]
