"""Writes deploy/helm/gpudra/values.schema.json from the daemons' own options (`make chart-schema`).

`kubeletPlugin.options` and `controller.options` in the chart's values are `gpudra kubelet-plugin` and
`gpudra controller` options in camelCase, passed as GPUDRA_<OPTION> variables. Their schema is made
from the options' declarations (gpudra.options.declared: the same ones the command line is made from),
so a new option is settable in the chart after one `make chart-schema`, and
`helm install` refuses a misspelt one (additionalProperties: false) with the field's name. Each value's
rule is its option type's (`gpudra.options.types`), the one the binary parses it with: a value the
pods would refuse at start (and crash-loop on) is refused by `helm install` instead. Options the
chart sets itself (paths it mounts, ports its probes use, names it gives) are left out on purpose:
each declares how the chart sets it, collected in CHART_OWNED. tests/unit/repo/test_chart_schema.py
checks the file is current.

Usage: python scripts/gen_chart_schema.py [--check]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gpudra.controller.options import ControllerOptions
from gpudra.node.options import PluginOptions
from gpudra.options import declared

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "deploy" / "helm" / "gpudra" / "values.schema.json"

_DECLARED: dict[str, type] = {"kubelet-plugin": PluginOptions, "controller": ControllerOptions}
_VALUES_KEY = {"kubelet-plugin": "kubeletPlugin", "controller": "controller"}


def options(command: str) -> dict[str, declared.Option]:
    """`command`'s options by flag (without the dashes), as declared in its options class."""
    return {found.flag: found for found in declared.options_of(_DECLARED[command])}


# Options the chart's templates set from their own values or the pod's downward API, and how: each
# declares it (`option(..., chart=...)`).
CHART_OWNED: dict[str, dict[str, str]] = {
    command: {flag: found.chart for flag, found in options(command).items() if found.chart is not None}
    for command in _DECLARED
}


def camel(option: str) -> str:
    head, *rest = option.split("-")
    return head + "".join(word.capitalize() for word in rest)


def _property(found: declared.Option) -> dict[str, Any]:
    """One option's schema: its help as the description, and the rule of its value type
    (`gpudra.options.types`), the one the binary checks the value with."""
    return {"description": found.help, **found.type.schema()}


def _mig_profiles_need_partitionable(field: str = "migProfiles") -> dict[str, Any]:
    """--mig-profiles (or --mig-share-profiles) with anything in it needs --mig-mode partitionable
    (gpudra.cli refuses it otherwise): the same rule across the two options."""
    return {
        "if": {
            "properties": {field: {"type": "string", "pattern": "[^\\s,]"}},
            "required": [field],
        },
        "then": {
            "properties": {"migMode": {"const": "partitionable"}},
            "required": ["migMode"],
        },
    }


def _partitionable_rules(props: dict[str, Any]) -> dict[str, Any]:
    """The rules above for the options `props` has: one as `if`/`then`, two under `allOf`."""
    rules = [_mig_profiles_need_partitionable(f) for f in ("migProfiles", "migShareProfiles") if f in props]
    if len(rules) == 1:
        return rules[0]
    return {"allOf": rules} if rules else {}


def schema() -> dict[str, Any]:
    sections: dict[str, Any] = {}
    for command, key in _VALUES_KEY.items():
        owned = CHART_OWNED[command]
        props = {camel(o): _property(f) for o, f in sorted(options(command).items()) if o not in owned}
        sections[key] = {
            "type": "object",
            "properties": {
                "options": {
                    "description": f"`gpudra {command}` options in camelCase; null keeps the CLI default",
                    "type": "object",
                    "additionalProperties": False,
                    "properties": props,
                    **_partitionable_rules(props),
                }
            },
        }
    return {
        "$schema": "https://json-schema.org/draft-07/schema#",
        "title": "gpudra Helm values",
        "type": "object",
        "additionalProperties": False,
        "required": ["driverName", "image", "kubeletPlugin", "controller"],
        "properties": {
            "driverName": {
                "description": "the DRA driver name (DeviceClasses, slices, configs)",
                "type": "string",
                "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$",
                "maxLength": 63,
            },
            "image": {
                "type": "object",
                "additionalProperties": False,
                "required": ["repository"],
                "properties": {
                    "repository": {"type": "string", "minLength": 1},
                    "tag": {"type": "string"},
                    "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                },
            },
            "imagePullSecrets": {"type": "array", "items": {"type": "object"}},
            "kubeletPlugin": _merge(
                sections["kubeletPlugin"],
                {
                    "additionalProperties": False,
                    "required": ["options", "kubeletDir", "cdiDir", "driverRoot", "port"],
                    "properties": {
                        "kubeletDir": _absolute_path("the kubelet's root directory on the nodes"),
                        "cdiDir": _absolute_path("where CDI specs are written on the nodes"),
                        "driverRoot": _absolute_path("the NVIDIA driver's root on the nodes"),
                        "port": _port("/metrics, /livez, /readyz"),
                        "priorityClassName": {"type": "string"},
                        **_scheduling(),
                        "updateStrategy": {"type": "object"},
                    },
                },
            ),
            "mpsHost": {
                "type": "object",
                "additionalProperties": False,
                "required": ["enabled"],
                "properties": {
                    "enabled": {"type": "boolean"},
                    "renewForVersion": {
                        "type": "string",
                        "description": "the chart version whose upgrade renders its own pod template",
                    },
                    "resources": {"type": "object"},
                },
            },
            "controller": _merge(
                sections["controller"],
                {
                    "additionalProperties": False,
                    "required": ["enabled", "options", "webhookPort", "port"],
                    "properties": {
                        "enabled": {"type": "boolean"},
                        "replicas": {"type": "integer", "minimum": 0},
                        "webhookPort": _port(
                            "HTTPS: admission reviews; /status and the GPU map for a bearer token"
                        ),
                        "port": _port("HTTP: /metrics, /livez, /readyz"),
                        **_scheduling(),
                    },
                },
            ),
            "deviceClasses": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    **{k: {"type": "boolean"} for k in ("gpu", "shared", "mig", "migShared")},
                    "migProfiles": {
                        "description": "MIG profiles that get a DeviceClass of their own (quota by size)",
                        "type": "array",
                        "items": {"type": "string", "pattern": r"^[1-7]g\.[0-9]+gb(\+[a-z.]+|-me)?$"},
                        "uniqueItems": True,
                    },
                },
            },
            "extendedResource": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean"},
                    "name": {
                        "description": "the extended resource pods ask for (a domain-prefixed name)",
                        "type": "string",
                        "pattern": r"^[a-z0-9.-]+/[A-Za-z0-9._-]+$",
                    },
                },
            },
            "nodeRestriction": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"enabled": {"type": "boolean"}},
            },
            "networkPolicy": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean"},
                    "httpFrom": {
                        "description": "NetworkPolicy peers (ipBlock, namespaceSelector, podSelector) "
                        "allowed to the HTTP ports",
                        "type": "array",
                        "items": {"type": "object"},
                    },
                    "webhookFrom": {
                        "description": "NetworkPolicy peers allowed to the controller's webhook port "
                        "(empty: every address): the API server's, where known",
                        "type": "array",
                        "items": {"type": "object"},
                    },
                    "prometheusFrom": {
                        "description": "NetworkPolicy peers allowed to the HTTP ports while "
                        "monitoring.monitors.enabled: where that Prometheus runs",
                        "type": "array",
                        "items": {"type": "object"},
                    },
                },
            },
            "monitoring": _monitoring(),
        },
    }


def _monitoring() -> dict[str, Any]:
    labels = {"type": "object", "additionalProperties": {"type": "string"}}
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "monitors": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean"},
                    "interval": {
                        "description": "the scrape interval, a Prometheus duration",
                        "type": "string",
                        "pattern": "^([0-9]+(ms|s|m|h))+$",
                    },
                    "labels": labels,
                },
            },
            "rules": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean"},
                    "labels": labels,
                    "idleAlertSeconds": {
                        "description": "GpudraAllocatedGpuIdle fires for a device idle longer than this",
                        "type": "integer",
                        "minimum": 1,
                    },
                    "runbookUrl": {
                        "description": "docs/troubleshooting.md as your users reach it",
                        "type": "string",
                    },
                },
            },
            "dashboard": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean"},
                    "labels": labels,
                    "annotations": labels,
                    "namespace": {"type": "string"},
                },
            },
        },
    }


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    return {
        **base,
        **{k: v for k, v in extra.items() if k != "properties"},
        "properties": {**base["properties"], **extra["properties"]},
    }


def _absolute_path(description: str) -> dict[str, Any]:
    return {"description": description, "type": "string", "pattern": "^/"}


def _port(description: str) -> dict[str, Any]:
    return {"description": description, "type": "integer", "minimum": 1, "maximum": 65535}


def _scheduling() -> dict[str, Any]:
    return {
        # null removes the default (Helm merges maps, so {} would keep it); `helm upgrade --reuse-values`
        # validates the null as given.
        "affinity": {"type": ["object", "null"]},
        "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
        "tolerations": {"type": "array", "items": {"type": "object"}},
        "resources": {"type": "object"},
        "podAnnotations": {"type": "object", "additionalProperties": {"type": "string"}},
    }


def render() -> str:
    return json.dumps(schema(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    if "--check" in argv:
        if SCHEMA.read_text() != render():
            print(f"{SCHEMA.relative_to(REPO)} is stale: run make chart-schema", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
