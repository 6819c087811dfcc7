"""MIG partitions on the real control plane: the real scheduler allocates partitions from gpudra's
counters, the real kubelet calls the plugin, and the simulated card gets exactly those instances.

After every step the simulator's GPU instances must equal what the checkpoint records; a layout the
placement tables allow must be allocated and created, one they do not must stay Pending.
"""

from __future__ import annotations

import itertools
import json
import signal
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from kubernetes import client, utils

from gpudra import sim
from gpudra.node import faults, gpu_driver
from gpudra.sim import machines
from gpudra.sim import state as sim_state
from tests.localcluster.node_plugin import DRIVER, PluginProcess

from .kube_helpers import (
    Resources,
    new_namespace,
    pod_events,
    pod_gone,
    pod_running,
    pool_devices,
    unschedulable,
    wait_for,
)

NODE = "node-h100"
H100 = machines.H100_SXM5_80GB
PROFILE_IDS = {p.name: p.id for p in H100.mig_profiles}


def _selector(profile: str, minor: int, start: int | None = None) -> dict[str, Any]:
    attrs = f'device.attributes["{DRIVER}"]'
    expression = f'{attrs}.profile == "{profile}" && {attrs}.parentMinor == {minor}'
    if start is not None:
        expression += f" && {attrs}.placementStart == {start}"
    return {"cel": {"expression": expression}}


def _template(name: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": requests}}},
    }


def layout_template(name: str, profiles: list[str], minor: int, start: int | None = None) -> dict[str, Any]:
    """A claim template with one request per profile, all on the GPU with `minor`."""
    return _template(
        name,
        [
            {
                "name": f"p{i}",
                "exactly": {"deviceClassName": "mig.gpudra.io", "selectors": [_selector(p, minor, start)]},
            }
            for i, p in enumerate(profiles)
        ],
    )


def whole_template(name: str, minor: int) -> dict[str, Any]:
    """A claim template for the whole GPU with `minor`."""
    selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].minor == {minor}'}}
    return _template(
        name, [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpudra.io", "selectors": [selector]}}]
    )


def pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "mig"}]}}],
            "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": template}],
        },
    }


def gpu_uuid(plugin: PluginProcess, minor: int) -> str:
    state = json.loads(plugin.sim_state.read_text())
    return str(state["gpus"][minor]["uuid"])  # the simulated DGX's minors follow its NVML indices


def card(plugin: PluginProcess, minor: int) -> dict[int, tuple[int, str]]:
    """placement start -> (GI profile ID, MIG UUIDs) on the simulated card."""
    gpu = json.loads(plugin.sim_state.read_text())["gpus"][minor]
    return {
        gi["start"]: (gi["profile_id"], ",".join(ci["uuid"] for ci in gi["compute_instances"]))
        for gi in gpu["gpu_instances"]
    }


def recorded(plugin: PluginProcess, minor: int) -> dict[int, tuple[int, str]]:
    """The same as the checkpoint records it, for claims whose MIG devices gpudra created."""
    parent = gpu_uuid(plugin, minor)
    found = {}
    for entry in plugin.checkpoint_claims().values():
        for device in entry["devices"]:
            mig = device.get("mig")
            if mig and mig["spec"]["gpu_uuid"] == parent:
                live = mig.get("live") or {}
                found[mig["spec"]["placement_start"]] = (mig["spec"]["profile_id"], live.get("uuid", ""))
    return found


def emptied(plugin: PluginProcess, minor: int) -> bool:
    return card(plugin, minor) == {} == recorded(plugin, minor)


def mig_switched_on_by_hand(plugin: PluginProcess, minor: int) -> None:
    """`nvidia-smi -i <minor> -mig 1`, as an administrator does before making an instance by hand. The
    GPU's mode is whatever the tests before left it: a whole-GPU claim of any test on this worker's
    cluster switches it off, and an instance cannot exist on a GPU with MIG off."""
    sim.set_mig_mode(state_file=plugin.sim_state, gpu_uuid=gpu_uuid(plugin, minor), enabled=True)


def in_step(plugin: PluginProcess, minor: int) -> dict[int, tuple[int, str]]:
    """The card's instances, after checking that they are exactly what the checkpoint records."""
    on_card = card(plugin, minor)
    assert on_card == recorded(plugin, minor)
    return on_card


def allocated_devices(api: client.ApiClient, found: client.V1Pod) -> list[str]:
    claim = Resources(api).get(
        "resourceclaims",
        found.status.resource_claim_statuses[0].resource_claim_name,
        found.metadata.namespace,
    )
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


@pytest.fixture
def plugin(gpudra: dict[str, PluginProcess]) -> Iterator[PluginProcess]:
    yield gpudra[NODE]
    if gpudra[NODE].process is None or gpudra[NODE].process.poll() is not None:
        gpudra[NODE].start()


def _delete_namespace_and_wait(
    core: client.CoreV1Api, ns: str, plugin: PluginProcess, minors: list[int]
) -> None:
    for item in core.list_namespaced_pod(ns).items:
        core.delete_namespaced_pod(item.metadata.name, ns, grace_period_seconds=0)
    for item in core.list_namespaced_pod(ns).items:
        wait_for("pod deleted", partial(pod_gone, core, item.metadata.name, ns), timeout=90)
    for minor in minors:
        wait_for(f"GPU {minor} emptied", partial(emptied, plugin, minor), timeout=60)
    core.delete_namespace(ns)


# --- time-slicing a partition ----------------------------------------------------------------------


def test_time_slicing_a_partition_sets_nothing_and_the_node_posts_a_warning_event(
    api: client.ApiClient, plugin: PluginProcess
) -> None:
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "mig-time-slicing")
    minor = 7
    template = layout_template("ts", ["1g.10gb"], minor)
    parameters = {
        "apiVersion": "resource.gpudra.io/v1beta1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    template["spec"]["spec"]["devices"]["config"] = [
        {"requests": ["p0"], "opaque": {"driver": DRIVER, "parameters": parameters}}
    ]
    utils.create_from_yaml(api, yaml_objects=[template, pod("ts", "ts")], namespace=ns)
    wait_for("ts Running", partial(pod_running, core, "ts", ns), timeout=120)
    [(start, _)] = in_step(plugin, minor).items()
    [entry] = [e for e in plugin.checkpoint_claims().values() if e["namespace"] == ns]
    assert [d["sharing"] for d in entry["devices"]] == [None]  # no record: no tool ran, nothing to undo
    assert plugin.timeslices()[gpu_uuid(plugin, minor)] == 0  # the GPU's time-slice untouched

    def event() -> Any:
        found = core.list_namespaced_event(
            "default",
            field_selector=f"involvedObject.kind=Node,involvedObject.name={NODE},reason=MigTimeSliceNotSet",
        ).items
        return next((e for e in found if f"ResourceClaim {ns}/" in e.message), None)

    posted = wait_for("a MigTimeSliceNotSet event on the node", event, timeout=60)
    assert posted.type == "Warning"
    assert f"device gpu-{minor}-mig-1g10gb-{start}" in posted.message
    assert "interval Long is not applied" in posted.message
    _delete_namespace_and_wait(core, ns, plugin, [minor])


# --- seven 1g partitions on one H100 --------------------------------------------------------------


def test_seven_1g_pods_fill_one_h100_and_an_eighth_waits_for_a_free_placement(
    api: client.ApiClient, plugin: PluginProcess
) -> None:
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "mig-seven")
    minor = 1
    utils.create_from_yaml(api, yaml_objects=[layout_template("one-g", ["1g.10gb"], minor)], namespace=ns)
    names = [f"infer-{i}" for i in range(8)]
    for name in names[:7]:
        utils.create_from_yaml(api, yaml_objects=[pod(name, "one-g")], namespace=ns)
    running = [wait_for(f"{n} Running", partial(pod_running, core, n, ns), timeout=120) for n in names[:7]]
    placements = {int(allocated_devices(api, p)[0].rsplit("-", 1)[1]) for p in running}
    assert placements == set(range(7))  # distinct placements, the GPU full
    assert sorted(in_step(plugin, minor)) == list(range(7))

    utils.create_from_yaml(api, yaml_objects=[pod(names[7], "one-g")], namespace=ns)
    wait_for("the 8th Unschedulable", lambda: unschedulable(core, names[7], ns), timeout=60)
    assert sorted(in_step(plugin, minor)) == list(range(7))

    freed = allocated_devices(api, running[3])[0]
    core.delete_namespaced_pod(names[3], ns, grace_period_seconds=0)
    eighth = wait_for("the 8th Running", lambda: pod_running(core, names[7], ns), timeout=120)
    assert allocated_devices(api, eighth) == [freed]
    wait_for("7 instances again", lambda: len(card(plugin, minor)) == 7, timeout=60)
    assert sorted(in_step(plugin, minor)) == list(range(7))
    _delete_namespace_and_wait(core, ns, plugin, [minor])


# --- every layout the placement tables allow, and one more that they do not -----------------------


def _feasible() -> set[tuple[str, ...]]:
    """Every set of H100 profiles (sorted names) that one GPU can hold at once, by its placement tables."""
    placements = [
        (profile.name, frozenset(range(start, start + profile.size)))
        for profile in H100.mig_profiles
        for start in profile.starts
    ]
    limits = {profile.name: profile.instances for profile in H100.mig_profiles}
    found: set[tuple[str, ...]] = set()

    def grow(first: int, used: frozenset[int], chosen: tuple[str, ...]) -> None:
        found.add(tuple(sorted(chosen)))
        for index in range(first, len(placements)):
            name, slices = placements[index]
            if not slices & used and chosen.count(name) < limits[name]:
                grow(index + 1, used | slices, (*chosen, name))

    grow(0, frozenset(), ())
    return found


def _layouts() -> list[list[str]]:
    """The maximal feasible sets: no profile can be added to any of them."""
    feasible = _feasible()
    names = [profile.name for profile in H100.mig_profiles]
    return [
        list(layout)
        for layout in sorted(feasible)
        if layout and not any(tuple(sorted((*layout, n))) in feasible for n in names)
    ]


def test_every_maximal_layout_is_allocated_and_created_and_one_more_partition_never_is(
    api: client.ApiClient, plugin: PluginProcess
) -> None:
    core = client.CoreV1Api(api)
    layouts = _layouts()
    assert len(layouts) >= 10, layouts
    minors = list(range(8))
    for batch_start in range(0, len(layouts), len(minors)):
        batch = layouts[batch_start : batch_start + len(minors)]
        ns = new_namespace(core, "mig-layouts")
        objects: list[dict[str, Any]] = []
        for minor, layout in zip(minors, batch, strict=False):
            objects += [
                layout_template(f"fits-{minor}", layout, minor),
                pod(f"fits-{minor}", f"fits-{minor}"),
                layout_template(f"over-{minor}", [*layout, "1g.10gb"], minor),
            ]
        utils.create_from_yaml(api, yaml_objects=objects, namespace=ns)
        for minor, layout in zip(minors, batch, strict=False):
            wait_for(f"{layout} Running", partial(pod_running, core, f"fits-{minor}", ns), timeout=180)
            on_card = in_step(plugin, minor)
            assert sorted(PROFILE_IDS[p] for p in layout) == sorted(pid for pid, _ in on_card.values())
        # One more 1g.10gb than the layout on the same GPU: the scheduler must never allocate it. (The
        # layout's own pod holds the GPU meanwhile, so the extra request competes with nothing else.)
        for minor, _ in zip(minors, batch, strict=False):
            utils.create_from_yaml(api, yaml_objects=[pod(f"over-{minor}", f"over-{minor}")], namespace=ns)
        for minor, layout in zip(minors, batch, strict=False):
            wait_for(
                f"{layout} + 1g Unschedulable",
                partial(unschedulable, core, f"over-{minor}", ns),
                timeout=60,
            )
        _delete_namespace_and_wait(core, ns, plugin, minors[: len(batch)])


# --- MIG mode on the H100, the A100 rule ------------------------------------------------------------


def test_a_whole_gpu_and_a_partition_take_turns_on_one_h100(
    api: client.ApiClient, plugin: PluginProcess
) -> None:
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "mig-turns")
    minor = 2
    whole = whole_template("whole", minor)
    utils.create_from_yaml(
        api,
        yaml_objects=[whole, pod("whole", "whole"), layout_template("part", ["3g.40gb"], minor)],
        namespace=ns,
    )
    wait_for("whole-GPU pod Running", lambda: pod_running(core, "whole", ns), timeout=120)
    assert json.loads(plugin.sim_state.read_text())["gpus"][minor]["mig_mode"] == 0  # switched off for it
    utils.create_from_yaml(api, yaml_objects=[pod("part", "part")], namespace=ns)
    wait_for(
        "partition pod Unschedulable while the whole GPU is held",
        lambda: unschedulable(core, "part", ns),
        timeout=60,
    )
    core.delete_namespaced_pod("whole", ns, grace_period_seconds=0)
    wait_for("partition pod Running", lambda: pod_running(core, "part", ns), timeout=120)
    assert json.loads(plugin.sim_state.read_text())["gpus"][minor]["mig_mode"] == 1
    assert len(in_step(plugin, minor)) == 1
    _delete_namespace_and_wait(core, ns, plugin, [minor])


def _published(api: client.ApiClient, node: str) -> list[dict[str, Any]]:
    slices = Resources(api).list("resourceslices", field_selector=f"spec.nodeName={node}")
    return [d for s in slices for d in s["spec"].get("devices", [])]


def test_an_a100_offers_partitions_only_with_mig_on_and_itself_only_with_mig_off(
    api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> None:
    a100 = gpudra["node-a100"]
    wait_for("no claim left on the A100s by earlier tests", lambda: not a100.checkpoint_claims(), timeout=60)
    published = _published(api, "node-a100")
    assert not [d["name"] for d in published if d["attributes"]["type"]["string"] == "gpu"]
    assert any(d["name"].startswith("gpu-0-mig-") for d in published)

    parent = gpu_uuid(a100, 0)
    a100.stop()
    sim.set_mig_mode(state_file=a100.sim_state, gpu_uuid=parent, enabled=False)
    try:
        a100.start()

        def republished() -> list[str] | None:
            names = [d["name"] for d in _published(api, "node-a100")]
            return names if "gpu-0" in names else None

        names = wait_for("gpu-0 published whole", republished, timeout=60)
        assert not [n for n in names if n.startswith("gpu-0-mig-")]  # and none of its partitions
        assert "gpu-0-shared" in names  # but its shared device, with the whole GPU
        assert any(n.startswith("gpu-1-mig-") for n in names) and "gpu-1" not in names
    finally:
        a100.stop()
        sim.set_mig_mode(state_file=a100.sim_state, gpu_uuid=parent, enabled=True)
        a100.start()
    wait_for(
        "gpu-0 back to partitions",
        lambda: "gpu-0" not in [d["name"] for d in _published(api, "node-a100")] or None,
        timeout=60,
    )


# --- errors and crashes ------------------------------------------------------------------------------


def _node_events(core: client.CoreV1Api, reason: str) -> list[str]:
    events = core.list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={NODE},reason={reason}"
    )
    return [str(event.message) for event in events.items]


def test_a_placement_taken_by_hand_is_not_offered_until_the_instance_is_gone(
    api: client.ApiClient, plugin: PluginProcess
) -> None:
    """An instance made by hand (not through a claim) is noticed and said once on the Node; the
    placements it overlaps and the whole GPU leave the slice, so a claim for one stays pending instead
    of failing at prepare, while other claims on the GPU run. Once it is destroyed, the placement is
    offered again and the pending claim runs. gpudra never touches the instance."""
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "mig-taken")
    minor = 3
    uuid = gpu_uuid(plugin, minor)
    # The test plays the administrator who made an instance by hand.
    mig_switched_on_by_hand(plugin, minor)
    with gpu_driver.connect("sim:dgx-h100", state_file=plugin.sim_state) as session:
        by_hand = session.create_mig_device(
            gpu_uuid=uuid, profile_id=PROFILE_IDS["2g.20gb"], placement_start=4
        )
    try:
        (said,) = wait_for(
            "the ForeignMigInstance event",
            lambda: [m for m in _node_events(core, "ForeignMigInstance") if uuid in m],
            timeout=30,
        )
        assert f"GPU instance {by_hand.gpu_instance_id} (2g.20gb at 4) was made outside gpudra" in said
        # The pool's slices are updated one after another: wait for all of them, not the first.
        wait_for(
            "the overlapped placements and the whole GPU left out of the slices, the rest offered",
            lambda: (
                (found := pool_devices(api, node=NODE, driver=DRIVER))
                and f"gpu-{minor}-mig-1g10gb-5" not in found
                and f"gpu-{minor}" not in found
                and f"gpu-{minor}-mig-1g10gb-0" in found
            ),
            timeout=30,
        )
        utils.create_from_yaml(
            api,
            yaml_objects=[
                layout_template("taken", ["1g.10gb"], minor, start=5),
                pod("taken", "taken"),
                layout_template("free", ["1g.10gb"], minor, start=0),
                pod("free", "free"),
            ],
            namespace=ns,
        )
        wait_for("the other claim's pod Running", lambda: pod_running(core, "free", ns), timeout=120)
        wait_for(
            "the taken placement's pod unschedulable", lambda: unschedulable(core, "taken", ns), timeout=60
        )
        assert not [e for e in pod_events(core, "taken", ns) if "did not create" in e]  # never allocated
        assert card(plugin, minor)[4] == (PROFILE_IDS["2g.20gb"], by_hand.uuid)
    finally:
        with gpu_driver.connect("sim:dgx-h100", state_file=plugin.sim_state) as session:
            session.destroy_mig_device(gpu_uuid=uuid, gpu_instance_id=by_hand.gpu_instance_id)
    wait_for(
        "the ForeignMigInstanceGone event",
        lambda: [m for m in _node_events(core, "ForeignMigInstanceGone") if uuid in m],
        timeout=30,
    )
    wait_for("the pending claim's pod Running", lambda: pod_running(core, "taken", ns), timeout=120)
    assert len([m for m in _node_events(core, "ForeignMigInstance") if uuid in m]) == 1  # said once
    core.delete_namespaced_pod("taken", ns, grace_period_seconds=0)
    core.delete_namespaced_pod("free", ns, grace_period_seconds=0)
    wait_for("pods deleted", lambda: pod_gone(core, "taken", ns) and pod_gone(core, "free", ns), timeout=90)
    wait_for(f"GPU {minor} empty", partial(emptied, plugin, minor), timeout=60)
    core.delete_namespace(ns)


def test_a_gpu_instance_made_by_hand_without_compute_instance_is_not_adopted_and_survives(
    api: client.ApiClient, plugin: PluginProcess
) -> None:
    """Issue 29, item 6: a GPU instance without a compute instance, at exactly the placement the
    scheduler gives a claim, was adopted at prepare and destroyed at unprepare."""
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "mig-bare")
    minor, profile = 5, PROFILE_IDS["1g.10gb"]
    wait_for(f"GPU {minor} empty", partial(emptied, plugin, minor), timeout=60)
    # The claim is allocated that placement first, while the plugin is down: with the instance already
    # there, the plugin's check for instances made outside gpudra may withhold the placement before the
    # scheduler gets to the claim (the behaviour the test above checks), and the pod would stay
    # Pending instead of reaching prepare. The kubelet retries the prepare once the plugin is back.
    plugin.stop()
    try:
        utils.create_from_yaml(
            api,
            yaml_objects=[layout_template("bare", ["1g.10gb"], minor, start=3), pod("bare", "bare")],
            namespace=ns,
        )
        wait_for("the claim allocated", lambda: scheduled(core, "bare", ns), timeout=120)
        mig_switched_on_by_hand(plugin, minor)
        with sim_state.StateFile(plugin.sim_state).update() as machine:  # `nvidia-smi mig -cgi 19` without -C
            machine.gpus[minor].gpu_instances.append(
                sim_state.GpuInstanceState(id=9, profile_id=profile, start=3, size=1)
            )
        plugin.start()

        def refused() -> str | None:
            return next((e for e in pod_events(core, "bare", ns) if "without a compute instance" in e), None)

        event = wait_for("the refusal in the pod's events", refused, timeout=120)
        for part in ("1g.10gb at placement 3", gpu_uuid(plugin, minor), "GPU instance 9", "never destroys"):
            assert part in event
        assert card(plugin, minor) == {3: (profile, "")} and recorded(plugin, minor) == {}
        core.delete_namespaced_pod("bare", ns, grace_period_seconds=0)
        wait_for("pod deleted", partial(pod_gone, core, "bare", ns), timeout=90)
        assert card(plugin, minor) == {3: (profile, "")} and recorded(plugin, minor) == {}
    finally:
        # Whatever failed: a pod left behind would get the partition once the hand-made instance is
        # gone, and the next test on this worker's cluster would find a MIG device it did not make.
        if plugin.process is None:
            plugin.start()
        core.delete_namespace(ns)
        wait_for("pod deleted", partial(pod_gone, core, "bare", ns), timeout=90)
        with sim_state.StateFile(plugin.sim_state).update() as machine:
            machine.gpus[minor].gpu_instances.clear()


def scheduled(core: client.CoreV1Api, name: str, namespace: str) -> bool:
    """Whether the pod has a node: its claims are allocated (the scheduler allocates before binding)."""
    found = core.read_namespaced_pod(name, namespace)
    return bool(found.spec.node_name)


@pytest.mark.parametrize(
    ("action", "step"),
    [
        *itertools.product(["prepare"], faults.PREPARE_STEPS),
        *itertools.product(["unprepare"], faults.UNPREPARE_STEPS),
    ],
)
def test_sigkill_at_every_mig_step_then_restart_leaves_no_orphan(
    api: client.ApiClient, plugin: PluginProcess, action: str, step: str
) -> None:
    core = client.CoreV1Api(api)
    ns = new_namespace(core, "mig-crash")
    minor = 4
    template = layout_template("victim", ["3g.40gb", "1g.10gb"], minor)
    if action == "prepare":
        plugin.stop()
        plugin.start(crash_at=step)
        utils.create_from_yaml(api, yaml_objects=[template, pod("victim", "victim")], namespace=ns)
        assert plugin.wait_killed() == -signal.SIGKILL
        plugin.start()
        wait_for("pod Running after the restart", lambda: pod_running(core, "victim", ns), timeout=120)
        assert len(in_step(plugin, minor)) == 2
    else:
        utils.create_from_yaml(api, yaml_objects=[template, pod("victim", "victim")], namespace=ns)
        wait_for("pod Running", lambda: pod_running(core, "victim", ns), timeout=120)
        assert len(in_step(plugin, minor)) == 2
        plugin.stop()
        plugin.start(crash_at=step)
        core.delete_namespaced_pod("victim", ns, grace_period_seconds=0)
        assert plugin.wait_killed() == -signal.SIGKILL
        plugin.start()
    if action == "prepare":
        core.delete_namespaced_pod("victim", ns, grace_period_seconds=0)
    wait_for("pod deleted", lambda: pod_gone(core, "victim", ns), timeout=120)
    wait_for("no orphan GI/CI, no entry", partial(emptied, plugin, minor), timeout=60)
    assert not [uid for uid, spec in plugin.cdi_specs().items() if f"gpu-{minor}-mig-" in json.dumps(spec)]
    core.delete_namespace(ns)
