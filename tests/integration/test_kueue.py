"""GPU quota per team with Kueue (docs/quota.md) on the real control plane: Kueue's manager, built from its
Go module (tests/localcluster/kueue.py), with gpudra's DeviceClasses mapped to quota resources
(examples/quota/kueue-configuration.yaml) and one ClusterQueue for two teams' LocalQueues
(examples/quota/kueue-queues.yaml). Jobs asking whole GPUs, MIG partitions of a size and shares are
admitted, queued and preempted as the quota says, and gpudra prepares exactly the claims of the Jobs
Kueue admitted: after each step the node's checkpoint and CDI specs hold those claims and no other."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils

from gpudra.migrate.migration import gpudra_classes
from tests.localcluster import LocalCluster
from tests.localcluster.helm import helm_binary
from tests.localcluster.kueue import KueueProcess
from tests.localcluster.node_plugin import DRIVER, PluginProcess

from .kube_helpers import Resources, pod_gone, wait_for

REPO = Path(__file__).resolve().parents[2]
QUOTA = REPO / "examples" / "quota"
NODE = "node-h100"
TEAMS = ("team-a", "team-b")
KUEUE = ("kueue.x-k8s.io", "v1beta2")
PLURALS = {
    "ResourceFlavor": "resourceflavors",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses",
}


def profile_classes() -> list[dict[str, Any]]:
    """The chart's per-profile MIG DeviceClasses (ci/quota-values.yaml)."""
    rendered = subprocess.run(
        [
            str(helm_binary()),
            "template",
            "gpudra",
            str(REPO / "deploy" / "helm" / "gpudra"),
            "-f",
            str(REPO / "deploy" / "helm" / "gpudra" / "ci" / "quota-values.yaml"),
            "--show-only",
            "templates/deviceclasses.yaml",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # the per-profile ones only: the local cluster already has the chart's base classes (mig-shared too)
    base = set(gpudra_classes(DRIVER).values())
    return [
        c
        for c in yaml.safe_load_all(rendered)
        if c and c["metadata"]["name"].startswith("mig-") and c["metadata"]["name"] not in base
    ]


@pytest.fixture(scope="module")
def kueue(
    cluster: LocalCluster, api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> Iterator[KueueProcess]:
    resources = Resources(api)
    classes = profile_classes()
    for device_class in classes:
        resources.create("deviceclasses", device_class)
    core = client.CoreV1Api(api)
    for team in TEAMS:
        core.create_namespace({"metadata": {"name": team}})
    running = KueueProcess(cluster, api)
    try:
        running.start()
        custom = client.CustomObjectsApi(api)
        for obj in yaml.safe_load_all((QUOTA / "kueue-queues.yaml").read_text()):
            plural = PLURALS[obj["kind"]]
            if "namespace" in obj["metadata"]:
                custom.create_namespaced_custom_object(*KUEUE, obj["metadata"]["namespace"], plural, obj)
            else:
                custom.create_cluster_custom_object(*KUEUE, plural, obj)
        yield running
    finally:
        for team in TEAMS:
            core.delete_namespace(team)
        for team in TEAMS:
            wait_for(f"namespace {team} gone", partial(_namespace_gone, core, team), timeout=180)
        wait_for("every team claim unprepared", lambda: not _prepared(gpudra[NODE]), timeout=90)
        running.stop()
        for device_class in classes:
            resources.delete("deviceclasses", device_class["metadata"]["name"])


def _namespace_gone(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespace(name)
    except client.ApiException as err:
        return err.status == 404
    return False


def template(name: str, device_class: str, capacity: dict[str, str] | None = None) -> dict[str, Any]:
    """A ResourceClaimTemplate for one device of `device_class`, without selectors or config (Kueue
    refuses both)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def job(name: str, claim_template: str, priority: str = "low") -> dict[str, Any]:
    """A one-pod Job in its team's LocalQueue; Kueue's webhook suspends it until admitted."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {"kueue.x-k8s.io/queue-name": "team", "kueue.x-k8s.io/priority-class": priority},
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                    ],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": claim_template}],
                }
            },
        },
    }


def submit(api: client.ApiClient, team: str, *objects: dict[str, Any]) -> None:
    for obj in objects:
        utils.create_from_dict(api, obj, namespace=team)


def workload(api: client.ApiClient, team: str, job_name: str) -> dict[str, Any] | None:
    """The Workload Kueue made for the Job, or None before it exists."""
    found = client.CustomObjectsApi(api).list_namespaced_custom_object(*KUEUE, team, "workloads")["items"]
    for item in found:
        if any(
            o["kind"] == "Job" and o["name"] == job_name for o in item["metadata"].get("ownerReferences", [])
        ):
            return dict(item)
    return None


def condition(api: client.ApiClient, team: str, job_name: str, kind: str) -> dict[str, Any] | None:
    wl = workload(api, team, job_name)
    for cond in (wl or {}).get("status", {}).get("conditions", []):
        if cond["type"] == kind:
            return dict(cond)
    return None


def admitted(api: client.ApiClient, team: str, job_name: str) -> bool:
    cond = condition(api, team, job_name, "Admitted")
    return bool(cond and cond["status"] == "True")


def queued(api: client.ApiClient, team: str, job_name: str) -> bool:
    """Kueue holds the Workload for want of quota: no quota reserved, the Job suspended, no pod."""
    cond = condition(api, team, job_name, "QuotaReserved")
    if not cond or cond["status"] != "False" or cond["reason"] != "Pending":
        return False
    found = client.BatchV1Api(api).read_namespaced_job(job_name, team)
    return bool(found.spec.suspend) and not _job_pods(api, team, job_name)


def _job_pods(api: client.ApiClient, team: str, job_name: str) -> list[client.V1Pod]:
    return list(client.CoreV1Api(api).list_namespaced_pod(team, label_selector=f"job-name={job_name}").items)


def running_claims(api: client.ApiClient, team: str, job_name: str) -> set[str] | None:
    """UIDs of the claims of the Job's pod once it runs, else None."""
    pods = [p for p in _job_pods(api, team, job_name) if p.status.phase == "Running"]
    if len(pods) != 1 or not pods[0].status.resource_claim_statuses:
        return None
    resources = Resources(api)
    return {
        resources.get("resourceclaims", s.resource_claim_name, team)["metadata"]["uid"]
        for s in pods[0].status.resource_claim_statuses
    }


def _prepared(plugin: PluginProcess) -> dict[str, Any]:
    """The teams' claims prepared on the node (checkpoint PrepareCompleted and a CDI spec), by UID."""
    specs = plugin.cdi_specs()
    return {
        uid: entry
        for uid, entry in plugin.checkpoint_claims().items()
        if entry["namespace"] in TEAMS and entry["state"] == "PrepareCompleted" and uid in specs
    }


def settled(
    api: client.ApiClient, plugin: PluginProcess, admitted_jobs: dict[str, str], queued_jobs: dict[str, str]
) -> dict[str, Any] | None:
    """When the jobs named admitted (job -> team) run with their claims prepared, those named queued
    wait, and the node holds no other team claim: the prepared entries; else None."""
    if not all(admitted(api, team, name) for name, team in admitted_jobs.items()):
        return None
    if not all(queued(api, team, name) for name, team in queued_jobs.items()):
        return None
    expected: set[str] = set()
    for name, team in admitted_jobs.items():
        claims = running_claims(api, team, name)
        if claims is None:
            return None
        expected |= claims
    prepared = _prepared(plugin)
    return prepared if set(prepared) == expected else None


def delete_jobs(api: client.ApiClient, plugin: PluginProcess) -> None:
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    for team in TEAMS:
        for item in batch.list_namespaced_job(team).items:
            batch.delete_namespaced_job(item.metadata.name, team, propagation_policy="Foreground")
        for pod in core.list_namespaced_pod(team).items:
            wait_for("pod gone", partial(pod_gone, core, pod.metadata.name, team), timeout=90)
    wait_for("every team claim unprepared", lambda: not _prepared(plugin), timeout=90)


def test_whole_gpus_are_admitted_queued_and_preempted_as_the_quota_says(
    api: client.ApiClient, kueue: KueueProcess, gpudra: dict[str, PluginProcess]
) -> None:
    plugin = gpudra[NODE]
    for team in TEAMS:
        submit(api, team, template("gpu", "gpu.gpudra.io"))
    try:
        # Two whole GPUs of quota: team A's two Jobs run, team B's next one waits.
        submit(api, "team-a", job("a1", "gpu"), job("a2", "gpu"))
        wait_for(
            "a1 and a2 admitted and prepared",
            lambda: settled(api, plugin, {"a1": "team-a", "a2": "team-a"}, {}),
            timeout=180,
        )
        submit(api, "team-b", job("b1", "gpu"))
        wait_for(
            "b1 queued",
            lambda: settled(api, plugin, {"a1": "team-a", "a2": "team-a"}, {"b1": "team-b"}),
            timeout=120,
        )

        # A Job of higher priority preempts one of team A's: its pod goes, gpudra unprepares its
        # claim, and the new Job's claim is prepared in its place; b1 still waits.
        submit(api, "team-b", job("b2", "gpu", priority="high"))

        def after_preemption() -> dict[str, Any] | None:
            evicted = [
                n
                for n in ("a1", "a2")
                if (c := condition(api, "team-a", n, "Evicted")) and c["status"] == "True"
            ]
            if len(evicted) != 1:
                return None
            [kept] = {"a1", "a2"} - set(evicted)
            return settled(api, plugin, {kept: "team-a", "b2": "team-b"}, {"b1": "team-b"})

        prepared = wait_for("b2 admitted by preempting a team A Job", after_preemption, timeout=180)
        assert len(prepared) == 2
        preempted = [n for n in ("a1", "a2") if not admitted(api, "team-a", n)]
        assert len(preempted) == 1
        assert condition(api, "team-a", preempted[0], "Evicted")["reason"] == "Preempted"
        assert client.BatchV1Api(api).read_namespaced_job(preempted[0], "team-a").spec.suspend
    finally:
        delete_jobs(api, plugin)


def test_mig_partitions_by_size_and_shares_are_charged_per_device(
    api: client.ApiClient, kueue: KueueProcess, gpudra: dict[str, PluginProcess]
) -> None:
    plugin = gpudra[NODE]
    for team in TEAMS:
        submit(
            api,
            team,
            template("mig-1g", "mig-1g10gb.gpudra.io"),
            template("mig-3g", "mig-3g40gb.gpudra.io"),
            template("share", "gpu-shared.gpudra.io", {"memory": "10Gi", "compute": "10"}),
        )
    try:
        # Two 1g.10gb partitions and one 3g.40gb of quota, two shares.
        submit(api, "team-a", job("m1", "mig-1g"), job("m3g", "mig-3g"), job("s1", "share"))
        submit(api, "team-b", job("m2", "mig-1g"), job("s2", "share"))
        running = {"m1": "team-a", "m3g": "team-a", "s1": "team-a", "m2": "team-b", "s2": "team-b"}
        wait_for(
            "the Jobs within quota admitted and prepared",
            lambda: settled(api, plugin, running, {}),
            timeout=240,
        )
        submit(api, "team-b", job("m4", "mig-1g"), job("m3g-b", "mig-3g"), job("s3", "share"))
        waiting = {"m4": "team-b", "m3g-b": "team-b", "s3": "team-b"}
        prepared = wait_for(
            "the Jobs over quota queued", lambda: settled(api, plugin, running, waiting), timeout=120
        )

        # gpudra made exactly the partitions Kueue charged for, and one MPS share per share Job.
        partitions = [d["device"] for e in prepared.values() for d in e["devices"] if d.get("mig")]
        assert sorted(name.split("-mig-")[1].rsplit("-", 1)[0] for name in partitions) == [
            "1g10gb",
            "1g10gb",
            "3g40gb",
        ]
        shares = [d["sharing"] for e in prepared.values() for d in e["devices"] if d.get("sharing")]
        assert [(s["strategy"], s["pinned_memory_limit"]) for s in shares] == [("MPS", 10 * 2**30)] * 2
    finally:
        delete_jobs(api, plugin)
