"""The device model the node's slices publish: the options' publishing fitted to what the cluster can
keep exclusive, with GPU health applied. I/O: none of its own (the probe, events and metrics are given).

The plugin's options say what a node offers (gpudra.model.publishing); the API server and its scheduler
decide what of it is safe. Each time the slice sync (re)reads the server's version (at start, and after
any failed sync: a restarted API server with other feature gates fails the sync first), the server is
probed (gpudra.kube.field_probe) and the model rebuilt for what it keeps. A form that would be dropped
or miscounted is withheld, never published half: a share or partition whose counters the server drops
would go to a second claim beside its GPU. Each change is logged, sent as a Node event and shown by
`gpudra_publishing_withheld{form}`; readiness is not affected (a gate left off is a configuration, not
a fault).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gpudra.model import devices, health_report
from gpudra.model.devices import DeviceModel, DeviceTaint
from gpudra.model.inventory import Inventory
from gpudra.model.kube_api import FAST_COUNTERS_MINOR
from gpudra.model.publishing import (
    WITHHELD_FORMS,
    Publishing,
    ServerFields,
    Withheld,
    counter_sets_slow_scheduler,
    fit_to_server,
)

if TYPE_CHECKING:  # types only
    from gpudra.kube.events import EventPoster

log = logging.getLogger(__name__)


class ServedModel:
    def __init__(
        self,
        inventory: Inventory,
        publishing: Publishing,
        *,
        model: DeviceModel,
        probe: Callable[[int], ServerFields],
        events: EventPoster,
        withheld_gauge: Callable[[str, bool], None] = lambda form, on: None,
        on_model: Callable[[DeviceModel], None] = lambda model: None,
    ) -> None:
        """`on_model` is told each model fitted to a server that differs from the one before, before
        it is published: prepare must read the devices as the slices show them (a MIG device that
        exists is published with its uuid where partitions are withheld)."""
        self.inventory = inventory
        self.on_model = on_model
        self.publishing = publishing
        self.probe = probe
        self.events = events
        self.withheld_gauge = withheld_gauge
        self._lock = threading.Lock()
        self._fitted = publishing
        self._model = model  # devices.publish(inventory, publishing), built once by the caller
        self._taints = True
        self._withheld: dict[str, Withheld] = {}
        self._cost_told = False

    @property
    def withheld(self) -> list[Withheld]:
        with self._lock:
            return list(self._withheld.values())

    def taints_kept(self) -> bool:
        """Whether the API server keeps device taints: unhealthy devices are published tainted, else
        left out (as the last probe found; True before the first)."""
        with self._lock:
            return self._taints

    def model(
        self, unhealthy: Mapping[str, DeviceTaint], messages: Mapping[str, str] | None = None
    ) -> DeviceModel:
        """What to publish now; `unhealthy`: device name -> its taint, published tainted or left out,
        and reported on the first slice either way, with `messages` (device -> the fault's words)."""
        with self._lock:
            model, taints = self._model, self._taints
        report = health_report.slice_annotations(
            model.devices, unhealthy, messages or {}, slices="tainted" if taints else "left-out"
        )
        if taints:
            published = devices.with_health_taints(model, unhealthy)
        else:
            published = devices.without_devices(model, unhealthy.keys())
        return dataclasses.replace(published, annotations=report) if report else published

    def on_server(self, minor: int) -> None:
        """Probe the server and fit the model to it (the slice sync calls this before it builds)."""
        fields = self.probe(minor)
        fitted, withheld = fit_to_server(self.publishing, fields)
        changed = None
        if fitted != self._fitted:  # only the slice sync calls this: no other writer
            changed = devices.publish(self.inventory, fitted)
            self.on_model(changed)  # prepare knows the devices before the slices show them
        with self._lock:
            if changed is not None:
                self._model = changed
                self._fitted = fitted
            self._taints = fields.device_taints
            now = {w.form: w for w in withheld}
            before, self._withheld = self._withheld, now
            model = self._model
        for form in WITHHELD_FORMS:
            self.withheld_gauge(form, form in now)
        for item in withheld:
            if item.form not in before:
                log.warning("not published", extra={"form": item.form, "why": item.why})
                self.events.post("Warning", "PublishingWithheld", f"gpudra on this node: {item.why}")
        for form in sorted(before.keys() - now.keys()):
            log.info("published again", extra={"form": form})
            self.events.post("Normal", "PublishingRestored", f"gpudra on this node publishes {form} again")
        self._counter_cost_notice(model, minor)

    def _counter_cost_notice(self, model: DeviceModel, minor: int) -> None:
        """Once per plugin start: a warning when this node publishes counter sets to a release whose
        scheduler pays for them on every node of the cluster (gpudra.model.publishing)."""
        if self._cost_told or not model.counter_sets or not counter_sets_slow_scheduler(minor):
            return
        self._cost_told = True
        message = (
            f"this node publishes {len(model.counter_sets)} counter set(s) ({self._fitted.describe()}); "
            f"the Kubernetes 1.{minor} scheduler then checks every node's pool for each node of each pod "
            f"with a ResourceClaim, whatever its driver: scheduling slows with the cluster's size "
            f"(fixed in 1.{FAST_COUNTERS_MINOR}). Offer partitions and shares only on the node groups that "
            f"need them (docs/install.md, What to publish)"
        )
        log.warning("counter sets slow this release's scheduler", extra={"server_minor": minor})
        self.events.post("Warning", "CounterSetsSlowScheduler", message)
