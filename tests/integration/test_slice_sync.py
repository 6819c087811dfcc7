"""The slice sync against other clients' writes to its pool, on the real control plane.

gpudra's plugin runs here with a 5-minute resync, so a slice put right within the deadlines below was put
right because the plugin watches its pool: (a) a slice whose spec someone edited, keeping every
annotation, is restored; (b) a stranger's slice in the pool at generation 2^63-1, which once made the
plugin compute 2^63 and fail on HTTP 400 forever, is deleted while the plugin's own slices keep their
small generation and its loops stay healthy; (c) a deleted slice is published again.
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tests.localcluster import LocalCluster
from tests.localcluster.cluster import free_port
from tests.localcluster.node_plugin import DRIVER, PluginProcess

from .conftest import CLUSTER_PREFIX
from .kube_helpers import RESOURCE, Resources, wait_for

NODE = "node-watched"
RESYNC_SECONDS = 300
DEADLINE = 30.0  # generous for a loaded machine, and ten times shorter than the resync
LARGEST_GENERATION = 2**63 - 1
WRITES = 'gpudra_resourceslice_writes_total{operation="%s"}'
FAILURES = 'gpudra_background_failures{loop="%s"}'
HEALTHY = 'gpudra_background_healthy{loop="%s"}'

Pool = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def watched() -> Iterator[tuple[Resources, PluginProcess]]:
    root = Path(tempfile.mkdtemp(prefix=CLUSTER_PREFIX, dir="/tmp"))
    with LocalCluster(root, nodes=(NODE,)) as cluster:
        resources = Resources(config.new_client_from_config(str(cluster.kubeconfig)))
        plugin = PluginProcess(cluster, cluster.nodes[NODE], "dgx-h100")
        plugin.start(metrics_port=free_port(), resync_seconds=RESYNC_SECONDS)
        try:
            wait_for("the plugin's pool", lambda: _complete(resources), timeout=60)
            yield resources, plugin
        finally:
            plugin.stop()


def _pool(resources: Resources) -> Pool:
    selector = f"spec.driver={DRIVER},spec.nodeName={NODE}"
    return {s["metadata"]["name"]: s for s in resources.list("resourceslices", field_selector=selector)}


def _complete(resources: Resources) -> Pool | None:
    """The pool, once it is whole: its slices at one generation, as many as each says there are."""
    pool = _pool(resources)
    pools = {
        (s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in pool.values()
    }
    return pool if len(pools) == 1 and next(iter(pools))[1] == len(pool) else None


def _generation(pool: Pool) -> int:
    (generation,) = {s["spec"]["pool"]["generation"] for s in pool.values()}
    return int(generation)


def _gone(resources: Resources, name: str) -> bool:
    try:
        resources.get("resourceslices", name)
    except client.ApiException as err:
        return err.status == 404
    return False


def test_a_slice_edited_by_someone_else_is_restored_within_seconds(
    watched: tuple[Resources, PluginProcess],
) -> None:
    resources, plugin = watched
    before = wait_for("the plugin's pool", lambda: _complete(resources))
    name = next(n for n, s in sorted(before.items()) if s["spec"].get("devices"))
    edited = copy.deepcopy(before[name])  # metadata as it was: every annotation and label kept
    edited["spec"]["devices"][0]["attributes"]["productName"] = {"string": "edited by someone else"}
    updates = plugin.metrics()[WRITES % "update"]

    started = time.monotonic()
    resources.custom.replace_cluster_custom_object(*RESOURCE, "resourceslices", name, edited)
    wait_for(
        "the edited slice to be restored",
        lambda: resources.get("resourceslices", name)["spec"] == before[name]["spec"],
        timeout=DEADLINE,
    )
    print(f"\nedited slice restored in {time.monotonic() - started:.2f}s")
    after = wait_for("the plugin's pool", lambda: _complete(resources))
    # Put back at the generation it had, alone: every other slice is the object it was.
    assert {n: s["metadata"]["resourceVersion"] for n, s in after.items() if n != name} == {
        n: s["metadata"]["resourceVersion"] for n, s in before.items() if n != name
    }
    wait_for("the restore to be counted", lambda: plugin.metrics()[WRITES % "update"] == updates + 1)


def test_a_foreign_slice_at_the_largest_generation_is_deleted(
    watched: tuple[Resources, PluginProcess],
) -> None:
    resources, plugin = watched
    before = wait_for("the plugin's pool", lambda: _complete(resources))
    failures = plugin.metrics()[FAILURES % "slice-sync"]
    stranger = f"{NODE}-not-gpudras"

    started = time.monotonic()
    resources.create(
        "resourceslices",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": stranger},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": LARGEST_GENERATION, "resourceSliceCount": 1},
                "devices": [{"name": "not-a-gpudra-device"}],
            },
        },
    )
    wait_for("the foreign slice to be deleted", lambda: _gone(resources, stranger), timeout=DEADLINE)
    print(f"\nforeign slice deleted in {time.monotonic() - started:.2f}s")
    after = wait_for("the plugin's pool", lambda: _complete(resources))
    assert set(after) == set(before)
    assert _generation(after) == _generation(before) < 10
    metrics = plugin.metrics()
    assert metrics[HEALTHY % "slice-sync"] == 1 and metrics[HEALTHY % "slice-watch"] == 1
    assert metrics[FAILURES % "slice-sync"] == failures  # no write was refused


def test_a_deleted_slice_is_published_again_within_seconds(
    watched: tuple[Resources, PluginProcess],
) -> None:
    resources, plugin = watched
    before = wait_for("the plugin's pool", lambda: _complete(resources))
    victim = sorted(before)[0]

    started = time.monotonic()
    resources.delete("resourceslices", victim)

    def recreated() -> dict[str, Any] | None:
        again = _pool(resources).get(victim)
        return again if again and again["metadata"]["uid"] != before[victim]["metadata"]["uid"] else None

    again = wait_for("the deleted slice to be published again", recreated, timeout=DEADLINE)
    print(f"\ndeleted slice back in {time.monotonic() - started:.2f}s")
    assert again["spec"] == before[victim]["spec"]  # same content, same generation
    metrics = plugin.metrics()
    assert metrics[HEALTHY % "slice-sync"] == 1 and metrics[HEALTHY % "slice-watch"] == 1


def test_a_restarted_plugin_keeps_its_pool_as_it_is_and_restores_it_alone(
    watched: tuple[Resources, PluginProcess],
) -> None:
    """Nothing is remembered after a restart: the plugin checks its slices with dry-run updates and
    adopts the unchanged ones, so it rewrites nothing and a later damage is repaired alone."""
    resources, plugin = watched
    before = wait_for("the plugin's pool", lambda: _complete(resources))
    plugin.stop()
    plugin.start(metrics_port=free_port(), resync_seconds=RESYNC_SECONDS)
    victim = sorted(before)[-1]
    resources.delete("resourceslices", victim)
    wait_for("the deleted slice to be published again", lambda: victim in _pool(resources), timeout=DEADLINE)
    after = wait_for("the plugin's pool", lambda: _complete(resources))
    assert {n: s["metadata"]["resourceVersion"] for n, s in after.items() if n != victim} == {
        n: s["metadata"]["resourceVersion"] for n, s in before.items() if n != victim
    }
    assert after[victim]["spec"] == before[victim]["spec"]
    metrics = plugin.metrics()
    assert [metrics[WRITES % op] for op in ("create", "update", "delete")] == [1, 0, 0]
