"""The simulated driver's event queue: what `hooks` raise and what NVML event sets deliver. Pure.

The driver raises an event once and hands it to every event set that was registered for its GPU and
type when it happened; each set returns its events in order, one per nvmlEventSetWait. Here the raised
events live in the machine's state (so a test process can raise one that the plugin's process
receives), numbered in order; an event set is a cursor into that sequence plus its registrations, and
delivers only events numbered after the registration for their GPU. The state keeps the newest `KEPT`
events: a set that falls further behind loses the oldest, as a driver's bounded queue does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudra.sim import state

KEPT = 256


@dataclass
class Registration:
    types: int  # nvmlEventType bits
    since: int  # seq of the newest event raised when it was made: only later ones are delivered


@dataclass
class EventSet:
    """One nvmlEventSet_t: per GPU index what it was registered for, and the last event it delivered."""

    cursor: int
    registrations: dict[int, Registration] = field(default_factory=dict)

    def register(self, *, gpu: int, types: int, newest: int) -> None:
        """Adds `types` for `gpu`; events from now on (after seq `newest`) are delivered."""
        found = self.registrations.get(gpu)
        if found is None:
            self.registrations[gpu] = Registration(types, newest)
        else:
            found.types |= types

    def take(self, machine_state: state.MachineState) -> state.Event | None:
        """The next event for this set, which it will not deliver again; None when there is none."""
        for event in machine_state.events:
            if event.seq <= self.cursor:
                continue
            registration = self.registrations.get(event.gpu)
            if (
                registration is not None
                and event.type & registration.types
                and event.seq > registration.since
            ):
                self.cursor = event.seq
                return event
        return None


def raise_event(
    machine_state: state.MachineState,
    *,
    gpu: int,
    type_: int,
    data: int = 0,
    gpu_instance_id: int | None = None,
    compute_instance_id: int | None = None,
) -> state.Event:
    """Appends an event to the machine's queue, dropping the oldest beyond `KEPT`."""
    machine_state.events_raised += 1
    event = state.Event(
        seq=machine_state.events_raised,
        gpu=gpu,
        type=type_,
        data=data,
        **({} if gpu_instance_id is None else {"gpu_instance_id": gpu_instance_id}),
        **({} if compute_instance_id is None else {"compute_instance_id": compute_instance_id}),
    )
    machine_state.events = [*machine_state.events, event][-KEPT:]
    return event
