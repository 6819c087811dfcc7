"""`gpudra explain` against the real scheduler: a corpus of claims goes to the scheduler at once (one pod
each, on the three simulated nodes), and once it has decided, explain must agree on every claim: "fits"
where the scheduler allocated (on that node), "cannot fit" where the pod stayed Unschedulable, with a
reason that names what to change.

Some claims compete for one GPU on purpose (a whole GPU two claims ask for, two shares that do not fit
together, admin access next to a holder): the scheduler's order decides which one waits, and explain
must agree with whichever it was, taking the others' allocations into account.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest
from kubernetes import client

from gpudra.kube.client import Kube
from gpudra.model.claim import read_claim, read_spec
from gpudra.scheduling.explain import ClaimToExplain, Explanation, device_classes, explain
from gpudra.scheduling.pools import ClusterInventory
from tests.localcluster import LocalCluster
from tests.localcluster.node_plugin import DRIVER, PluginProcess

from .kube_helpers import Resources, new_namespace, pod_gone, unschedulable, wait_for

A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'
H100, L4, T4 = "NVIDIA H100 80GB HBM3", "NVIDIA L4", "Tesla T4"


def exact(device_class: str, *selectors: str, **extra: Any) -> dict[str, Any]:
    return {
        "deviceClassName": device_class,
        "selectors": [{"cel": {"expression": s}} for s in selectors],
        **extra,
    }


def gpu(*selectors: str, **extra: Any) -> dict[str, Any]:
    return exact("gpu.gpudra.io", *selectors, **extra)


def mig(*selectors: str, **extra: Any) -> dict[str, Any]:
    return exact("mig.gpudra.io", *selectors, **extra)


def share(*selectors: str, **extra: Any) -> dict[str, Any]:
    return exact("gpu-shared.gpudra.io", *selectors, **extra)


@dataclass(frozen=True)
class Case:
    """One claim: its requests ({name: exactly} or {name: [subrequests]}), what the scheduler should do
    with it ("fits", "pending", or "either" when it competes), and for a pending one, words of which
    at least one the reason must contain."""

    name: str
    requests: dict[str, dict[str, Any] | list[tuple[str, dict[str, Any]]]]
    expect: str
    reason: tuple[str, ...] = ()
    constraints: list[dict[str, Any]] = field(default_factory=list)
    group: str | None = None  # of the claims in one group, exactly one stays pending


def _minor(n: int) -> str:
    return f"{A}.minor == {n}"


def _parent(n: int) -> str:
    return f"{A}.parentMinor == {n}"


CORPUS = [
    # --- node-h100: eight H100s, whole, shared, or as MIG partitions ----------------------------
    Case("gpu-product", {"gpu": gpu(f'{A}.productName == "{H100}"', _minor(0))}, "either", group="gpu0"),
    Case(
        "taken-gpu0",
        {"gpu": gpu(f'{A}.architecture == "Hopper"', _minor(0))},
        "either",
        ("allocated to",),
        group="gpu0",
    ),
    Case("memory-40gi", {"gpu": gpu(f'{C}.memory.compareTo(quantity("40Gi")) >= 0', _minor(1))}, "fits"),
    Case(
        "pair-nvlink",
        {"gpus": gpu(f"{A}.minor in [2, 3]", count=2)},
        "fits",
        constraints=[{"matchAttribute": f"{DRIVER}/nvlinkDomain"}],
    ),
    Case(
        "mig-counters-exhausted",
        {
            "big": mig(f'{A}.profile == "4g.40gb"', _parent(4)),
            "half": mig(f'{A}.profile == "3g.40gb"', _parent(4)),
            "small": mig(f'{A}.profile == "1g.20gb"', _parent(4)),
        },
        "pending",
        ("counter", "together"),
    ),
    Case(
        "mig-pci",
        {
            "mig": mig(
                'device.attributes["resource.kubernetes.io"].pciBusID.matches("^0000:[0-9a-f]{2}:00.0$")',
                f'{A}.profile == "1g.10gb"',
                f'{A}.architecture == "Hopper"',
                _parent(4),
            )
        },
        "fits",
    ),
    Case("has-guard", {"mig": mig(f'has({A}.profile) && {A}.profile == "2g.20gb"', _parent(4))}, "fits"),
    Case(
        "compute-capability-9",
        {"mig": mig(f"{A}.cudaComputeCapability.major() == 9", f'{A}.profile == "1g.10gb"', _parent(4))},
        "fits",
    ),
    Case(
        "mig-eight-1g",
        {"mig": mig(f'{A}.profile == "1g.10gb"', _parent(5), count=8)},
        "pending",
        ("only 7 match",),
    ),
    Case(
        "first-available-h200-then-mig",
        {
            "gpu": [
                ("h200", gpu(f'{A}.productName == "NVIDIA H200"')),
                ("mig", mig(f'{A}.profile == "2g.20gb"', _parent(5))),
            ]
        },
        "fits",
    ),
    Case(
        "share-10gi",
        {"share": share(_minor(6), capacity={"requests": {"memory": "10Gi", "compute": "10"}})},
        "fits",
    ),
    Case(
        "share-50gi-a",
        {"share": share(_minor(6), capacity={"requests": {"memory": "50Gi"}})},
        "either",
        ("memory",),
        group="shares",
    ),
    Case(
        "share-50gi-b",
        {"share": share(_minor(6), capacity={"requests": {"memory": "50Gi"}})},
        "either",
        ("memory",),
        group="shares",
    ),
    Case(
        "share-too-big",
        {"share": share(_minor(6), capacity={"requests": {"memory": "100Gi"}})},
        "pending",
        ("request policy",),
    ),
    Case("holder-gpu7", {"gpu": gpu(_minor(7))}, "fits"),
    Case("admin-gpu7", {"gpu": gpu(_minor(7), adminAccess=True)}, "either", ("counter",)),
    Case(
        "count-too-many", {"gpus": gpu(f'{A}.productName == "{H100}"', count=9)}, "pending", ("only 8 match",)
    ),
    Case(
        "memory-too-big",
        {"gpu": gpu(f'{C}.memory.compareTo(quantity("100Gi")) >= 0')},
        "pending",
        ("no device has",),
    ),
    Case(
        "multiprocessors-too-many",
        {"gpu": gpu(f"{C}.multiprocessors.asInteger() > 200")},
        "pending",
        ("no device has", "multiprocessors"),
    ),
    Case("mig-product-h200", {"mig": mig(f'{A}.productName == "NVIDIA H200"')}, "pending", ("NVIDIA H200",)),
    # --- node-a100: eight A100s with MIG on, so partitions only --------------------------------
    Case(
        "a100-1g5gb",
        {"mig": mig(f'{A}.profile == "1g.5gb"', _parent(0), f'{A}.productName.contains("A100")')},
        "fits",
    ),
    Case(
        "cel-bind",
        {
            "mig": mig(
                f"cel.bind(g, {A}, "
                'g.profile == "1g.10gb" && g.parentMinor == 0 && g.architecture == "Ampere")'
            )
        },
        "fits",
    ),
    Case(
        "in-list",
        {"mig": mig(f'{A}.profile in ["1g.5gb+me", "1g.5gb"] && {A}.architecture == "Ampere"', _parent(0))},
        "fits",
    ),
    Case(
        "a100-pair-same-gpu",
        {
            "a": mig(f'{A}.profile == "1g.5gb"', _parent(1), f'{A}.architecture == "Ampere"'),
            "b": mig(f'{A}.profile == "1g.5gb"', f'{A}.architecture == "Ampere"'),
        },
        "fits",
        constraints=[{"matchAttribute": f"{DRIVER}/parentUUID"}],
    ),
    Case("a100-7g", {"mig": mig(f'{A}.profile == "7g.40gb"', _parent(2))}, "fits"),
    Case(
        "a100-7g-and-1g",
        {
            "whole": mig(f'{A}.profile == "7g.40gb"', _parent(3)),
            "extra": mig(f'{A}.profile == "1g.5gb"', _parent(3), f'{A}.architecture == "Ampere"'),
        },
        "pending",
        ("counter", "together"),
    ),
    Case(
        "a100-distinct",
        {
            "a": mig(
                f'{A}.profile == "1g.5gb"', f"{A}.parentMinor in [4, 5]", f'{A}.architecture == "Ampere"'
            ),
            "b": mig(
                f'{A}.profile == "1g.5gb"', f"{A}.parentMinor in [4, 5]", f'{A}.architecture == "Ampere"'
            ),
        },
        "fits",
        constraints=[{"distinctAttribute": f"{DRIVER}/parentUUID"}],
    ),
    Case(
        "a100-by-memory",
        {
            "mig": mig(
                f'{C}.memory.compareTo(quantity("19Gi")) >= 0', _parent(6), f'{A}.architecture == "Ampere"'
            )
        },
        "fits",
    ),
    Case(
        "a100-first-available",
        {
            "mig": [
                ("h100-only", mig(f'{A}.profile == "3g.40gb"', _parent(7), f'{A}.architecture == "Ampere"')),
                ("fallback", mig(f'{A}.profile == "2g.10gb"', _parent(7), f'{A}.architecture == "Ampere"')),
            ]
        },
        "fits",
    ),
    Case(
        "quantity-arithmetic",
        {
            "mig": mig(
                f'{C}.memory.add(quantity("1Gi")).isGreaterThan(quantity("9Gi"))',
                _parent(7),
                f'{A}.architecture == "Ampere"',
            )
        },
        "fits",
    ),
    Case("a100-whole", {"gpu": gpu(f'{A}.productName.contains("A100")')}, "pending", ("no device has",)),
    Case(
        "a100-3g40gb",
        {"mig": mig(f'{A}.profile == "3g.40gb"', f'{A}.architecture == "Ampere"')},
        "pending",
        ("no device has",),
    ),
    # --- node-mixed: four L4s and two T4s, no MIG ----------------------------------------------
    Case("l4-product", {"gpu": gpu(f'{A}.productName == "{L4}"', _minor(0))}, "fits"),
    Case(
        "l4-semver",
        {
            "gpu": gpu(
                f'{A}.cudaComputeCapability == semver("8.9.0")',
                f'{A}.driverVersion.compareTo(semver("v580.65", true)) >= 0',
                f'{A}.driverVersion.isGreaterThan(semver("550.0.0"))',
                _minor(1),
            )
        },
        "fits",
    ),
    Case("t4-all", {"gpus": gpu(f'{A}.productName == "{T4}"', allocationMode="All")}, "fits"),
    Case(
        "l4-share",
        {"share": share(f'{A}.productName == "{L4}"', _minor(2), capacity={"requests": {"memory": "4Gi"}})},
        "fits",
    ),
    Case("admin-l4", {"gpu": gpu(f'{A}.productName == "{L4}"', _minor(3), adminAccess=True)}, "fits"),
    Case(
        "l4-nvlink-pair",
        {"gpus": gpu(f'{A}.productName == "{L4}"', count=2)},
        "pending",
        ("nvlinkDomain", "can be allocated"),
        constraints=[{"matchAttribute": f"{DRIVER}/nvlinkDomain"}],
    ),
    Case("t4-three", {"gpus": gpu(f'{A}.productName == "{T4}"', count=3)}, "pending", ("only 2 match",)),
    Case(
        "driver-too-old",
        {"gpu": gpu(f'{A}.driverVersion.isLessThan(semver("500.0.0"))')},
        "pending",
        ("driverVersion",),
    ),
    Case(
        "compute-capability-10",
        {"gpu": gpu(f"{A}.cudaComputeCapability.major() >= 10")},
        "pending",
        ("cudaComputeCapability",),
    ),
    Case(
        "unknown-domain",
        {"gpu": gpu('"model" in device.attributes["other.example.com"]')},
        "pending",
        ("no device has",),
    ),
    Case(
        "t4-share-compute",
        {"share": share(f'{A}.productName == "{T4}"', capacity={"requests": {"compute": "150"}})},
        "pending",
        ("request policy", "can be allocated"),
    ),
    Case(
        "first-available-none",
        {
            "gpu": [
                ("h200", gpu(f'{A}.productName == "NVIDIA H200"')),
                ("b200", gpu(f'{A}.productName == "NVIDIA B200"')),
            ]
        },
        "pending",
        ("none of its 2 choices",),
    ),
    Case(
        "h100-and-t4",
        {"h100": gpu(f'{A}.productName == "{H100}"'), "t4": gpu(f'{A}.productName == "{T4}"')},
        "pending",
        ("no device",),
    ),
]


def claim_object(case: Case) -> dict[str, Any]:
    requests: list[dict[str, Any]] = []
    for name, spec in case.requests.items():
        if isinstance(spec, list):
            requests.append({"name": name, "firstAvailable": [{"name": sub, **s} for sub, s in spec]})
        else:
            requests.append({"name": name, "exactly": spec})
    devices: dict[str, Any] = {"requests": requests}
    if case.constraints:
        devices["constraints"] = case.constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": case.name},
        "spec": {"devices": devices},
    }


def pod_object(case: Case) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": case.name},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": case.name}],
        },
    }


@dataclass
class Outcome:
    allocated: bool
    node: str | None


def decided(core: client.CoreV1Api, resources: Resources, ns: str, case: Case) -> Outcome | None:
    """What the scheduler did with the case's pod, once it did: bound (claim allocated) or Unschedulable."""
    pod = core.read_namespaced_pod(case.name, ns)
    if pod.spec.node_name:
        claim = resources.get("resourceclaims", case.name, ns)
        if (claim.get("status") or {}).get("allocation"):
            return Outcome(True, pod.spec.node_name)
        return None
    return Outcome(False, None) if unschedulable(core, case.name, ns) else None


@pytest.fixture
def namespace(
    cluster: LocalCluster, api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> Iterator[str]:
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "explain")
    # admin access is only allowed in namespaces labeled for it
    core.patch_namespace(ns, {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}})
    try:
        yield ns
    finally:
        _cleanup(core, Resources(api), ns, gpudra)


def _cleanup(
    core: client.CoreV1Api, resources: Resources, ns: str, plugins: dict[str, PluginProcess]
) -> None:
    uids = {c["metadata"]["uid"] for c in resources.list("resourceclaims", ns)}
    for item in core.list_namespaced_pod(ns).items:
        core.delete_namespaced_pod(item.metadata.name, ns, grace_period_seconds=0)
    for item in core.list_namespaced_pod(ns).items:
        wait_for("pod deleted", partial(pod_gone, core, item.metadata.name, ns), timeout=120)
    for claim in resources.list("resourceclaims", ns):
        resources.delete("resourceclaims", claim["metadata"]["name"], ns)
    wait_for("claims deallocated and gone", lambda: not resources.list("resourceclaims", ns), timeout=120)
    wait_for(
        "every claim unprepared on every node",
        lambda: not any(uids & set(p.checkpoint_claims()) for p in plugins.values()),
        timeout=120,
    )
    core.delete_namespace(ns)


def test_explain_agrees_with_the_scheduler_on_every_claim_of_the_corpus(
    cluster: LocalCluster, api: client.ApiClient, namespace: str
) -> None:
    assert len(CORPUS) >= 40
    core, resources = client.CoreV1Api(api), Resources(api)
    for case in CORPUS:
        resources.create("resourceclaims", claim_object(case), namespace)
    for case in CORPUS:
        core.create_namespaced_pod(namespace, pod_object(case))
    outcomes = {
        case.name: wait_for(
            f"the scheduler to decide on {case.name}",
            partial(decided, core, resources, namespace, case),
            timeout=180,
        )
        for case in CORPUS
    }

    kube = Kube(api)
    classes = device_classes(kube.list_device_classes())
    inventory = ClusterInventory(kube.list_all_slices())
    allocated = [read_claim(c) for c in kube.list_all_claims()]
    specs = {c["metadata"]["name"]: c for c in resources.list("resourceclaims", namespace)}
    disagreements = []
    for case in CORPUS:
        outcome = outcomes[case.name]
        target = ClaimToExplain(f"{namespace}/{case.name}", read_spec(specs[case.name]["spec"]))
        result = explain([target], classes=classes, inventory=inventory, allocated=allocated)
        problem = _disagreement(case, outcome, result)
        print(
            f"{case.name}: {f'allocated on {outcome.node}' if outcome.allocated else 'pending'}: "
            f"{result.verdict}"
        )
        if problem:
            disagreements.append(f"{case.name}: {problem}\n  verdict: {result.verdict}")
    assert not disagreements, "\n".join(disagreements)

    for case in CORPUS:  # the designed outcomes: the corpus covers both answers
        if case.expect != "either":
            assert outcomes[case.name].allocated == (case.expect == "fits"), case.name
    for group in {c.group for c in CORPUS if c.group}:
        members = [c.name for c in CORPUS if c.group == group]
        assert sum(not outcomes[m].allocated for m in members) == 1, (group, members)
    # the scheduler did not change its mind while explain ran
    for case in CORPUS:
        assert decided(core, resources, namespace, case) == outcomes[case.name], case.name

    _check_cli(cluster, namespace, outcomes)


def _disagreement(case: Case, outcome: Outcome, result: Explanation) -> str | None:
    fitting = [r.node for r in result.nodes if r.fits]
    if outcome.allocated:
        if not result.fits:
            return f"the scheduler allocated it on {outcome.node}, explain says it cannot fit"
        if outcome.node not in fitting:
            return f"the scheduler allocated it on {outcome.node}, explain fits it only on {fitting}"
        return None
    if result.fits:
        return f"the pod stays Unschedulable, explain fits it on {fitting}"
    if not result.verdict.startswith("cannot fit"):
        return "no reason given"
    if case.reason and not any(word in result.verdict for word in case.reason):
        return f"the reason names none of {case.reason}"
    return None


def _check_cli(cluster: LocalCluster, namespace: str, outcomes: dict[str, Outcome]) -> None:
    """`gpudra explain` as users run it: claim/NAME and pod/NAME from the cluster, text and JSON."""
    base = [sys.executable, "-m", "gpudra", "explain", "-n", namespace, f"--kubeconfig={cluster.kubeconfig}"]
    fits = next(name for name, o in outcomes.items() if o.allocated)
    done = subprocess.run(
        [*base, f"claim/{fits}", "-o", "json"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["apiVersion"], result["kind"]) == ("gpudra.io/v1alpha1", "Explanation")
    assert result["fits"] and outcomes[fits].node in [n["node"] for n in result["nodes"] if n["fits"]]

    done = subprocess.run(
        [*base, "pod/count-too-many"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1, done.stderr
    verdict = done.stdout.splitlines()[0]
    assert verdict.startswith("cannot fit") and "only 8 match" in verdict, done.stdout
