"""What a manifest can still get wrong that the API server accepts and gpudra would silently not see:
what is left of NVIDIA's DRA driver in a claim moved to gpudra, a config for another driver on gpudra's
requests, a template without its `spec.spec` level, and bare config files. Pure.

`gpudra validate` reports these beside the config checks of `gpudra.model.manifests` (the admission
webhook's, which judges only gpudra's own config entries: a claim that still names NVIDIA's driver
never reaches it). The names follow docs/migrate.md's table of what changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from gpudra.api import config_problems
from gpudra.model.kube_api import GROUP
from gpudra.model.manifests import Problem
from gpudra.model.tolerant import items, mapping

NVIDIA_DRIVER = "gpu.nvidia.com"
NVIDIA_CONFIG_GROUP = "resource.nvidia.com"
# NVIDIA's DeviceClasses -> the kind of gpudra class that replaces each
NVIDIA_CLASSES = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig"}
CONFIG_KINDS = ("GpuConfig", "MigDeviceConfig")
CONFIG_GROUP = "resource.gpudra.io"
MIGRATE = "docs/migrate.md"
# Classic DRA (Kubernetes 1.26 to 1.30): resource.k8s.io/v1alpha2, and NVIDIA's parameter objects for it.
CLASSIC_VERSION = f"{GROUP}/v1alpha2"
NVIDIA_CLASSIC_GROUP = "gpu.resource.nvidia.com"
# Structured parameters' first version (Kubernetes 1.31): a claim's, a template's and a class's shape
# is v1beta1's, which no API server since 1.32 serves for them.
ALPHA3_VERSION = f"{GROUP}/v1alpha3"
ALPHA3_KINDS = ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass")


def classic(kind: object, api_version: str) -> str | None:
    """Why an object of classic DRA has no translation (None: it is not one)."""
    if api_version == CLASSIC_VERSION:
        return (
            f"{CLASSIC_VERSION} {kind} is classic DRA (Kubernetes 1.26 to 1.30: resourceClassName, "
            "parametersRef), which no API server since 1.31 serves and no rule rewrites exactly: write "
            f"the claim anew with structured parameters, a request of a gpudra DeviceClass and its "
            f"settings as an opaque {CONFIG_GROUP}/v1beta1 GpuConfig ({MIGRATE}, Classic DRA)"
        )
    if api_version.startswith(f"{NVIDIA_CLASSIC_GROUP}/"):
        return (
            f"{api_version} {kind} is a parameter object of NVIDIA's classic-DRA driver (before "
            "Kubernetes 1.31), which no driver reads now: its settings go into the claim's opaque "
            f"config, {CONFIG_GROUP}/v1beta1 GpuConfig or MigDeviceConfig ({MIGRATE}, Classic DRA)"
        )
    return None


def _alpha3(kind: object) -> str:
    return (
        f"{ALPHA3_VERSION} {kind} (Kubernetes 1.31) is served by no API server gpudra runs on (1.34+): "
        f"`gpudra migrate` rewrites it as {GROUP}/v1, the same fields ({MIGRATE}, Classic DRA)"
    )


def gpudra_classes(driver: str) -> dict[str, str]:
    """gpudra's DeviceClasses for `driver`, as the chart names them: form -> class name."""
    suffix = driver.removeprefix("gpu.")
    return {form: f"{form}.{suffix}" for form in ("gpu", "gpu-shared", "mig", "mig-shared")}


def migration_problems(docs: Iterable[tuple[str, Mapping[str, Any]]], *, driver: str) -> list[Problem]:
    """Every problem of the kinds above in the (file name, parsed object) pairs, `v1 List`s unpacked."""
    problems = []
    for file, document in docs:
        for prefix, obj in _objects(document, ""):
            problems += [Problem(file, label, prefix + at, why) for label, at, why in _check(obj, driver)]
    return problems


def _objects(obj: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    kind, items = obj.get("kind"), obj.get("items")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
        for index, item in enumerate(items):
            if isinstance(item, Mapping):
                yield from _objects(item, f"{prefix}items[{index}].")
        return
    yield prefix, obj


def _check(obj: Mapping[str, Any], driver: str) -> list[tuple[str, str, str]]:
    """(object label, field, message) for one object."""
    kind, api_version = obj.get("kind"), str(obj.get("apiVersion", ""))
    if kind in CONFIG_KINDS and api_version.startswith((f"{CONFIG_GROUP}/", f"{NVIDIA_CONFIG_GROUP}/")):
        # A config on its own, as a user drafts one before pasting it into a claim.
        return [(str(kind), err.field or "", err.reason) for err in config_problems(obj)]
    label = f"{kind} {_name(obj)}"
    why = classic(kind, api_version)
    if why is not None:
        return [(label, "apiVersion", why)]
    if api_version == ALPHA3_VERSION and kind in ALPHA3_KINDS:
        alpha3 = [(label, "apiVersion", _alpha3(kind))]
        return alpha3 + (_claim_problems(obj, str(kind), label, driver) if kind != "DeviceClass" else [])
    if not api_version.startswith(f"{GROUP}/") or kind not in ("ResourceClaim", "ResourceClaimTemplate"):
        return []
    return _claim_problems(obj, str(kind), label, driver)


def _claim_problems(obj: Mapping[str, Any], kind: str, label: str, driver: str) -> list[tuple[str, str, str]]:
    spec = mapping(obj.get("spec"))
    at = "spec"
    if kind == "ResourceClaimTemplate":
        if "spec" not in spec:
            found = "spec.devices" if "devices" in spec else "spec.spec"
            return [(label, found, _NO_SPEC_SPEC)]
        spec, at = mapping(spec.get("spec")), "spec.spec"
    devices = mapping(spec.get("devices"))
    return [(label, f"{at}.devices.{field}", message) for field, message in _devices(devices, driver)]


_NO_SPEC_SPEC = (
    "a ResourceClaimTemplate holds the claim's spec one level down: spec.spec.devices, not spec.devices "
    "(the API server drops or refuses the misplaced field, and pods get claims without devices)"
)


def _devices(devices: Mapping[str, Any], driver: str) -> list[tuple[str, str]]:
    classes = gpudra_classes(driver)
    ours = set(classes.values())
    found: list[tuple[str, str]] = []
    request_classes: dict[str, set[str]] = {}
    for index, item in enumerate(items(devices.get("requests"))):
        request = mapping(item)
        name = str(request.get("name", ""))
        for field, chosen in _choices(request):
            request_classes.setdefault(name, set()).add(str(chosen.get("deviceClassName", "")))
            leftovers = _request_leftovers(chosen, classes, driver)
            found += [(f"requests[{index}].{field}.{f}", m) for f, m in leftovers]
    for index, constraint in enumerate(items(devices.get("constraints"))):
        attribute = str(mapping(constraint).get("matchAttribute", ""))
        if attribute.startswith(f"{NVIDIA_DRIVER}/"):
            renamed = f"{driver}/{attribute.partition('/')[2]}"
            message = f"{_nvidia(attribute)}; gpudra's is {renamed}"
            found.append((f"constraints[{index}].matchAttribute", message))
    for index, entry in enumerate(items(devices.get("config"))):
        opaque = mapping(mapping(entry).get("opaque"))
        other = opaque.get("driver")
        if not isinstance(other, str) or other == driver:
            continue
        named = items(mapping(entry).get("requests"))
        targets = [str(n).partition("/")[0] for n in named] if named else list(request_classes)
        # NVIDIA's driver is a leftover wherever it is; another driver's config is for its own requests,
        # unless every request it applies to is gpudra's.
        only_ours = bool(targets) and all(
            request_classes.get(t) and request_classes[t] <= ours for t in targets
        )
        if other == NVIDIA_DRIVER or only_ours:
            found.append((f"config[{index}].opaque.driver", _foreign_config(other, driver, targets)))
    return found


def _choices(request: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """A request's device choices: `exactly`, or each of `firstAvailable`."""
    if isinstance(request.get("exactly"), Mapping):
        yield "exactly", request["exactly"]
    for index, sub in enumerate(items(request.get("firstAvailable"))):
        if isinstance(sub, Mapping):
            yield f"firstAvailable[{index}]", sub


def _request_leftovers(
    chosen: Mapping[str, Any], classes: Mapping[str, str], driver: str
) -> list[tuple[str, str]]:
    found = []
    name = chosen.get("deviceClassName")
    if name in NVIDIA_CLASSES:
        form = NVIDIA_CLASSES[str(name)]
        instead = f"{classes[form]} ({classes[form + '-shared']} for a share)"
        found.append(("deviceClassName", f"{_nvidia(str(name))}; gpudra's is {instead}"))
    for index, selector in enumerate(items(chosen.get("selectors"))):
        expression = str(mapping(mapping(selector).get("cel")).get("expression", ""))
        if f'"{NVIDIA_DRIVER}"' in expression or f"'{NVIDIA_DRIVER}'" in expression:
            found.append(
                (
                    f"selectors[{index}].cel.expression",
                    f"names {NVIDIA_DRIVER}, NVIDIA's DRA driver's attributes and capacities ({MIGRATE}); "
                    "gpudra's are under "
                    f'"{driver}" (this selector matches no gpudra device)',
                )
            )
    for index, toleration in enumerate(items(chosen.get("tolerations"))):
        key = str(mapping(toleration).get("key", ""))
        if key.startswith(f"{NVIDIA_DRIVER}/"):
            message = f"{key} is NVIDIA's DRA driver's taint ({MIGRATE}); gpudra's is gpudra.io/unhealthy"
            found.append((f"tolerations[{index}].key", message))
    return found


def _foreign_config(other: str, driver: str, targets: Sequence[str]) -> str:
    which = f"request(s) {', '.join(targets)}" if targets else "this claim"
    return (
        f"{other} is another driver's: gpudra ignores this config on {which}, without a word; gpudra's is "
        f"opaque.driver: {driver} with parameters.apiVersion: {CONFIG_GROUP}/v1beta1 ({MIGRATE})"
    )


def _nvidia(name: str) -> str:
    return f"{name} is NVIDIA's DRA driver's name ({MIGRATE})"


def _name(obj: Mapping[str, Any]) -> str:
    meta = mapping(obj.get("metadata"))
    name = meta.get("name") or "(no name)"
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else str(name)
