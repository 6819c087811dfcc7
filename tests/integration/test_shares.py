"""MPS and GPU shares on the real control plane: the real scheduler allocates shares of one GPU from its
consumable capacity (KEP-5075), the real kubelet calls the plugin, and the simulated card's MPS daemons
carry each claim's limits; with shares by count, N pods share a GPU without stating memory and pod N+1
waits, `gpudra explain` naming the count. MPS daemons outlive a SIGKILLed plugin and are adopted at its
restart; one that dies while its claim runs is started again by the running plugin.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, utils

from gpudra.node import faults
from gpudra.node.sharing.mps_daemons import PID_FILE
from tests.localcluster.cluster import free_port
from tests.localcluster.node_plugin import DRIVER, PluginProcess

from .kube_helpers import (
    claim_pod,
    claim_template,
    new_namespace,
    pod_gone,
    pod_running,
    unschedulable,
    wait_for,
)

NODE = "node-h100"
MINOR = 6  # the H100 these tests share; the MIG tests use others at the same time only in other runs
GIB = 2**30


def share_template(
    name: str, memory_gib: int, compute: int, parameters: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A claim for one share of the H100 with MINOR: memory and compute asked as consumable capacity."""
    selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].minor == {MINOR}'}}
    request = {
        "name": "share",
        "exactly": {
            "deviceClassName": "gpu-shared.gpudra.io",
            "selectors": [selector],
            "capacity": {"requests": {"memory": f"{memory_gib}Gi", "compute": str(compute)}},
        },
    }
    devices: dict[str, Any] = {"requests": [request]}
    if parameters is not None:
        devices["config"] = [{"requests": ["share"], "opaque": {"driver": DRIVER, "parameters": parameters}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}},
    }


def mps_template(name: str, threads: int) -> dict[str, Any]:
    return claim_template(
        name,
        {
            "apiVersion": "resource.gpudra.io/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": threads}},
        },
    )


def daemons(plugin: PluginProcess) -> list[dict[str, Any]]:
    """The simulated card's MPS control daemons that are alive."""
    return plugin.mps_daemons()


def mps_dirs(plugin: PluginProcess) -> list[str]:
    root = plugin.state_dir / "mps"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def allocation(api: client.ApiClient, found: client.V1Pod) -> dict[str, Any]:
    name = found.status.resource_claim_statuses[0].resource_claim_name
    claim = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "resource.k8s.io", "v1", found.metadata.namespace, "resourceclaims", name
    )
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return dict(result)


@pytest.fixture
def plugin(gpudra: dict[str, PluginProcess]) -> Iterator[PluginProcess]:
    yield gpudra[NODE]
    if gpudra[NODE].process is None or gpudra[NODE].process.poll() is not None:
        gpudra[NODE].start()


def _cleanup(core: client.CoreV1Api, ns: str, plugin: PluginProcess) -> None:
    for item in core.list_namespaced_pod(ns).items:
        core.delete_namespaced_pod(item.metadata.name, ns, grace_period_seconds=0)
    for item in core.list_namespaced_pod(ns).items:
        wait_for("pod deleted", partial(pod_gone, core, item.metadata.name, ns), timeout=90)
    wait_for(
        "no MPS daemon or directory left", lambda: not daemons(plugin) and not mps_dirs(plugin), timeout=60
    )
    wait_for("every claim unprepared", lambda: not _mps_left(plugin), timeout=60)
    core.delete_namespace(ns)


def _mps_left(plugin: PluginProcess) -> list[str]:
    """Claims with an MPS device still in a CDI spec or the checkpoint."""
    specs = [uid for uid, spec in plugin.cdi_specs().items() if "nvidia-mps" in json.dumps(spec)]
    return specs + [uid for uid, entry in plugin.checkpoint_claims().items() if '"MPS"' in json.dumps(entry)]


def test_shares_of_one_h100_get_their_capacity_as_mps_limits_and_a_fourth_waits(
    api: client.ApiClient, plugin: PluginProcess
) -> None:
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "shares")
    asks = {"share-10": (10, 10), "share-20": (20, 20), "share-40": (40, 40), "late-20": (20, 20)}
    objects = [share_template(name, gib, compute) for name, (gib, compute) in asks.items()]
    objects += [claim_pod(name, {"gpu": name}, node=NODE) for name in list(asks)[:3]]
    utils.create_from_yaml(api, yaml_objects=objects, namespace=ns)
    running = {
        n: wait_for(f"{n} Running", partial(pod_running, core, n, ns), timeout=120) for n in list(asks)[:3]
    }
    results = {n: allocation(api, p) for n, p in running.items()}
    assert {r["device"] for r in results.values()} == {f"gpu-{MINOR}-shared"}
    assert len({r["shareID"] for r in results.values()}) == 3
    limits = {
        (d["default_active_thread_percentage"], tuple(d["default_pinned_memory_limits"].values()))
        for d in daemons(plugin)
    }
    assert limits == {(10.0, ("10240M",)), (20.0, ("20480M",)), (40.0, ("40960M",))}
    # Each claim's CDI device carries its share ID, and mounts its own daemon's pipe.
    specs = plugin.cdi_specs()
    for result in results.values():
        named = [
            d for spec in specs.values() for d in spec["devices"] if d["name"].endswith(result["shareID"])
        ]
        assert len(named) == 1
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in named[0]["containerEdits"]["env"]

    # 10 + 20 + 40 GiB are taken of the 79 GiB a share may ask: 20 more do not fit.
    utils.create_from_yaml(
        api, yaml_objects=[claim_pod("late-20", {"gpu": "late-20"}, node=NODE)], namespace=ns
    )
    wait_for("late-20 Unschedulable", lambda: unschedulable(core, "late-20", ns), timeout=60)
    assert len(daemons(plugin)) == 3

    core.delete_namespaced_pod("share-40", ns, grace_period_seconds=0)
    late = wait_for("late-20 Running", partial(pod_running, core, "late-20", ns), timeout=120)
    assert allocation(api, late)["device"] == f"gpu-{MINOR}-shared"
    wait_for(
        "the 40 GiB daemon stopped, the late one running",
        lambda: sorted(d["default_active_thread_percentage"] for d in daemons(plugin)) == [10.0, 20.0, 20.0],
        timeout=60,
    )
    _cleanup(core, ns, plugin)


COUNT = 4  # --shares-per-gpu for the test below


@pytest.fixture
def counted(plugin: PluginProcess, api: client.ApiClient) -> Iterator[PluginProcess]:
    """The H100 node's plugin restarted with shares by count (--shares-per-gpu COUNT), its slices
    carrying the count; restarted as it was afterwards."""
    original = plugin.group
    plugin.stop()
    plugin.group = {**original, "shares-per-gpu": str(COUNT)}
    try:
        plugin.start()
        wait_for(
            "the shared devices carry the count", lambda: _count_published(api) == str(COUNT), timeout=60
        )
        yield plugin
    finally:
        plugin.stop()
        plugin.group = original
        plugin.start()
        wait_for("the count is gone", lambda: _count_published(api) is None, timeout=60)


def _count_published(api: client.ApiClient) -> str | None:
    slices = client.CustomObjectsApi(api).list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices"
    )
    for item in slices["items"]:
        spec = item["spec"]
        if spec.get("nodeName") != NODE or spec.get("driver") != DRIVER:
            continue
        for device in spec.get("devices") or []:
            if device["name"] == f"gpu-{MINOR}-shared":
                return (device.get("capacity", {}).get("shares") or {}).get("value")
    return None


def count_template(name: str) -> dict[str, Any]:
    """A claim for one share of the H100 with MINOR by count: `shares: 1`, no memory, no config."""
    selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].minor == {MINOR}'}}
    request = {
        "name": "share",
        "exactly": {
            "deviceClassName": "gpu-shared.gpudra.io",
            "selectors": [selector],
            "capacity": {"requests": {"shares": "1"}},
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def test_shares_by_count_let_n_pods_share_a_gpu_with_1_nth_of_its_memory_and_pod_n_plus_1_waits(
    api: client.ApiClient, cluster: Any, counted: PluginProcess
) -> None:
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "count")
    names = [f"count-{n}" for n in range(1, COUNT + 2)]
    objects: list[dict[str, Any]] = [count_template("by-count")]
    objects += [claim_pod(name, {"gpu": "by-count"}, node=NODE) for name in names[:COUNT]]
    utils.create_from_yaml(api, yaml_objects=objects, namespace=ns)
    running = {
        n: wait_for(f"{n} Running", partial(pod_running, core, n, ns), timeout=120) for n in names[:COUNT]
    }
    results = [allocation(api, p) for p in running.values()]
    assert {r["device"] for r in results} == {f"gpu-{MINOR}-shared"}
    # the request policy's defaults: one share, and 79 whole GiB / 4 of memory, no SM share
    assert [r["consumedCapacity"] for r in results] == [
        {"memory": "19Gi", "compute": "0", "shares": "1"}
    ] * COUNT
    # under MPS, a share's default strategy, that memory is each claim's pinned limit
    assert (
        sorted(tuple(d["default_pinned_memory_limits"].values()) for d in daemons(counted))
        == [("19456M",)] * COUNT
    )

    last = names[COUNT]
    utils.create_from_yaml(api, yaml_objects=[claim_pod(last, {"gpu": "by-count"}, node=NODE)], namespace=ns)
    wait_for(f"{last} Unschedulable", lambda: unschedulable(core, last, ns), timeout=60)
    explained = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpudra",
            "explain",
            "-n",
            ns,
            f"--kubeconfig={cluster.kubeconfig}",
            f"pod/{last}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert explained.returncode == 1, explained.stderr
    assert f"shares: needs 1, 0 of {COUNT} left" in explained.stdout, explained.stdout

    core.delete_namespaced_pod(names[0], ns, grace_period_seconds=0)
    wait_for(f"{last} Running", partial(pod_running, core, last, ns), timeout=120)
    _cleanup(core, ns, counted)


def test_a_whole_gpu_claim_waits_while_shares_hold_the_gpu(
    api: client.ApiClient, plugin: PluginProcess
) -> None:
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "shares-whole")
    selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].minor == {MINOR}'}}
    whole = claim_template("whole")
    whole["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [selector]
    utils.create_from_yaml(
        api,
        yaml_objects=[share_template("share", 8, 0), whole, claim_pod("share", {"gpu": "share"}, node=NODE)],
        namespace=ns,
    )
    wait_for("share Running", partial(pod_running, core, "share", ns), timeout=120)
    [daemon] = daemons(plugin)
    assert daemon["default_active_thread_percentage"] == 100.0  # compute 0: no SM cap
    utils.create_from_yaml(api, yaml_objects=[claim_pod("whole", {"gpu": "whole"}, node=NODE)], namespace=ns)
    wait_for("whole Unschedulable", lambda: unschedulable(core, "whole", ns), timeout=60)
    core.delete_namespaced_pod("share", ns, grace_period_seconds=0)
    wait_for("whole Running", partial(pod_running, core, "whole", ns), timeout=120)
    _cleanup(core, ns, plugin)


def _two_mps_pods_running(api: client.ApiClient, core: client.CoreV1Api, prefix: str) -> str:
    """A new namespace with pods "half" (MPS, 50% of the threads) and "share" (a 16 GiB share at 25%),
    both Running on NODE; the namespace's name."""
    ns = new_namespace(core, prefix)
    utils.create_from_yaml(
        api,
        yaml_objects=[
            mps_template("half", 50),
            share_template("share", 16, 25),
            claim_pod("half", {"gpu": "half"}, node=NODE),
            claim_pod("share", {"gpu": "share"}, node=NODE),
        ],
        namespace=ns,
    )
    for name in ("half", "share"):
        wait_for(f"{name} Running", partial(pod_running, core, name, ns), timeout=120)
    return ns


def test_mps_daemons_survive_a_plugin_sigkill_and_are_adopted(
    api: client.ApiClient, plugin: PluginProcess
) -> None:
    core = client.CoreV1Api(api)
    ns = _two_mps_pods_running(api, core, "mps-adopt")
    before = {d["pid"]: d["default_active_thread_percentage"] for d in daemons(plugin)}
    assert sorted(before.values()) == [25.0, 50.0]

    assert plugin.process is not None and plugin.mps_host.process is not None
    host = plugin.mps_host.process.pid
    assert {_parent(pid) for pid in before} == {host}  # mps-host's children, not the plugin's
    plugin.process.send_signal(signal.SIGKILL)
    assert plugin.wait_killed() == -signal.SIGKILL
    assert {d["pid"] for d in daemons(plugin)} == set(before)  # the workloads' daemons keep running
    plugin.start()
    assert {d["pid"] for d in daemons(plugin)} == set(before)  # adopted, not started again

    core.delete_namespaced_pod("half", ns, grace_period_seconds=0)
    wait_for("half's daemon stopped", lambda: len(daemons(plugin)) == 1, timeout=90)
    [left] = daemons(plugin)
    assert before[left["pid"]] == 25.0  # exactly the other claim's daemon is left
    _cleanup(core, ns, plugin)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[1])


def _serving(plugin: PluginProcess) -> dict[str, dict[str, Any]]:
    """Pipe directory -> the daemon that serves it now (the pid in its pid file): a daemon killed with
    SIGKILL leaves its record in the simulated card's state, under the same directory."""
    serving = {}
    for daemon in daemons(plugin):
        try:
            pid = int((Path(daemon["pipe_directory"]) / PID_FILE).read_text())
        except (OSError, ValueError):
            continue
        if pid == daemon["pid"]:
            serving[daemon["pipe_directory"]] = daemon
    return serving


def _limits(daemon: dict[str, Any]) -> tuple[Any, ...]:
    return (
        daemon["visible_devices"],
        daemon["default_active_thread_percentage"],
        daemon["default_pinned_memory_limits"],
    )


def test_an_mps_daemon_killed_while_its_claim_runs_is_started_again_with_its_limits(
    api: client.ApiClient, plugin: PluginProcess
) -> None:
    """What a rolling update does to the daemons the old plugin pod started (they die with its
    container), and what a crashed daemon does: the running plugin notices and starts it again."""
    core = client.CoreV1Api(api)
    plugin.stop()
    plugin.start(metrics_port=free_port(), mps_check_interval=0.5)
    try:
        ns = _two_mps_pods_running(api, core, "mps-keep")
        before = _serving(plugin)
        [pipe] = [p for p, d in before.items() if d["default_active_thread_percentage"] == 50.0]
        [other] = set(before) - {pipe}
        killed = before[pipe]["pid"]
        os.kill(killed, signal.SIGKILL)

        # Counted once the daemon answers with its limits set (it registers, then gets them).
        wait_for(
            "the killed daemon counted as started again",
            lambda: plugin.metrics()['gpudra_mps_daemon_restarts_total{outcome="started"}'] == 1,
            timeout=60,
        )
        after = _serving(plugin)
        assert after[pipe]["pid"] != killed
        assert _limits(after[pipe]) == _limits(before[pipe])
        assert after[other] == before[other]  # the claim whose daemon ran is left as it was
        [event] = wait_for(
            "a MpsDaemonRestarted event",
            lambda: [
                e for e in _node_events(api, "MpsDaemonRestarted") if f"ResourceClaim {ns}/" in e.message
            ],
        )
        assert event.type == "Warning"
        assert "MPS daemon of a prepared claim had stopped; started again" in plugin.tail(200)
        # Its clients lost their server: the GPU "half" holds alone is Unhealthy in its pod's status
        # (KEP-4680, through the real kubelet); the share's pod, whose device other claims share, is not.
        wait_for(
            "half's GPU Unhealthy in its pod status",
            lambda: _device_health(core, "half", ns) == {"Unhealthy"},
        )
        assert _device_health(core, "share", ns) <= {"Healthy"}

        core.delete_namespaced_pod("half", ns, grace_period_seconds=0)
        wait_for("half's daemon stopped", lambda: list(_serving(plugin)) == [other], timeout=90)
        _cleanup(core, ns, plugin)  # unprepared cleanly: no daemon, directory, CDI spec or entry left
    finally:
        plugin.stop()
        plugin.start()


def _device_health(core: client.CoreV1Api, pod: str, namespace: str) -> set[str]:
    """The health of each device in the pod's allocatedResourcesStatus, read as the API server returns
    it (a client model could drop the field)."""
    document: dict[str, Any] = core.read_namespaced_pod(pod, namespace, _preload_content=False).json()
    containers = document.get("status", {}).get("containerStatuses") or []
    return {
        resource["health"]
        for container in containers
        for status in container.get("allocatedResourcesStatus") or []
        for resource in status.get("resources") or []
    }


def _node_events(api: client.ApiClient, reason: str) -> list[Any]:
    events = client.CoreV1Api(api).list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={NODE},reason={reason}"
    )
    return list(events.items)


@pytest.mark.parametrize(
    ("action", "step"),
    [
        *itertools.product(["prepare"], faults.MPS_PREPARE_STEPS),
        *itertools.product(["unprepare"], faults.MPS_UNPREPARE_STEPS),
    ],
)
def test_sigkill_at_every_mps_step_then_restart_leaves_no_orphan(
    api: client.ApiClient, plugin: PluginProcess, action: str, step: str
) -> None:
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "mps-crash")
    objects = [mps_template("victim", 30), claim_pod("victim", {"gpu": "victim"}, node=NODE)]
    if action == "prepare":
        plugin.stop()
        plugin.start(crash_at=step)
        utils.create_from_yaml(api, yaml_objects=objects, namespace=ns)
        assert plugin.wait_killed() == -signal.SIGKILL
        plugin.start()
        wait_for("pod Running after the restart", lambda: pod_running(core, "victim", ns), timeout=120)
        assert len(daemons(plugin)) == 1
    else:
        utils.create_from_yaml(api, yaml_objects=objects, namespace=ns)
        wait_for("pod Running", lambda: pod_running(core, "victim", ns), timeout=120)
        plugin.stop()
        plugin.start(crash_at=step)
        core.delete_namespaced_pod("victim", ns, grace_period_seconds=0)
        assert plugin.wait_killed() == -signal.SIGKILL
        plugin.start()
    _cleanup(core, ns, plugin)  # no daemon, directory, CDI spec or checkpoint entry is left


def _pipe_mount(spec: Any) -> Path | None:
    """The host side of the pipe directory a claim's CDI spec mounts into its containers."""
    if isinstance(spec, dict):
        if spec.get("containerPath") == "/tmp/nvidia-mps":
            return Path(spec["hostPath"])
        found = [_pipe_mount(value) for value in spec.values()]
    elif isinstance(spec, list):
        found = [_pipe_mount(value) for value in spec]
    else:
        return None
    return next((f for f in found if f is not None), None)


@pytest.mark.parametrize("tampering", ["fifo", "foreign-pid", "deleted"])
def test_a_tenants_tampered_pipe_directory_costs_other_claims_nothing_and_kills_only_its_daemon(
    api: client.ApiClient, plugin: PluginProcess, tampering: str
) -> None:
    """Issue 29, items 2-4, done on the host side of the mount the claim's CDI spec gives its containers:
    the pid file replaced by a FIFO (unprepare blocked under the node lock), the other tenant's daemon's
    pid written into it (the plugin killed that daemon), the pid file deleted (the daemon ran forever).
    Meanwhile another claim is prepared; the tenant's pod deleted, exactly its daemon stops, the other
    tenant's keeps its pid and answers, and the tampering is a MpsTampering event naming the claim."""
    core = client.CoreV1Api(api)
    ns = _two_mps_pods_running(api, core, f"mps-{tampering}")
    try:
        claim_name, pipe = _claim_pipe(api, core, plugin, ns, "half")
        _, victims_pipe = _claim_pipe(api, core, plugin, ns, "share")
        serving = _serving(plugin)
        attacker, victim = serving[str(pipe)]["pid"], serving[str(victims_pipe)]["pid"]
        pid_file = pipe / PID_FILE
        pid_file.unlink()
        if tampering == "fifo":
            os.mkfifo(pid_file)
        elif tampering == "foreign-pid":
            pid_file.write_text(f"{victim}\n")

        utils.create_from_yaml(
            api,
            yaml_objects=[mps_template("third", 30), claim_pod("third", {"gpu": "third"}, node=NODE)],
            namespace=ns,
        )
        wait_for("another claim prepared meanwhile", partial(pod_running, core, "third", ns), timeout=60)
        core.delete_namespaced_pod("half", ns, grace_period_seconds=0)
        wait_for("the tenant's pod gone", partial(pod_gone, core, "half", ns), timeout=60)
        wait_for(
            "the tenant's daemon stopped and its directory removed",
            lambda: attacker not in {d["pid"] for d in daemons(plugin)} and not pipe.exists(),
            timeout=30,
        )
        assert victim in {d["pid"] for d in daemons(plugin)}
        assert _serving(plugin)[str(victims_pipe)]["pid"] == victim  # still answering in its directory
        kind = {"fifo": "pid-file-replaced", "foreign-pid": "pid-file-foreign", "deleted": "pid-file-removed"}
        [event] = wait_for(
            "a MpsTampering event",
            lambda: [
                e
                for e in _node_events(api, "MpsTampering")
                if f"ResourceClaim {ns}/{claim_name}" in e.message and kind[tampering] in e.message
            ],
        )
        assert event.type == "Warning"
    finally:
        _cleanup(core, ns, plugin)


def _claim_pipe(
    api: client.ApiClient, core: client.CoreV1Api, plugin: PluginProcess, ns: str, pod: str
) -> tuple[str, Path]:
    """The pod's claim's name, and the host side of the pipe directory its CDI spec mounts."""
    found = core.read_namespaced_pod(pod, ns)
    name = found.status.resource_claim_statuses[0].resource_claim_name
    claim = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "resource.k8s.io", "v1", ns, "resourceclaims", name
    )
    pipe = _pipe_mount(plugin.cdi_specs()[claim["metadata"]["uid"]])
    assert pipe is not None
    return str(name), pipe


MIG_MINOR = 5  # the H100 whose 1g.10gb partition the test below shares (MINOR's GPU is whole-GPU shares')
MIG_SHARED = f"gpu-{MIG_MINOR}-mig-1g10gb-6-shared"


@pytest.fixture
def mig_shares(plugin: PluginProcess, api: client.ApiClient) -> Iterator[PluginProcess]:
    """The H100 node's plugin restarted with 1g.10gb partitions shareable (--mig-share-profiles); its
    slices then carry their shared forms. Restarted as it was afterwards."""
    original = plugin.group
    plugin.stop()
    plugin.group = {**original, "mig-share-profiles": "1g.10gb"}
    try:
        plugin.start()
        wait_for("the shared partitions published", lambda: MIG_SHARED in _published(api), timeout=60)
        yield plugin
    finally:
        plugin.stop()
        plugin.group = original
        plugin.start()
        wait_for("the shared partitions gone", lambda: MIG_SHARED not in _published(api), timeout=60)


def _published(api: client.ApiClient) -> set[str]:
    slices = client.CustomObjectsApi(api).list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices"
    )
    return {
        d["name"]
        for item in slices["items"]
        if item["spec"].get("nodeName") == NODE and item["spec"].get("driver") == DRIVER
        for d in item["spec"].get("devices", [])
    }


def _placement(exclusive: bool) -> dict[str, Any]:
    attrs = f'device.attributes["{DRIVER}"]'
    expression = f"{attrs}.parentMinor == {MIG_MINOR} && {attrs}.placementStart == 6"
    return {
        "deviceClassName": "mig.gpudra.io" if exclusive else "mig-shared.gpudra.io",
        "selectors": [{"cel": {"expression": f'{expression} && {attrs}.profile == "1g.10gb"'}}],
    }


def _mig_template(name: str, capacity: dict[str, str] | None) -> dict[str, Any]:
    exactly = _placement(exclusive=capacity is None)
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def _mig_instances(plugin: PluginProcess) -> dict[int, str]:
    """placement start -> MIG UUID of each partition on the simulated H100 with MIG_MINOR."""
    gpu = json.loads(plugin.sim_state.read_text())["gpus"][MIG_MINOR]
    return {
        gi["start"]: ",".join(ci["uuid"] for ci in gi["compute_instances"]) for gi in gpu["gpu_instances"]
    }


def test_two_pods_share_one_1g_partition_with_mps_limits_inside_it_and_the_last_one_out_destroys_it(
    api: client.ApiClient, mig_shares: PluginProcess
) -> None:
    plugin = mig_shares
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "mig-shares")
    asks = {"small": {"memory": "3Gi", "compute": "30"}, "large": {"memory": "6Gi", "compute": "60"}}
    objects = [_mig_template(name, capacity) for name, capacity in asks.items()]
    objects += [_mig_template("exclusive", None)]
    objects += [claim_pod(name, {"gpu": name}, node=NODE) for name in asks]
    utils.create_from_yaml(api, yaml_objects=objects, namespace=ns)
    running = {n: wait_for(f"{n} Running", partial(pod_running, core, n, ns), timeout=120) for n in asks}
    results = {n: allocation(api, p) for n, p in running.items()}
    assert {r["device"] for r in results.values()} == {MIG_SHARED}
    assert len({r["shareID"] for r in results.values()}) == 2

    # One partition, created by the first share; each share's daemon sees that MIG device only.
    [(start, mig_uuid)] = _mig_instances(plugin).items()
    assert start == 6 and mig_uuid.startswith("MIG-")
    limits = {
        (
            d["visible_devices"],
            d["default_active_thread_percentage"],
            tuple(d["default_pinned_memory_limits"].items()),
        )
        for d in daemons(plugin)
    }
    assert limits == {(mig_uuid, 30.0, ((mig_uuid, "3072M"),)), (mig_uuid, 60.0, ((mig_uuid, "6144M"),))}

    # The exclusive form of the placement is not allocated while the shares hold it.
    utils.create_from_yaml(
        api, yaml_objects=[claim_pod("exclusive", {"gpu": "exclusive"}, node=NODE)], namespace=ns
    )
    wait_for("exclusive Unschedulable", lambda: unschedulable(core, "exclusive", ns), timeout=60)
    core.delete_namespaced_pod("exclusive", ns, grace_period_seconds=0)
    wait_for("exclusive deleted", partial(pod_gone, core, "exclusive", ns), timeout=90)

    # The first share out leaves the partition to the other; the last one destroys it.
    core.delete_namespaced_pod("small", ns, grace_period_seconds=0)
    wait_for("small deleted", partial(pod_gone, core, "small", ns), timeout=90)
    wait_for("one daemon left", lambda: len(daemons(plugin)) == 1, timeout=60)
    assert _mig_instances(plugin) == {6: mig_uuid}
    core.delete_namespaced_pod("large", ns, grace_period_seconds=0)
    wait_for("large deleted", partial(pod_gone, core, "large", ns), timeout=90)
    wait_for("the partition destroyed", lambda: _mig_instances(plugin) == {}, timeout=60)
    _cleanup(core, ns, plugin)
