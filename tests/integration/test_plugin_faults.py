"""Faults of issue 8 on the real control plane and kubelet: a hung API server, a damaged or newer
checkpoint, a full state disk, a read-only CDI root, two plugin instances overlapping, a claim named
twice in one call. Each test starts its own gpudra plugin on a one-node cluster shared by the module,
with simulated GPUs; the filesystems are real tmpfs mounts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes import client, config, utils

from gpudra._proto import dra_v1_pb2, dra_v1_pb2_grpc
from gpudra.node import checkpoint
from tests.localcluster import LocalCluster
from tests.localcluster.cluster import free_port
from tests.localcluster.node_plugin import DRIVER, PluginProcess
from tests.localcluster.processes import http_get

from .conftest import CLUSTER_PREFIX, REPO
from .kube_helpers import Resources, claim_pod, claim_template, pod_events, pod_gone, pod_running, wait_for

NODE = "node-faults"
PROFILE = "dgx-h100"
NS = "default"


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[LocalCluster, client.ApiClient]]:
    root = Path(tempfile.mkdtemp(prefix=CLUSTER_PREFIX, dir="/tmp"))
    with LocalCluster(root, nodes=(NODE,)) as cluster:
        api = config.new_client_from_config(str(cluster.kubeconfig))
        utils.create_from_yaml(
            api,
            yaml_objects=list(yaml.safe_load_all((REPO / "deploy/manifests/deviceclasses.yaml").read_text())),
        )
        yield cluster, api


@pytest.fixture
def plugin(node: tuple[LocalCluster, client.ApiClient]) -> Iterator[PluginProcess]:
    """A fresh plugin on a node with no state left by an earlier test."""
    cluster, _ = node
    process = PluginProcess(cluster, cluster.nodes[NODE], PROFILE)
    shutil.rmtree(process.state_dir, ignore_errors=True)
    try:
        yield process
    finally:
        process.stop()


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` mounted at `path` (created), unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    # mode 0755, as the kubelet's hostPath would make it: a tmpfs root is 1777 by default, a state
    # directory the plugin refuses (gpudra.node.state_dir).
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def _run_pod(api: client.ApiClient, name: str) -> None:
    utils.create_from_yaml(
        api, yaml_objects=[claim_template(name), claim_pod(name, {"gpu": name}, NODE)], namespace=NS
    )


def _running(api: client.ApiClient, name: str, timeout: float = 120) -> client.V1Pod:
    core = client.CoreV1Api(api)
    return wait_for(f"pod {name} running", lambda: pod_running(core, name, NS), timeout=timeout)


def _delete_pod(api: client.ApiClient, name: str) -> None:
    core = client.CoreV1Api(api)
    core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    wait_for(f"pod {name} gone", lambda: pod_gone(core, name, NS), timeout=120)
    Resources(api).delete("resourceclaimtemplates", name, NS)


def _wait_clean(plugin: PluginProcess) -> None:
    """The kubelet unprepares a deleted pod's claims after the pod object is gone: wait for it."""
    wait_for(
        "no CDI spec and no checkpoint entry left",
        lambda: plugin.cdi_specs() == {} and plugin.checkpoint_claims() == {},
        timeout=60,
    )


def _claim_of(api: client.ApiClient, pod: client.V1Pod) -> dict[str, Any]:
    name = pod.status.resource_claim_statuses[0].resource_claim_name
    return Resources(api).get("resourceclaims", name, NS)


def _failed_prepare(api: client.ApiClient, pod: str, text: str) -> str:
    """Wait for a pod event from a failed prepare whose message holds `text`; return it."""
    core = client.CoreV1Api(api)

    def found() -> str | None:
        return next((e for e in pod_events(core, pod, NS) if text in e), None)

    return wait_for(f"a prepare failure of pod {pod} with {text!r}", found, timeout=90)


def _probe(plugin: PluginProcess, path: str) -> tuple[int, str]:
    status, body = http_get(f"http://127.0.0.1:{plugin.metrics_port}{path}")
    return status, body.decode()


def _node_events(api: client.ApiClient, reason: str) -> list[Any]:
    events = client.CoreV1Api(api).list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={NODE},reason={reason}"
    )
    return list(events.items)


@contextlib.contextmanager
def _stub(plugin: PluginProcess) -> Iterator[Any]:
    socket_path = plugin.node.plugins_dir / DRIVER / "dra.sock"
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        yield dra_v1_pb2_grpc.DRAPluginStub(channel)


def _ref(claim: dict[str, Any]) -> Any:
    meta = claim["metadata"]
    return dra_v1_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def _apiserver_pid(cluster: LocalCluster) -> int:
    [apiserver] = [c for c in cluster.components if c.name == "kube-apiserver"]
    return int(apiserver.process.pid)


# --- item 2 (and 9): a hung API server -------------------------------------------------------------


def test_a_hung_api_server_holds_up_no_call_that_does_not_need_it(
    node: tuple[LocalCluster, client.ApiClient], plugin: PluginProcess
) -> None:
    cluster, api = node
    plugin.start(metrics_port=free_port())
    _run_pod(api, "hung")
    claim = _claim_of(api, _running(api, "hung"))
    uid = claim["metadata"]["uid"]
    with _stub(plugin) as stub:
        # item 9: the same claim twice in one call is prepared and answered once
        twice = stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[_ref(claim), _ref(claim)]), timeout=30
        )
        assert list(twice.claims) == [uid] and twice.claims[uid].error == ""

        os.kill(_apiserver_pid(cluster), signal.SIGSTOP)  # hung: connections accepted, never answered
        try:
            # Issue 29, item 7: 20 prepares that need the API server, more than the plugin's 16 workers
            unknown = [
                dra_v1_pb2.Claim(namespace=NS, name=f"never-created-{n}", uid=str(uuid.uuid4()))
                for n in range(20)
            ]
            replies: dict[str, Any] = {}

            def prepare_unknown(one: Any) -> None:
                replies[one.uid] = stub.NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(claims=[one]), timeout=120
                ).claims[one.uid]

            readers = [threading.Thread(target=prepare_unknown, args=(one,)) for one in unknown]
            for reader in readers:  # each needs the API server: waits for it, or is refused a turn
                reader.start()
            wait_for("the calls beyond the turns refused", lambda: len(replies) >= 8, timeout=30)
            assert all("the API server answers slowly" in reply.error for reply in replies.values())
            # Answered at all, and without an error, while the API server is stopped and the reads above
            # still wait: the call did not need it (a call that did would wait or be refused a turn).
            again = stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=[_ref(claim)]), timeout=30
            )
            assert again.claims[uid].error == "" and len(again.claims[uid].devices) == 1
            assert _probe(plugin, "/livez")[0] == 200
            unprepared = stub.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[_ref(claim)]), timeout=30
            )
            assert unprepared.claims[uid].error == ""
            assert uid not in plugin.cdi_specs() and uid not in plugin.checkpoint_claims()
            assert sum(reader.is_alive() for reader in readers) == 12  # the claim reads still wait
        finally:
            os.kill(_apiserver_pid(cluster), signal.SIGCONT)
        for reader in readers:
            reader.join(120)
        assert len(replies) == 20
        port = cluster.server.rsplit(":", 1)[1]
        for reply in replies.values():
            assert reply.error  # refused, timed out, or the claim does not exist once the API server answers
            assert f":{port}" not in reply.error and "127.0.0.1" not in reply.error  # item 9: no address

    # item 9: the metrics/probe endpoint listens on the address it was given (127.0.0.1), not 0.0.0.0
    port_hex = f"{plugin.metrics_port:04X}"
    listening = [
        line.split()[1]
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
        if line.split()[1].endswith(f":{port_hex}") and line.split()[3] == "0A"
    ]
    assert listening == [f"0100007F:{port_hex}"]
    _delete_pod(api, "hung")  # the kubelet's own unprepare of an unprepared claim is fine


# --- item 3: a damaged checkpoint ------------------------------------------------------------------


def test_a_damaged_checkpoint_is_rebuilt_from_the_cdi_specs_and_reported(
    node: tuple[LocalCluster, client.ApiClient], plugin: PluginProcess
) -> None:
    _, api = node
    plugin.start(metrics_port=free_port())
    _run_pod(api, "damaged")
    uid = _claim_of(api, _running(api, "damaged"))["metadata"]["uid"]
    plugin.stop()
    plugin.checkpoint.write_bytes(b'{"checksum": "0", "data": garbage')

    plugin.start(metrics_port=free_port())

    assert uid in plugin.cdi_specs()  # the running pod's spec survives
    assert uid in plugin.checkpoint_claims()  # and its GPU stays taken
    assert list(plugin.state_dir.glob("checkpoint.json.corrupt-*"))
    assert plugin.metrics()["gpudra_checkpoint_rebuilds_total"] == 1
    [event] = wait_for("a CheckpointRebuilt event", lambda: _node_events(api, "CheckpointRebuilt"))
    assert event.type == "Warning" and "1 prepared claim(s) were rebuilt" in event.message
    assert wait_for("ready", lambda: _probe(plugin, "/readyz")[0] == 200)
    _delete_pod(api, "damaged")
    _wait_clean(plugin)


@pytest.mark.parametrize("fault", ["newer-version", "directory"])
def test_a_checkpoint_that_cannot_be_used_refuses_claims_until_the_operator_fixes_it(
    node: tuple[LocalCluster, client.ApiClient], plugin: PluginProcess, fault: str
) -> None:
    _, api = node
    plugin.state_dir.mkdir(parents=True, exist_ok=True)
    if fault == "newer-version":
        data = {"version": checkpoint.VERSION + 1, "boot_id": "b", "claims": {}}
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode()).hexdigest()
        plugin.checkpoint.write_text(json.dumps({"checksum": digest, "data": data}))
        why = "written by a newer gpudra"
    else:
        plugin.checkpoint.mkdir()  # a hostPath mount gone wrong
        why = "Is a directory"

    plugin.start(metrics_port=free_port())

    status, body = _probe(plugin, "/readyz")
    assert status == 503 and "[-]checkpoint failed:" in body and why in body
    assert _probe(plugin, "/livez")[0] == 200  # a restart would not help: not a liveness failure
    assert plugin.metrics()["gpudra_checkpoint_usable"] == 0
    wait_for(
        "a CheckpointRefused event",
        lambda: [e for e in _node_events(api, "CheckpointRefused") if why in e.message],
    )
    name = f"refused-{fault}"
    _run_pod(api, name)
    assert why in _failed_prepare(api, name, "not preparing or unpreparing claims on this node")

    # the operator acts; the plugin notices by itself, without a restart
    recovered_before = len(_node_events(api, "CheckpointRecovered"))
    if fault == "newer-version":
        plugin.checkpoint.rename(plugin.state_dir / "checkpoint.json.from-newer-gpudra")
    else:
        plugin.checkpoint.rmdir()
    wait_for("ready again", lambda: _probe(plugin, "/readyz")[0] == 200, timeout=60)
    assert plugin.metrics()["gpudra_checkpoint_usable"] == 1
    wait_for(
        "a new CheckpointRecovered event",
        lambda: len(_node_events(api, "CheckpointRecovered")) > recovered_before,
    )
    _running(api, name)
    _delete_pod(api, name)
    _wait_clean(plugin)


# --- item 4: disk full, read-only CDI root ----------------------------------------------------------


def test_a_full_state_disk_fails_the_prepare_cleanly_and_the_retry_completes(
    node: tuple[LocalCluster, client.ApiClient], plugin: PluginProcess
) -> None:
    _, api = node
    with tmpfs(plugin.state_dir, "1m"):
        plugin.start(metrics_port=free_port())
        filler = plugin.state_dir / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as out:  # close() fails too: full
            while True:
                out.write(b"\0" * 4096)
                out.flush()
        status, body = _probe(plugin, "/readyz")
        assert status == 503 and "[-]state-dir failed:" in body and "No space left on device" in body

        _run_pod(api, "full")
        _failed_prepare(api, "full", "No space left on device")
        # nothing set up: no spec, GPUs untouched; at most an entry the retry settles (PrepareStarted),
        # when the disk filled up after the first save
        assert plugin.cdi_specs() == {}
        assert {c["state"] for c in plugin.checkpoint_claims().values()} <= {"PrepareStarted"}
        assert set(plugin.timeslices().values()) == {0}

        filler.unlink()
        pod = _running(api, "full")
        uid = _claim_of(api, pod)["metadata"]["uid"]
        assert set(plugin.checkpoint_claims()) == {uid} and set(plugin.cdi_specs()) == {uid}
        _delete_pod(api, "full")
        _wait_clean(plugin)
        plugin.stop()


def test_a_read_only_cdi_root_fails_calls_cleanly_until_it_is_writable_again(
    node: tuple[LocalCluster, client.ApiClient], plugin: PluginProcess
) -> None:
    _, api = node
    cdi_root = plugin.node.cdi_root
    with tmpfs(cdi_root, "4m"):
        plugin.start(metrics_port=free_port())
        _run_pod(api, "ro-running")
        uid = _claim_of(api, _running(api, "ro-running"))["metadata"]["uid"]
        subprocess.run(["mount", "-o", "remount,ro", str(cdi_root)], check=True)
        try:
            status, body = _probe(plugin, "/readyz")
            assert status == 503 and "[-]cdi-root failed:" in body and "Read-only file system" in body
            _run_pod(api, "ro-new")
            _failed_prepare(api, "ro-new", "Read-only file system")
            client.CoreV1Api(api).delete_namespaced_pod("ro-running", NS, grace_period_seconds=0)
            # the unprepare cannot remove the spec: the claim keeps its GPU (its spec still names it).
            # It changes no GPU, so its entry stays PrepareCompleted (no UnprepareStarted save first).
            wait_for(
                "an unprepare stuck on the read-only root",
                lambda: f"unprepare failed claim={uid}" in plugin.log.read_text(),
            )
            assert plugin.checkpoint_claims()[uid]["state"] == "PrepareCompleted"
            assert uid in plugin.cdi_specs()
            assert list(plugin.checkpoint_claims()) == [uid]  # ro-new left nothing behind
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(cdi_root)], check=True)
        core = client.CoreV1Api(api)
        wait_for("ro-running gone", lambda: pod_gone(core, "ro-running", NS), timeout=120)
        Resources(api).delete("resourceclaimtemplates", "ro-running", NS)
        new_uid = _claim_of(api, _running(api, "ro-new"))["metadata"]["uid"]
        assert set(plugin.checkpoint_claims()) == {new_uid} and set(plugin.cdi_specs()) == {new_uid}
        _delete_pod(api, "ro-new")
        _wait_clean(plugin)
        plugin.stop()


# --- item 6: two instances overlapping --------------------------------------------------------------


def test_the_old_instance_exiting_leaves_the_new_one_serving(
    node: tuple[LocalCluster, client.ApiClient], plugin: PluginProcess
) -> None:
    cluster, api = node
    plugin.start()
    _run_pod(api, "overlap-old")
    old_uid = _claim_of(api, _running(api, "overlap-old"))["metadata"]["uid"]

    successor = PluginProcess(cluster, cluster.nodes[NODE], PROFILE)
    successor.log = plugin.node.root / "gpudra-plugin-successor.log"
    try:
        successor.start()  # a rolling update: the new instance starts while the old one runs
        plugin.stop()  # then the old one gets SIGTERM
        assert (plugin.node.plugins_dir / DRIVER / "dra.sock").is_socket()
        assert (plugin.node.registry_dir / f"{DRIVER}-reg.sock").is_socket()

        _run_pod(api, "overlap-new")
        new_uid = _claim_of(api, _running(api, "overlap-new"))["metadata"]["uid"]
        assert set(successor.checkpoint_claims()) == {old_uid, new_uid}
        _delete_pod(api, "overlap-old")  # a claim the old instance prepared, unprepared by the new one
        _delete_pod(api, "overlap-new")
        _wait_clean(successor)
    finally:
        successor.stop()


def _served(plugin: PluginProcess, call: str) -> float:
    """How many claims this instance prepared or unprepared (`call`), by its own metrics."""
    return plugin.metrics().get(f'gpudra_{call}_seconds_count{{outcome="ok"}}', 0.0)


def _slice_writes(plugin: PluginProcess) -> float:
    return sum(v for k, v in plugin.metrics().items() if k.startswith("gpudra_resourceslice_writes_total"))


def test_a_rolling_update_with_instance_ids_keeps_the_node_served_throughout(
    node: tuple[LocalCluster, client.ApiClient], plugin: PluginProcess
) -> None:
    """The chart's update (maxSurge 1, each pod's sockets named after its UID) on the real kubelet: the
    kubelet keeps both registrations and calls the newer one, which catches up with the checkpoint the
    older one saved; the older one's SIGTERM removes only its own sockets; the newer one publishes the
    pool only once the older one is gone, without a write, since its slices are the same."""
    cluster, api = node
    paths = cluster.nodes[NODE]
    old = PluginProcess(cluster, paths, PROFILE, instance_id="pod-a")
    new = PluginProcess(cluster, paths, PROFILE, instance_id="pod-b")
    kubelet_log = cluster.directory / "logs" / f"kubelet-{NODE}.log"
    try:
        old.start(metrics_port=free_port())
        _run_pod(api, "rolling-old")
        old_uid = _claim_of(api, _running(api, "rolling-old"))["metadata"]["uid"]
        assert _served(old, "prepare") == 1
        wait_for("the pool published", lambda: _probe(old, "/readyz")[0] == 200)
        published = _slice_writes(old)  # none when an earlier test's plugin left the same pool

        new.start(metrics_port=free_port(), resync_seconds=1)  # the surge pod: both run from here on
        for instance in ("pod-a", "pod-b"):
            assert (paths.registry_dir / f"{DRIVER}-{instance}-reg.sock").is_socket()
            assert (paths.plugins_dir / DRIVER / f"dra-{instance}.sock").is_socket()
        assert _probe(new, "/readyz")[0] == 200  # standing by for the slices does not hold the update up
        # The kubelet's DRA manager logs each instance it connects to by its endpoint (the DRA socket).
        connected = f'endpoint="{paths.plugins_dir / DRIVER / "dra-pod-b.sock"}" connected=true'
        wait_for("the kubelet to connect to the new instance", lambda: connected in kubelet_log.read_text())

        _run_pod(api, "rolling-mid")  # the kubelet calls the instance it registered last
        mid_uid = _claim_of(api, _running(api, "rolling-mid"))["metadata"]["uid"]
        assert (_served(old, "prepare"), _served(new, "prepare")) == (1, 1)
        _delete_pod(api, "rolling-old")  # the old instance's claim, unprepared by the new one
        wait_for("the old claim unprepared", lambda: old_uid not in new.checkpoint_claims())
        assert (_served(old, "unprepare"), _served(new, "unprepare")) == (0, 1)
        assert set(new.cdi_specs()) == set(new.checkpoint_claims()) == {mid_uid}
        assert (_slice_writes(old), _slice_writes(new)) == (published, 0)  # no fight over the pool

        old.stop()  # SIGTERM: the DaemonSet deletes the old pod once the new one is ready
        assert not (paths.registry_dir / f"{DRIVER}-pod-a-reg.sock").exists()
        assert not (paths.plugins_dir / DRIVER / "dra-pod-a.sock").exists()
        assert (paths.registry_dir / f"{DRIVER}-pod-b-reg.sock").is_socket()
        assert (paths.plugins_dir / DRIVER / "dra-pod-b.sock").is_socket()

        _run_pod(api, "rolling-new")
        new_uid = _claim_of(api, _running(api, "rolling-new"))["metadata"]["uid"]
        assert _served(new, "prepare") == 2
        claims = new.checkpoint_claims()
        assert set(claims) == set(new.cdi_specs()) == {mid_uid, new_uid}
        assert {entry["state"] for entry in claims.values()} == {"PrepareCompleted"}
        wait_for("the new instance publishing", lambda: "publishing from this one" in new.log.read_text())
        time.sleep(3)  # three resyncs of its own
        assert _slice_writes(new) == 0
        _delete_pod(api, "rolling-mid")
        _delete_pod(api, "rolling-new")
        _wait_clean(new)
    finally:
        old.stop()
        new.stop()


def test_when_the_new_instance_dies_the_old_one_serves_and_knows_its_claims(
    node: tuple[LocalCluster, client.ApiClient], plugin: PluginProcess
) -> None:
    """A failed update: the new pod's plugin is SIGKILLed while the old one still runs. The kubelet falls
    back to the old instance, which catches up with the checkpoint the new one saved before it
    unprepares the new one's claim, and prepares the next pod."""
    cluster, api = node
    paths = cluster.nodes[NODE]
    old = PluginProcess(cluster, paths, PROFILE, instance_id="pod-c")
    new = PluginProcess(cluster, paths, PROFILE, instance_id="pod-d")
    try:
        old.start(metrics_port=free_port())
        new.start(metrics_port=free_port())
        _run_pod(api, "fallback-new")
        new_uid = _claim_of(api, _running(api, "fallback-new"))["metadata"]["uid"]
        assert (_served(old, "prepare"), _served(new, "prepare")) == (0, 1)
        assert new.process is not None
        new.process.kill()
        new.process.wait()

        _delete_pod(api, "fallback-new")  # unprepared through the old instance, which never saw it
        wait_for("the claim unprepared", lambda: new_uid not in old.checkpoint_claims())
        assert _served(old, "unprepare") == 1 and new_uid not in old.cdi_specs()
        assert "checkpoint saved by another instance of the plugin; loaded again" in old.log.read_text()
        _run_pod(api, "fallback-old")
        old_uid = _claim_of(api, _running(api, "fallback-old"))["metadata"]["uid"]
        assert _served(old, "prepare") == 1
        assert set(old.checkpoint_claims()) == set(old.cdi_specs()) == {old_uid}
        _delete_pod(api, "fallback-old")
        _wait_clean(old)
    finally:
        old.stop()
        new.stop()
        for stale in (
            paths.registry_dir / f"{DRIVER}-pod-d-reg.sock",
            paths.plugins_dir / DRIVER / "dra-pod-d.sock",
        ):
            stale.unlink(missing_ok=True)  # what a SIGKILL leaves behind


# --- item 8: API load independent of the cluster's size ---------------------------------------------

IDLE_WINDOW_SECONDS = 30
OTHER_CLAIMS = 100


def _requests(plugin: PluginProcess) -> dict[str, float]:
    return {k: v for k, v in plugin.metrics().items() if k.startswith("gpudra_api_requests_total")}


def test_an_idle_node_reads_no_claims_however_many_the_cluster_holds(
    node: tuple[LocalCluster, client.ApiClient], plugin: PluginProcess
) -> None:
    _, api = node
    # 100 resync periods in the window: an unchanged pool is read from the watch, so none costs a request
    plugin.start(metrics_port=free_port(), resync_seconds=IDLE_WINDOW_SECONDS / 100)
    wait_for("the first sync", lambda: _probe(plugin, "/readyz")[0] == 200)
    # Start-up is over once the watch has the pool and saw the echo of every first write: until then a
    # resync LISTs. Wait for two readings of the counts a second apart to be equal.
    seen: list[dict[str, float]] = [_requests(plugin)]

    def settled() -> bool:
        time.sleep(1)
        seen.append(_requests(plugin))
        return seen[-1] == seen[-2]

    wait_for("the start-up requests to end", settled, timeout=30)
    core = client.CoreV1Api(api)
    ns = f"tenant-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    before = _requests(plugin)

    resources = Resources(api)
    for i in range(OTHER_CLAIMS):  # other tenants' claims, some for gpudra: none is this node's business
        resources.create(
            "resourceclaims",
            {
                "metadata": {"name": f"c{i}"},
                "spec": {
                    "devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.gpudra.io"}}]}
                },
            },
            ns,
        )
    time.sleep(IDLE_WINDOW_SECONDS)  # a window of idling: what the plugin does on its own
    after = _requests(plugin)

    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    made = {k: v for k, v in delta.items() if v}
    print(f"API requests of an idle node in {IDLE_WINDOW_SECONDS} s with {OTHER_CLAIMS} new claims: {made}")
    assert not [k for k in made if "resourceclaims" in k]  # no claim read, no claim list
    # no LIST and no write: at most the renewal of the one WATCH (every 5 minutes) falls in the window
    assert set(made) <= {'gpudra_api_requests_total{resource="resourceslices",verb="watch"}'}, made
    assert sum(made.values()) <= 1, made
