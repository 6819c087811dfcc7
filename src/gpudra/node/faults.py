"""Crash points for testing crash safety. I/O: kills the process when told to.

`GPUDRA_CRASH_AT=<step>` makes the plugin SIGKILL itself when it reaches that step of prepare or
unprepare (or of recording a GPU fault: HEALTH_STEPS), the same as a node-level kill at the worst
moment; the integration tests restart it and check that the kubelet's retries complete and nothing is
left over. Unset (always, in production) it does nothing.
"""

from __future__ import annotations

import os
import signal

PREPARE_STEPS = (
    "prepare-started",
    "prepare-mig-created",
    "prepare-applied",
    "prepare-cdi-written",
    "prepare-completed",
)
UNPREPARE_STEPS = (
    "unprepare-started",
    "unprepare-undone",
    "unprepare-mig-destroyed",
    "unprepare-cdi-deleted",
)
STEPS = PREPARE_STEPS + UNPREPARE_STEPS
# Reached only by claims with MPS devices, inside "prepare-applied" and "unprepare-undone".
MPS_PREPARE_STEPS = ("prepare-mps-directories", "prepare-mps-started")
MPS_UNPREPARE_STEPS = ("unprepare-mps-stopped",)
# Reached where the MPS daemons run: in the plugin, or in `gpudra mps-host` (whose own GPUDRA_CRASH_AT
# it is). A command's checked control sockets linked into the daemon's `tool/` directory and not yet
# unlinked (in prepare and unprepare alike); a stopped daemon's directory moved into the trash and not
# yet emptied (gpudra.node.sharing.mps_daemons).
MPS_DAEMON_STEPS = ("mps-control-linked", "unprepare-mps-trashed")
# Recording a GPU fault (gpudra.node.health.gpu_faults): saved in the health file, its Node event not yet
# posted.
HEALTH_STEPS = ("health-saved",)


def reached(step: str) -> None:
    if os.environ.get("GPUDRA_CRASH_AT") == step:
        os.kill(os.getpid(), signal.SIGKILL)
