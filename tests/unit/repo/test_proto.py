"""Tests for the kubelet gRPC protos and their generated stubs: regeneration, wire numbers, live calls."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

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

REPO = Path(__file__).resolve().parents[3]
GEN_SCRIPT = REPO / "scripts" / "gen_proto.py"
COMMITTED = REPO / "src" / "gpudra" / "_proto"

# ---------------------------------------------------------------------------------------------------------
# The wire contract, transcribed from /work/shared/reference/dra-api.md section 1 (not from the .proto files).
# message short name -> field name -> (field number, type); message and enum types are named within the
# same proto package.

_DRA_V1BETA1: dict[str, dict[str, tuple[int, str]]] = {
    "NodePrepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodePrepareResourcesResponse": {"claims": (1, "map<string, NodePrepareResourceResponse>")},
    "NodePrepareResourceResponse": {"devices": (1, "repeated Device"), "error": (2, "string")},
    "Device": {
        "request_names": (1, "repeated string"),
        "pool_name": (2, "string"),
        "device_name": (3, "string"),
        "cdi_device_ids": (4, "repeated string"),
    },
    "NodeUnprepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodeUnprepareResourcesResponse": {"claims": (1, "map<string, NodeUnprepareResourceResponse>")},
    "NodeUnprepareResourceResponse": {"error": (1, "string")},
    "Claim": {"namespace": (1, "string"), "uid": (2, "string"), "name": (3, "string")},
}
_DRA_V1 = {
    **_DRA_V1BETA1,
    "Device": {**_DRA_V1BETA1["Device"], "share_id": (5, "optional string")},
}
_REGISTRATION: dict[str, dict[str, tuple[int, str]]] = {
    "PluginInfo": {
        "type": (1, "string"),
        "name": (2, "string"),
        "endpoint": (3, "string"),
        "supported_versions": (4, "repeated string"),
    },
    "RegistrationStatus": {"plugin_registered": (1, "bool"), "error": (2, "string")},
    "RegistrationStatusResponse": {},
    "InfoRequest": {},
}
_HEALTH: dict[str, dict[str, tuple[int, str]]] = {
    "NodeWatchResourcesRequest": {},
    "DeviceIdentifier": {"pool_name": (1, "string"), "device_name": (2, "string")},
    "DeviceHealth": {
        "device": (1, "DeviceIdentifier"),
        "health": (2, "HealthStatus"),
        "last_updated_time": (3, "int64"),
        "health_check_timeout_seconds": (4, "int64"),
        "message": (5, "string"),
    },
    "NodeWatchResourcesResponse": {"devices": (1, "repeated DeviceHealth")},
}

# module -> (proto package, messages)
PACKAGES: dict[ModuleType, tuple[str, dict[str, dict[str, tuple[int, str]]]]] = {
    dra_v1_pb2: ("k8s.io.kubelet.pkg.apis.dra.v1", _DRA_V1),
    dra_v1beta1_pb2: ("k8s.io.kubelet.pkg.apis.dra.v1beta1", _DRA_V1BETA1),
    pluginregistration_v1_pb2: ("pluginregistration", _REGISTRATION),
    dra_health_v1alpha1_pb2: ("v1alpha1", _HEALTH),
}
ENUMS = {"v1alpha1.HealthStatus": {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}}

# module -> {method path: (request type, response type, server streaming)}
_DRA_METHODS = {
    "NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse", False),
    "NodeUnprepareResources": ("NodeUnprepareResourcesRequest", "NodeUnprepareResourcesResponse", False),
}
SERVICES: dict[ModuleType, dict[str, tuple[str, str, bool]]] = {
    dra_v1_pb2: {
        f"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{m}": (
            f"k8s.io.kubelet.pkg.apis.dra.v1.{i}",
            f"k8s.io.kubelet.pkg.apis.dra.v1.{o}",
            s,
        )
        for m, (i, o, s) in _DRA_METHODS.items()
    },
    dra_v1beta1_pb2: {
        f"/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/{m}": (
            f"k8s.io.kubelet.pkg.apis.dra.v1beta1.{i}",
            f"k8s.io.kubelet.pkg.apis.dra.v1beta1.{o}",
            s,
        )
        for m, (i, o, s) in _DRA_METHODS.items()
    },
    pluginregistration_v1_pb2: {
        "/pluginregistration.Registration/GetInfo": (
            "pluginregistration.InfoRequest",
            "pluginregistration.PluginInfo",
            False,
        ),
        "/pluginregistration.Registration/NotifyRegistrationStatus": (
            "pluginregistration.RegistrationStatus",
            "pluginregistration.RegistrationStatusResponse",
            False,
        ),
    },
    dra_health_v1alpha1_pb2: {
        "/v1alpha1.DRAResourceHealth/NodeWatchResources": (
            "v1alpha1.NodeWatchResourcesRequest",
            "v1alpha1.NodeWatchResourcesResponse",
            True,
        ),
    },
}

MODULE_IDS = ["dra_v1", "dra_v1beta1", "pluginregistration_v1", "dra_health_v1alpha1"]


def _reference(full_name: str) -> dict[str, tuple[int, str]]:
    package, _, short = full_name.rpartition(".")
    return next(messages[short] for pkg, messages in PACKAGES.values() if pkg == package)


# ---------------------------------------------------------------------------------------------------------
# Generation


def test_committed_stubs_equal_a_fresh_generation(tmp_path: Path) -> None:
    (tmp_path / "stale_pb2_grpc.py").write_text("left over from a removed proto\n")
    (tmp_path / "__init__.py").write_text("kept\n")
    subprocess.run([sys.executable, str(GEN_SCRIPT), "--out", str(tmp_path)], check=True, capture_output=True)

    assert not (tmp_path / "stale_pb2_grpc.py").exists()
    assert (tmp_path / "__init__.py").read_text() == "kept\n"
    fresh = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != "__init__.py"}
    committed = {
        p.name: p.read_bytes() for p in COMMITTED.iterdir() if p.is_file() and p.name != "__init__.py"
    }
    assert sorted(fresh) == sorted(committed)
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert stale == [], "run: python scripts/gen_proto.py"


def test_generator_reports_protoc_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("gen_proto", GEN_SCRIPT)
    assert spec is not None and spec.loader is not None
    gen_proto = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_proto)
    (tmp_path / "broken.proto").write_text('syntax = "proto3";\nmessage Broken { strin name = 1; }\n')
    monkeypatch.setattr(gen_proto, "PROTO_ROOT", tmp_path)
    monkeypatch.setattr(gen_proto, "MODULES", {"broken.proto": "broken"})

    with pytest.raises(SystemExit, match=r"grpc_tools\.protoc failed \(1\):\n.*broken\.proto:2.*strin"):
        gen_proto.generate(tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------
# Descriptors against the reference


def _describe(field: FieldDescriptor) -> str:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        entry = field.message_type.fields_by_name
        return f"map<{_describe(entry['key'])}, {_describe(entry['value'])}>"
    if field.message_type is not None:
        base = field.message_type.name
    elif field.enum_type is not None:
        base = field.enum_type.name
    else:
        base = {
            FieldDescriptor.TYPE_STRING: "string",
            FieldDescriptor.TYPE_BOOL: "bool",
            FieldDescriptor.TYPE_INT64: "int64",
        }[field.type]
    if field.is_repeated:
        return f"repeated {base}"
    if field.has_presence and field.message_type is None:
        return f"optional {base}"
    return base


def _fields(message: Descriptor) -> dict[str, tuple[int, str]]:
    return {f.name: (f.number, _describe(f)) for f in message.fields}


@pytest.mark.parametrize("module", list(PACKAGES), ids=MODULE_IDS)
def test_messages_match_reference(module: ModuleType) -> None:
    file: FileDescriptor = module.DESCRIPTOR
    package, messages = PACKAGES[module]

    assert file.package == package
    assert {name: _fields(m) for name, m in file.message_types_by_name.items()} == messages


@pytest.mark.parametrize("module", list(SERVICES), ids=MODULE_IDS)
def test_services_match_reference(module: ModuleType) -> None:
    file: FileDescriptor = module.DESCRIPTOR
    methods = {
        f"/{service.full_name}/{method.name}": (
            method.input_type.full_name,
            method.output_type.full_name,
            method.server_streaming,
        )
        for service in file.services_by_name.values()
        for method in service.methods
    }
    assert methods == SERVICES[module]
    assert not any(m.client_streaming for s in file.services_by_name.values() for m in s.methods)


def test_health_status_enum_matches_reference() -> None:
    enums = {
        e.full_name: {v.name: v.number for v in e.values}
        for e in dra_health_v1alpha1_pb2.DESCRIPTOR.enum_types_by_name.values()
    }
    assert enums == ENUMS


def test_v1beta1_device_has_no_share_id() -> None:
    with pytest.raises(ValueError, match="share_id"):
        dra_v1beta1_pb2.Device(share_id="s")  # type: ignore[call-arg]


# ---------------------------------------------------------------------------------------------------------
# Raw wire bytes, decoded and encoded with the reference table only

_VARINT, _LEN = 0, 2


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _element_type(kind: str) -> str:
    return kind.removeprefix("repeated ").removeprefix("optional ")


def _map_entry(kind: str) -> dict[str, tuple[int, str]]:
    key, value = kind.removeprefix("map<").removesuffix(">").split(", ")
    return {"key": (1, key), "value": (2, value)}


def _decode_value(raw: int | bytes, kind: str, package: str) -> Any:
    element = _element_type(kind)
    if kind.startswith("map<"):
        assert isinstance(raw, bytes)
        return _decode_fields(raw, _map_entry(kind), package)
    if element in {"bool", "int64", "HealthStatus"}:
        assert isinstance(raw, int), f"{kind} must be a varint"
        return bool(raw) if element == "bool" else raw
    assert isinstance(raw, bytes), f"{kind} must be length-delimited"
    if element == "string":
        return raw.decode()
    return _decode_fields(raw, _reference(f"{package}.{element}"), package)


def _decode_fields(data: bytes, reference: dict[str, tuple[int, str]], package: str) -> dict[str, Any]:
    by_number = {number: (name, kind) for name, (number, kind) in reference.items()}
    out: dict[str, Any] = {}
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        assert number in by_number, f"field number {number} is not in the reference ({sorted(by_number)})"
        name, kind = by_number[number]
        raw: int | bytes
        if wire_type == _VARINT:
            raw, pos = _read_varint(data, pos)
        else:
            assert wire_type == _LEN, f"{name}: unexpected wire type {wire_type}"
            length, pos = _read_varint(data, pos)
            raw, pos = data[pos : pos + length], pos + length
        value = _decode_value(raw, kind, package)
        if kind.startswith(("repeated ", "map<")):
            out.setdefault(name, []).append(value)
        else:
            assert name not in out, f"{name} is singular but occurs twice"
            out[name] = value
    return out


def wire_decode(data: bytes, full_name: str) -> dict[str, Any]:
    """Decodes serialized bytes into {field name: value}, naming fields by the reference's numbers."""
    return _decode_fields(data, _reference(full_name), full_name.rpartition(".")[0])


def _encode_value(value: Any, kind: str, package: str) -> tuple[int, bytes]:
    element = _element_type(kind)
    if kind.startswith("map<"):
        return _LEN, _encode_fields(value, _map_entry(kind), package)
    if element in {"bool", "int64", "HealthStatus"}:
        return _VARINT, _varint(int(value))
    if element == "string":
        return _LEN, value.encode()
    return _LEN, _encode_fields(value, _reference(f"{package}.{element}"), package)


def _encode_fields(values: dict[str, Any], reference: dict[str, tuple[int, str]], package: str) -> bytes:
    out = bytearray()
    for name, given_value in values.items():
        number, kind = reference[name]
        repeated = kind.startswith(("repeated ", "map<"))
        for value in given_value if repeated else [given_value]:
            wire_type, payload = _encode_value(value, kind, package)
            out += _varint(number << 3 | wire_type)
            out += _varint(len(payload)) + payload if wire_type == _LEN else payload
    return bytes(out)


def wire_encode(values: dict[str, Any], full_name: str) -> bytes:
    """Encodes {field name: value} into wire bytes using the reference's field numbers."""
    return _encode_fields(values, _reference(full_name), full_name.rpartition(".")[0])


def _dra_cases(pb: ModuleType, version: str) -> list[tuple[Message, dict[str, Any], str]]:
    claim = pb.Claim(namespace="team-a", uid="0f6c-uid", name="gpu-claim")
    claim_wire = {"namespace": "team-a", "uid": "0f6c-uid", "name": "gpu-claim"}
    device = pb.Device(
        request_names=["gpu"],
        pool_name="node-a",
        device_name="gpu-0",
        cdi_device_ids=["k8s.gpu.example.com/claim=0f6c-uid"],
    )
    device_wire = {
        "request_names": ["gpu"],
        "pool_name": "node-a",
        "device_name": "gpu-0",
        "cdi_device_ids": ["k8s.gpu.example.com/claim=0f6c-uid"],
    }
    return [
        (claim, claim_wire, f"{version}-claim"),
        (device, device_wire, f"{version}-device"),
        (
            pb.NodePrepareResourcesRequest(claims=[claim]),
            {"claims": [claim_wire]},
            f"{version}-prepare-request",
        ),
        (
            pb.NodePrepareResourcesResponse(
                claims={"0f6c-uid": pb.NodePrepareResourceResponse(devices=[device], error="partly failed")}
            ),
            {"claims": [{"key": "0f6c-uid", "value": {"devices": [device_wire], "error": "partly failed"}}]},
            f"{version}-prepare-response",
        ),
        (
            pb.NodeUnprepareResourcesRequest(claims=[claim]),
            {"claims": [claim_wire]},
            f"{version}-unprepare-request",
        ),
        (
            pb.NodeUnprepareResourcesResponse(
                claims={"0f6c-uid": pb.NodeUnprepareResourceResponse(error="busy")}
            ),
            {"claims": [{"key": "0f6c-uid", "value": {"error": "busy"}}]},
            f"{version}-unprepare-response",
        ),
    ]


WIRE_CASES = [
    *_dra_cases(dra_v1_pb2, "v1"),
    *_dra_cases(dra_v1beta1_pb2, "v1beta1"),
    (
        dra_v1_pb2.Device(pool_name="node-a", device_name="gpu-0", share_id="share-7"),
        {"pool_name": "node-a", "device_name": "gpu-0", "share_id": "share-7"},
        "v1-device-share-id",
    ),
    # Presence: an explicitly empty share_id still goes on the wire.
    (dra_v1_pb2.Device(share_id=""), {"share_id": ""}, "v1-device-empty-share-id"),
    (pluginregistration_v1_pb2.InfoRequest(), {}, "info-request"),
    (
        pluginregistration_v1_pb2.PluginInfo(
            type="DRAPlugin",
            name="gpu.example.com",
            endpoint="/var/lib/kubelet/plugins/gpu.example.com/dra.sock",
            supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"],
        ),
        {
            "type": "DRAPlugin",
            "name": "gpu.example.com",
            "endpoint": "/var/lib/kubelet/plugins/gpu.example.com/dra.sock",
            "supported_versions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"],
        },
        "plugin-info",
    ),
    (
        pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True, error="none"),
        {"plugin_registered": True, "error": "none"},
        "registration-status",
    ),
    (pluginregistration_v1_pb2.RegistrationStatusResponse(), {}, "registration-status-response"),
    (dra_health_v1alpha1_pb2.NodeWatchResourcesRequest(), {}, "watch-request"),
    (
        dra_health_v1alpha1_pb2.NodeWatchResourcesResponse(
            devices=[
                dra_health_v1alpha1_pb2.DeviceHealth(
                    device=dra_health_v1alpha1_pb2.DeviceIdentifier(pool_name="node-a", device_name="gpu-0"),
                    health=dra_health_v1alpha1_pb2.UNHEALTHY,
                    last_updated_time=1_760_000_000,
                    health_check_timeout_seconds=60,
                    message="XID 79: GPU has fallen off the bus",
                ),
            ]
        ),
        {
            "devices": [
                {
                    "device": {"pool_name": "node-a", "device_name": "gpu-0"},
                    "health": 2,
                    "last_updated_time": 1_760_000_000,
                    "health_check_timeout_seconds": 60,
                    "message": "XID 79: GPU has fallen off the bus",
                }
            ]
        },
        "watch-response",
    ),
]


@pytest.mark.parametrize(("message", "wire"), [c[:2] for c in WIRE_CASES], ids=[c[2] for c in WIRE_CASES])
def test_wire_bytes_use_reference_numbers(message: Message, wire: dict[str, Any]) -> None:
    full_name = message.DESCRIPTOR.full_name
    data = message.SerializeToString(deterministic=True)

    assert wire_decode(data, full_name) == wire
    parsed = type(message).FromString(wire_encode(wire, full_name))
    assert parsed == message
    assert type(message).FromString(data) == message


def test_unset_share_id_is_absent_from_the_wire() -> None:
    device = dra_v1_pb2.Device(pool_name="node-a")

    assert not device.HasField("share_id")
    assert "share_id" not in wire_decode(device.SerializeToString(), "k8s.io.kubelet.pkg.apis.dra.v1.Device")


_text = st.text(max_size=20)


@given(
    request_names=st.lists(_text, max_size=3),
    pool_name=_text,
    device_name=_text,
    cdi_device_ids=st.lists(_text, max_size=3),
    share_id=st.none() | _text,
)
def test_any_v1_device_round_trips_through_reference_numbers(
    request_names: list[str],
    pool_name: str,
    device_name: str,
    cdi_device_ids: list[str],
    share_id: str | None,
) -> None:
    device = dra_v1_pb2.Device(
        request_names=request_names,
        pool_name=pool_name,
        device_name=device_name,
        cdi_device_ids=cdi_device_ids,
        share_id=share_id,
    )
    # proto3 leaves empty scalars and lists off the wire; share_id has presence.
    expected = {
        name: value
        for name, value in [
            ("request_names", request_names),
            ("pool_name", pool_name),
            ("device_name", device_name),
            ("cdi_device_ids", cdi_device_ids),
        ]
        if value
    }
    if share_id is not None:
        expected["share_id"] = share_id

    data = device.SerializeToString()
    assert wire_decode(data, "k8s.io.kubelet.pkg.apis.dra.v1.Device") == expected
    assert (
        dra_v1_pb2.Device.FromString(wire_encode(expected, "k8s.io.kubelet.pkg.apis.dra.v1.Device")) == device
    )


# ---------------------------------------------------------------------------------------------------------
# Live gRPC over unix sockets with the generated servicers and stubs


class _Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.statuses: list[pluginregistration_v1_pb2.RegistrationStatus] = []

    def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(
            type="DRAPlugin",
            name="gpu.example.com",
            endpoint="/plugins/gpu.example.com/dra.sock",
            supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"],
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.statuses.append(request)
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class _DraV1(dra_v1_pb2_grpc.DRAPluginServicer):  # type: ignore[misc]
    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return dra_v1_pb2.NodePrepareResourcesResponse(
            claims={
                claim.uid: dra_v1_pb2.NodePrepareResourceResponse(
                    devices=[
                        dra_v1_pb2.Device(
                            pool_name="node-a",
                            device_name="gpu-0",
                            cdi_device_ids=[f"k8s.gpu.example.com/claim={claim.uid}"],
                        )
                    ]
                )
                for claim in request.claims
            }
        )


class _DraV1beta1(dra_v1beta1_pb2_grpc.DRAPluginServicer):  # type: ignore[misc]
    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return dra_v1beta1_pb2.NodeUnprepareResourcesResponse(
            claims={claim.uid: dra_v1beta1_pb2.NodeUnprepareResourceResponse() for claim in request.claims}
        )


class _Health(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        for health in (dra_health_v1alpha1_pb2.HEALTHY, dra_health_v1alpha1_pb2.UNHEALTHY):
            yield dra_health_v1alpha1_pb2.NodeWatchResourcesResponse(
                devices=[
                    dra_health_v1alpha1_pb2.DeviceHealth(
                        device=dra_health_v1alpha1_pb2.DeviceIdentifier(
                            pool_name="node-a", device_name="gpu-0"
                        ),
                        health=health,
                    )
                ]
            )


@pytest.fixture
def sockets(tmp_path: Path) -> Iterator[tuple[grpc.Channel, grpc.Channel, _Registration]]:
    """Serves a registration socket and a DRA socket (v1, v1beta1, health) in-process; yields channels."""
    registration = _Registration()
    reg_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(registration, reg_server)
    reg_server.add_insecure_port(f"unix:{tmp_path / 'reg.sock'}")
    dra_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_DraV1(), dra_server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(_DraV1beta1(), dra_server)
    dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(_Health(), dra_server)
    dra_server.add_insecure_port(f"unix:{tmp_path / 'dra.sock'}")
    reg_server.start()
    dra_server.start()
    with (
        grpc.insecure_channel(f"unix:{tmp_path / 'reg.sock'}") as reg,
        grpc.insecure_channel(f"unix:{tmp_path / 'dra.sock'}") as dra,
    ):
        yield reg, dra, registration
    reg_server.stop(None)
    dra_server.stop(None)


def test_registration_get_info_and_notify(sockets: tuple[grpc.Channel, grpc.Channel, _Registration]) -> None:
    reg, _, registration = sockets
    stub = pluginregistration_v1_pb2_grpc.RegistrationStub(reg)

    info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=5)
    stub.NotifyRegistrationStatus(
        pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=5
    )

    assert (info.type, info.name, list(info.supported_versions)) == (
        "DRAPlugin",
        "gpu.example.com",
        ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"],
    )
    assert [s.plugin_registered for s in registration.statuses] == [True]


def test_dra_v1_prepare_over_the_stub(sockets: tuple[grpc.Channel, grpc.Channel, _Registration]) -> None:
    _, dra, _ = sockets
    stub = dra_v1_pb2_grpc.DRAPluginStub(dra)

    response = stub.NodePrepareResources(
        dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[
                dra_v1_pb2.Claim(namespace="team-a", uid="uid-1", name="c1"),
                dra_v1_pb2.Claim(namespace="team-a", uid="uid-2", name="c2"),
            ]
        ),
        timeout=5,
    )

    assert {uid: [d.cdi_device_ids[0] for d in r.devices] for uid, r in response.claims.items()} == {
        "uid-1": ["k8s.gpu.example.com/claim=uid-1"],
        "uid-2": ["k8s.gpu.example.com/claim=uid-2"],
    }


# The kubelet dials these exact HTTP/2 paths; calling them as raw strings proves the servicers register them.
RAW_CALLS = [
    (
        "/pluginregistration.Registration/GetInfo",
        pluginregistration_v1_pb2.InfoRequest(),
        _Registration().GetInfo(None, None),
    ),
    (
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(uid="uid-1")]),
        dra_v1_pb2.NodePrepareResourcesResponse(
            claims={
                "uid-1": dra_v1_pb2.NodePrepareResourceResponse(
                    devices=[
                        dra_v1_pb2.Device(
                            pool_name="node-a",
                            device_name="gpu-0",
                            cdi_device_ids=["k8s.gpu.example.com/claim=uid-1"],
                        )
                    ]
                )
            }
        ),
    ),
    (
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
        dra_v1beta1_pb2.NodeUnprepareResourcesRequest(claims=[dra_v1beta1_pb2.Claim(uid="uid-9")]),
        dra_v1beta1_pb2.NodeUnprepareResourcesResponse(
            claims={"uid-9": dra_v1beta1_pb2.NodeUnprepareResourceResponse()}
        ),
    ),
]


@pytest.mark.parametrize(
    ("path", "request_message", "expected"),
    RAW_CALLS,
    ids=["GetInfo", "v1-NodePrepareResources", "v1beta1-NodeUnprepareResources"],
)
def test_reference_method_paths_are_served(
    sockets: tuple[grpc.Channel, grpc.Channel, _Registration],
    path: str,
    request_message: Message,
    expected: Message,
) -> None:
    channel = sockets[0] if path.startswith("/pluginregistration.") else sockets[1]
    call = channel.unary_unary(
        path,
        request_serializer=type(request_message).SerializeToString,
        response_deserializer=type(expected).FromString,
    )

    assert call(request_message, timeout=5) == expected


def test_health_stream_over_the_stub(sockets: tuple[grpc.Channel, grpc.Channel, _Registration]) -> None:
    _, dra, _ = sockets
    stub = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(dra)
    raw = dra.unary_stream(
        "/v1alpha1.DRAResourceHealth/NodeWatchResources",
        request_serializer=dra_health_v1alpha1_pb2.NodeWatchResourcesRequest.SerializeToString,
        response_deserializer=dra_health_v1alpha1_pb2.NodeWatchResourcesResponse.FromString,
    )

    for call in (stub.NodeWatchResources, raw):
        responses = list(call(dra_health_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=5))
        assert [r.devices[0].health for r in responses] == [
            dra_health_v1alpha1_pb2.HEALTHY,
            dra_health_v1alpha1_pb2.UNHEALTHY,
        ]
