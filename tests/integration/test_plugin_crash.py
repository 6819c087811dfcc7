"""SIGKILL of gpudra's plugin at every step of prepare and unprepare, then a restart.

The plugin kills itself at the named step (GPUDRA_CRASH_AT), exactly like a node-level SIGKILL at
that moment. After the restart the kubelet's own retries must complete the pod's prepare (or its
unprepare), and nothing may be left over: no CDI file, no checkpoint entry, no GPU setting.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client, utils

from gpudra.node import faults
from tests.localcluster.node_plugin import PluginProcess

from .kube_helpers import Resources, claim_pod, claim_template, pod_gone, pod_running, wait_for

NODE = "node-h100"
LONG_SLICES = {
    "apiVersion": "resource.gpudra.io/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
}


@pytest.fixture
def plugin(gpudra: dict[str, PluginProcess]) -> Iterator[PluginProcess]:
    yield gpudra[NODE]
    # Whatever a test did, leave a healthy plugin for the next one.
    if gpudra[NODE].process is None or gpudra[NODE].process.poll() is not None:
        gpudra[NODE].start()


def _assert_clean(plugin: PluginProcess, uid: str) -> None:
    assert uid not in plugin.cdi_specs()
    assert uid not in plugin.checkpoint_claims()
    assert all(level == 0 for level in plugin.timeslices().values())


@pytest.mark.parametrize("step", faults.PREPARE_STEPS)
def test_crash_during_prepare_then_restart_completes(
    api: client.ApiClient, plugin: PluginProcess, step: str
) -> None:
    core = client.CoreV1Api(api)
    ns = f"crash-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    plugin.stop()
    plugin.start(crash_at=step)
    utils.create_from_yaml(
        api,
        yaml_objects=[claim_template("victim", LONG_SLICES), claim_pod("victim", {"gpu": "victim"}, NODE)],
        namespace=ns,
    )

    assert plugin.wait_killed() == -signal.SIGKILL
    plugin.start()
    pod = wait_for("pod Running after the restart", lambda: pod_running(core, "victim", ns), timeout=120)
    claim = Resources(api).get(
        "resourceclaims", pod.status.resource_claim_statuses[0].resource_claim_name, ns
    )
    uid = claim["metadata"]["uid"]
    assert plugin.checkpoint_claims()[uid]["state"] == "PrepareCompleted"
    assert uid in plugin.cdi_specs()
    assert 3 in plugin.timeslices().values()

    core.delete_namespaced_pod("victim", ns, grace_period_seconds=0)
    wait_for("pod deleted", lambda: pod_gone(core, "victim", ns), timeout=60)
    wait_for("claim unprepared", lambda: uid not in plugin.checkpoint_claims(), timeout=60)
    _assert_clean(plugin, uid)
    core.delete_namespace(ns)


@pytest.mark.parametrize("step", faults.UNPREPARE_STEPS)
def test_crash_during_unprepare_then_restart_completes(
    api: client.ApiClient, plugin: PluginProcess, step: str
) -> None:
    core = client.CoreV1Api(api)
    ns = f"crash-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    utils.create_from_yaml(
        api,
        yaml_objects=[claim_template("victim", LONG_SLICES), claim_pod("victim", {"gpu": "victim"}, NODE)],
        namespace=ns,
    )
    pod = wait_for("pod Running", lambda: pod_running(core, "victim", ns), timeout=90)
    claim = Resources(api).get(
        "resourceclaims", pod.status.resource_claim_statuses[0].resource_claim_name, ns
    )
    uid = claim["metadata"]["uid"]
    plugin.stop()
    plugin.start(crash_at=step)

    core.delete_namespaced_pod("victim", ns, grace_period_seconds=0)
    assert plugin.wait_killed() == -signal.SIGKILL
    plugin.start()
    wait_for("pod deleted", lambda: pod_gone(core, "victim", ns), timeout=120)
    wait_for("claim unprepared", lambda: uid not in plugin.checkpoint_claims(), timeout=60)
    _assert_clean(plugin, uid)
    core.delete_namespace(ns)
