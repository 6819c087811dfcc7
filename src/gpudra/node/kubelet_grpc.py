"""Serves the kubelet: plugin registration, the DRA gRPC API (v1 and v1beta1) and device health.
I/O: two unix sockets (the only module that imports grpc).

The registration socket goes in the kubelet's plugins_registry directory; the kubelet's plugin watcher
finds it, calls GetInfo, and connects to the DRA socket in the plugin directory. Stale sockets from a
previous run are removed at start, and on stop each socket is removed only while it is still the one
this instance bound (a newer instance of a rolling update may have replaced it).

With an instance ID (the chart passes the pod's UID) both sockets are this instance's own,
`<driver>-<id>-reg.sock` and `dra-<id>.sock` (a digest of the ID where the path would not fit a unix
socket), and the registration names that DRA socket: a kubelet 1.33+ keeps the registrations of both
pods of a rolling update (`maxSurge: 1`), sends new calls to the newest and falls back to the other
when one goes away, so the node always has a plugin. Without one (the names every instance shares) a
new instance replaces the old one's sockets, and the kubelet sees the plugin briefly go away and come
back.

The sockets open first, before the plugin has loaded its device state (`serve()` hands that over), so
the kubelet registers the plugin within a fraction of a second of its start instead of after every
import, NVML and the checkpoint. Nothing is promised early: a DRA call that arrives before `serve()`
waits for it (up to STARTUP_WAIT_SECONDS, then each claim fails with "starting" and the kubelet retries),
and so does a health stream. The readiness probe reports the parts that are not ready yet.

One claim's failure is that claim's error in the response; the others in the same call proceed. The
claims of one call are prepared (and unprepared) concurrently: a pod with several claims waits for the
slowest one, not for their sum. DeviceState keeps claims that touch the same GPU apart.

A hung API server holds up only the calls that need it. A claim prepared already is answered from the
checkpoint on the gRPC worker itself, and an unprepare needs no API server; a claim to prepare reads
its claim object, so a call with one takes a turn (`_Turns`) first: at most half of the workers run
such calls at once and a quarter more wait for a turn, and a call beyond both is refused at once (the
kubelet retries it). The other workers stay free for the calls that need no API server, however long
the API server hangs; a call that waits behind them is not held longer than its deadline.

With a health source, the DRA socket also serves DRAResourceHealth (v1alpha1, KEP-4680): a kubelet
that calls NodeWatchResources gets every device's health at once and again after every poll, until it
cancels or the server stops; `stop()` ends open streams first, so they never hold up shutdown.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from gpudra._proto import (
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from gpudra.errors import ClusterError, ConfigError, GpudraError
from gpudra.node.allocation import ClaimRef

if TYPE_CHECKING:  # types only: this module opens the sockets before the rest of the plugin loads
    from gpudra.node import checkpoint as ckpt
    from gpudra.node.health.monitor import Snapshot

log = logging.getLogger(__name__)
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"

# How often an idle health stream looks whether the kubelet went away or the server is stopping.
_STREAM_CHECK_SECONDS = 0.25
# How long a DRA call that arrives before serve() waits for it; the kubelet's own timeout is longer.
STARTUP_WAIT_SECONDS = 30.0
# A unix socket's path in bytes (sun_path holds 108, with the terminating NUL).
MAX_SOCKET_PATH = 107
# By gpudra.node.health.monitor.Health value (a StrEnum: its members are these strings).
_HEALTH_STATUS = {
    "Healthy": dra_health_v1alpha1_pb2.HEALTHY,
    "Unhealthy": dra_health_v1alpha1_pb2.UNHEALTHY,
    "Unknown": dra_health_v1alpha1_pb2.UNKNOWN,
}


class PrepareBackend(Protocol):
    """What the servicers call: gpudra.node.prepare.DeviceState. `prepared` answers a claim prepared
    already from the checkpoint, without the API server (None: `prepare` must read the claim)."""

    def prepared(self, ref: ClaimRef) -> tuple[ckpt.PreparedDevice, ...] | None: ...

    def prepare(self, ref: ClaimRef) -> tuple[ckpt.PreparedDevice, ...]: ...

    def unprepare(self, ref: ClaimRef) -> None: ...


class HealthSource(Protocol):
    """What the health stream reads: gpudra.node.health.monitor.HealthMonitor."""

    @property
    def timeout_seconds(self) -> int: ...

    def wait(self, *, after: int, timeout: float) -> Snapshot | None: ...


@dataclass
class Observer:
    """Hooks for metrics: outcome per claim ('ok' or an error reason) and call durations."""

    prepared: Callable[[str, float], None] = lambda outcome, seconds: None
    unprepared: Callable[[str, float], None] = lambda outcome, seconds: None


def _error_reason(err: BaseException) -> str:
    return "config" if isinstance(err, ConfigError) else type(err).__name__


def _claim_ref(claim: Any) -> ClaimRef:
    return ClaimRef(uid=claim.uid, namespace=claim.namespace, name=claim.name)


class _Parts:
    """What the servicers call, once `KubeletServer.serve` has it: the backend, the observer, the health
    source. `wait` holds a call that comes earlier."""

    def __init__(self, stopping: threading.Event) -> None:
        self.ready = threading.Event()
        self.stopping = stopping
        self.backend: PrepareBackend | None = None
        self.observer = Observer()
        self.health: HealthSource | None = None

    def set(self, backend: PrepareBackend, observer: Observer | None, health: HealthSource | None) -> None:
        self.backend, self.health = backend, health
        self.observer = observer or Observer()
        self.ready.set()

    def wait(self, context: Any) -> PrepareBackend:
        """The backend, waiting for it while the call's deadline and STARTUP_WAIT_SECONDS allow."""
        if not self.ready.wait(_patience(context)) or self.backend is None:
            raise GpudraError(
                "gpudra is starting: its device state is not loaded yet (the kubelet retries this claim)"
            )
        return self.backend


def _patience(context: Any) -> float:
    """How long a call may wait before its work starts: while its deadline allows (less a second to
    answer in), and STARTUP_WAIT_SECONDS at most."""
    remaining = context.time_remaining() if context is not None else None
    return STARTUP_WAIT_SECONDS if remaining is None else min(STARTUP_WAIT_SECONDS, max(remaining - 1, 0))


class _NoTurn(ClusterError):
    """A call that needs the API server got no turn (`_Turns`)."""


class _Turns:
    """Turns for the calls that need the API server, so that however long it hangs they never hold
    every gRPC worker: at most `running` such calls at once and `waiting` more waiting for a turn; a
    call beyond both is refused at once, and a waiting call gives up at its deadline."""

    def __init__(self, *, running: int, waiting: int) -> None:
        self.running, self.waiting = running, waiting
        self._free = threading.Semaphore(running)
        self._lock = threading.Lock()
        self._waiters = 0

    @contextmanager
    def turn(self, patience: float) -> Iterator[None]:
        if not self._free.acquire(blocking=False):
            with self._lock:
                full = self._waiters >= self.waiting
                if not full:
                    self._waiters += 1
            if full:
                raise _NoTurn(self._busy("this call is refused rather than queued"))
            try:
                granted = self._free.acquire(timeout=patience)
            finally:
                with self._lock:
                    self._waiters -= 1
            if not granted:
                raise _NoTurn(self._busy(f"this call waited {patience:.1f} s for its turn"))
        try:
            yield
        finally:
            self._free.release()

    def _busy(self, outcome: str) -> str:
        return (
            f"the API server answers slowly: {self.running} calls are preparing claims it must read and "
            f"{self.waiting} more wait for their turn; {outcome} (the kubelet retries it)"
        )


@dataclass(frozen=True)
class _Pools:
    """Where the claims of a call with several run (the gRPC worker waits for them): `api` for claims
    to prepare, which read the API server, `claims` for unprepares, so neither waits behind the other;
    `turns` bound the calls that need the API server."""

    claims: futures.Executor
    api: futures.Executor
    turns: _Turns


def _servicer(pb: ModuleType, base: type, parts: _Parts, pools: _Pools) -> Any:
    """A DRAPlugin servicer for one API version; v1 and v1beta1 differ only in their modules."""

    has_share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name

    def prepare(claim: Any, result: Any, backend: PrepareBackend, *, known_only: bool = False) -> bool:
        """Prepare `claim` into `result` (its devices, or its error). With `known_only`, only a claim
        prepared already, answered from the checkpoint: False (and nothing done) for any other."""
        started, outcome = time.monotonic(), "ok"
        try:
            ref = _claim_ref(claim)
            devices = backend.prepared(ref) if known_only else backend.prepare(ref)
            if devices is None:
                return False
            for device in devices:
                added = result.devices.add(
                    request_names=list(device.request_names),
                    pool_name=device.pool,
                    device_name=device.device,
                    cdi_device_ids=list(device.cdi_device_ids),
                )
                # v1 only (kubelets 1.35+): v1beta1 has no share_id, and its kubelets no shares.
                if device.share_id is not None and has_share_id:
                    added.share_id = device.share_id
        except Exception as err:
            outcome = _error_reason(err)
            result.Clear()
            result.error = _message(err)
            _log_failure("prepare", claim, err)
        parts.observer.prepared(outcome, time.monotonic() - started)
        return True

    def refuse(claim: Any, result: Any, err: GpudraError) -> None:
        result.error = str(err)
        _log_failure("prepare", claim, err)
        parts.observer.prepared(_error_reason(err), 0.0)

    def unprepare(claim: Any, result: Any, backend: PrepareBackend) -> None:
        started, outcome = time.monotonic(), "ok"
        try:
            backend.unprepare(_claim_ref(claim))
        except Exception as err:
            outcome = _error_reason(err)
            result.error = _message(err)
            _log_failure("unprepare", claim, err)
        parts.observer.unprepared(outcome, time.monotonic() - started)

    def run(
        step: Callable[[Any, Any, PrepareBackend], object],
        work: Sequence[tuple[Any, Any]],
        backend: PrepareBackend,
        pool: futures.Executor,
    ) -> None:
        if len(work) == 1:  # the usual call: no hand-over to another thread
            step(*work[0], backend)
        else:
            for done in [pool.submit(step, claim, result, backend) for claim, result in work]:
                done.result()

    def each(prepares: bool, request: Any, response: Any, context: Any) -> Any:
        # One result message per claim, made here: protobuf messages are not safe to add to from
        # several threads, but each thread then fills only its own.
        work = [(claim, response.claims[claim.uid]) for claim in _distinct(request.claims)]
        try:
            backend = parts.wait(context)
        except GpudraError as err:
            for claim, result in work:
                result.error = str(err)
                _log_failure("prepare or unprepare", claim, err)
            return response
        if not prepares:
            run(unprepare, work, backend, pools.claims)
            return response
        # Claims prepared already are answered here, from the checkpoint: they never wait for a turn,
        # and so never behind claims that wait for the API server.
        pending = [
            (claim, result) for claim, result in work if not prepare(claim, result, backend, known_only=True)
        ]
        if pending:
            try:
                with pools.turns.turn(_patience(context)):
                    run(prepare, pending, backend, pools.api)
            except _NoTurn as err:
                for claim, result in pending:
                    refuse(claim, result, err)
        return response

    class Servicer(base):  # type: ignore[misc]
        def NodePrepareResources(self, request: Any, context: Any) -> Any:
            return each(True, request, pb.NodePrepareResourcesResponse(), context)

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            return each(False, request, pb.NodeUnprepareResourcesResponse(), context)

    return Servicer()


def _socket(directory: Path, prefix: str, suffix: str, instance_id: str | None) -> Path:
    """`<prefix><suffix>`, or with an instance ID `<prefix>-<id><suffix>`; when that path, with its
    hidden name one byte longer, would not fit a unix socket, a digest of the ID replaces the ID (the
    names need only be the instance's own, and the same in each of its containers)."""
    if not instance_id:
        return directory / f"{prefix}{suffix}"
    socket = directory / f"{prefix}-{instance_id}{suffix}"
    if len(os.fsencode(socket)) + 1 > MAX_SOCKET_PATH:
        socket = directory / f"{prefix}-{hashlib.sha256(instance_id.encode()).hexdigest()[:12]}{suffix}"
    return socket


def _distinct(claims: Iterable[Any]) -> Iterator[Any]:
    """Each claim once: a claim named twice in one call is answered (and prepared) once."""
    seen: set[str] = set()
    for claim in claims:
        if claim.uid not in seen:
            seen.add(claim.uid)
            yield claim


def _message(err: BaseException) -> str:
    return str(err) if isinstance(err, GpudraError) else f"internal error: {type(err).__name__}: {err}"


def _log_failure(action: str, claim: Any, err: BaseException) -> None:
    extra = {
        "claim": claim.uid,
        "claim_namespace": claim.namespace,
        "claim_name": claim.name,
        "error": str(err),
    }
    if isinstance(err, GpudraError):
        log.warning(f"{action} failed", extra=extra)
    else:
        log.exception(f"{action} failed unexpectedly", extra=extra)


def _health_response(snapshot: Snapshot, *, timeout_seconds: int) -> Any:
    """One NodeWatchResources message: the complete device list of a snapshot."""
    return dra_health_v1alpha1_pb2.NodeWatchResourcesResponse(
        devices=[
            dra_health_v1alpha1_pb2.DeviceHealth(
                device=dra_health_v1alpha1_pb2.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                health=_HEALTH_STATUS[d.health],
                last_updated_time=int(snapshot.checked_at),
                health_check_timeout_seconds=timeout_seconds,
                message=d.message,
            )
            for d in snapshot.devices
        ]
    )


class _HealthServicer(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
    def __init__(self, parts: _Parts) -> None:
        self.parts = parts

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        log.info("the kubelet watches device health")
        seen = 0
        try:
            while context.is_active() and not self.parts.stopping.is_set():
                source = self.parts.health
                if source is None:  # not served yet: the stream opens, its first message waits
                    self.parts.ready.wait(_STREAM_CHECK_SECONDS)
                    continue
                snapshot = source.wait(after=seen, timeout=_STREAM_CHECK_SECONDS)
                if snapshot is not None:
                    seen = snapshot.generation
                    yield _health_response(snapshot, timeout_seconds=source.timeout_seconds)
        finally:
            # also when gRPC drops the generator at a yield because the kubelet went away
            log.info("device health stream ended")


class _Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, driver: str, endpoint: Path, versions: tuple[str, ...]) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.versions = versions
        # None: registered; else why not (the readiness probe reports it).
        self.problem: str | None = "the kubelet has not registered the plugin yet"

    def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=list(self.versions),
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            self.problem = None
            log.info("registered with the kubelet")
        else:
            self.problem = f"the kubelet refused the registration: {request.error}"
            log.error("the kubelet refused the registration", extra={"error": request.error})
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class KubeletServer:
    """The two gRPC servers the kubelet talks to. The backend (and observer, and health source) come with
    the constructor or later through `serve()`; device health is offered when a `health` source is given
    or `health_service` says one will be. `instance_id` gives the sockets this instance's own names (see
    the module docstring). Of the `workers` gRPC threads, calls that need the API server hold at most
    half plus a quarter (`_Turns`); a health stream holds one while it is open."""

    def __init__(
        self,
        *,
        driver: str,
        registry_dir: Path,
        plugin_dir: Path,
        backend: PrepareBackend | None = None,
        observer: Observer | None = None,
        health: HealthSource | None = None,
        health_service: bool | None = None,
        workers: int = 16,
        instance_id: str | None = None,
    ) -> None:
        self.driver = driver
        self.instance_id = instance_id
        self.dra_socket = _socket(plugin_dir.absolute(), "dra", ".sock", instance_id)
        self.registration_socket = _socket(registry_dir.absolute(), driver, "-reg.sock", instance_id)
        self._stopping = threading.Event()
        self._parts = _Parts(self._stopping)
        if backend is not None:
            self._parts.set(backend, observer, health)
        self._dra = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dra"))
        self._pools = _Pools(
            claims=futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="claim"),
            api=futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="claim-api"),
            turns=_Turns(running=max(1, workers // 2), waiting=max(1, workers // 4)),
        )
        for pb, grpc_module in ((dra_v1_pb2, dra_v1_pb2_grpc), (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)):
            grpc_module.add_DRAPluginServicer_to_server(
                _servicer(pb, grpc_module.DRAPluginServicer, self._parts, self._pools), self._dra
            )
        self._inodes: dict[Path, int] = {}  # socket -> inode this instance bound
        self._started = False
        versions: tuple[str, ...] = SUPPORTED_VERSIONS
        if health is not None if health_service is None else health_service:
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                _HealthServicer(self._parts), self._dra
            )
            versions += (HEALTH_SERVICE,)
        self._registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reg"))
        self._registrar = _Registration(driver, self.dra_socket, versions)
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(self._registrar, self._registration)

    def serve(
        self, backend: PrepareBackend, *, observer: Observer | None = None, health: HealthSource | None = None
    ) -> None:
        """Answer the DRA calls (and health streams) from now on, calls that are waiting included."""
        self._parts.set(backend, observer, health)

    def serving(self) -> str | None:
        """None once `serve()` handed over the backend; else why calls wait (for the readiness probe)."""
        return None if self._parts.ready.is_set() else "the device state is not loaded yet"

    def start(self) -> None:
        # Bound under a hidden name (the kubelet's plugin watcher skips dot files), then renamed over
        # the real one: a previous instance's socket is replaced atomically, and gRPC, which unlinks
        # the path it bound when it stops, only ever removes the hidden name. Sockets of an instance's
        # own need no process ID to tell the hidden names of two instances apart (two pods' processes
        # may have the same one, each in its own PID namespace).
        sockets = {
            socket: socket.with_name(
                f".{socket.name}" if self.instance_id else f".{socket.name}.{os.getpid()}"
            )
            for socket in (self.dra_socket, self.registration_socket)
        }
        for socket, bound in sockets.items():
            if len(os.fsencode(bound)) > MAX_SOCKET_PATH:
                raise ConfigError(
                    f"the socket path {bound} (bound there, then renamed to {socket.name}) is "
                    f"{len(os.fsencode(bound))} bytes; unix sockets allow {MAX_SOCKET_PATH}: shorten "
                    "--registry-dir, --plugin-dir or --driver-name"
                )
        self._started = True
        for server, socket in ((self._dra, self.dra_socket), (self._registration, self.registration_socket)):
            socket.parent.mkdir(parents=True, exist_ok=True)
            bound = sockets[socket]
            bound.unlink(missing_ok=True)
            # `unix:<absolute path>`, not `unix://<path>`: grpcio (1.85) refuses a path of 106 or 107 bytes
            # in the second form, which the kernel and the first form allow (test_kubelet_plugin).
            server.add_insecure_port(f"unix:{bound}")
            server.start()
            os.replace(bound, socket)
            self._inodes[socket] = socket.stat().st_ino
        log.info(
            "serving the kubelet",
            extra={"dra_socket": str(self.dra_socket), "registration_socket": str(self.registration_socket)},
        )

    def registration_problem(self) -> str | None:
        """None once the kubelet accepted the registration; else why the plugin is not registered."""
        return self._registrar.problem

    def stop(self, timeout: float = 5.0) -> None:
        """End health streams, stop accepting calls, let those in flight finish (up to `timeout`
        seconds), remove the sockets. Idempotent."""
        if not self._started:
            return
        self._started = False
        self._stopping.set()
        self._registration.stop(grace=None)
        self._unlink_own(self.registration_socket)
        self._dra.stop(grace=timeout).wait(timeout + 1)
        for pool in (self._pools.claims, self._pools.api):
            pool.shutdown(wait=False, cancel_futures=True)
        self._unlink_own(self.dra_socket)

    def _unlink_own(self, socket: Path) -> None:
        """Remove `socket` only if it is still the one this instance bound: during a rolling update the
        next instance has already replaced it, and removing that one would cut the kubelet off."""
        try:
            if socket.stat().st_ino == self._inodes.get(socket):
                socket.unlink()
        except FileNotFoundError:
            pass
