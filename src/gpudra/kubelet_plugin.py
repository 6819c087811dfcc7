"""Serves the kubelet: plugin registration and the DRA gRPC API, v1 and v1beta1.
I/O: two unix sockets (the only module that imports grpc).

The registration socket goes in the kubelet's plugins_registry directory; the kubelet's plugin watcher
finds it, calls GetInfo, and connects to the DRA socket in the plugin directory. Stale sockets from a
previous run are removed at start and both sockets on stop. The registration socket is opened last, so
the kubelet never calls a plugin that cannot serve yet.

One claim's failure is that claim's error in the response; the others in the same call proceed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import grpc

from gpudra import checkpoint as ckpt
from gpudra._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from gpudra.errors import ConfigError, GpudraError
from gpudra.prepare import ClaimRef

log = logging.getLogger(__name__)
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


class PrepareBackend(Protocol):
    """What the servicers call: gpudra.prepare.DeviceState."""

    def prepare(self, ref: ClaimRef) -> tuple[ckpt.PreparedDevice, ...]: ...

    def unprepare(self, ref: ClaimRef) -> None: ...


@dataclass
class Observer:
    """Hooks for metrics: outcome per claim ('ok' or an error reason) and call durations."""

    prepared: Callable[[str, float], None] = lambda outcome, seconds: None
    unprepared: Callable[[str, float], None] = lambda outcome, seconds: None


def _error_reason(err: BaseException) -> str:
    return "config" if isinstance(err, ConfigError) else type(err).__name__


def _claim_ref(claim: Any) -> ClaimRef:
    return ClaimRef(uid=claim.uid, namespace=claim.namespace, name=claim.name)


def _servicer(pb: ModuleType, base: type, backend: PrepareBackend, observer: Observer) -> Any:
    """A DRAPlugin servicer for one API version; v1 and v1beta1 differ only in their modules."""

    class Servicer(base):  # type: ignore[misc]
        def NodePrepareResources(self, request: Any, context: Any) -> Any:
            response = pb.NodePrepareResourcesResponse()
            for claim in request.claims:
                started, outcome = time.monotonic(), "ok"
                result = response.claims[claim.uid]
                try:
                    for device in backend.prepare(_claim_ref(claim)):
                        result.devices.add(
                            request_names=list(device.request_names),
                            pool_name=device.pool,
                            device_name=device.device,
                            cdi_device_ids=list(device.cdi_device_ids),
                        )
                except Exception as err:
                    outcome = _error_reason(err)
                    result.Clear()
                    result.error = _message(err)
                    _log_failure("prepare", claim, err)
                observer.prepared(outcome, time.monotonic() - started)
            return response

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            response = pb.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                started, outcome = time.monotonic(), "ok"
                result = response.claims[claim.uid]
                try:
                    backend.unprepare(_claim_ref(claim))
                except Exception as err:
                    outcome = _error_reason(err)
                    result.error = _message(err)
                    _log_failure("unprepare", claim, err)
                observer.unprepared(outcome, time.monotonic() - started)
            return response

    return Servicer()


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


class _Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, driver: str, endpoint: Path) -> None:
        self.driver = driver
        self.endpoint = endpoint

    def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            log.info("registered with the kubelet")
        else:
            log.error("the kubelet refused the registration", extra={"error": request.error})
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class KubeletServer:
    """The two gRPC servers the kubelet talks to."""

    def __init__(
        self,
        *,
        driver: str,
        backend: PrepareBackend,
        registry_dir: Path,
        plugin_dir: Path,
        observer: Observer | None = None,
        workers: int = 16,
    ) -> None:
        self.driver = driver
        self.dra_socket = plugin_dir.absolute() / "dra.sock"
        self.registration_socket = registry_dir.absolute() / f"{driver}-reg.sock"
        observer = observer or Observer()
        self._dra = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dra"))
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            _servicer(dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginServicer, backend, observer), self._dra
        )
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            _servicer(dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginServicer, backend, observer), self._dra
        )
        self._registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reg"))
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(
            _Registration(driver, self.dra_socket), self._registration
        )

    def start(self) -> None:
        for server, socket in ((self._dra, self.dra_socket), (self._registration, self.registration_socket)):
            socket.parent.mkdir(parents=True, exist_ok=True)
            socket.unlink(missing_ok=True)
            server.add_insecure_port(f"unix://{socket}")
            server.start()
        log.info(
            "serving the kubelet",
            extra={"dra_socket": str(self.dra_socket), "registration_socket": str(self.registration_socket)},
        )

    def stop(self, grace: float = 5.0) -> None:
        """Stop accepting calls, let those in flight finish (up to `grace` seconds), remove the sockets."""
        self._registration.stop(grace=None)
        self.registration_socket.unlink(missing_ok=True)
        self._dra.stop(grace=grace).wait(grace + 1)
        self.dra_socket.unlink(missing_ok=True)
