"""Decoding user-supplied opaque parameters into GpuConfig / MigDeviceConfig, with every problem named. Pure.

`gpudra validate` and the kubelet plugin both decode through here, so a config is judged the same way
before it is applied and at prepare.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Literal, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gpudra.api.v1beta1 import API_VERSION, KINDS, PER_DEVICE_LIMITS_FIELD, Advice, DeviceConfig
from gpudra.errors import ConfigError

_NVIDIA_API_VERSION = "resource.nvidia.com/v1beta1"
# The API server's limit for opaque parameters (on create); anything larger did not come through it.
MAX_PARAMETERS_BYTES = 10 * 1024
# A real GpuConfig nests 4 levels; the bound keeps every later step (pydantic, json.dumps for error
# messages) far from Python's recursion limit whatever a tenant nests.
MAX_PARAMETERS_DEPTH = 32


def decode_config(raw: Mapping[str, object] | bytes | str, *, field_prefix: str = "") -> DeviceConfig:
    """The normalized config that `raw` (a JSON object, or its JSON text) describes.

    Raises one ConfigError naming every problem: `field` is the first problem's full path
    (`field_prefix` + `.sharing.strategy`, ...), and the message lists the others after it.
    """
    decoded = _decode(raw, field_prefix)
    if isinstance(decoded, list):
        raise combined(decoded)
    return decoded


def config_advice(raw: Mapping[str, object] | bytes | str, *, field_prefix: str = "") -> list[Advice]:
    """What a valid config does otherwise than it may seem to (`Advice`, fields prefixed with
    `field_prefix`); empty when `raw` is invalid (its problems are `config_problems`)."""
    decoded = _decode(raw, field_prefix)
    if isinstance(decoded, list):
        return []
    return [replace(a, field=_path(field_prefix, [a.field])) for a in decoded.advice()]


def _depth_exceeds(value: object, limit: int) -> bool:
    """Whether `value` nests objects or arrays deeper than `limit`; iterative, so any depth is safe."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[object]
        if isinstance(item, Mapping):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _too_deep(prefix: str) -> ConfigError:
    return ConfigError(
        f"nests objects or arrays more than {MAX_PARAMETERS_DEPTH} levels deep; a GpuConfig needs 4",
        field=prefix or None,
    )


def _too_large(size: int, prefix: str) -> ConfigError:
    return ConfigError(
        f"is {size} bytes; at most {MAX_PARAMETERS_BYTES} allowed "
        "(the API server's limit for opaque parameters)",
        field=prefix or None,
    )


def combined(problems: Sequence[ConfigError]) -> ConfigError:
    """One ConfigError for several: the first one's field, and a message that lists the others after it."""
    first, *others = problems
    return ConfigError("; ".join([first.reason, *(str(other) for other in others)]), field=first.field)


def config_problems(raw: Mapping[str, object] | bytes | str, *, field_prefix: str = "") -> list[ConfigError]:
    """Every problem `decode_config` would report, one ConfigError per field; empty when `raw` is valid."""
    decoded = _decode(raw, field_prefix)
    return decoded if isinstance(decoded, list) else []


def _decode(raw: Mapping[str, object] | bytes | str, prefix: str) -> DeviceConfig | list[ConfigError]:
    if isinstance(raw, bytes | str):
        if len(raw) > MAX_PARAMETERS_BYTES:
            return [_too_large(len(raw), prefix)]
        try:
            raw = json.loads(raw)
        except RecursionError:
            return [_too_deep(prefix)]
        except ValueError as err:
            return [ConfigError(f"is not valid JSON: {err}", field=prefix or None)]
    if not isinstance(raw, Mapping):
        return [ConfigError("must be a JSON object (a GpuConfig or MigDeviceConfig)", field=prefix or None)]
    if _depth_exceeds(raw, MAX_PARAMETERS_DEPTH):
        return [_too_deep(prefix)]
    size = len(json.dumps(raw, separators=(",", ":"), default=str))
    if size > MAX_PARAMETERS_BYTES:
        return [_too_large(size, prefix)]

    problems = []
    api_version, kind = raw.get("apiVersion"), raw.get("kind")
    if api_version is None:
        problems.append(
            ConfigError(f"is required; must be {API_VERSION}", field=_path(prefix, ["apiVersion"]))
        )
    elif api_version != API_VERSION:
        hint = " (the fields are those of resource.nvidia.com/v1beta1: only the apiVersion differs)"
        message = f"must be {API_VERSION}{hint if api_version == _NVIDIA_API_VERSION else ''}"
        problems.append(ConfigError(message, field=_path(prefix, ["apiVersion"])))
    model = KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        required = "is required; " if kind is None else ""
        problems.append(
            ConfigError(f"{required}must be one of: {', '.join(KINDS)}", field=_path(prefix, ["kind"]))
        )
        return problems

    try:
        config = model.model_validate({key: value for key, value in raw.items() if key != "apiVersion"})
    except ValidationError as err:
        return problems + [_problem(model, detail, prefix) for detail in err.errors()]
    return problems or config.normalized()


def _problem(model: type[BaseModel], detail: ErrorDetails, prefix: str) -> ConfigError:
    loc = detail["loc"]
    field = _path(prefix, loc)
    match detail["type"]:
        case "gpudra":
            message = str((detail.get("ctx") or {})["reason"])
        case "extra_forbidden":
            allowed = [info.alias or name for name, info in _model_at(model, loc[:-1]).model_fields.items()]
            message = f"unknown field; the fields here are: {', '.join(allowed)}"
        case "missing":
            message = "is required"
            values = _literal_values(_model_at(model, loc[:-1]), loc[-1])
            if values:
                message += f"; must be one of: {', '.join(values)}"
        case "model_type" | "model_attributes_type" | "dict_type":
            message = "must be an object"
        case _:
            message = detail["msg"]
    return ConfigError(message, field=field)


def _path(prefix: str, loc: Sequence[int | str]) -> str:
    """A dotted field path; map keys and list indexes in brackets, as Kubernetes writes them."""
    path = prefix
    for index, part in enumerate(loc):
        if part == "[key]":
            continue
        if isinstance(part, int) or (index and loc[index - 1] == PER_DEVICE_LIMITS_FIELD):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel]:
    """The nested model that the field at `loc` (JSON names, from `model`) holds."""
    for part in loc:
        info = next(info for info in model.model_fields.values() if info.alias == part)
        model = next(
            arg for arg in get_args(info.annotation) if isinstance(arg, type) and issubclass(arg, BaseModel)
        )
    return model


def _literal_values(model: type[BaseModel], alias: int | str) -> tuple[str, ...]:
    info = next(info for info in model.model_fields.values() if info.alias == alias)
    return get_args(info.annotation) if get_origin(info.annotation) is Literal else ()
