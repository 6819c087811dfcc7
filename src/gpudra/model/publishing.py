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

from dataclasses import dataclass
from typing import Literal

from gpudra.model.kube_api import FAST_COUNTERS_MINOR, SHARES_MINOR

MigMode = Literal["partitionable", "static"]


@dataclass(frozen=True)
class Publishing:
    mig_mode: MigMode = "static"
    shares: bool = False
    # partitionable mode: the MIG profiles offered, by name; None: every profile
    mig_profiles: frozenset[str] | None = None
    # static mode: a GPU whose MIG mode switches without a reset (Hopper and newer, bare metal) that is in
    # MIG mode without MIG devices is offered whole, MIG switched off when it is prepared. Set when
    # partitions on demand were asked but the server cannot keep them (fit_to_server): the operator let
    # gpudra manage MIG mode, and such a GPU would otherwise offer nothing at all.
    switch_idle_mig: bool = False

    def describe(self) -> str:
        """One line for logs, events and `gpudra inventory`: what is offered besides whole GPUs."""
        parts = []
        if self.mig_mode == "partitionable":
            profiles = ",".join(sorted(self.mig_profiles)) if self.mig_profiles else "every profile"
            parts.append(f"MIG partitions on demand ({profiles})")
        else:
            parts.append("existing MIG devices")
            if self.switch_idle_mig:
                parts.append("idle MIG-mode GPUs whole")
        parts.append("shares" if self.shares else "no shares")
        return "whole GPUs, " + ", ".join(parts)


def counter_sets_slow_scheduler(server_minor: int) -> bool:
    """Whether a scheduler of this minor pays for counter sets on every node of the cluster."""
    return server_minor < FAST_COUNTERS_MINOR


@dataclass(frozen=True)
class ServerFields:
    """Which of the DRA fields gpudra relies on the API server keeps (its feature gates), as a dry run
    of a probe slice showed, and its minor version."""

    minor: int
    counters: bool  # sharedCounters, consumesCounters (DRAPartitionableDevices)
    consumable_capacity: bool  # allowMultipleAllocations, capacity requestPolicy (DRAConsumableCapacity)
    device_taints: bool  # device taints (DRADeviceTaints)


# What can be withheld, the label values of gpudra_publishing_withheld{form}.
WITHHELD_FORMS = ("partitions", "shares", "health-taints")


@dataclass(frozen=True)
class Withheld:
    """A form of the node's GPUs left out because the cluster could not keep it exclusive."""

    form: str  # one of WITHHELD_FORMS
    why: str  # one line for the log, the Node event and the operator


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
            Withheld(
                "partitions",
                "the API server drops counter sets (feature gate DRAPartitionableDevices is off): MIG "
                "partitions are not offered on demand; existing MIG devices are published instead, and a "
                "GPU in MIG mode without any as a whole GPU where its mode switches without a reset",
            )
        )
    if shares:
        reason = None
        if not fields.counters:
            reason = "the API server drops counter sets (feature gate DRAPartitionableDevices is off)"
        elif not fields.consumable_capacity:
            reason = (
                "the API server drops allowMultipleAllocations (feature gate DRAConsumableCapacity is off)"
            )
        elif fields.minor < SHARES_MINOR:
            reason = (
                f"the 1.{fields.minor} scheduler does not count the counters shares consume (fixed in "
                f"1.{SHARES_MINOR}), so a share and its whole GPU could go to two claims"
            )
        if reason is not None:
            shares = False
            withheld.append(Withheld("shares", f"{reason}: GPU shares are not offered"))
    if not fields.device_taints:
        withheld.append(
            Withheld(
                "health-taints",
                "the API server drops device taints (feature gate DRADeviceTaints is off): an unhealthy "
                "GPU is left out of the slices instead of published tainted",
            )
        )
    fitted = Publishing(
        mig_mode=mig_mode,
        shares=shares,
        mig_profiles=publishing.mig_profiles if mig_mode == "partitionable" else None,
        switch_idle_mig=publishing.switch_idle_mig or mig_mode != publishing.mig_mode,
    )
    return fitted, withheld
