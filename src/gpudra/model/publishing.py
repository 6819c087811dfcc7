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

MigMode = Literal["partitionable", "static"]

# The first minor whose scheduler gathers only the pools relevant to a node, counter sets or not.
FAST_COUNTERS_MINOR = 37


@dataclass(frozen=True)
class Publishing:
    mig_mode: MigMode = "static"
    shares: bool = False
    # partitionable mode: the MIG profiles offered, by name; None: every profile
    mig_profiles: frozenset[str] | None = None

    @property
    def may_use_counters(self) -> bool:
        """Whether this publishing can carry counter sets (partitions on demand or shares)."""
        return self.shares or self.mig_mode == "partitionable"

    def describe(self) -> str:
        """One line for logs, events and `gpudra inventory`: what is offered besides whole GPUs."""
        parts = []
        if self.mig_mode == "partitionable":
            profiles = ",".join(sorted(self.mig_profiles)) if self.mig_profiles else "every profile"
            parts.append(f"MIG partitions on demand ({profiles})")
        else:
            parts.append("existing MIG devices")
        parts.append("shares" if self.shares else "no shares")
        return "whole GPUs, " + ", ".join(parts)


def counter_sets_slow_scheduler(server_minor: int) -> bool:
    """Whether a scheduler of this minor pays for counter sets on every node of the cluster."""
    return server_minor < FAST_COUNTERS_MINOR
