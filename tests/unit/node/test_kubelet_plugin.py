"""KubeletServer over real unix sockets: registration, both DRA API versions, errors per claim, stop."""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from gpudra._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from gpudra.errors import ClaimError, ConfigError
from gpudra.model.claim import Claim
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import ClaimRef
from gpudra.node.dra_service import Observer, _NoTurn, _Turns
from gpudra.node.kubelet_grpc import KubeletServer
from tests.unit.claims import whole_gpus
from tests.unit.harness.kube import Claims
from tests.unit.harness.node import Node, uid

DRIVER = "gpu.gpudra.io"
VERSIONS = {
    "v1": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}


def device(uid: str, name: str) -> ckpt.PreparedDevice:
    return ckpt.PreparedDevice(
        request_names=("gpus",),
        pool="node-a",
        device=name,
        cdi_device_ids=(f"{DRIVER}/claim={uid}-{name}", "nvidia.com/gpu=GPU-1"),
        gpu_uuids=("GPU-1",),
    )


class Backend:
    """Answers by claim UID: devices, or the exception in `failures`; can hold calls on an Event."""

    def __init__(self) -> None:
        self.failures: dict[str, Exception] = {}
        self.calls: list[tuple[str, ClaimRef]] = []
        self.entered = threading.Event()
        self.release: threading.Event | None = None
        self.arrive: Callable[[], object] = lambda: None

    def prepared(self, ref: ClaimRef) -> tuple[ckpt.PreparedDevice, ...] | None:
        return None

    def prepare_from_claim(self, ref: ClaimRef) -> tuple[ckpt.PreparedDevice, ...]:
        self._call("prepare", ref)
        return (device(ref.uid, "gpu-0"), device(ref.uid, "gpu-1"))

    def unprepare(self, ref: ClaimRef) -> None:
        self._call("unprepare", ref)

    def _call(self, action: str, ref: ClaimRef) -> None:
        self.calls.append((action, ref))
        self.entered.set()
        self.arrive()
        if self.release is not None:
            self.release.wait()
        if ref.uid in self.failures:
            raise self.failures[ref.uid]


class Outcomes:
    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.unprepared: list[str] = []

    def observer(self) -> Observer:
        return Observer(
            prepared=lambda outcome, seconds: self.prepared.append(outcome),
            unprepared=lambda outcome, seconds: self.unprepared.append(outcome),
        )


@pytest.fixture
def sockets() -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer
    root = Path(tempfile.mkdtemp(prefix="gd-", dir="/tmp"))
    yield root
    shutil.rmtree(root)


@pytest.fixture
def backend() -> Backend:
    return Backend()


@pytest.fixture
def outcomes() -> Outcomes:
    return Outcomes()


@pytest.fixture
def server(sockets: Path, backend: Backend, outcomes: Outcomes) -> Iterator[KubeletServer]:
    running = KubeletServer(
        driver=DRIVER,
        backend=backend,
        registry_dir=sockets / "registry",
        plugin_dir=sockets / "plugin",
        observer=outcomes.observer(),
    )
    running.start()
    yield running
    if backend.release is not None:
        backend.release.set()
    running.stop(timeout=1)


def channel(socket: Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix:{socket.absolute()}")  # as the server binds: see kubelet_grpc


def claim(pb: ModuleType, uid: str) -> Any:
    return pb.Claim(namespace="team-a", uid=uid, name=f"claim-{uid}")


def test_get_info(server: KubeletServer, sockets: Path) -> None:
    assert server.registration_socket == sockets / "registry" / f"{DRIVER}-reg.sock"
    with channel(server.registration_socket) as ch:
        info = pluginregistration_v1_pb2_grpc.RegistrationStub(ch).GetInfo(
            pluginregistration_v1_pb2.InfoRequest(), timeout=10
        )
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(sockets / "plugin" / "dra.sock")
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


@pytest.mark.parametrize("registered", [True, False], ids=["registered", "refused"])
def test_registration_status_is_acknowledged(server: KubeletServer, registered: bool) -> None:
    status = pluginregistration_v1_pb2.RegistrationStatus(
        plugin_registered=registered, error="" if registered else "no"
    )
    with channel(server.registration_socket) as ch:
        answer = pluginregistration_v1_pb2_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
            status, timeout=10
        )
    assert answer == pluginregistration_v1_pb2.RegistrationStatusResponse()


def test_the_endpoint_is_absolute_for_relative_directories(
    sockets: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(sockets)
    relative = KubeletServer(
        driver=DRIVER, backend=backend, registry_dir=Path("reg"), plugin_dir=Path("plug")
    )
    assert relative.dra_socket == sockets / "plug" / "dra.sock"
    assert relative.registration_socket == sockets / "reg" / f"{DRIVER}-reg.sock"


@pytest.mark.parametrize("version", VERSIONS, ids=str)
def test_prepare_answers_each_claim_on_its_own(
    server: KubeletServer, backend: Backend, outcomes: Outcomes, version: str
) -> None:
    pb, pb_grpc = VERSIONS[version]
    backend.failures["bad"] = ClaimError("ResourceClaim team-a/claim-bad is not allocated")
    request = pb.NodePrepareResourcesRequest(claims=[claim(pb, "bad"), claim(pb, "good")])
    with channel(server.dra_socket) as ch:
        answer = pb_grpc.DRAPluginStub(ch).NodePrepareResources(request, timeout=10)

    assert set(answer.claims) == {"bad", "good"}
    assert answer.claims["bad"] == pb.NodePrepareResourceResponse(
        error="ResourceClaim team-a/claim-bad is not allocated"
    )
    good = answer.claims["good"]
    assert good.error == ""
    assert [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in good.devices
    ] == [
        (["gpus"], "node-a", "gpu-0", [f"{DRIVER}/claim=good-gpu-0", "nvidia.com/gpu=GPU-1"]),
        (["gpus"], "node-a", "gpu-1", [f"{DRIVER}/claim=good-gpu-1", "nvidia.com/gpu=GPU-1"]),
    ]
    assert sorted(backend.calls, key=lambda call: call[1].uid) == [
        ("prepare", ClaimRef(uid="bad", namespace="team-a", name="claim-bad")),
        ("prepare", ClaimRef(uid="good", namespace="team-a", name="claim-good")),
    ]
    assert sorted(outcomes.prepared) == ["ClaimError", "ok"]


@pytest.mark.parametrize("action", ["prepare", "unprepare"])
def test_the_claims_of_one_call_run_concurrently(
    server: KubeletServer, backend: Backend, action: str
) -> None:
    # Each claim waits until all four are inside the backend: one after the other, none would get out.
    arrived = threading.Barrier(4, timeout=10)
    backend.arrive = arrived.wait
    claims = [claim(dra_v1_pb2, f"c{n}") for n in range(4)]
    with channel(server.dra_socket) as ch:
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        if action == "prepare":
            answer: Any = stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=claims))
        else:
            answer = stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims))
    assert sorted(answer.claims) == ["c0", "c1", "c2", "c3"]
    assert all(not result.error for result in answer.claims.values())
    assert not arrived.broken


@pytest.mark.parametrize("version", VERSIONS, ids=str)
def test_unprepare_answers_each_claim_on_its_own(
    server: KubeletServer, backend: Backend, outcomes: Outcomes, version: str
) -> None:
    pb, pb_grpc = VERSIONS[version]
    backend.failures["bad"] = ConfigError("must be one of: a, b", field="x.y")
    request = pb.NodeUnprepareResourcesRequest(claims=[claim(pb, "good"), claim(pb, "bad")])
    with channel(server.dra_socket) as ch:
        answer = pb_grpc.DRAPluginStub(ch).NodeUnprepareResources(request, timeout=10)
    assert dict(answer.claims) == {
        "good": pb.NodeUnprepareResourceResponse(),
        "bad": pb.NodeUnprepareResourceResponse(error="x.y: must be one of: a, b"),
    }
    assert [action for action, _ in backend.calls] == ["unprepare", "unprepare"]
    assert sorted(outcomes.unprepared) == ["config", "ok"]


@pytest.mark.parametrize("version", VERSIONS, ids=str)
def test_an_unexpected_exception_is_an_internal_error_and_the_server_lives_on(
    server: KubeletServer, backend: Backend, outcomes: Outcomes, version: str
) -> None:
    pb, pb_grpc = VERSIONS[version]
    backend.failures["boom"] = RuntimeError("boom")
    with channel(server.dra_socket) as ch:
        stub = pb_grpc.DRAPluginStub(ch)
        prepared = stub.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=[claim(pb, "boom")]), timeout=10
        )
        unprepared = stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=[claim(pb, "boom")]), timeout=10
        )
        after = stub.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=[claim(pb, "fine")]), timeout=10
        )
    assert prepared.claims["boom"] == pb.NodePrepareResourceResponse(
        error="internal error: RuntimeError: boom"
    )
    assert unprepared.claims["boom"].error == "internal error: RuntimeError: boom"
    assert len(after.claims["fine"].devices) == 2
    assert outcomes.prepared == ["RuntimeError", "ok"]


def test_an_empty_request_gets_an_empty_answer(server: KubeletServer) -> None:
    with channel(server.dra_socket) as ch:
        answer = dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(), timeout=10
        )
    assert answer == dra_v1_pb2.NodePrepareResourcesResponse()


def test_stale_sockets_are_replaced_at_start(sockets: Path, backend: Backend) -> None:
    stale = [sockets / "registry" / f"{DRIVER}-reg.sock", sockets / "plugin" / "dra.sock"]
    for path in stale:
        path.parent.mkdir(parents=True)
        path.write_text("left over from a previous run")
    server = KubeletServer(
        driver=DRIVER, backend=backend, registry_dir=sockets / "registry", plugin_dir=sockets / "plugin"
    )
    server.start()
    try:
        assert all(stat.S_ISSOCK(os.stat(path).st_mode) for path in stale)
        with channel(server.dra_socket) as ch:
            dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim(dra_v1_pb2, "x")]), timeout=10
            )
    finally:
        server.stop(timeout=1)
    assert not any(path.exists() for path in stale)


def test_stop_removes_both_sockets(server: KubeletServer) -> None:
    assert server.dra_socket.exists() and server.registration_socket.exists()
    server.stop(timeout=1)
    assert not server.dra_socket.exists()
    assert not server.registration_socket.exists()


def _prepare_in_background(server: KubeletServer) -> Any:
    ch = channel(server.dra_socket)
    stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
    return ch, stub.NodePrepareResources.future(
        dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim(dra_v1_pb2, "slow")]), timeout=30
    )


def test_stop_waits_for_a_call_in_flight(server: KubeletServer, backend: Backend) -> None:
    backend.release = threading.Event()
    ch, call = _prepare_in_background(server)
    assert backend.entered.wait(10)
    stopper = threading.Thread(target=server.stop, kwargs={"timeout": 10})
    stopper.start()
    time.sleep(0.3)
    assert stopper.is_alive()  # still waiting for the call
    backend.release.set()
    stopper.join(10)
    assert not stopper.is_alive()
    assert len(call.result(timeout=10).claims["slow"].devices) == 2
    assert not server.dra_socket.exists()
    ch.close()


def test_stop_gives_up_on_a_call_after_the_grace_period(server: KubeletServer, backend: Backend) -> None:
    backend.release = threading.Event()
    ch, call = _prepare_in_background(server)
    assert backend.entered.wait(10)
    started = time.monotonic()
    server.stop(timeout=0.5)
    # Not before the grace; the call itself never ends (backend.release is never set), so the upper bound
    # only tells "gave up" from "waited on it".
    assert 0.4 < time.monotonic() - started < 30
    with pytest.raises(grpc.RpcError):
        call.result(timeout=10)
    assert not server.dra_socket.exists() and not server.registration_socket.exists()
    ch.close()


@pytest.mark.parametrize("version", VERSIONS, ids=str)
def test_a_claim_named_twice_in_one_call_is_answered_once(
    server: KubeletServer, backend: Backend, version: str
) -> None:
    pb, pb_grpc = VERSIONS[version]
    twice = [claim(pb, "c"), claim(pb, "c")]
    with channel(server.dra_socket) as ch:
        stub = pb_grpc.DRAPluginStub(ch)
        prepared = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=twice), timeout=10)
        stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=twice), timeout=10)
    assert [d.device_name for d in prepared.claims["c"].devices] == ["gpu-0", "gpu-1"]
    assert [action for action, _ in backend.calls] == ["prepare", "unprepare"]


def test_an_old_instance_stopping_leaves_the_new_instance_s_sockets(sockets: Path) -> None:
    """A rolling update: the new instance starts (and takes the sockets over) before the old one stops."""

    def instance() -> KubeletServer:
        return KubeletServer(
            driver=DRIVER, backend=Backend(), registry_dir=sockets / "registry", plugin_dir=sockets / "plugin"
        )

    old, new = instance(), instance()
    old.start()
    new.start()
    try:
        old.stop(timeout=1)
        assert new.registration_socket.exists() and new.dra_socket.exists()
        with channel(new.registration_socket) as ch:
            info = pluginregistration_v1_pb2_grpc.RegistrationStub(ch).GetInfo(
                pluginregistration_v1_pb2.InfoRequest(), timeout=10
            )
        assert info.name == DRIVER
    finally:
        new.stop(timeout=1)
    assert not new.registration_socket.exists() and not new.dra_socket.exists()


def _info(socket: Path) -> Any:
    with channel(socket) as ch:
        return pluginregistration_v1_pb2_grpc.RegistrationStub(ch).GetInfo(
            pluginregistration_v1_pb2.InfoRequest(), timeout=10
        )


def test_instances_with_ids_serve_side_by_side_each_from_its_own_sockets(sockets: Path) -> None:
    """A rolling update with maxSurge: both pods registered at once, each removing only its own sockets."""
    backends = {"a": Backend(), "b": Backend()}
    servers = {
        name: KubeletServer(
            driver=DRIVER,
            backend=backend,
            registry_dir=sockets / "registry",
            plugin_dir=sockets / "plugin",
            instance_id=f"pod-{name}",
        )
        for name, backend in backends.items()
    }
    old, new = servers["a"], servers["b"]
    assert old.registration_socket == sockets / "registry" / f"{DRIVER}-pod-a-reg.sock"
    assert old.dra_socket == sockets / "plugin" / "dra-pod-a.sock"
    old.start()
    new.start()
    try:
        for name, server in servers.items():
            assert _info(server.registration_socket).endpoint == str(
                sockets / "plugin" / f"dra-pod-{name}.sock"
            )
            with channel(server.dra_socket) as ch:
                stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
                stub.NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim(dra_v1_pb2, name)])
                )
            assert [ref.uid for _, ref in backends[name].calls] == [name]
        old.stop(timeout=1)
        assert not old.registration_socket.exists() and not old.dra_socket.exists()
        assert _info(new.registration_socket).name == DRIVER
    finally:
        new.stop(timeout=1)
    assert sorted(p.name for p in (sockets / "registry").iterdir()) == []
    assert sorted(p.name for p in (sockets / "plugin").iterdir()) == []


def test_an_instance_id_too_long_for_a_socket_path_is_replaced_by_its_digest(sockets: Path) -> None:
    pod_uid = "0b5a2c1e-7f3d-4e8a-9c6b-1d2e3f4a5b6c"
    plugin_dir = sockets / ("p" * (106 - len(f"{sockets}//dra-{pod_uid}.sock")))

    def server(directory: Path) -> KubeletServer:
        return KubeletServer(
            driver=DRIVER,
            backend=Backend(),
            registry_dir=sockets / "r",
            plugin_dir=directory,
            instance_id=pod_uid,
        )

    fits = server(plugin_dir)
    assert fits.dra_socket.name == f"dra-{pod_uid}.sock"  # 106 bytes: its hidden name has 107
    # ... which gRPC binds and serves (in its `unix://` form it refused 106 and 107 bytes: the plugin
    # crashed at start on a node whose plugin directory had just that length).
    fits.start()
    try:
        assert _info(fits.registration_socket).endpoint == str(fits.dra_socket)
        with channel(fits.dra_socket) as ch:
            stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
            stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[]), timeout=10)
    finally:
        fits.stop(timeout=1)
    longer = server(plugin_dir.with_name(plugin_dir.name + "p"))
    assert re.fullmatch(r"dra-[0-9a-f]{12}\.sock", longer.dra_socket.name)
    assert longer.dra_socket.name == server(longer.dra_socket.parent).dra_socket.name  # the same every time
    longer.start()
    try:
        assert _info(longer.registration_socket).endpoint == str(longer.dra_socket)
    finally:
        longer.stop(timeout=1)


def test_a_socket_path_too_long_for_unix_sockets_is_a_clear_error(sockets: Path) -> None:
    server = KubeletServer(
        driver=DRIVER, backend=Backend(), registry_dir=sockets / "registry", plugin_dir=sockets / ("p" * 100)
    )
    with pytest.raises(ConfigError, match=r"unix sockets allow 107: shorten --registry-dir, --plugin-dir"):
        server.start()
    assert not (sockets / ("p" * 100)).exists() and not (sockets / "registry").exists()  # nothing bound
    server.stop(timeout=1)


def test_calls_before_serve_wait_for_the_backend(sockets: Path, backend: Backend) -> None:
    """The sockets open before the device state is loaded: a call that comes first is answered once
    `serve()` hands the backend over, not refused."""
    server = KubeletServer(driver=DRIVER, registry_dir=sockets / "registry", plugin_dir=sockets / "plugin")
    server.start()
    try:
        assert server.serving() == "the device state is not loaded yet"
        answers: list[Any] = []
        with channel(server.dra_socket) as ch:
            stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
            request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim(dra_v1_pb2, "early")])
            caller = threading.Thread(
                target=lambda: answers.append(stub.NodePrepareResources(request, timeout=10))
            )
            caller.start()
            time.sleep(0.3)
            assert answers == [] and backend.calls == []  # waiting, not answered from nothing
            server.serve(backend)
            caller.join(10)
        assert server.serving() is None
        assert answers[0].claims["early"].error == "" and len(answers[0].claims["early"].devices) == 2
    finally:
        server.stop(timeout=1)


def test_a_call_that_outwaits_the_start_fails_each_claim_with_starting(
    sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpudra.node.dra_service.STARTUP_WAIT_SECONDS", 0.2)
    server = KubeletServer(driver=DRIVER, registry_dir=sockets / "registry", plugin_dir=sockets / "plugin")
    server.start()
    try:
        with channel(server.dra_socket) as ch:
            answer = dra_v1_pb2_grpc.DRAPluginStub(ch).NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(
                    claims=[claim(dra_v1_pb2, "a"), claim(dra_v1_pb2, "b")]
                ),
                timeout=10,
            )
        assert {uid: result.error for uid, result in answer.claims.items()} == dict.fromkeys(
            ("a", "b"),
            "gpudra is starting: its device state is not loaded yet (the kubelet retries this claim)",
        )
    finally:
        server.stop(timeout=1)


# --- a hung API server --------------------------------------------------------------------------


class HungClaims:
    """The node's claims, read as from an API server that hangs while `hung` is set: every GET waits
    until `answer` is set (the client's read timeout, in the plugin)."""

    def __init__(self, claims: Claims) -> None:
        self.claims = claims
        self.hung = threading.Event()
        self.answer = threading.Event()
        self.waiting = threading.Semaphore(0)  # released once per GET that hangs

    def get(self, *, namespace: str, name: str, uid: str) -> Claim:
        if self.hung.is_set():
            self.waiting.release()
            self.answer.wait(30)
        return self.claims.get(namespace=namespace, name=name, uid=uid)


def test_a_hung_api_server_holds_up_no_call_that_needs_none(tmp_path: Path, sockets: Path) -> None:
    """20 prepares of new claims wait for a hung API server; a prepare of a claim prepared already
    (answered from the checkpoint) and an unprepare are still answered at once, each call refused a
    turn is answered at once too, and the waiting ones finish when the API server answers again."""
    node = Node(tmp_path, "dgx-h100")
    source = HungClaims(node.claims)
    state = node.state()
    state.claims = source
    done = [node.claims.add(whole_gpus(uid(n), f"gpu-{n}")) for n in (1, 2)]
    new = [node.claims.add(whole_gpus(uid(10 + n), "gpu-3")) for n in range(20)]
    running = KubeletServer(
        driver=DRIVER, backend=state, registry_dir=sockets / "registry", plugin_dir=sockets / "plugin"
    )
    running.start()
    try:
        with channel(running.dra_socket) as ch:
            stub = dra_v1_pb2_grpc.DRAPluginStub(ch)

            def prepare(ref: ClaimRef, timeout: float = 30) -> Any:
                request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim_of(ref)])
                return stub.NodePrepareResources(request, timeout=timeout).claims[ref.uid]

            first = [prepare(ref) for ref in done]
            assert all(not answer.error for answer in first)
            source.hung.set()
            with futures.ThreadPoolExecutor(max_workers=len(new)) as kubelet:
                waiting = [kubelet.submit(prepare, ref) for ref in new]
                for _ in range(8):  # half of the 16 workers read their claims
                    assert source.waiting.acquire(timeout=10)
                deadline = time.monotonic() + 10
                while sum(w.done() for w in waiting) < 8 and time.monotonic() < deadline:
                    time.sleep(0.05)  # the other calls arrive: 4 wait for a turn, 8 are refused at once
                refused = [w.result() for w in waiting if w.done()]
                assert len(refused) == 8
                assert all("the API server answers slowly" in r.error for r in refused)
                assert all("refused rather than queued (the kubelet retries it)" in r.error for r in refused)

                # Both answered while the API server still hangs (source.answer is set below): a call
                # that waited for a turn or for the server would end at its deadline with an error.
                again = prepare(done[0], timeout=20)
                assert not again.error and again.devices == first[0].devices
                unprepared = stub.NodeUnprepareResources(
                    dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim_of(done[1])]), timeout=20
                ).claims[done[1].uid]
                assert not unprepared.error and uid(2) not in node.entries()

                source.answer.set()  # the API server answers again: the 12 calls it held go on
                answers = [w.result(timeout=30) for w in waiting]
            served = [a for a in answers if "slowly" not in a.error]
            assert len(served) == 12
            assert sum(not a.error for a in served) == 1  # all want gpu-3: one gets it
            assert all("already prepared" in a.error for a in served if a.error)
    finally:
        source.answer.set()
        running.stop(timeout=1)


def claim_of(ref: ClaimRef) -> Any:
    return dra_v1_pb2.Claim(namespace=ref.namespace, uid=ref.uid, name=ref.name)


def test_turns_let_some_calls_wait_refuse_the_rest_at_once_and_end_a_wait_at_its_patience() -> None:
    turns = _Turns(running=1, waiting=1)
    outcomes: list[str] = []

    def second() -> None:
        try:
            with turns.turn(10):
                outcomes.append("second ran")
        except _NoTurn as err:
            outcomes.append(str(err))

    with turns.turn(1):
        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.2)  # the second call waits for its turn
        started = time.monotonic()
        with pytest.raises(_NoTurn, match="refused rather than queued") as refused, turns.turn(10):
            pass
        assert time.monotonic() - started < 5  # at once: a queued call would wait its patience, 10 s
        assert str(refused.value) == (
            "the API server answers slowly: 1 calls are preparing claims it must read and 1 more wait for "
            "their turn; this call is refused rather than queued (the kubelet retries it)"
        )
    waiter.join(5)
    assert outcomes == ["second ran"]
    with (
        turns.turn(1),
        pytest.raises(_NoTurn, match=r"this call waited 0\.2 s for its turn"),
        turns.turn(0.2),
    ):
        pass
