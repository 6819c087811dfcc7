"""Keeps the MPS control daemons of prepared claims running. I/O: through DeviceState, from a thread.

A claim's daemon detaches from the plugin, so a plugin restart leaves it running, but it can still
stop while its claim runs: it lived in the container of a plugin pod that a rolling update deleted
(`maxSurge: 1`: the new pod adopted the daemon, then the old pod's processes died with its container),
or it crashed or was killed. Its clients then lose MPS until the claim is prepared again. So every
`--mps-check-interval-seconds` the keeper has recovery start again each daemon that no longer
answers, with the limits its claim's records hold (see `gpudra.node.recovery.restart_stopped_daemons` for
the locking that keeps two instances on a node, and a claim mid-prepare or mid-unprepare, safe).

Each restart is a warning in the log, `gpudra_mps_daemon_restarts_total{outcome="started"}` and a
`MpsDaemonRestarted` Warning event on the Node, since the claim's pods lost their daemon for a while.
The processes that ran under it lost their MPS server and their CUDA contexts for good, so each device
the claim holds alone (a whole GPU or a MIG partition, not a share: that would flag other tenants'
pods) is also reported Unhealthy in the kubelet's device health (KEP-4680: the pods'
`allocatedResourcesStatus`) until the claim is unprepared: only new processes, in a new pod, work
again. The report is kept in memory: a plugin restart forgets it (the event stays).
A failed restart fails the step: the `Loop` logs it, counts it (`gpudra_background_failures`) and tries
again after its backoff, which starts at the interval; the first failure of a claim in a row is a
`MpsDaemonRestartFailed` Warning event.

A daemon's pipe directory is mounted read-write into its claim's containers; what they change there
(found when the daemon is stopped or sent commands: `gpudra.node.sharing.mps_daemons`) changes nothing
gpudra does, and is reported by `TamperingReports`: `gpudra_mps_tampering_total{kind}` and a
`MpsTampering` Warning event on the Node naming the claim.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gpudra.errors import HardwareError
from gpudra.node import checkpoint as ckpt
from gpudra.node.metrics import PluginMetrics
from gpudra.node.prepare import DeviceState
from gpudra.node.recovery import restart_stopped_daemons
from gpudra.node.sharing.mps import daemon_roots
from gpudra.node.sharing.mps_daemons import Tampering
from gpudra.runtime.service import Loop

if TYPE_CHECKING:  # types only
    from gpudra.kube.events import EventPoster

log = logging.getLogger(__name__)
# A restart that keeps failing (e.g. the GPU's driver refuses MPS now) is tried at most this seldom.
_MAX_BACKOFF_SECONDS = 60.0


class MpsKeeper:
    """A `service.Service`: checks the prepared claims' MPS daemons every `interval` seconds."""

    def __init__(
        self, state: DeviceState, *, interval: float, metrics: PluginMetrics, events: EventPoster
    ) -> None:
        self.state = state
        self.interval = interval
        self.metrics = metrics
        self.events = events
        self._failing: set[str] = set()  # claims whose last restart attempt failed
        # claim UID -> (the devices it holds alone, why they are Unhealthy); see the module docstring
        self._interrupted: dict[str, tuple[tuple[str, ...], str]] = {}
        self._interrupted_lock = threading.Lock()
        self.on_interrupted: Callable[[], None] = lambda: None  # wiring: the health loop's wake
        self.loop = Loop(
            "mps-daemons",
            self.step,
            min_backoff=interval,
            max_backoff=max(interval, _MAX_BACKOFF_SECONDS),
        )

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float) -> None:
        self.loop.stop(timeout)

    def step(self) -> float:
        """One round; HardwareError naming each claim whose daemon could not be started again."""
        check = restart_stopped_daemons(self.state)
        self.interrupted_devices()  # forgets unprepared claims, even where no health monitor reads them
        for entry in check.restarted:
            self._interrupt(entry)
            self.metrics.mps_daemon_restarts.labels("started").inc()
            log.warning(
                "MPS daemon of a prepared claim had stopped; started again with its limits",
                extra={"claim": entry.uid, "directory": str(_directory(entry))},
            )
            self.events.post(
                "Warning",
                "MpsDaemonRestarted",
                f"the MPS control daemon of ResourceClaim {_claim(entry)} had stopped (its pods' MPS clients "
                f"lost it); gpudra started it again with the claim's limits in {_directory(entry)}",
            )
        for entry, error in check.failed:
            self.metrics.mps_daemon_restarts.labels("failed").inc()
            if entry.uid not in self._failing:
                self.events.post(
                    "Warning",
                    "MpsDaemonRestartFailed",
                    f"the MPS control daemon of ResourceClaim {_claim(entry)} has stopped and cannot be "
                    f"started again (gpudra keeps trying): {error}",
                )
        # Only this round's failures: a claim restarted, answering again or unprepared drops out.
        self._failing = {entry.uid for entry, _ in check.failed}
        if check.failed:
            raise HardwareError(
                "cannot start again the MPS daemon of "
                + "; ".join(f"ResourceClaim {_claim(entry)}: {error}" for entry, error in check.failed)
            )
        return self.interval

    def interrupted_devices(self) -> dict[str, str]:
        """Device -> why it is Unhealthy, for the devices of prepared claims whose daemon was started again
        (read by the health monitor at each poll); a claim unprepared since is forgotten."""
        claims = self.state.store.latest().claims
        prepared = {uid for uid, entry in claims.items() if entry.state == "PrepareCompleted"}
        with self._interrupted_lock:
            for uid in set(self._interrupted) - prepared:
                del self._interrupted[uid]
            return {device: why for devices, why in self._interrupted.values() for device in devices}

    def _interrupt(self, entry: ckpt.ClaimEntry) -> None:
        # MPS devices only: a claim may time-slice another of its GPUs, which lost nothing
        alone = tuple(
            d.device for d in entry.devices if isinstance(d.sharing, ckpt.MpsRecord) and d.share_id is None
        )
        if not alone:
            return
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        why = (
            f"the MPS control daemon of ResourceClaim {_claim(entry)} stopped and was started again at "
            f"{when}: processes that ran under it lost their MPS server; a new pod gets a working device"
        )
        with self._interrupted_lock:
            self._interrupted[entry.uid] = (alone, why)
        self.on_interrupted()


class TamperingReports:
    """Hears what `MpsDaemons` found changed in a claim's pipe directory (it logs it): counts it, and posts
    a `MpsTampering` Warning event on the Node naming the claim."""

    def __init__(self, *, metrics: PluginMetrics, events: EventPoster) -> None:
        self.metrics = metrics
        self.events = events
        # The checkpoint's claims, by which a directory is named after its claim; bound (by wiring) once
        # the state that keeps them exists, which needs these reports first.
        self.claims: Callable[[], Mapping[str, ckpt.ClaimEntry]] = dict

    def __call__(self, found: Tampering) -> None:
        self.metrics.mps_tampering.labels(found.kind).inc()
        owner = next((e for e in self.claims().values() if found.root in daemon_roots(e)), None)
        whose = f"ResourceClaim {_claim(owner)}" if owner is not None else f"no claim ({found.root})"
        self.events.post(
            "Warning",
            "MpsTampering",
            f"a container changed the MPS pipe directory of {whose} ({found.kind}): {found.detail}",
        )


def _claim(entry: ckpt.ClaimEntry) -> str:
    # An entry rebuilt from its CDI spec knows its UID only.
    return f"{entry.namespace}/{entry.name} ({entry.uid})" if entry.name else entry.uid


def _directory(entry: ckpt.ClaimEntry) -> str:
    return ", ".join(str(root) for root in daemon_roots(entry))
