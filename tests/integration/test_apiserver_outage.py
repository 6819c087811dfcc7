"""The real API server stops for 20 s while gpudra's plugin runs, then comes back.

Before the background loops ran under `service.Loop`, the first urllib3 error of an outage ended the
claim watch's thread for good. Now no loop dies: the slice sync counts and retries its failures and
republishes within seconds of the restart, and a new pod's claim is prepared with exactly one read of
that claim (prepare reads each claim once, with a GET; there is no watch to go stale or to storm).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config, utils

from tests.localcluster import LocalCluster
from tests.localcluster.cluster import free_port
from tests.localcluster.node_plugin import PluginProcess

from .conftest import CLUSTER_PREFIX, REPO
from .kube_helpers import claim_pod, claim_template, pod_running, wait_for

NODE = "node-outage"
OUTAGE_SECONDS = 20
READS = "gpudra_claim_reads"
FAILURES = 'gpudra_background_failures{loop="slice-sync"}'
HEALTHY = 'gpudra_background_healthy{loop="slice-sync"}'


@pytest.fixture
def outage_cluster() -> Iterator[tuple[LocalCluster, PluginProcess]]:
    root = Path(tempfile.mkdtemp(prefix=CLUSTER_PREFIX, dir="/tmp"))
    with LocalCluster(root, nodes=(NODE,)) as cluster:
        api = config.new_client_from_config(str(cluster.kubeconfig))
        utils.create_from_yaml(
            api,
            yaml_objects=list(yaml.safe_load_all((REPO / "deploy/manifests/deviceclasses.yaml").read_text())),
        )
        plugin = PluginProcess(cluster, cluster.nodes[NODE], "mixed")
        plugin.start(metrics_port=free_port())
        try:
            yield cluster, plugin
        finally:
            plugin.stop()


def _run_pod(cluster: LocalCluster, name: str) -> None:
    api = config.new_client_from_config(str(cluster.kubeconfig))
    core = client.CoreV1Api(api)
    utils.create_from_yaml(
        api, yaml_objects=[claim_template(name), claim_pod(name, {"gpu": name}, NODE)], namespace="default"
    )
    wait_for(f"pod {name} running", lambda: pod_running(core, name, "default"), timeout=90)


def test_the_plugin_rides_out_an_api_server_outage(
    outage_cluster: tuple[LocalCluster, PluginProcess],
) -> None:
    cluster, plugin = outage_cluster
    _run_pod(cluster, "before")
    assert plugin.metrics()[READS] == 1

    cluster.stop_apiserver()
    time.sleep(OUTAGE_SECONDS)
    down = plugin.metrics()
    assert plugin.process is not None and plugin.process.poll() is None
    assert down[FAILURES] >= 1  # every failed sync is counted, logged and retried (--resync-seconds=5)
    assert down[HEALTHY] == 0

    cluster.start_apiserver()
    restarted = time.monotonic()
    wait_for("the slice sync to succeed again", lambda: plugin.metrics()[HEALTHY] == 1, timeout=60)
    resync_seconds = time.monotonic() - restarted
    _run_pod(cluster, "after")
    after = plugin.metrics()
    print(
        f"\nslice sync back {resync_seconds:.1f}s after the API server; failed syncs during the outage: "
        f"{down[FAILURES]:.0f}; claim reads for two pods: {after[READS]:.0f}"
    )
    assert after[READS] == 2  # one GET per claim prepared, outage or not
