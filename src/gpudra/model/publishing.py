"""What a node publishes beyond its whole GPUs: MIG partitions on demand, shares. Pure.

Every form of a GPU besides the GPU itself needs counter sets (KEP-4815) to keep the forms exclusive,
and every scheduling cycle in the cluster pays for them: up to Kubernetes 1.36 the scheduler's allocator
treats every ResourceSlice that carries counter sets as relevant to every node, so each per-node Filter
call rebuilds every other node's pool (kubernetes#138917; fixed in 1.37's allocator). The defaults are
therefore the layout that costs the scheduler what whole GPUs cost: whole GPUs and the MIG devices that
exist, one form per GPU, no counter sets. Partitions and shares are offered per node group, where they
are wanted (docs/install.md, "What to publish"; BENCHMARKS.md, "Cluster scale").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gpudra.errors import ConfigError
from gpudra.model.kube_api import DRA_GATES_MINOR, FAST_COUNTERS_MINOR, SHARES_MINOR, TAINTS_ALPHA_API_MINOR
from gpudra.options.declared import option
from gpudra.options.types import Choice, Count, Names, Switch

MigMode = Literal["partitionable", "static"]
# What a MIG partition carries: `full`, everything its GPU carries too (product, versions, PCIe root, NUMA
# node, ...), so one selector reads the same on both; `minimal`, only what names the partition (type,
# profile, parent, placement, product; memory and multiprocessors). Every scheduling cycle converts and
# CEL-evaluates each device's attributes: with every profile offered, minimal cut the scheduler's CPU
# per pod by a third and its memory by 40 % (BENCHMARKS.md, "Cluster scale"), at the price of selectors
# and constraints over partitions by those GPU attributes.
PartitionAttributes = Literal["full", "minimal"]

SHARES_PER_GPU_NEED_SHARES = (
    "sets a count of shares per GPU, which needs --shares on (or --mig-share-profiles)"
)
MIG_SHARE_PROFILES_NEED_PARTITIONABLE = (
    "names MIG profiles to offer as shareable partitions, which needs --mig-mode partitionable"
)
MIG_PROFILES_NEED_PARTITIONABLE = (
    "names MIG profiles to offer on demand, which needs --mig-mode partitionable"
)

# The range of `Publishing.shares_per_gpu` (0: off). Not 1: a count range needs min + step <= value, and
# one share is a whole GPU. 64: far beyond what shares of one GPU run well (MPS serves 48 clients).
MIN_SHARES_PER_GPU = 2
MAX_SHARES_PER_GPU = 64


# Kubernetes' own syntax for MIG profile names, e.g. 1g.10gb, 1g.10gb+me, 7g.80gb.
_MIG_PROFILE = r"[0-9]+c?\.?[0-9]*g\.[0-9]+gb(\+[a-z]+)*"
_MIG_PROFILES_RULE = "comma-separated MIG profile names (e.g. 1g.10gb,3g.40gb)"


@dataclass(frozen=True, kw_only=True)
class Publishing:
    """Each field but switch_idle_mig is an option of `gpudra kubelet-plugin` and `gpudra inventory`
    (gpudra.options.declared): what a node publishes is what every scheduling cycle in the cluster
    pays for, so the defaults are the layout that costs the scheduler no more than whole GPUs
    (docs/install.md, "What to publish")."""

    mig_mode: MigMode = option(
        "static: whole GPUs with MIG off and the MIG devices that exist; partitionable: every MIG "
        "profile x placement offered, created on demand (counter sets: Kubernetes 1.37+ for a fast "
        "scheduler, see docs/install.md)",
        type=Choice(("partitionable", "static")),
        default="static",
    )
    # partitionable mode: the MIG profiles offered, by name; None: every profile
    mig_profiles: frozenset[str] | None = option(
        "with --mig-mode partitionable: the MIG profiles offered, comma-separated (e.g. "
        "1g.10gb,3g.40gb); empty: every profile the GPUs have",
        type=Names(_MIG_PROFILE, _MIG_PROFILES_RULE, none_when_empty=True),
        default="",
    )
    # partitionable mode: the offered MIG profiles whose partitions are also published as shareable (one
    # device more per placement of each, so opt-in per profile; gpudra.model.devices). Independent of
    # `shares` (whole GPUs); `shares_per_gpu` gives them a count too.
    mig_share_profiles: frozenset[str] = option(
        "with --mig-mode partitionable: offered MIG profiles whose partitions are also published as "
        "shareable, comma-separated (e.g. 1g.10gb): several claims each get a share (memory, compute, "
        "and a count with --shares-per-gpu) of one partition, limited by MPS inside it; each adds one "
        "device per placement for the scheduler to look at on every node",
        type=Names(_MIG_PROFILE, _MIG_PROFILES_RULE),
        default="",
    )
    partition_attributes: PartitionAttributes = option(
        "the attributes of MIG partitions: full, everything their GPU carries too (product, versions, "
        "PCIe root, NUMA node); minimal, only type, profile, parent, placement and product, which costs the "
        "scheduler a third less CPU per pod with many partitions (selectors by the others then match no "
        "partition)",
        type=Choice(("full", "minimal")),
        default="full",
    )
    shares: bool = option(
        "on: publish each whole GPU also as a shared device (MPS/time-slicing shares by memory and "
        "compute; consumable capacity and counter sets: Kubernetes 1.37+ for a fast scheduler)",
        type=Switch(("off", "on"), on="on"),
        default="off",
    )
    # shares by count: each GPU's shared device offers this many shares (gpudra.model.devices); 0: off
    shares_per_gpu: int = option(
        f"with --shares on (or --mig-share-profiles): shares by count, as the device plugin's "
        f"replicas: each GPU's (or partition's) shared device offers this many (at most one per GiB "
        f"of memory), every share takes at least one, and one that names no memory gets the memory / "
        f"N; {MIN_SHARES_PER_GPU} to {MAX_SHARES_PER_GPU}, 0: shares by memory and compute only",
        type=Count(MIN_SHARES_PER_GPU, MAX_SHARES_PER_GPU, zero_means="off"),
        default="0",
    )
    # static mode: a GPU whose MIG mode switches without a reset (Hopper and newer, bare metal) that is in
    # MIG mode without MIG devices is offered whole, MIG switched off when it is prepared. Set when
    # partitions on demand were asked but the server cannot keep them (fit_to_server): the operator let
    # gpudra manage MIG mode, and such a GPU would otherwise offer nothing at all.
    switch_idle_mig: bool = False

    def check_options(self) -> None:
        """The combinations the options refuse: profiles without partitionable mode, shareable
        profiles that are not offered, a count of shares with nothing shared."""
        if self.mig_profiles and self.mig_mode != "partitionable":
            raise ConfigError(MIG_PROFILES_NEED_PARTITIONABLE, field="--mig-profiles")
        if self.mig_share_profiles and self.mig_mode != "partitionable":
            raise ConfigError(MIG_SHARE_PROFILES_NEED_PARTITIONABLE, field="--mig-share-profiles")
        offered = self.mig_profiles
        if self.mig_share_profiles and offered and not self.mig_share_profiles <= offered:
            raise ConfigError(
                f"{', '.join(sorted(self.mig_share_profiles - offered))} is not among the offered "
                f"--mig-profiles; allowed: {', '.join(sorted(offered))}",
                field="--mig-share-profiles",
            )
        if self.shares_per_gpu and not self.shares and not self.mig_share_profiles:
            raise ConfigError(SHARES_PER_GPU_NEED_SHARES, field="--shares-per-gpu")

    def describe(self) -> str:
        """One line for logs, events and `gpudra inventory`: what is offered besides whole GPUs."""
        parts = []
        if self.mig_mode == "partitionable":
            profiles = ",".join(sorted(self.mig_profiles)) if self.mig_profiles else "every profile"
            minimal = ", minimal attributes" if self.partition_attributes == "minimal" else ""
            parts.append(f"MIG partitions on demand ({profiles}{minimal})")
            if self.mig_share_profiles:
                count = f", {self.shares_per_gpu} each by count" if self.shares_per_gpu else ""
                shared = ",".join(sorted(self.mig_share_profiles))
                parts.append(f"shares of MIG partitions ({shared}{count})")
        else:
            parts.append("existing MIG devices")
            if self.switch_idle_mig:
                parts.append("idle MIG-mode GPUs whole")
        if self.shares and self.shares_per_gpu:
            parts.append(f"shares ({self.shares_per_gpu} per GPU by count)")
        else:
            parts.append("shares" if self.shares else "no shares")
        return "whole GPUs, " + ", ".join(parts)


def counter_sets_slow_scheduler(server_minor: int) -> bool:
    """Whether a scheduler of this minor pays for counter sets on every node of the cluster."""
    return server_minor < FAST_COUNTERS_MINOR


# The feature gates each field depends on (kube-apiserver --feature-gates names).
PARTITIONABLE_GATE = "DRAPartitionableDevices"  # sharedCounters, consumesCounters
CONSUMABLE_GATE = "DRAConsumableCapacity"  # allowMultipleAllocations, capacity requestPolicy
TAINTS_GATE = "DRADeviceTaints"  # device taints
DRA_GATES = (PARTITIONABLE_GATE, CONSUMABLE_GATE, TAINTS_GATE)


@dataclass(frozen=True)
class ServerFields:
    """Which of the DRA fields gpudra relies on the API server keeps (its feature gates), as a dry run
    of a probe slice showed, and its minor version."""

    minor: int
    counters: bool  # sharedCounters, consumesCounters (DRAPartitionableDevices)
    consumable_capacity: bool  # allowMultipleAllocations, capacity requestPolicy (DRAConsumableCapacity)
    device_taints: bool  # device taints (DRADeviceTaints)

    @classmethod
    def of_release(cls, minor: int, gates: Mapping[str, bool] | None = None) -> ServerFields:
        """What an API server of 1.`minor` keeps with the feature `gates` given set and the others at
        that release's defaults: what a probe of such a server finds, for when none can be probed
        (`gpudra inventory`, `gpudra explain` offline)."""
        gates = gates or {}

        def on(gate: str) -> bool:
            return gates.get(gate, minor >= DRA_GATES_MINOR)

        return cls(
            minor=minor,
            counters=on(PARTITIONABLE_GATE),
            consumable_capacity=on(CONSUMABLE_GATE),
            device_taints=on(TAINTS_GATE),
        )

    def describe(self) -> str:
        """One line: the release and the fields it drops, e.g. `Kubernetes 1.35 (drops counter sets,
        allowMultipleAllocations, device taints)`."""
        dropped = [
            name
            for name, kept in (
                ("counter sets", self.counters),
                ("allowMultipleAllocations", self.consumable_capacity),
                ("device taints", self.device_taints),
            )
            if not kept
        ]
        return f"Kubernetes 1.{self.minor}" + (f" (drops {', '.join(dropped)})" if dropped else "")


def parse_feature_gates(text: str, *, field: str = "--feature-gates") -> dict[str, bool]:
    """`Gate=true,Other=false`, the Kubernetes components' own syntax, as a map; ConfigError naming
    `field` for an entry of another shape."""
    gates = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, _, value = item.partition("=")
        if not name.strip() or value.strip().lower() not in ("true", "false"):
            raise ConfigError(f"{item.strip()!r} is not Gate=true or Gate=false", field=field)
        gates[name.strip()] = value.strip().lower() == "true"
    return gates


# What can be withheld, the label values of gpudra_publishing_withheld{form}.
WITHHELD_FORMS = ("partitions", "shares", "health-taints")
# Each form as people call it (plural: "... need feature gate X").
FORM_NAMES = {
    "partitions": "MIG partitions on demand",
    "shares": "GPU shares",
    "health-taints": "taints on unhealthy GPUs",
}


@dataclass(frozen=True)
class Withheld:
    """A form of the node's GPUs left out because the cluster could not keep it exclusive."""

    form: str  # one of WITHHELD_FORMS
    why: str  # one line for the log, the Node event and the operator
    # What would serve it, one line: "MIG partitions on demand need feature gate DRAPartitionableDevices
    # (on by default from 1.36)", or "GPU shares are not available before Kubernetes 1.36 (...)"
    needs: str = ""
    gates: tuple[str, ...] = ()  # the feature gates it needs that are off
    cause: str = ""  # what the server does that rules it out, e.g. "the API server drops counter sets"


def fit_to_server(publishing: Publishing, fields: ServerFields) -> tuple[Publishing, list[Withheld]]:
    """What of `publishing` this server can serve without a GPU ever going to two claims, and what is
    withheld. Without counter sets the scheduler cannot keep a partition, a share and their GPU apart,
    so they go (MIG then as static devices); shares also need consumable capacity and a scheduler that
    counts their counters. Health taints are reported here and applied by the caller."""
    withheld: list[Withheld] = []
    mig_mode = publishing.mig_mode
    shares = publishing.shares
    if mig_mode == "partitionable" and not fields.counters:
        mig_mode = "static"
        withheld.append(
            _withheld(
                "partitions",
                ("the API server drops counter sets", PARTITIONABLE_GATE),
                "MIG partitions are not offered on demand; existing MIG devices are published instead, and "
                "a GPU in MIG mode without any as a whole GPU where its mode switches without a reset",
                fields,
                (PARTITIONABLE_GATE,),
            )
        )
    mig_shares = publishing.mig_share_profiles if mig_mode == "partitionable" else frozenset()
    if shares or mig_shares:
        off = tuple(
            gate
            for gate, kept in (
                (PARTITIONABLE_GATE, fields.counters),
                (CONSUMABLE_GATE, fields.consumable_capacity),
            )
            if not kept
        )
        cause: tuple[str, str | None] | None = None
        if not fields.counters:
            cause = ("the API server drops counter sets", PARTITIONABLE_GATE)
        elif not fields.consumable_capacity:
            cause = ("the API server drops allowMultipleAllocations", CONSUMABLE_GATE)
        elif fields.minor < SHARES_MINOR:
            cause = (
                f"the 1.{fields.minor} scheduler does not count the counters shares consume (fixed in "
                f"1.{SHARES_MINOR}), so a share and its whole GPU could go to two claims",
                None,
            )
        if cause is not None:
            shares, mig_shares = False, frozenset()
            withheld.append(_withheld("shares", cause, "GPU shares are not offered", fields, off))
    if not fields.device_taints:
        withheld.append(
            _withheld(
                "health-taints",
                ("the API server drops device taints", TAINTS_GATE),
                "an unhealthy GPU is left out of the slices instead of published tainted",
                fields,
                (TAINTS_GATE,),
            )
        )
    fitted = Publishing(
        mig_mode=mig_mode,
        shares=shares,
        shares_per_gpu=publishing.shares_per_gpu if shares or mig_shares else 0,
        mig_profiles=publishing.mig_profiles if mig_mode == "partitionable" else None,
        switch_idle_mig=publishing.switch_idle_mig or mig_mode != publishing.mig_mode,
        partition_attributes=publishing.partition_attributes,
        mig_share_profiles=mig_shares,
    )
    return fitted, withheld


def _withheld(
    form: str,
    cause: tuple[str, str | None],
    effect: str,
    fields: ServerFields,
    gates: tuple[str, ...],
) -> Withheld:
    """`cause`: what the server does, and the feature gate that is off for it (None: none is)."""
    text, gate = cause
    why = f"{text} (feature gate {gate} is off): {effect}" if gate else f"{text}: {effect}"
    return Withheld(form, why, _needs(form, fields, gates), gates, text)


def _needs(form: str, fields: ServerFields, gates: tuple[str, ...]) -> str:
    """What would serve `form` on a cluster like this one, one line."""
    name = FORM_NAMES[form]
    listed = _gates(gates)
    if form == "shares" and fields.minor < SHARES_MINOR:
        return f"{name} are not available before Kubernetes 1.{SHARES_MINOR}" + (
            f" ({listed} on by default there)" if gates else ""
        )
    text = f"{name} need {listed} (on by default from 1.{DRA_GATES_MINOR})"
    if form == "health-taints" and fields.minor == TAINTS_ALPHA_API_MINOR:
        text += f"; on 1.{fields.minor} also --runtime-config=resource.k8s.io/v1alpha3=true"
    return text


def _gates(gates: tuple[str, ...]) -> str:
    if not gates:
        return "no feature gate"
    if len(gates) == 1:
        return f"feature gate {gates[0]}"
    return f"feature gates {', '.join(gates[:-1])} and {gates[-1]}"
