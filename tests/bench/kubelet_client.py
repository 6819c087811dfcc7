"""The benchmark's stand-in for the kubelet: plugin registration and the DRA v1 gRPC calls, with
gpudra's generated stubs. I/O: unix sockets.

The same client drives every plugin, so that client costs are the same on every side. Timings are
taken around the blocking call, so they include gRPC on both ends, as a kubelet would see them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from gpudra._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from tests.bench.claims import ClaimRef
from tests.bench.errors import BenchError

CALL_TIMEOUT_SECONDS = 120.0
POLL_SECONDS = 0.003


def wait_for_info(
    socket: Path, *, deadline: float, alive: Callable[[], bool]
) -> pluginregistration_v1_pb2.PluginInfo:
    """Poll `socket` every few ms until GetInfo answers there, as the kubelet's plugin watcher would
    call it on seeing the file appear."""
    while time.monotonic() < deadline:
        if not alive():
            raise BenchError(f"the plugin exited before answering GetInfo on {socket}")
        if socket.exists():
            try:
                with grpc.insecure_channel(f"unix://{socket}") as channel:
                    stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
                    return stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=1.0)
            except grpc.RpcError:
                pass  # bound but not serving yet
        time.sleep(POLL_SECONDS)
    raise BenchError(f"GetInfo did not answer on {socket}")


def notify_registered(socket: Path) -> None:
    """What the kubelet tells a plugin whose GetInfo it accepted."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        pluginregistration_v1_pb2_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=10.0
        )


def _claims(refs: Sequence[ClaimRef]) -> list[dra_v1_pb2.Claim]:
    return [dra_v1_pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]


class DraClient:
    """One connection to a plugin's DRA socket, shared by every calling thread (as in the kubelet)."""

    def __init__(self, endpoint: str) -> None:
        self.channel = grpc.insecure_channel(f"unix://{endpoint}")
        self.stub = dra_v1_pb2_grpc.DRAPluginStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def prepare(self, refs: Sequence[ClaimRef]) -> float:
        """Prepare `refs` in one call; its seconds. Raises BenchError naming each claim that failed
        (an error, or no devices)."""
        request = dra_v1_pb2.NodePrepareResourcesRequest(claims=_claims(refs))
        return self._call("prepare", self.stub.NodePrepareResources, request, refs, needs_devices=True)

    def unprepare(self, refs: Sequence[ClaimRef]) -> float:
        """Unprepare `refs` in one call; its seconds. Raises BenchError naming each claim that failed."""
        request = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=_claims(refs))
        return self._call("unprepare", self.stub.NodeUnprepareResources, request, refs, needs_devices=False)

    @staticmethod
    def _call(
        action: str,
        method: Callable[..., Any],
        request: Any,
        refs: Sequence[ClaimRef],
        *,
        needs_devices: bool,
    ) -> float:
        started = time.perf_counter()
        try:
            response = method(request, timeout=CALL_TIMEOUT_SECONDS)
        except grpc.RpcError as err:
            raise BenchError(f"{type(request).__name__.removesuffix('Request')}: {err}") from err
        seconds = time.perf_counter() - started
        failed = []
        for r in refs:
            answer = response.claims.get(r.uid)
            if answer is None:
                failed.append(f"{r.namespace}/{r.name}: not answered")
            elif answer.error or (needs_devices and not answer.devices):
                failed.append(f"{r.namespace}/{r.name}: {answer.error or 'no devices'}")
        if failed:
            raise BenchError(f"{action} failed for " + "; ".join(failed))
        return seconds
