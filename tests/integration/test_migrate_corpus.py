"""What `gpudra migrate` writes runs: manifests of NVIDIA's DRA driver and device plugin from the unit
tests' corpus (tests/unit/data/migrate), converted by the command as a user runs it, go to the real
control plane; the real scheduler allocates their claims from gpudra's slices, the real kubelet has
the plugin prepare them, and each claim is prepared with what its source asked: the device form (whole
GPU, share, MIG profile), the share's size as MPS limits, the time-slice.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils

from tests.localcluster.node_plugin import PluginProcess

from .kube_helpers import Resources, new_namespace, pod_gone, wait_for

CORPUS = Path(__file__).resolve().parents[1] / "unit" / "data" / "migrate"
MEMORY = ("--gpu-memory", "81559Mi")

Check = Callable[[dict[str, PluginProcess], list[dict[str, Any]]], bool]


def _plugin(name: str) -> tuple[str, ...]:
    return ("--device-plugin-config", str(CORPUS / "device-plugin" / name))


def _mps(threads: float, *limits: str) -> Check:
    """An MPS daemon with these limits runs for one of the claims."""

    def check(plugins: dict[str, PluginProcess], claims: list[dict[str, Any]]) -> bool:
        wanted = (threads, sorted(limits))
        found = [
            (d["default_active_thread_percentage"], sorted(d["default_pinned_memory_limits"].values()))
            for plugin in plugins.values()
            for d in plugin.mps_daemons()
        ]
        return wanted in found

    return check


def _long_time_slice(plugins: dict[str, PluginProcess], claims: list[dict[str, Any]]) -> bool:
    return any(3 in plugin.timeslices().values() for plugin in plugins.values())


def _time_sliced(plugins: dict[str, PluginProcess], claims: list[dict[str, Any]]) -> bool:
    """Every claim is prepared with the TimeSlicing strategy (the Default interval: nothing to see on
    the card)."""
    entries = {uid: entry for p in plugins.values() for uid, entry in p.checkpoint_claims().items()}
    uids = [c["metadata"]["uid"] for c in claims]
    return all(uid in entries and "TimeSlicing" in json.dumps(entries[uid]) for uid in uids)


@dataclass(frozen=True)
class Case:
    pods: int  # pods that run
    devices: tuple[str, ...]  # a regex per device allocated, over all claims
    args: tuple[str, ...] = ()
    check: Check | None = None
    claims: int = 0  # claims in all (0: one per pod)


WHOLE, SHARE = r"gpu-\d+", r"gpu-\d+-shared"
MIG = r"gpu-\d+-mig-{}-\d+"
CASES = {
    "dra-gpu-test1.yaml": Case(2, (WHOLE, WHOLE)),
    "dra-gpu-test3.yaml": Case(2, (WHOLE,), claims=1),
    "dra-gpu-test4-mig.yaml": Case(1, (MIG.format("1g10gb"), MIG.format("2g20gb"))),
    "dra-time-slicing.yaml": Case(1, (WHOLE,), check=_long_time_slice),
    "dra-mps.yaml": Case(1, (WHOLE, WHOLE), check=_mps(50.0, "16384M", "32768M")),
    "dra-mig-mps.yaml": Case(1, (MIG.format("3g40gb"),), check=_mps(50.0, "8192M")),
    "dra-consumable-shares-memory.yaml": Case(1, (SHARE,)),
    "dp-time-slicing-renamed.yaml": Case(
        2, (SHARE, SHARE), (*_plugin("time-slicing-renamed.yaml"), *MEMORY), check=_time_sliced
    ),
    "dp-mps.yaml": Case(
        3, (SHARE, SHARE, SHARE), (*_plugin("mps.yaml"), *MEMORY), check=_mps(25.0, "19456M")
    ),
    "dp-mig-mixed.yaml": Case(
        1, (MIG.format("3g40gb"), MIG.format("2g20gb")), _plugin("mig-mixed.yaml"), claims=2
    ),
    "dp-mig-single.yaml": Case(1, (MIG.format(".*"),), _plugin("mig-single.yaml")),
}


@dataclass
class Applied:
    namespace: str
    objects: list[dict[str, Any]] = field(default_factory=list)


def migrated(name: str, args: tuple[str, ...]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "gpudra", "migrate", str(CORPUS / "input" / name), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    found = []
    for obj in yaml.safe_load_all(done.stdout):
        if isinstance(obj, dict) and obj.get("kind") != "Namespace":
            obj.setdefault("metadata", {}).pop("namespace", None)  # each case in a namespace of its own
            found.append(obj)
    return found


def _claims(api: client.ApiClient, ns: str) -> list[dict[str, Any]]:
    return Resources(api).list("resourceclaims", ns)


def _allocated(api: client.ApiClient, ns: str, count: int) -> list[dict[str, Any]] | None:
    claims = [c for c in _claims(api, ns) if (c.get("status") or {}).get("allocation")]
    return claims if len(claims) == count else None


def _running(core: client.CoreV1Api, ns: str, count: int) -> list[client.V1Pod] | None:
    pods = [p for p in core.list_namespaced_pod(ns).items if p.status.phase == "Running"]
    return pods if len(pods) == count else None


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_migrated_workload_is_allocated_and_prepared_as_its_source_asked(
    name: str, api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> None:
    case = CASES[name]
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "migrated")
    try:
        utils.create_from_yaml(api, yaml_objects=migrated(name, case.args), namespace=ns)
        try:
            wait_for(f"{case.pods} pods Running", partial(_running, core, ns, case.pods), timeout=180)
        except AssertionError as err:
            events = [
                f"{e.involved_object.name}: {e.reason}: {e.message}"
                for e in core.list_namespaced_event(ns).items
            ]
            raise AssertionError(f"{err}; events: {events}") from None
        claims = wait_for(
            "claims allocated", partial(_allocated, api, ns, case.claims or case.pods), timeout=60
        )
        devices = [r["device"] for c in claims for r in c["status"]["allocation"]["devices"]["results"]]
        unmatched = list(case.devices)
        for device in devices:
            pattern = next((p for p in unmatched if re.fullmatch(p, device)), None)
            assert pattern is not None, f"{device} is none of {unmatched} (all: {devices})"
            unmatched.remove(pattern)
        assert not unmatched, f"no device for {unmatched} (all: {devices})"
        entries = {u: e for p in gpudra.values() for u, e in p.checkpoint_claims().items()}
        assert all(entries[c["metadata"]["uid"]]["state"] == "PrepareCompleted" for c in claims)
        check = case.check
        if check is not None:
            wait_for(f"{name} prepared as asked", lambda: check(gpudra, claims), timeout=30)
    finally:
        _clean(api, core, ns)


def _clean(api: client.ApiClient, core: client.CoreV1Api, ns: str) -> None:
    """The namespace's workloads and pods deleted, and their claims unprepared, before the next case."""
    apps = client.AppsV1Api(api)
    for deployment in apps.list_namespaced_deployment(ns).items:
        apps.delete_namespaced_deployment(deployment.metadata.name, ns)
    for pod in core.list_namespaced_pod(ns).items:
        core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
    for pod in core.list_namespaced_pod(ns).items:
        wait_for("pod deleted", partial(pod_gone, core, pod.metadata.name, ns), timeout=90)
    for claim in _claims(api, ns):
        if not claim["metadata"].get("ownerReferences"):  # a ResourceClaim of the manifest, not a pod's
            Resources(api).delete("resourceclaims", claim["metadata"]["name"], ns)
    wait_for("claims gone", lambda: not _claims(api, ns), timeout=90)
    core.delete_namespace(ns)
