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
waits for it (gpudra.node.dra_service), and so does a health stream. The readiness probe reports the
parts that are not ready yet.

The DRA calls are answered by gpudra.node.dra_service.DraService, which knows no gRPC: one thin
adapter per DRA API version (v1, v1beta1) turns a request's claims into its typed claims and its
answers into the response. The gRPC workers are the service's calling threads.

With a health source, the DRA socket also serves DRAResourceHealth (v1alpha1, KEP-4680): a kubelet
that calls NodeWatchResources gets every device's health at once and again after every poll, until it
cancels or the server stops; `stop()` ends open streams first, so they never hold up shutdown.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from concurrent import futures
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
from gpudra.errors import ConfigError
from gpudra.node.allocation import ClaimRef
from gpudra.node.dra_service import DraService, Observer, PrepareBackend

if TYPE_CHECKING:  # types only: this module opens the sockets before the rest of the plugin loads
    from gpudra.node.health.monitor import Snapshot

log = logging.getLogger(__name__)
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"

# How often an idle health stream looks whether the kubelet went away or the server is stopping.
_STREAM_CHECK_SECONDS = 0.25
# A unix socket's path in bytes (sun_path holds 108, with the terminating NUL).
MAX_SOCKET_PATH = 107
# By gpudra.node.health.monitor.Health value (a StrEnum: its members are these strings).
_HEALTH_STATUS = {
    "Healthy": dra_health_v1alpha1_pb2.HEALTHY,
    "Unhealthy": dra_health_v1alpha1_pb2.UNHEALTHY,
    "Unknown": dra_health_v1alpha1_pb2.UNKNOWN,
}


class HealthSource(Protocol):
    """What the health stream reads: gpudra.node.health.monitor.HealthMonitor."""

    @property
    def timeout_seconds(self) -> int: ...

    def wait(self, *, after: int, timeout: float) -> Snapshot | None: ...


def _remaining(context: grpc.ServicerContext | None) -> float | None:
    return context.time_remaining() if context is not None else None


def _refs(claims: Iterable[Any]) -> list[ClaimRef]:
    return [ClaimRef(uid=claim.uid, namespace=claim.namespace, name=claim.name) for claim in claims]


class _DraAdapter:
    """DRAPlugin for one API version, over the DraService: the request's claims in, each claim's
    answer into the response. The versions differ only in their messages' module (`pb`) and in
    whether a device has a share ID."""

    pb: ModuleType
    share_ids: bool

    def __init__(self, service: DraService) -> None:
        self.service = service

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.pb.NodePrepareResourcesResponse()
        answers = self.service.prepare(_refs(request.claims), remaining=_remaining(context))
        for uid, answer in answers.items():
            result = response.claims[uid]  # the entry exists once named, an empty one included
            if answer.error is not None:
                result.error = answer.error
            for device in answer.devices:
                added = result.devices.add(
                    request_names=list(device.request_names),
                    pool_name=device.pool,
                    device_name=device.device,
                    cdi_device_ids=list(device.cdi_device_ids),
                )
                if device.share_id is not None and self.share_ids:
                    added.share_id = device.share_id
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.pb.NodeUnprepareResourcesResponse()
        answers = self.service.unprepare(_refs(request.claims), remaining=_remaining(context))
        for uid, answer in answers.items():
            result = response.claims[uid]
            if answer.error is not None:
                result.error = answer.error
        return response


class _DraV1(_DraAdapter, dra_v1_pb2_grpc.DRAPluginServicer):  # type: ignore[misc]
    pb = dra_v1_pb2
    share_ids = True  # kubelets 1.35+ take a share's ID
    add_to_server = staticmethod(dra_v1_pb2_grpc.add_DRAPluginServicer_to_server)


class _DraV1beta1(_DraAdapter, dra_v1beta1_pb2_grpc.DRAPluginServicer):  # type: ignore[misc]
    pb = dra_v1beta1_pb2
    share_ids = False  # v1beta1 has no share_id, and its kubelets no shares
    add_to_server = staticmethod(dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server)


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
    def __init__(self, server: KubeletServer) -> None:
        self.server = server

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        log.info("the kubelet watches device health")
        seen = 0
        try:
            while context.is_active() and not self.server.stopping.is_set():
                source = self.server.health
                if source is None:  # not served yet: the stream opens, its first message waits
                    self.server.dra.ready.wait(_STREAM_CHECK_SECONDS)
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
        self.stopping = threading.Event()
        self.health: HealthSource | None = None
        self.dra = DraService(workers=workers)
        if backend is not None:
            self.serve(backend, observer=observer, health=health)
        self._dra = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dra"))
        for adapter in (_DraV1, _DraV1beta1):
            adapter.add_to_server(adapter(self.dra), self._dra)
        self._inodes: dict[Path, int] = {}  # socket -> inode this instance bound
        self._started = False
        versions: tuple[str, ...] = SUPPORTED_VERSIONS
        if health is not None if health_service is None else health_service:
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                _HealthServicer(self), self._dra
            )
            versions += (HEALTH_SERVICE,)
        self._registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reg"))
        self._registrar = _Registration(driver, self.dra_socket, versions)
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(self._registrar, self._registration)

    def serve(
        self, backend: PrepareBackend, *, observer: Observer | None = None, health: HealthSource | None = None
    ) -> None:
        """Answer the DRA calls (and health streams) from now on, calls that are waiting included."""
        self.health = health  # before the DRA service is ready, which a waiting health stream waits for
        self.dra.serve(backend, observer)

    def serving(self) -> str | None:
        """None once `serve()` handed over the backend; else why calls wait (for the readiness probe)."""
        return None if self.dra.ready.is_set() else "the device state is not loaded yet"

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
        self.stopping.set()
        self._registration.stop(grace=None)
        self._unlink_own(self.registration_socket)
        self._dra.stop(grace=timeout).wait(timeout + 1)
        self.dra.shutdown()
        self._unlink_own(self.dra_socket)

    def _unlink_own(self, socket: Path) -> None:
        """Remove `socket` only if it is still the one this instance bound: during a rolling update the
        next instance has already replaced it, and removing that one would cut the kubelet off."""
        try:
            if socket.stat().st_ino == self._inodes.get(socket):
                socket.unlink()
        except FileNotFoundError:
            pass
