"""What `gpudra migrate` rewrites, and how. Pure: parsed objects in, parsed objects out.

Two sources of manifests move to gpudra:

- NVIDIA's DRA driver: claims, templates and DeviceClasses naming its classes (`gpu.nvidia.com`,
  `mig.nvidia.com`), its attribute domain in CEL selectors and `matchAttribute`, its opaque configs
  (`resource.nvidia.com/v1beta1`) and its device taints in tolerations. Both drivers publish the same
  attribute names and gpudra's config kinds keep NVIDIA's fields, so most of this is renaming
  (docs/migrate.md, "What changes in every manifest").
- NVIDIA's device plugin: pods, workloads and pod templates whose containers ask `nvidia.com/gpu`,
  `nvidia.com/mig-<profile>` or a shared resource the plugin's config names. Each distinct ask becomes
  a ResourceClaimTemplate, and the pod spec names it (`spec.resourceClaims`, the container's
  `resources.claims`) instead of the extended resource. Each container gets claims of its own, as the
  device plugin gave each container devices of its own, except a regular init container asking what an
  app container asks: it names that container's claim, since its devices were the app container's
  afterwards (a restartable sidecar runs beside the app containers and keeps its own).

What has no gpudra equivalent is left exactly as it was and reported (`Remark`: the field and
why), so the output never means something else than the input without a word; a whole object is
rewritten or left alone per part, never dropped.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpudra.api import config_problems
from gpudra.errors import ConfigError
from gpudra.migrate.migration import (
    ALPHA3_VERSION,
    CONFIG_GROUP,
    NVIDIA_CONFIG_GROUP,
    NVIDIA_DRIVER,
    classic,
    gpudra_classes,
)
from gpudra.model.devices import SHARED_ATTRIBUTE, dns_label
from gpudra.model.kube_api import API_VERSION, GROUP
from gpudra.model.tolerant import items, mapping

GIB = 1024**3
MigStrategy = Literal["none", "single", "mixed"]
MIG_STRATEGIES: tuple[MigStrategy, ...] = ("none", "single", "mixed")
SharingStrategy = Literal["TimeSlicing", "MPS"]

PLAIN_GPU = "nvidia.com/gpu"
_MIG_RESOURCE = re.compile(r"nvidia\.com/mig-(?P<profile>[0-9]+c?\.?[0-9]*g\.[0-9]+gb(\+[a-z]+)*)")
# NVIDIA's taint keys (docs/migrate.md's table) -> gpudra's
UNHEALTHY_TAINT = "gpudra.io/unhealthy"
_NVIDIA_TAINTS = ("gpu.nvidia.com/xid", "gpu.nvidia.com/gpu-lost")

# Attributes NVIDIA's driver publishes that gpudra publishes under the same name in its own domain
_SAME_ATTRIBUTES = frozenset(
    (
        "type",
        "uuid",
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
        "profile",
        "parentUUID",
        "index",  # NVIDIA's before v25.8; the same meaning (the NVML index)
        "minor",
    )
)
_STANDARD = "resource.kubernetes.io"
# NVIDIA's older `pcieBusID` is the standard attribute now, in both drivers
_TO_STANDARD = {"pcieBusID": "pciBusID"}
# The standard attributes NVIDIA's manifests name (`resource.kubernetes.io/numaNode`, pciBusID,
# pcieRoot) are gpudra's too, under the same names: they stay as they are.
_SAME_CAPACITIES = frozenset(
    ("memory", "multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")
)
_REFERENCE = re.compile(
    r"""device\.(?P<what>attributes|capacity)\[\s*(?P<q>["'])(?P<domain>[a-z0-9.-]+)(?P=q)\s*\]"""
    r"""(?:\.(?P<name>[A-Za-z_][A-Za-z0-9_]*)|\[\s*(?P<q2>["'])(?P<quoted>[^"']+)(?P=q2)\s*\])?"""
)
_WHOLE_GPU = re.compile(r"""\.type\s*==\s*["']gpu["']""")
_DRIVER_LITERAL = re.compile(r"""(?P<q>["'])gpu\.nvidia\.com(?P=q)""")

# Pod templates of the workload kinds, by path
_POD_SPECS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
_CONTAINER_LISTS = ("initContainers", "containers")
_MAX_NAME = 63


# --- the device plugin's config -------------------------------------------------------------------


@dataclass(frozen=True)
class Replicated:
    """One resource the device plugin shares: `replicas` pods per device of `resource`."""

    strategy: SharingStrategy
    resource: str  # what is shared: nvidia.com/gpu or nvidia.com/mig-<profile>
    replicas: int
    all_devices: bool  # `devices` is all (the default), not some of the node's GPUs


@dataclass(frozen=True)
class DevicePlugin:
    """What the device plugin's config says about the resources pods ask for."""

    mig_strategy: MigStrategy = "none"
    shared: Mapping[str, Replicated] = field(default_factory=dict)  # advertised name -> what it shares


_TOP_FIELDS = ("version", "flags", "resources", "sharing", "imex")
_SHARING_FIELDS = {"timeSlicing": "TimeSlicing", "mps": "MPS"}
_REPLICATED_FIELDS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
_RESOURCE_FIELDS = ("name", "rename", "replicas", "devices")
_RESOURCE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def device_plugin_config(raw: object, *, mig_strategy: MigStrategy | None = None) -> DevicePlugin:
    """The device plugin's config file (`version: v1`, as its chart's ConfigMap holds it), checked;
    ConfigError names the field and what is allowed. `mig_strategy` overrides `flags.migStrategy`."""
    config = _mapping(raw, "", "the device plugin's config (version: v1, flags, sharing)")
    _known(config, "", _TOP_FIELDS)
    if config.get("version", "v1") != "v1":
        raise ConfigError(f"{config.get('version')!r} is not v1, the only version", field="version")
    flags = _mapping(config.get("flags", {}), "flags", "a mapping")
    strategy = flags.get("migStrategy", "none")
    if strategy not in MIG_STRATEGIES:
        raise ConfigError(
            f"{strategy!r} is not one of {', '.join(MIG_STRATEGIES)}", field="flags.migStrategy"
        )
    sharing = _mapping(config.get("sharing", {}), "sharing", "a mapping")
    _known(sharing, "sharing", tuple(_SHARING_FIELDS))
    if len(sharing) > 1:
        raise ConfigError("timeSlicing and mps exclude each other: give one", field="sharing")
    shared: dict[str, Replicated] = {}
    for key, value in sharing.items():
        shared.update(_replicated(value, f"sharing.{key}", _SHARING_FIELDS[key]))
    return DevicePlugin(mig_strategy=mig_strategy or strategy, shared=shared)


def _replicated(raw: object, at: str, strategy: Any) -> dict[str, Replicated]:
    section = _mapping(raw, at, "a mapping")
    _known(section, at, _REPLICATED_FIELDS)
    rename_by_default = section.get("renameByDefault", False)
    for flag in ("renameByDefault", "failRequestsGreaterThanOne"):
        if not isinstance(section.get(flag, False), bool):
            raise ConfigError(f"{section[flag]!r} is not true or false", field=f"{at}.{flag}")
    resources = section.get("resources")
    if not isinstance(resources, list) or not resources:
        raise ConfigError("is required: a list of {name, replicas}", field=f"{at}.resources")
    found = {}
    for index, item in enumerate(resources):
        where = f"{at}.resources[{index}]"
        resource = _mapping(item, where, "a mapping of name, rename, replicas, devices")
        _known(resource, where, _RESOURCE_FIELDS)
        name = resource.get("name")
        if name != PLAIN_GPU and not (isinstance(name, str) and _MIG_RESOURCE.fullmatch(name)):
            allowed = f"{PLAIN_GPU} or nvidia.com/mig-<profile> (the only resources the device plugin shares)"
            raise ConfigError(f"{name!r} is not {allowed}", field=f"{where}.name")
        replicas = resource.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise ConfigError(f"{replicas!r} is not a whole number >= 1", field=f"{where}.replicas")
        rename = resource.get("rename")
        if rename is not None and not (isinstance(rename, str) and _RESOURCE_NAME.fullmatch(rename)):
            raise ConfigError(
                f"{rename!r} is not a resource name (e.g. nvidia.com/gpu.shared)", field=f"{where}.rename"
            )
        advertised = rename or (f"{name}.shared" if rename_by_default else name)
        found[advertised] = Replicated(strategy, name, replicas, resource.get("devices", "all") == "all")
    return found


def _mapping(value: object, at: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"must be {what}, not {type(value).__name__}", field=at or None)
    return value


def _known(value: Mapping[str, Any], at: str, allowed: tuple[str, ...]) -> None:
    for key in value:
        if key not in allowed:
            where = f"{at}.{key}" if at else str(key)
            raise ConfigError(f"is not a field here; the fields are: {', '.join(allowed)}", field=where)


# --- what a translation returns ---------------------------------------------------------------------


# NVIDIA's classes whose devices its ConsumableShares share by memory -> gpudra's form of them
_SHAREABLE = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig"}
_SHARES_OF = {"gpu": "shares", "mig": "shares of a MIG partition"}


@dataclass(frozen=True)
class Remark:
    """Where in an object, and what of it: why it was left as it was (untranslated), or what a reader
    of the translation should know (a note)."""

    field: str
    reason: str
    object: str = ""  # "Kind namespace/name" of a List's item; empty: the object translated


@dataclass
class Translation:
    """One object's translation: `obj` is None when nothing changed; `added` are the new objects
    (ResourceClaimTemplates) it needs, to be written before it; `notes` are translations a reader
    should know the limits of; `untranslated` what was left as it was."""

    obj: dict[str, Any] | None = None
    added: list[dict[str, Any]] = field(default_factory=list)
    untranslated: list[Remark] = field(default_factory=list)
    notes: list[Remark] = field(default_factory=list)


@dataclass(frozen=True)
class TranslationOptions:
    driver: str = "gpu.gpudra.io"
    device_plugin: DevicePlugin | None = None  # None: no config given (replicas and renames unknown)
    gpu_memory: int | None = None  # bytes of the GPUs that replicas divide; None: not given
    # replicas as shares by count (`shares: 1`, the node's --shares-per-gpu set to the replicas) instead
    # of shares of memory / replicas
    by_count: bool = False


def translate(
    obj: Mapping[str, Any], options: TranslationOptions, made: set[tuple[str | None, str]] | None = None
) -> Translation:
    """The gpudra equivalent of one parsed object (`v1 List`s: each item). `made` holds the (namespace,
    name) of the templates made so far, which are not made again; the new ones are added to it."""
    done = Translation()
    _Translator(options, done, "", set() if made is None else made).one(copy.deepcopy(dict(obj)), obj)
    return done


@dataclass
class _Translator:
    options: TranslationOptions
    done: Translation
    prefix: str  # the path of the object inside a List
    made: set[tuple[str | None, str]]

    def left(self, at: str, reason: str) -> None:
        self.done.untranslated.append(Remark(self.prefix + at, reason))

    def one(self, new: dict[str, Any], old: Mapping[str, Any]) -> None:
        kind, items = str(new.get("kind", "")), new.get("items")
        if kind.endswith("List") and isinstance(items, list):
            self.items(new, items)
        elif self.rewrite(new) and new != old:
            self.done.obj = new

    def items(self, new: dict[str, Any], items: list[Any]) -> None:
        result: list[Any] = []
        changed = False
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                result.append(item)
                continue
            inner = Translation()
            _Translator(self.options, inner, f"{self.prefix}items[{index}].", self.made).one(
                copy.deepcopy(item), item
            )
            named = label(item)
            self.done.untranslated += [dataclasses.replace(r, object=named) for r in inner.untranslated]
            self.done.notes += [dataclasses.replace(r, object=named) for r in inner.notes]
            result += [*inner.added, inner.obj if inner.obj is not None else item]
            changed = changed or inner.obj is not None or bool(inner.added)
        if changed:
            new["items"] = result
            self.done.obj = new

    def rewrite(self, obj: dict[str, Any]) -> bool:
        """Rewrites `obj` in place; False when it is of no kind this module translates."""
        kind, api_version = obj.get("kind"), str(obj.get("apiVersion", ""))
        why = classic(kind, api_version)
        if why is not None:
            self.left("apiVersion", why)
            return False
        if api_version.startswith(f"{GROUP}/") and kind in ("ResourceClaim", "ResourceClaimTemplate"):
            self.claim(obj, str(kind))
            return True
        if api_version.startswith(f"{GROUP}/") and kind == "DeviceClass":
            self.device_class(obj)
            return True
        if kind in _POD_SPECS:
            self.workload(obj, str(kind))
            return True
        if api_version.startswith(f"{NVIDIA_CONFIG_GROUP}/"):
            self.left("kind", f"{api_version} {kind} is NVIDIA's DRA driver's own object: {_NO_KIND}")
        return False

    # --- NVIDIA's DRA driver ---------------------------------------------------------------------

    def claim(self, obj: dict[str, Any], kind: str) -> None:
        spec = obj.get("spec")
        at = "spec"
        if kind == "ResourceClaimTemplate" and isinstance(spec, dict):
            spec, at = spec.get("spec"), "spec.spec"
        devices = spec.get("devices") if isinstance(spec, dict) else None
        if not isinstance(devices, dict):
            return
        before = copy.deepcopy(devices)
        alpha3 = obj.get("apiVersion") == ALPHA3_VERSION  # v1beta1's shape, served by no 1.34+
        beta1 = alpha3 or obj.get("apiVersion") == f"{GROUP}/v1beta1"
        self.devices(devices, f"{at}.devices", beta1=beta1)
        if devices != before or alpha3:
            obj["apiVersion"] = API_VERSION
            if beta1:
                _to_v1(devices)
            obj.pop("status", None)  # an allocation of NVIDIA's devices, which gpudra never made

    def devices(self, devices: dict[str, Any], at: str, *, beta1: bool) -> bool:
        """Translates a claim's `devices`; True when it names NVIDIA's driver anywhere."""
        nvidia = False
        for index, request in enumerate(items(devices.get("requests"))):
            if not isinstance(request, dict):
                continue
            where = f"{at}.requests[{index}]"
            for sub, chosen in _choices(request, beta1=beta1):
                nvidia = self.choice(chosen, f"{where}{sub}") or nvidia
        for index, constraint in enumerate(items(devices.get("constraints"))):
            for key in ("matchAttribute", "distinctAttribute"):
                name = constraint.get(key) if isinstance(constraint, dict) else None
                if isinstance(name, str) and (name.startswith(f"{NVIDIA_DRIVER}/") or nvidia):
                    renamed = self.qualified(name, f"{at}.constraints[{index}].{key}")
                    if renamed is not None:
                        constraint[key] = renamed
        for index, entry in enumerate(items(devices.get("config"))):
            nvidia = self.config(entry, f"{at}.config[{index}]") or nvidia
        return nvidia

    def choice(self, chosen: dict[str, Any], at: str) -> bool:
        name = chosen.get("deviceClassName")
        classes = gpudra_classes(self.options.driver)
        nvidia = isinstance(name, str) and name.endswith(".nvidia.com")
        if name in _SHAREABLE:
            form = _SHAREABLE[name]
            capacity = mapping(chosen.get("capacity")).get("requests")
            others = ", ".join(sorted(set(mapping(capacity)) - {"memory", "shares"}))
            if not capacity:
                chosen["deviceClassName"] = classes[form]
            elif others:
                self.left(
                    f"{at}.capacity.requests",
                    f"asks {others} of a {form.upper()} share (NVIDIA's ConsumableShares); gpudra's "
                    f"{_SHARES_OF[form]} ({form}-shared) are asked by memory and by shares only",
                )
            else:
                # NVIDIA's ConsumableShares by memory or by count (its --consumable-shares=N): gpudra's
                # share of a GPU, or of a MIG partition, which a node offers only for the profiles it is
                # told to (each costs the scheduler)
                chosen["deviceClassName"] = classes[f"{form}-shared"]
                if "shares" in mapping(capacity):
                    self.done.notes.append(
                        Remark(
                            self.prefix + f"{at}.capacity.requests.shares",
                            "shares by count (NVIDIA's --consumable-shares=N): the nodes need "
                            "kubeletPlugin.options.sharesPerGpu set to that N (and shares: on), which "
                            "gives a share that names no memory 1/N of the GPU's (docs/migrate.md)",
                        )
                    )
                if form == "mig":
                    self.done.notes.append(
                        Remark(
                            self.prefix + f"{at}.capacity.requests",
                            "a share of a MIG device (NVIDIA's ConsumableShares): the nodes need the profile "
                            "in kubeletPlugin.options.migShareProfiles (with migMode: partitionable) "
                            "(docs/migrate.md)",
                        )
                    )
        elif nvidia:
            self.left(f"{at}.deviceClassName", _NO_CLASS.get(str(name), f"{name} has no gpudra equivalent"))
        for index, selector in enumerate(items(chosen.get("selectors"))):
            cel = mapping(mapping(selector).get("cel"))
            expression = cel.get("expression")
            if isinstance(expression, str) and (nvidia or NVIDIA_DRIVER in expression):
                nvidia = True
                renamed = self.cel(expression, f"{at}.selectors[{index}].cel.expression")
                if renamed is not None:
                    selector["cel"]["expression"] = renamed
        for toleration in items(chosen.get("tolerations")):
            if isinstance(toleration, dict) and toleration.get("key") in _NVIDIA_TAINTS:
                toleration["key"] = UNHEALTHY_TAINT
                nvidia = True
        if isinstance(chosen.get("tolerations"), list):
            chosen["tolerations"] = _unique(chosen["tolerations"])
        return nvidia

    def cel(self, expression: str, at: str) -> str | None:
        """The expression with NVIDIA's domain and driver renamed; None (and reported) when it
        names what gpudra does not publish."""
        missing: list[str] = []

        def rename(match: re.Match[str]) -> str:
            domain, name = match["domain"], match["name"] or match["quoted"]
            what, quote = match["what"], match["q"]
            if domain == NVIDIA_DRIVER:
                if name is None:
                    return f"device.{what}[{quote}{self.options.driver}{quote}]"
                if what == "attributes" and name in _TO_STANDARD:
                    return f"device.attributes[{quote}{_STANDARD}{quote}].{_TO_STANDARD[name]}"
                known = _SAME_ATTRIBUTES if what == "attributes" else _SAME_CAPACITIES
                if name in known:
                    return f"device.{what}[{quote}{self.options.driver}{quote}].{name}"
                missing.append(f"{'attribute' if what == 'attributes' else 'capacity'} {name}")
            return match[0]

        renamed = _REFERENCE.sub(rename, expression)
        renamed = _DRIVER_LITERAL.sub(lambda m: f"{m['q']}{self.options.driver}{m['q']}", renamed)
        if missing:
            self.left(
                at, f"names NVIDIA's {', '.join(missing)}, which gpudra does not publish (docs/migrate.md)"
            )
            return None
        if NVIDIA_DRIVER in renamed:
            self.left(at, f"names {NVIDIA_DRIVER} where migrate cannot tell what it stands for")
            return None
        return renamed

    def qualified(self, name: str, at: str) -> str | None:
        """A `domain/attribute` name in a constraint, renamed."""
        domain, _, attribute = name.partition("/")
        if domain == NVIDIA_DRIVER and attribute in _TO_STANDARD:
            return f"{_STANDARD}/{_TO_STANDARD[attribute]}"
        if domain == NVIDIA_DRIVER and attribute in _SAME_ATTRIBUTES:
            return f"{self.options.driver}/{attribute}"
        if domain == NVIDIA_DRIVER:
            self.left(at, f"{name}: gpudra publishes no attribute {attribute} (docs/migrate.md)")
        return None

    def config(self, entry: object, at: str) -> bool:
        opaque = mapping(mapping(entry).get("opaque"))
        if opaque.get("driver") != NVIDIA_DRIVER:
            return False
        parameters = opaque.get("parameters")
        api_version = str(mapping(parameters).get("apiVersion", ""))
        kind = mapping(parameters).get("kind")
        if api_version != f"{NVIDIA_CONFIG_GROUP}/v1beta1" or kind not in ("GpuConfig", "MigDeviceConfig"):
            self.left(
                f"{at}.opaque.parameters",
                f"{api_version or '(no apiVersion)'} {kind}: only NVIDIA's GpuConfig and MigDeviceConfig "
                "have gpudra equivalents (docs/migrate.md, What gpudra has no equivalent for)",
            )
            return True
        renamed = {**mapping(parameters), "apiVersion": f"{CONFIG_GROUP}/v1beta1"}
        problems = config_problems(renamed, field_prefix=f"{at}.opaque.parameters")
        for problem in problems:
            self.left(problem.field or f"{at}.opaque.parameters", f"gpudra refuses it: {problem.reason}")
        if not problems:
            opaque["driver"] = self.options.driver  # type: ignore[index]
            opaque["parameters"] = renamed  # type: ignore[index]
        return True

    def device_class(self, obj: dict[str, Any]) -> None:
        name = str(mapping(obj.get("metadata")).get("name", ""))
        if obj.get("apiVersion") == ALPHA3_VERSION:
            obj["apiVersion"] = API_VERSION  # a class's fields are the same in v1
        spec = obj.get("spec")
        if not isinstance(spec, dict) or NVIDIA_DRIVER not in repr(spec):
            return
        if name.endswith(".nvidia.com"):
            self.left(
                "metadata.name",
                f"{name} is one of NVIDIA's own classes, which its chart installs; gpudra's chart installs "
                f"{', '.join(gpudra_classes(self.options.driver).values())}",
            )
            return
        whole = False
        for index, selector in enumerate(items(spec.get("selectors"))):
            cel = mapping(mapping(selector).get("cel"))
            if isinstance(cel.get("expression"), str):
                whole = whole or bool(_WHOLE_GPU.search(cel["expression"]))
                renamed = self.cel(cel["expression"], f"spec.selectors[{index}].cel.expression")
                if renamed is not None:
                    selector["cel"]["expression"] = renamed
        if whole and isinstance(spec.get("selectors"), list):
            # gpudra's shares of a GPU are of type gpu too: a class of whole GPUs leaves them out, as
            # gpudra's own gpu class does
            domain = self.options.driver
            expression = f'!("{SHARED_ATTRIBUTE}" in device.attributes["{domain}"])'
            spec["selectors"].append({"cel": {"expression": expression}})
        for index, entry in enumerate(items(spec.get("config"))):
            self.config(entry, f"spec.config[{index}]")
        obj["apiVersion"] = API_VERSION

    # --- NVIDIA's device plugin ------------------------------------------------------------------

    def workload(self, obj: dict[str, Any], kind: str) -> None:
        path = _POD_SPECS[kind]
        spec: Any = obj
        for key in path:
            spec = spec.get(key) if isinstance(spec, dict) else None
        if not isinstance(spec, dict):
            return
        at = ".".join(path)
        namespace = mapping(obj.get("metadata")).get("namespace")
        taken = {str(mapping(e).get("name")) for e in items(spec.get("resourceClaims"))}
        by_list: dict[str, list[dict[str, str]]] = {}
        # The app containers first: a regular init container's devices, under the device plugin, are
        # the app containers' afterwards (and the scheduler counts the larger of the two, not the sum),
        # so one asking what an app container asks names that container's claim instead of its own.
        apps: dict[str, str] = {}  # template -> the first app container's claim of it
        for list_name in reversed(_CONTAINER_LISTS):
            by_list[list_name] = []
            for index, container in enumerate(items(spec.get(list_name))):
                if isinstance(container, dict):
                    where = f"{at}.{list_name}[{index}]"
                    regular_init = (
                        list_name == "initContainers" and container.get("restartPolicy") != "Always"
                    )
                    claims = self.container(
                        container, where, namespace, taken, reuse=apps if regular_init else {}
                    )
                    by_list[list_name] += claims
                    if list_name == "containers":
                        for entry in claims:
                            apps.setdefault(entry["resourceClaimTemplateName"], entry["name"])
        entries = [entry for list_name in _CONTAINER_LISTS for entry in by_list[list_name]]
        if entries:
            spec["resourceClaims"] = [*items(spec.get("resourceClaims")), *entries]
            for key in mapping(spec.get("nodeSelector")):
                if str(key).startswith("nvidia.com/"):
                    self.done.notes.append(
                        Remark(
                            self.prefix + f"{at}.nodeSelector[{key}]",
                            "GPU feature discovery's label: the pod schedules only where GFD still labels "
                            "the node; a CEL selector on the device's attributes (productName, "
                            "capacity memory) says it in the claim (docs/migrate.md, Whole GPUs)",
                        )
                    )

    def container(
        self,
        container: dict[str, Any],
        at: str,
        namespace: object,
        taken: set[str],
        *,
        reuse: Mapping[str, str],
    ) -> list[dict[str, str]]:
        """The pod claims this container's asks need (each also named in its resources.claims); an ask
        whose template is in `reuse` names that existing pod claim instead."""
        resources = container.get("resources")
        if not isinstance(resources, dict):
            return []
        asked = {**mapping(resources.get("requests")), **mapping(resources.get("limits"))}
        entries = []
        for resource in sorted(str(r) for r in asked if str(r).startswith("nvidia.com/")):
            where = f"{at}.resources.limits[{resource}]"
            count = _count(asked[resource])
            if count is None:
                self.left(where, f"{asked[resource]!r} is not a whole number of devices")
                continue
            template = self.ask(resource, count, where) if count else None
            if template is None and count:
                continue
            _drop(resources, resource)  # a count of 0 asks nothing: it goes, with no claim
            if template is None:
                continue
            name = _template_name(template)
            made = (namespace if isinstance(namespace, str) else None, name)
            if made not in self.made:
                self.made.add(made)
                self.done.added.append(_template(template, name, namespace, self.options.driver))
            if name in reuse:
                resources["claims"] = [*items(resources.get("claims")), {"name": reuse[name]}]
                continue
            entry = _unique_name(f"{container.get('name', 'container')}-{template.form}", taken)
            taken.add(entry)
            entries.append({"name": entry, "resourceClaimTemplateName": name})
            resources["claims"] = [*items(resources.get("claims")), {"name": entry}]
        return entries

    def ask(self, resource: str, count: int, at: str) -> _Ask | None:
        """What one container's ask for `resource` is in gpudra's terms; None (and reported) if nothing."""
        plugin = self.options.device_plugin or DevicePlugin()
        shared = plugin.shared.get(resource)
        if shared is not None:
            return self.share(shared, resource, count, plugin, at)
        if resource == PLAIN_GPU:
            if plugin.mig_strategy == "single":
                self.done.notes.append(
                    Remark(
                        self.prefix + at,
                        "under the single MIG strategy nvidia.com/gpu is a MIG partition of the node's one "
                        "layout: the claim asks any partition of mig.gpudra.io; name its profile "
                        "(docs/migrate.md, MIG, single strategy)",
                    )
                )
                return _Ask("mig", count)
            return _Ask("gpu", count)
        mig = _MIG_RESOURCE.fullmatch(resource)
        if mig is not None:
            return _Ask("mig", count, profile=mig["profile"])
        why = (
            "not a resource of NVIDIA's device plugin that migrate knows"
            if self.options.device_plugin is not None
            else "not nvidia.com/gpu or nvidia.com/mig-<profile>: if the device plugin's config names it "
            "(a shared or renamed resource), pass it with --device-plugin-config"
        )
        self.left(at, why)
        return None

    def share(
        self, shared: Replicated, resource: str, count: int, plugin: DevicePlugin, at: str
    ) -> _Ask | None:
        mode = "time-slicing" if shared.strategy == "TimeSlicing" else "MPS"
        if shared.resource != PLAIN_GPU or plugin.mig_strategy == "single":
            self.left(
                at,
                f"{resource} is {shared.replicas} {mode} replicas of a MIG partition: gpudra shares whole "
                "GPUs only (docs/migrate.md); give the pod a partition of its own (mig.gpudra.io)",
            )
            return None
        if not shared.all_devices:
            self.left(
                at, f"{resource} shares only some of the node's GPUs (devices), which gpudra has no rule for"
            )
            return None
        if count != 1:
            self.left(
                at,
                f"asks {count} of {shared.replicas} {mode} replicas, which the device plugin may give on one "
                "GPU or several: ask one share of the size needed (gpu-shared, capacity.requests.memory)",
            )
            return None
        compute = 100 // shared.replicas if shared.strategy == "MPS" else None
        if self.options.by_count:
            self.done.notes.append(
                Remark(
                    at,
                    f"{resource} is {shared.replicas} {mode} replicas: one share by count; the nodes need "
                    f"kubeletPlugin.options.sharesPerGpu={shared.replicas} (and shares: on), which gives it "
                    f"1/{shared.replicas} of the GPU's memory (docs/migrate.md)",
                )
            )
            return _Ask(
                "gpu-shared", 1, shares=1, of=shared.replicas, compute=compute, sharing=shared.strategy
            )
        memory = self.options.gpu_memory
        if memory is None:
            self.left(
                at,
                f"{mode} replicas: a gpudra share states its memory, the GPU's divided by {shared.replicas}: "
                "pass the GPUs' memory with --gpu-memory (an H100 80GB publishes 81559Mi; "
                "`gpudra inventory -o wide` shows it)",
            )
            return None
        gib = memory // shared.replicas // GIB
        if gib < 1:
            self.left(at, f"the GPU's memory divided by {shared.replicas} is less than 1Gi, a share's least")
            return None
        return _Ask("gpu-shared", 1, memory_gib=gib, compute=compute, sharing=shared.strategy)


@dataclass(frozen=True)
class _Ask:
    """One distinct ask, which becomes one ResourceClaimTemplate."""

    form: str  # gpu, gpu-shared, mig
    count: int
    profile: str | None = None
    memory_gib: int | None = None
    compute: int | None = None
    sharing: SharingStrategy | None = None
    shares: int | None = None  # shares by count asked, of `of` per GPU
    of: int | None = None


_NO_KIND = (
    "gpudra has no equivalent (ComputeDomains need IMEX; configs belong in a claim's "
    "devices.config; docs/migrate.md, What gpudra has no equivalent for)"
)
_NO_CLASS = {
    "vfio.gpu.nvidia.com": "a GPU bound to vfio-pci for a VM: gpudra hands GPUs to containers only",
    "compute-domain-daemon.nvidia.com": "ComputeDomains (IMEX, multi-node NVLink) have no gpudra equivalent",
    "compute-domain-default-channel.nvidia.com": "ComputeDomains (IMEX channels) have no gpudra equivalent",
}


def _template_name(ask: _Ask) -> str:
    """The shape in the name (`gpudra-mig-1g10gb-x2`): one template per namespace and shape."""
    if ask.form == "mig":
        kind = f"mig-{dns_label(ask.profile)}" if ask.profile else "mig-any"
    elif ask.form == "gpu-shared":
        how = "time-sliced" if ask.sharing == "TimeSlicing" else f"mps-{ask.compute}pct"
        size = f"{ask.memory_gib}gi" if ask.memory_gib is not None else f"1of{ask.of}"
        return f"gpudra-gpu-shared-{size}-{how}"
    else:
        kind = "gpu"
    return f"gpudra-{kind}" if ask.count == 1 else f"gpudra-{kind}-x{ask.count}"


def _template(ask: _Ask, name: str, namespace: object, driver: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": gpudra_classes(driver)[ask.form]}
    if ask.count != 1:
        exactly["count"] = ask.count
    if ask.profile:
        expression = f'device.attributes["{driver}"].profile == "{ask.profile}"'
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    if ask.memory_gib is not None or ask.shares is not None:
        capacity: dict[str, str] = {}
        if ask.memory_gib is not None:
            capacity["memory"] = f"{ask.memory_gib}Gi"
        if ask.shares is not None:
            capacity["shares"] = str(ask.shares)
        if ask.compute is not None:
            capacity["compute"] = str(ask.compute)
        exactly["capacity"] = {"requests": capacity}
    request = "mig" if ask.form == "mig" else "gpu"
    devices: dict[str, Any] = {"requests": [{"name": request, "exactly": exactly}]}
    if ask.sharing == "TimeSlicing":
        parameters = {
            "apiVersion": f"{CONFIG_GROUP}/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}},
        }
        devices["config"] = [{"opaque": {"driver": driver, "parameters": parameters}}]
    metadata: dict[str, Any] = {"name": name}
    if isinstance(namespace, str):
        metadata["namespace"] = namespace
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": {"spec": {"devices": devices}},
    }


def label(obj: Mapping[str, Any]) -> str:
    """ "Kind namespace/name", as `gpudra validate` names an object."""
    meta = mapping(obj.get("metadata"))
    name, namespace = meta.get("name") or "(no name)", meta.get("namespace")
    return f"{obj.get('kind', '(no kind)')} {f'{namespace}/' if namespace else ''}{name}"


def _unique_name(wanted: str, taken: set[str]) -> str:
    """A DNS label for a pod's claim entry, not yet among `taken`."""
    base = wanted[:_MAX_NAME].strip("-")
    name, number = base, 2
    while name in taken:
        suffix = f"-{number}"
        name, number = base[: _MAX_NAME - len(suffix)].strip("-") + suffix, number + 1
    return name


def _count(amount: object) -> int | None:
    """A device count as a container's limits hold it (an int, or a string of one)."""
    if isinstance(amount, bool):
        return None
    if isinstance(amount, int):
        return amount if amount >= 0 else None
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses
    if isinstance(amount, str) and amount.isascii() and amount.isdigit():
        return int(amount)
    return None


def _drop(resources: dict[str, Any], resource: str) -> None:
    """`resource` out of a container's limits and requests (and those out when they are left empty)."""
    for key in ("limits", "requests"):
        amounts = resources.get(key)
        if isinstance(amounts, dict):
            amounts.pop(resource, None)
            if not amounts:
                del resources[key]


_V1BETA1_CHOICE = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)


def _choices(request: dict[str, Any], *, beta1: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """A request's device choices with their paths: `exactly`, each of `firstAvailable`, or (v1beta1)
    the request itself."""
    if isinstance(request.get("exactly"), dict):
        yield ".exactly", request["exactly"]
    elif beta1 and "deviceClassName" in request:
        yield "", request
    for index, sub in enumerate(items(request.get("firstAvailable"))):
        if isinstance(sub, dict):
            yield f".firstAvailable[{index}]", sub


def _to_v1(devices: dict[str, Any]) -> None:
    """resource.k8s.io/v1beta1's request fields moved under v1's `exactly`."""
    for request in items(devices.get("requests")):
        if isinstance(request, dict) and "deviceClassName" in request and "exactly" not in request:
            exactly = {key: request.pop(key) for key in _V1BETA1_CHOICE if key in request}
            request["exactly"] = exactly


def _unique(items: list[Any]) -> list[Any]:
    found: list[Any] = []
    for item in items:
        if item not in found:
            found.append(item)
    return found
