"""Checks of the gpudra configs in claim, template and class manifests. Pure.

`validate_documents` judges parsed objects (`gpudra.cli.manifest_files` reads them from files for
`gpudra validate FILE...`): each config entry whose `opaque.driver` is gpudra's must carry a
valid GpuConfig or MigDeviceConfig of at most 10 KiB, and in claims its `requests` must name requests of
the claim. Other drivers' entries and other kinds of objects are left alone. `document_warnings` says
what a valid config does otherwise than it may seem to (the webhook's warnings, `validate`'s warning
lines).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpudra.api import config_advice, config_problems
from gpudra.model.kube_api import GROUP

# Kubernetes' limit on opaque parameters (resource/v1 OpaqueParametersMaxLength).
MAX_PARAMETERS_BYTES = 10 * 1024

# kind -> path of its devices (requests and config) or, for a DeviceClass, of its spec (config only)
_DEVICES_AT = {
    "ResourceClaim": ("spec", "devices"),
    "ResourceClaimTemplate": ("spec", "spec", "devices"),
    "DeviceClass": ("spec",),
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong in one file. `object` and `field` are empty when the file itself is at fault."""

    file: str
    object: str  # "Kind namespace/name", or "Kind name" for cluster-scoped objects
    field: str  # e.g. spec.devices.config[0].opaque.parameters.sharing.strategy
    message: str

    def __str__(self) -> str:
        return ": ".join(part for part in (self.file, self.object, self.field, self.message) if part)


def validate_documents(docs: Iterable[tuple[str, Mapping[str, Any]]], *, driver: str) -> list[Problem]:
    """Every problem in the gpudra configs of the (file name, parsed object) pairs, `v1 List`s included."""
    problems: list[Problem] = []
    for file, label, at, entry, requests in _entries(docs, driver=driver):
        if isinstance(entry, str):  # the object's config list itself is wrong
            problems.append(Problem(file, label, at, entry))
            continue
        for field, message in _entry_problems(entry, driver=driver, requests=requests):
            problems.append(Problem(file, label, f"{at}.{field}", message))
    return problems


def document_warnings(docs: Iterable[tuple[str, Mapping[str, Any]]], *, driver: str) -> list[Problem]:
    """What the valid gpudra configs of the pairs do otherwise than they may seem to
    (`gpudra.api.Advice`: a MIG device's TimeSlicing sets nothing): the admission webhook's warnings,
    `gpudra validate`'s and `gpudra explain`'s warning lines. Invalid configs give none."""
    warnings: list[Problem] = []
    for file, label, at, entry, _ in _entries(docs, driver=driver):
        parameters = _parameters(entry, driver=driver)
        if parameters is None:
            continue
        for advice in config_advice(parameters, field_prefix="opaque.parameters"):
            warnings.append(Problem(file, label, f"{at}.{advice.field}", advice.message))
    return warnings


_Entry = tuple[str, str, str, object, set[str] | None]


def _entries(docs: Iterable[tuple[str, Mapping[str, Any]]], *, driver: str) -> Iterator[_Entry]:
    """(file, object label, the entry's field path, the config entry, the names its `requests` may
    use) for each config entry of each object; the entry is a message instead when the object's config
    list is not a list."""
    for file, document in docs:
        yield from _object_entries(document, file=file, prefix="")


def _object_entries(obj: Mapping[str, Any], *, file: str, prefix: str) -> Iterator[_Entry]:
    kind, items = obj.get("kind"), obj.get("items")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
        for index, item in enumerate(items):
            if isinstance(item, Mapping):
                yield from _object_entries(item, file=file, prefix=f"{prefix}items[{index}].")
        return
    api_version = obj.get("apiVersion")
    if not (isinstance(api_version, str) and api_version.startswith(f"{GROUP}/") and kind in _DEVICES_AT):
        return
    keys = _DEVICES_AT[kind]
    devices = _at(obj, keys)
    if devices is None:
        return
    label = f"{kind} {_name(obj)}"
    at = prefix + ".".join(keys)
    configs = devices.get("config") or []
    if not isinstance(configs, list):
        yield file, label, f"{at}.config", "must be a list", None
        return
    requests = None if kind == "DeviceClass" else _request_names(devices)
    for index, entry in enumerate(configs):
        yield file, label, f"{at}.config[{index}]", entry, requests


def _parameters(entry: object, *, driver: str) -> Mapping[str, Any] | None:
    """The entry's opaque parameters when it is an entry of `driver` that has them as an object."""
    if not isinstance(entry, Mapping):
        return None
    opaque = entry.get("opaque")
    if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
        return None
    parameters = opaque.get("parameters")
    return parameters if isinstance(parameters, Mapping) else None


def _entry_problems(entry: object, *, driver: str, requests: set[str] | None) -> list[tuple[str, str]]:
    """(field relative to the entry, message) for one config entry; none for other drivers' entries."""
    if not isinstance(entry, Mapping):
        return []
    opaque = entry.get("opaque")
    if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
        return []
    found = []
    if requests is not None:
        named = entry.get("requests") or []
        for index, name in enumerate(named if isinstance(named, list) else []):
            if name not in requests:
                listed = ", ".join(sorted(requests)) or "none"
                found.append(
                    (f"requests[{index}]", f"names no request of this claim; its requests are: {listed}")
                )
    parameters = opaque.get("parameters")
    if not isinstance(parameters, Mapping):
        message = "is required" if parameters is None else "must be a JSON object"
        found.append(("opaque.parameters", f"{message} (a GpuConfig or MigDeviceConfig)"))
        return found
    size = len(json.dumps(parameters, separators=(",", ":"), ensure_ascii=False, default=str).encode())
    if size > MAX_PARAMETERS_BYTES:
        found.append(("opaque.parameters", f"is {size} bytes as JSON; must be at most 10 KiB (10240 bytes)"))
    for err in config_problems(parameters, field_prefix="opaque.parameters"):
        found.append((err.field or "opaque.parameters", err.reason))
    return found


def _request_names(devices: Mapping[str, Any]) -> set[str]:
    """What a config's `requests` may name: each request, and `request/subrequest` for firstAvailable."""
    names = set()
    for request in devices.get("requests") or []:
        if isinstance(request, Mapping) and isinstance(request.get("name"), str):
            names.add(request["name"])
            for sub in request.get("firstAvailable") or []:
                if isinstance(sub, Mapping) and isinstance(sub.get("name"), str):
                    names.add(f"{request['name']}/{sub['name']}")
    return names


def _at(obj: Mapping[str, Any], keys: Sequence[str]) -> Mapping[str, Any] | None:
    for key in keys:
        value = obj.get(key)
        if not isinstance(value, Mapping):
            return None
        obj = value
    return obj


def _name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name = metadata.get("name") or (
        f"{metadata['generateName']}*" if metadata.get("generateName") else "(no name)"
    )
    namespace = metadata.get("namespace")
    return f"{namespace}/{name}" if namespace else str(name)
