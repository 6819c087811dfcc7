"""examples/quota/ fits together (docs/quota.md): the Kueue mappings name gpudra's classes and the chart's
per-profile MIG classes of ci/quota-values.yaml, the ClusterQueue gives quota to exactly the mapped
resources, and the ResourceQuota caps gpudra's own classes. The objects themselves go to the real API
server in tests/integration/test_quota.py and test_kueue.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpudra.model.devices import dns_label

ROOT = Path(__file__).resolve().parents[3]
QUOTA = ROOT / "examples" / "quota"
CHART_CI = ROOT / "deploy" / "helm" / "gpudra" / "ci" / "quota-values.yaml"
OWN_CLASSES = ROOT / "deploy" / "manifests" / "deviceclasses.yaml"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


# Shares of a MIG partition are opt-in per profile on a node group (kubeletPlugin.options.migShareProfiles):
# the examples give quota to what a partitionable node group with shares offers; docs/quota.md says how to
# add mig-shared.gpudra.io like gpu-shared.gpudra.io.
OPT_IN_CLASSES = {"mig-shared.gpudra.io"}


def _own_classes() -> set[str]:
    return {d["metadata"]["name"] for d in _docs(OWN_CLASSES)} - OPT_IN_CLASSES


def _profile_classes() -> set[str]:
    """The classes the chart makes from ci/quota-values.yaml's migProfiles (templates/deviceclasses.yaml)."""
    profiles = yaml.safe_load(CHART_CI.read_text())["deviceClasses"]["migProfiles"]
    return {f"mig-{dns_label(p)}.gpudra.io" for p in profiles}


def test_kueue_maps_whole_gpus_shares_and_each_profile_class_once() -> None:
    [config] = _docs(QUOTA / "kueue-configuration.yaml")
    assert config["featureGates"]["DynamicResourceAllocation"] is True
    mappings = config["resources"]["deviceClassMappings"]
    mapped = [c for m in mappings for c in m["deviceClassNames"]]
    assert len(mapped) == len(set(mapped))
    # mig.gpudra.io stays unmapped: Kueue refuses its Workloads, so partitions are asked by size.
    assert set(mapped) == (_own_classes() - {"mig.gpudra.io"}) | _profile_classes()


def test_the_cluster_queue_covers_exactly_the_mapped_resources() -> None:
    [config] = _docs(QUOTA / "kueue-configuration.yaml")
    names = {m["name"] for m in config["resources"]["deviceClassMappings"]}
    [queue] = [d for d in _docs(QUOTA / "kueue-queues.yaml") if d["kind"] == "ClusterQueue"]
    [group] = queue["spec"]["resourceGroups"]
    assert set(group["coveredResources"]) == names
    assert {r["name"] for f in group["flavors"] for r in f["resources"]} == names
    local = [d for d in _docs(QUOTA / "kueue-queues.yaml") if d["kind"] == "LocalQueue"]
    assert {q["spec"]["clusterQueue"] for q in local} == {queue["metadata"]["name"]}
    assert len({q["metadata"]["namespace"] for q in local}) == 2


def test_the_resource_quota_caps_gpudra_s_own_classes() -> None:
    [quota] = _docs(QUOTA / "resourcequota.yaml")
    suffix = ".deviceclass.resource.k8s.io/devices"
    assert {name.removesuffix(suffix) for name in quota["spec"]["hard"]} == _own_classes()
