"""Claim usage: the Idle entries of status.devices (format and read-back), the node's sampler (when it
writes, what it keeps across restarts, what it forgets), its metrics, and the status write itself."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpudra.errors import ClusterError, HardwareError
from gpudra.gpu.nvml import DeviceUsage
from gpudra.kube.claim_status import ClaimStatus
from gpudra.kube.client import Conflict, NotFound
from gpudra.model import claim_usage
from gpudra.model.claim import Claim, read_claim
from gpudra.node import checkpoint as ckpt
from gpudra.node.metrics import PluginMetrics
from gpudra.node.usage import ClaimUsage
from tests.unit.harness.kube import FakeRequestKube

DRIVER = "gpu.gpudra.io"
NODE = "node-1"
UID = "5f7c2a9e-8b1d-4e3f-a6c0-2d9b8e7f1a34"
SHARE = "0b6f8c3e-1d2a-4b5c-9e7f-112233445566"
T0 = datetime(2026, 11, 23, 8, 0, 0, tzinfo=UTC)
GPU0, GPU1, MIG = (
    "GPU-00000000-0000-0000-0000-000000000000",
    "GPU-11111111-1111-1111-1111-111111111111",
    "MIG-aaaa",
)
PUBLISHED: dict[str, Any] = {
    "gpu-0": {"attributes": {"type": {"string": "gpu"}, "uuid": {"string": GPU0}}},
    "gpu-1": {"attributes": {"type": {"string": "gpu"}, "uuid": {"string": GPU1}}},
    "gpu-1-mig-1g10gb-0": {"attributes": {"type": {"string": "mig"}, "parentUUID": {"string": GPU1}}},
}


# --- the format ---------------------------------------------------------------------------------


def test_an_entry_carries_one_idle_condition_to_the_second() -> None:
    since = T0 + timedelta(microseconds=700_000)
    entry = claim_usage.device_entry(
        driver=DRIVER, key=(NODE, "gpu-0", None), idleness=claim_usage.no_activity(since, mig=False)
    )
    assert entry == {
        "driver": DRIVER,
        "pool": NODE,
        "device": "gpu-0",
        "conditions": [
            {
                "type": "Idle",
                "status": "True",
                "reason": "NoActivity",
                "message": "no kernel ran on the GPU since 2026-11-23T08:00:00Z",
                "lastTransitionTime": "2026-11-23T08:00:00Z",
            }
        ],
    }
    shared = claim_usage.device_entry(
        driver=DRIVER, key=(NODE, "gpu-0", SHARE), idleness=claim_usage.active(since, mig=True)
    )
    assert shared["shareID"] == SHARE
    assert shared["conditions"][0] | {"lastTransitionTime": ""} == {
        "type": "Idle",
        "status": "False",
        "reason": "Active",
        "message": "compute processes run on the MIG device",
        "lastTransitionTime": "",
    }


def test_idle_since_reads_back_what_the_plugin_wrote() -> None:
    later = datetime(2026, 11, 23, 9, 30, 5, 123, tzinfo=UTC)
    entries = [
        claim_usage.device_entry(
            driver=DRIVER, key=(NODE, "gpu-0", None), idleness=claim_usage.no_activity(later, mig=False)
        ),
        claim_usage.device_entry(
            driver=DRIVER, key=(NODE, "gpu-1", None), idleness=claim_usage.active(T0, mig=False)
        ),
        claim_usage.device_entry(
            driver=DRIVER, key=(NODE, "gpu-2", None), idleness=claim_usage.not_measurable(T0, "x" * 999)
        ),
        # two shares of one device in the claim: the longest streak
        claim_usage.device_entry(
            driver=DRIVER, key=("node-2", "gpu-3", "a"), idleness=claim_usage.no_activity(T0, mig=False)
        ),
        claim_usage.device_entry(
            driver=DRIVER,
            key=("node-2", "gpu-3", "b"),
            idleness=claim_usage.no_activity(T0 + timedelta(minutes=5), mig=False),
        ),
        claim_usage.device_entry(
            driver="other.example.com", key=(NODE, "x", None), idleness=claim_usage.no_activity(T0, mig=False)
        ),
    ]
    claim = read_claim({"status": {"devices": entries}})
    assert claim_usage.idle_since(claim, driver=DRIVER) == {
        (NODE, "gpu-0"): later.replace(microsecond=0),
        ("node-2", "gpu-3"): T0,
    }
    idleness = claim_usage.device_idleness(claim, driver=DRIVER)
    assert len(idleness[(NODE, "gpu-2", None)].message) == claim_usage.MAX_MESSAGE
    assert idleness[(NODE, "gpu-1", None)] == claim_usage.active(T0, mig=False)


def test_a_node_clock_behind_never_makes_a_device_idle_before_its_claim_existed() -> None:
    created = T0 + timedelta(hours=1)  # the API server's clock
    entries = [
        claim_usage.device_entry(  # the node's clock, an hour behind
            driver=DRIVER, key=(NODE, "gpu-0", None), idleness=claim_usage.no_activity(T0, mig=False)
        ),
        claim_usage.device_entry(
            driver=DRIVER,
            key=(NODE, "gpu-1", None),
            idleness=claim_usage.no_activity(created + timedelta(minutes=3), mig=False),
        ),
    ]
    claim = read_claim(
        {"metadata": {"creationTimestamp": claim_usage.format_time(created)}, "status": {"devices": entries}}
    )
    assert claim_usage.idle_since(claim, driver=DRIVER) == {
        (NODE, "gpu-0"): created,
        (NODE, "gpu-1"): created + timedelta(minutes=3),
    }


@pytest.mark.parametrize(
    "claim",
    [
        {},
        {"status": None},
        {"status": {"devices": "nope"}},
        {"status": {"devices": [{"driver": DRIVER, "pool": NODE, "device": "gpu-0"}]}},
        {"status": {"devices": [{"driver": DRIVER, "pool": NODE, "device": "gpu-0", "conditions": 7}]}},
        {"status": {"devices": [{"driver": DRIVER, "pool": 3, "device": "gpu-0", "conditions": []}]}},
        {
            "status": {
                "devices": [
                    {
                        "driver": DRIVER,
                        "pool": NODE,
                        "device": "gpu-0",
                        "conditions": [
                            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-23T08:00:00Z"},
                            {"type": "Idle", "status": "Maybe", "lastTransitionTime": "2026-11-23T08:00:00Z"},
                            {"type": "Idle", "status": "True", "lastTransitionTime": "yesterday"},
                            {"type": "Idle", "status": "True", "lastTransitionTime": "2026-11-23T08:00:00"},
                        ],
                    }
                ]
            }
        },
    ],
    ids=[
        "no status",
        "null status",
        "devices not a list",
        "no conditions",
        "conditions not a list",
        "pool not a string",
        "other or malformed conditions",
    ],
)
def test_idle_since_ignores_what_is_not_a_well_formed_idle_condition(claim: dict[str, Any]) -> None:
    assert claim_usage.idle_since(read_claim(claim), driver=DRIVER) == {}


# --- the sampler --------------------------------------------------------------------------------


class FakeProbe:
    """NVML by device UUID: a usage, or an error to raise."""

    def __init__(self) -> None:
        self.usage: dict[str, DeviceUsage | Exception] = {}
        self.calls = 0

    def set(
        self, uuid: str, *, utilization: int | None = 0, memory: int = 0, pids: Sequence[int] = ()
    ) -> None:
        self.usage[uuid] = DeviceUsage(utilization=utilization, memory_used=memory, processes=tuple(pids))

    def device_usage(self, *, uuid: str) -> DeviceUsage:
        self.calls += 1
        found = self.usage[uuid]
        if isinstance(found, Exception):
            raise found
        return found


class FakeApi:
    """The API server's claims, by (namespace, name); records the writes, fails while `failure` is set."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets: list[tuple[str, str]] = []
        self.writes: list[dict[str, Any]] = []
        self.failure: Exception | None = None

    def add(self, name: str, uid: str = UID, pods: Sequence[str] = ("pod-a",), devices: Any = ()) -> None:
        reserved = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]
        self.claims[("ns", name)] = {
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "status": {"reservedFor": reserved, "devices": list(devices)},
        }

    def get(self, namespace: str, name: str) -> Claim:
        self.gets.append((namespace, name))
        if self.failure is not None:
            raise self.failure
        if (namespace, name) not in self.claims:
            raise NotFound(f"reading ResourceClaim {namespace}/{name}: HTTP 404 Not Found")
        return read_claim(self.claims[(namespace, name)])

    def apply_node_devices(
        self, *, node_name: str, namespace: str, name: str, uid: str, devices: Sequence[dict[str, Any]]
    ) -> None:
        if self.failure is not None:
            raise self.failure
        self.writes.append({"node": node_name, "claim": name, "uid": uid, "devices": list(devices)})

    def conditions(self, write: int = -1) -> dict[str, tuple[str, str]]:
        """Device -> (status, lastTransitionTime) of one write."""
        return {
            e["device"]: (e["conditions"][0]["status"], e["conditions"][0]["lastTransitionTime"])
            for e in self.writes[write]["devices"]
        }


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def tick(self, seconds: float = 30) -> None:
        self.now += timedelta(seconds=seconds)


def _gpu(name: str, *, share_id: str | None = None, admin: bool = False) -> ckpt.PreparedDevice:
    uuid = PUBLISHED[name]["attributes"]["uuid"]["string"]
    return ckpt.PreparedDevice(
        request_names=("gpu",),
        pool=NODE,
        device=name,
        cdi_device_ids=(f"k8s.gpu.gpudra.io/claim={UID}-{name}",),
        gpu_uuids=(uuid,),
        admin_access=admin,
        share_id=share_id,
    )


def _mig() -> ckpt.PreparedDevice:
    return ckpt.PreparedDevice(
        request_names=("mig",),
        pool=NODE,
        device="gpu-1-mig-1g10gb-0",
        cdi_device_ids=(f"k8s.gpu.gpudra.io/claim={UID}-gpu-1-mig-1g10gb-0",),
        gpu_uuids=(GPU1,),
        mig=ckpt.MigRecord(
            spec=ckpt.MigSpec(gpu_uuid=GPU1, profile_id=19, placement_start=0),
            live=ckpt.MigLive(gpu_instance_id=9, compute_instance_id=0, uuid=MIG),
        ),
    )


def _entry(
    name: str, *devices: ckpt.PreparedDevice, uid: str = UID, state: Any = "PrepareCompleted"
) -> ckpt.ClaimEntry:
    return ckpt.ClaimEntry(uid=uid, namespace="ns", name=name, state=state, devices=devices)


class Node:
    """A sampler over fakes, with the prepared claims in `prepared`."""

    def __init__(self) -> None:
        self.prepared: dict[str, ckpt.ClaimEntry] = {}
        self.probe, self.api, self.clock = FakeProbe(), FakeApi(), Clock()
        self.usage = self.restart()

    def restart(self) -> ClaimUsage:
        self.usage = ClaimUsage(
            driver=DRIVER,
            node_name=NODE,
            claims=lambda: self.prepared,
            devices=PUBLISHED,
            probe=self.probe,
            api=self.api,
            interval=30,
            clock=self.clock,
        )
        return self.usage

    def prepare(self, entry: ckpt.ClaimEntry) -> None:
        self.prepared[entry.uid] = entry

    def step(self) -> float:
        self.clock.tick()
        return self.usage.step()


@pytest.fixture
def node() -> Node:
    return Node()


def test_nothing_prepared_costs_no_request(node: Node) -> None:
    assert node.step() == 30
    assert (node.api.gets, node.api.writes, node.probe.calls) == ([], [], 0)
    assert node.usage.readings() == []


def test_the_first_sample_writes_and_unchanged_samples_write_nothing(node: Node) -> None:
    node.api.add("c")
    node.probe.set(GPU0, utilization=40, memory=5 << 30)
    node.prepare(_entry("c", _gpu("gpu-0")))
    node.step()
    first = node.clock.now
    assert node.api.gets == [("ns", "c")]
    assert node.api.writes == [
        {
            "node": NODE,
            "claim": "c",
            "uid": UID,
            "devices": [
                claim_usage.device_entry(
                    driver=DRIVER, key=(NODE, "gpu-0", None), idleness=claim_usage.active(first, mig=False)
                )
            ],
        }
    ]
    node.probe.set(GPU0, utilization=90, memory=6 << 30)  # still active: other figures, same status
    for _ in range(3):
        node.step()
    assert len(node.api.writes) == 1
    assert node.api.gets == [("ns", "c")]  # read once


def test_active_to_idle_writes_once_with_the_streak_start(node: Node) -> None:
    node.api.add("c")
    node.probe.set(GPU0, utilization=10)
    node.prepare(_entry("c", _gpu("gpu-0")))
    node.step()
    node.probe.set(GPU0, utilization=0)
    node.step()
    streak = node.clock.now
    node.step()
    node.step()
    assert len(node.api.writes) == 2
    assert node.api.conditions() == {"gpu-0": ("True", claim_usage.format_time(streak))}
    assert node.api.writes[-1]["devices"][0]["conditions"][0]["message"] == (
        f"no kernel ran on the GPU since {claim_usage.format_time(streak)}"
    )
    (reading,) = node.usage.readings()
    assert reading.idle_seconds == 60 and reading.utilization == 0
    node.probe.set(GPU0, utilization=1)
    node.step()
    assert len(node.api.writes) == 3
    assert node.api.conditions() == {"gpu-0": ("False", claim_usage.format_time(node.clock.now))}
    assert node.usage.readings()[0].idle_seconds == 0


def test_a_restart_keeps_the_streak_the_claim_shows(node: Node) -> None:
    node.api.add("c")
    node.probe.set(GPU0, utilization=0)
    node.prepare(_entry("c", _gpu("gpu-0")))
    node.step()
    streak = node.clock.now
    node.api.claims[("ns", "c")]["status"]["devices"] = node.api.writes[-1]["devices"]

    node.restart()
    node.step()
    assert len(node.api.writes) == 1  # the claim already says so
    assert node.api.gets == [("ns", "c")] * 2
    assert node.usage.readings()[0].idle_seconds == (node.clock.now - streak).total_seconds()

    node.restart()  # a restart that finds the device busy again: a change, written
    node.probe.set(GPU0, utilization=3)
    node.step()
    assert node.api.conditions() == {"gpu-0": ("False", claim_usage.format_time(node.clock.now))}


def test_a_mig_device_is_active_while_a_compute_process_runs_on_it(node: Node) -> None:
    node.api.add("c")
    node.probe.set(MIG, utilization=None, memory=2 << 30, pids=[4242])
    node.prepare(_entry("c", _mig()))
    node.step()
    assert node.api.conditions() == {"gpu-1-mig-1g10gb-0": ("False", claim_usage.format_time(node.clock.now))}
    (reading,) = node.usage.readings()
    assert (reading.gpu_uuid, reading.utilization, reading.memory_used) == (MIG, None, 2 << 30)
    node.probe.set(MIG, utilization=None, memory=0)
    node.step()
    assert node.api.conditions() == {"gpu-1-mig-1g10gb-0": ("True", claim_usage.format_time(node.clock.now))}
    message = node.api.writes[-1]["devices"][0]["conditions"][0]["message"]
    assert message.startswith("no compute process on the MIG device since ")


def test_claims_sharing_a_gpu_each_get_the_gpus_figures(node: Node) -> None:
    other = "9d1e0c4b-7a6f-4e2d-8c3b-5a4f3e2d1c0b"
    node.api.add("a", pods=["p2", "p1"])
    node.api.add("b", uid=other, pods=["p3"])
    node.probe.set(GPU0, utilization=70, memory=1 << 30)
    node.prepare(_entry("a", _gpu("gpu-0")))
    node.prepare(_entry("b", _gpu("gpu-0"), uid=other))
    node.step()
    assert sorted(w["claim"] for w in node.api.writes) == ["a", "b"]
    readings = {r.claim: r for r in node.usage.readings()}
    assert readings["a"].pods == ("p1", "p2") and readings["b"].pods == ("p3",)
    assert {(r.utilization, r.memory_used, r.gpu_uuid) for r in readings.values()} == {(70, 1 << 30, GPU0)}


def test_an_unprepared_claim_is_forgotten(node: Node) -> None:
    node.api.add("c")
    node.probe.set(GPU0, utilization=0)
    node.prepare(_entry("c", _gpu("gpu-0")))
    node.step()
    del node.prepared[UID]
    node.step()
    assert node.usage.readings() == []
    calls = node.probe.calls
    node.step()
    assert (node.probe.calls, len(node.api.writes), len(node.api.gets)) == (calls, 1, 1)


def test_a_failed_write_is_retried_until_it_succeeds(node: Node) -> None:
    node.api.add("c")
    node.probe.set(GPU0, utilization=0)
    node.prepare(_entry("c", _gpu("gpu-0")))
    node.step()
    node.probe.set(GPU0, utilization=50)
    node.api.failure = ClusterError("writing the device status of ResourceClaim ns/c: timed out")
    with pytest.raises(ClusterError, match="timed out"):
        node.step()
    became_active = node.clock.now
    with pytest.raises(ClusterError, match="timed out"):
        node.step()
    node.api.failure = None
    node.step()
    assert len(node.api.writes) == 2
    assert node.api.conditions() == {"gpu-0": ("False", claim_usage.format_time(became_active))}
    node.step()
    assert len(node.api.writes) == 2


def test_a_failed_read_is_retried(node: Node) -> None:
    node.probe.set(GPU0, utilization=0)
    node.prepare(_entry("c", _gpu("gpu-0")))
    node.api.failure = ClusterError("reading ResourceClaim ns/c: cannot reach the API server")
    with pytest.raises(ClusterError, match="cannot reach"):
        node.step()
    assert node.usage.readings() == []
    node.api.failure = None
    node.api.add("c")
    node.step()
    assert node.api.gets == [("ns", "c"), ("ns", "c")] and len(node.api.writes) == 1


@pytest.mark.parametrize("change", ["deleted", "recreated"])
def test_a_claim_gone_or_recreated_is_not_written(node: Node, change: str) -> None:
    node.probe.set(GPU0, utilization=0)
    node.prepare(_entry("c", _gpu("gpu-0")))
    if change == "recreated":
        node.api.add("c", uid="another-uid")
    node.step()
    assert node.api.writes == []
    assert node.usage.readings()[0].idle_seconds == 0  # still sampled for the metrics


def test_a_claim_replaced_between_read_and_write_is_written_no_more(node: Node) -> None:
    node.api.add("c")
    node.probe.set(GPU0, utilization=0)
    node.prepare(_entry("c", _gpu("gpu-0")))
    conflict = Conflict("writing the device status of ResourceClaim ns/c: HTTP 409 Conflict")
    node.api.apply_node_devices = _raising(conflict)
    node.step()  # no failure: nothing to retry
    node.probe.set(GPU0, utilization=5)
    node.step()
    assert node.api.writes == []


def _raising(error: Exception) -> Any:
    def call(**_: Any) -> None:
        raise error

    return call


def test_a_device_nvml_cannot_measure_is_unknown(node: Node) -> None:
    node.api.add("c")
    node.probe.usage[GPU0] = HardwareError("nvmlDeviceGetHandleByUUID on GPU x failed: GPU is lost")
    node.prepare(_entry("c", _gpu("gpu-0")))
    node.step()
    (entry,) = node.api.writes[-1]["devices"]
    assert entry["conditions"][0]["status"] == "Unknown"
    assert entry["conditions"][0]["reason"] == "NotMeasurable"
    assert "GPU is lost" in entry["conditions"][0]["message"]
    (reading,) = node.usage.readings()
    assert (reading.memory_used, reading.idle_seconds) == (None, None)


def test_shares_admin_access_and_unfinished_claims(node: Node) -> None:
    node.api.add("c")
    node.api.add("watcher", uid="admin-uid")
    node.probe.set(GPU0, utilization=0)
    node.prepare(_entry("c", _gpu("gpu-0", share_id=SHARE)))
    node.prepare(_entry("watcher", _gpu("gpu-0", admin=True), uid="admin-uid"))
    node.prepare(_entry("half", _gpu("gpu-1"), uid="half-uid", state="PrepareStarted"))
    node.step()
    assert node.api.gets == [("ns", "c")]
    (write,) = node.api.writes
    assert write["devices"][0]["shareID"] == SHARE


# --- metrics ------------------------------------------------------------------------------------


def test_the_metrics_show_each_claim_device_with_its_pods(node: Node) -> None:
    node.api.add("c", pods=["web-1", "web-0"])
    node.probe.set(GPU0, utilization=0, memory=123)
    node.probe.set(MIG, utilization=None, memory=456, pids=[1])
    node.prepare(_entry("c", _gpu("gpu-0"), _mig()))
    node.step()
    node.clock.tick(12)
    metrics = PluginMetrics()
    metrics.track_claim_usage(node.usage.readings)
    labels = {"namespace": "ns", "claim": "c", "pod": "web-0,web-1"}
    gpu, mig = (
        labels | {"device": "gpu-0", "gpu_uuid": GPU0},
        labels | {"device": _mig().device, "gpu_uuid": MIG},
    )
    sample = metrics.registry.get_sample_value
    assert sample("gpudra_claim_gpu_utilization_percent", gpu) == 0
    assert sample("gpudra_claim_gpu_utilization_percent", mig) is None  # no series rather than a fake 0
    assert sample("gpudra_claim_gpu_memory_used_bytes", gpu) == 123
    assert sample("gpudra_claim_gpu_memory_used_bytes", mig) == 456
    assert sample("gpudra_claim_idle_seconds", gpu) == 12
    assert sample("gpudra_claim_idle_seconds", mig) == 0


# --- the status write ---------------------------------------------------------------------------


def test_a_node_applies_its_entries_with_the_claims_uid_as_precondition() -> None:
    kube = FakeRequestKube()
    entry = claim_usage.device_entry(
        driver=DRIVER, key=(NODE, "gpu-0", None), idleness=claim_usage.active(T0, mig=False)
    )
    ClaimStatus(kube).apply_node_devices(node_name=NODE, namespace="ns", name="c", uid=UID, devices=[entry])
    assert kube.counts == [("patch", "resourceclaims/status")]
    assert kube.requests == [
        (
            "PATCH",
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status",
            {
                "query": {"fieldManager": "gpudra-node-1", "force": "true"},
                "body": {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "c", "namespace": "ns", "uid": UID},
                    "status": {"devices": [entry]},
                },
                "content_type": "application/apply-patch+yaml",
            },
        )
    ]


def test_replacing_the_entries_keeps_the_rest_of_the_status_and_the_version() -> None:
    kube = FakeRequestKube()
    claim = {
        "metadata": {"namespace": "ns", "name": "c", "uid": UID, "resourceVersion": "42"},
        "status": {"allocation": {"devices": {"results": []}}, "devices": [{"driver": DRIVER}]},
    }
    ClaimStatus(kube).replace_devices(claim, [])
    ((method, path, kwargs),) = kube.requests
    assert (method, path) == ("PUT", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status")
    assert kwargs["body"]["metadata"]["resourceVersion"] == "42"
    assert kwargs["body"]["status"] == {"allocation": {"devices": {"results": []}}, "devices": []}
    assert kube.counts == [("update", "resourceclaims/status")]
