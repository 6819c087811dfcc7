"""How much room for large MIG profiles first-fit leaves, in gpudra's published order and in placement order.

The kube-scheduler allocates, for a request, the first published device that matches it and whose counters
still fit. Emulated here on an 8x H100 node with the device model's own devices and counter sets: a seeded
run of claim creations and deletions of small and mid-sized profiles, then a count of how many more
7g.80gb, 4g.40gb and 3g.40gb claims would still fit, each on its own, one after another. The same run is
replayed over the devices in plain placement order (each profile's placements by ascending start, the
order NVML lists them) and in the order gpudra publishes (`placement.packing_order`).

What it shows: small instances packed high keep 4g@0 free, so the gain is mostly in 4g.40gb room; 3g.40gb
room is about even, and any one seed may go either way.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from gpudra.model.devices import Device, DeviceModel, build_devices
from gpudra.quantity import parse_quantity
from tests.unit import inventories as inv

# (profile, weight): mostly small claims, which are what fragments a GPU
MIX = (("1g.10gb", 6), ("1g.20gb", 3), ("2g.20gb", 3), ("3g.40gb", 1), ("4g.40gb", 1))
LARGE = ("7g.80gb", "4g.40gb", "3g.40gb")
EVENTS = 200
CREATE = 0.5  # the odds that an event creates a claim; otherwise it deletes a live one, while any is live
SEEDS = range(100)  # one seed's difference is mostly noise of +-2; a hundred show the trend


def _attribute(device: Device, name: str) -> int | str:
    (value,) = device["attributes"][name].values()
    assert isinstance(value, int | str)
    return value


def _profile(device: Device) -> str | None:
    return str(_attribute(device, "profile")) if _attribute(device, "type") == "mig" else None


def _demand(device: Device) -> dict[tuple[str, str], int]:
    return {
        (use["counterSet"], name): int(parse_quantity(counter["value"]))
        for use in device.get("consumesCounters", [])
        for name, counter in use["counters"].items()
    }


def placement_order(model: DeviceModel) -> list[Device]:
    """The model's devices per GPU, whole GPU first, each profile's placements by ascending start."""

    def key(device: Device) -> tuple[int, int, int, str, int]:
        if _profile(device) is None:
            return (int(_attribute(device, "minor")), 0, 0, "", 0)
        return (
            int(_attribute(device, "parentMinor")),
            1,
            int(_attribute(device, "placementSize")),
            str(_attribute(device, "profile")),
            int(_attribute(device, "placementStart")),
        )

    return sorted(model.devices, key=key)


class FirstFit:
    """The scheduler's choice for one-device requests by profile, over `order`, against the counter sets."""

    def __init__(self, model: DeviceModel, order: Sequence[Device]) -> None:
        self.free = {
            (counter_set["name"], name): int(parse_quantity(counter["value"]))
            for counter_set in model.counter_sets
            for name, counter in counter_set["counters"].items()
        }
        self.candidates = [(_profile(d), d["name"], _demand(d)) for d in order]
        self.demands = {name: demand for _, name, demand in self.candidates}

    def allocate(self, profile: str) -> str | None:
        """The device allocated to a claim for `profile`, its counters taken; None when none fits."""
        for offered, name, demand in self.candidates:
            if offered == profile and all(self.free[key] >= amount for key, amount in demand.items()):
                for key, amount in demand.items():
                    self.free[key] -= amount
                return name
        return None

    def release(self, name: str) -> None:
        for key, amount in self.demands[name].items():
            self.free[key] += amount

    def room(self, profile: str) -> int:
        """How many more claims for `profile` would be allocated, one after another (the state is kept)."""
        saved = dict(self.free)
        count = 0
        while self.allocate(profile) is not None:
            count += 1
        self.free = saved
        return count


@dataclass(frozen=True)
class Outcome:
    refused: int  # creations that found no device
    room: dict[str, int]  # LARGE profile -> how many more would fit at the end

    @property
    def large(self) -> int:
        return sum(self.room.values())


@dataclass(frozen=True)
class Event:
    claim: int
    profile: str | None  # the profile the claim is created for; None deletes it


def claim_events(seed: int) -> list[Event]:
    """`EVENTS` creations and deletions drawn from `random.Random(seed)`, the same for every strategy.

    Drawn once, before any replay, so that a claim refused under one order cannot shift the draws that
    follow; a deletion names a claim created before it, and deleting a refused claim does nothing.
    """
    rng = random.Random(seed)
    profiles, weights = zip(*MIX, strict=True)
    live: list[int] = []
    events: list[Event] = []
    for claim in range(EVENTS):
        if live and rng.random() >= CREATE:
            events.append(Event(live.pop(rng.randrange(len(live))), None))
        else:
            events.append(Event(claim, rng.choices(profiles, weights)[0]))
            live.append(claim)
    return events


def replay(model: DeviceModel, order: Sequence[Device], events: Sequence[Event]) -> Outcome:
    """`events` allocated first-fit over `order`, then the room left for each LARGE profile."""
    node = FirstFit(model, order)
    allocated: dict[int, str] = {}
    refused = 0
    for event in events:
        if event.profile is None:
            if event.claim in allocated:
                node.release(allocated.pop(event.claim))
            continue
        device = node.allocate(event.profile)
        if device is None:
            refused += 1
        else:
            allocated[event.claim] = device
    return Outcome(refused=refused, room={profile: node.room(profile) for profile in LARGE})


def measure(seeds: Sequence[int]) -> dict[str, list[Outcome]]:
    """Each strategy's outcome per seed, over the same claim sequence."""
    model = build_devices(inv.h100_node(), mig_mode="partitionable")
    orders = {"placement": placement_order(model), "gpudra": list(model.devices)}
    return {
        strategy: [replay(model, order, claim_events(seed)) for seed in seeds]
        for strategy, order in orders.items()
    }


def report(outcomes: dict[str, list[Outcome]], *, shown: int) -> str:
    """A table: the first `shown` seeds one by one, then the totals over all, then seeds won and lost."""
    columns = ("seed", "strategy", "refused", *LARGE, "large")
    rows = [
        (str(seed), strategy, str(o.refused), *(str(o.room[p]) for p in LARGE), str(o.large))
        for seed in range(shown)
        for strategy, per_seed in outcomes.items()
        for o in [per_seed[seed]]
    ]
    rows += [
        (
            f"all {len(per_seed)}",
            strategy,
            str(sum(o.refused for o in per_seed)),
            *(str(sum(o.room[p] for o in per_seed)) for p in LARGE),
            str(sum(o.large for o in per_seed)),
        )
        for strategy, per_seed in outcomes.items()
    ]
    widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns))]
    lines = [
        "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in [columns, *rows]
    ]
    pairs = list(zip(outcomes["placement"], outcomes["gpudra"], strict=True))
    more, fewer = sum(g.large > p.large for p, g in pairs), sum(g.large < p.large for p, g in pairs)
    return "\n".join(
        [
            f"8x H100, first-fit, {EVENTS} events per seed ({CREATE:.0%} creations of "
            f"{', '.join(p for p, _ in MIX)}); room = more claims of that profile that still fit",
            *lines,
            f"gpudra's order leaves more large room on {more} seeds, less on {fewer}, "
            f"as much on {len(pairs) - more - fewer}",
        ]
    )


def test_gpudra_order_leaves_more_room_for_large_profiles_than_placement_order(
    capsys: pytest.CaptureFixture[str],
) -> None:
    outcomes = measure(SEEDS)
    with capsys.disabled():
        print("\n" + report(outcomes, shown=5))
    plain, packed = outcomes["placement"], outcomes["gpudra"]
    # Over many seeds, not on each: no fixed order wins every sequence. Deletions leave instances where
    # earlier ones pushed them: seed 2 ends with a 1g.20gb at 6 and a 2g.20gb at 2 in gpudra's order (4 was
    # held when the 2g came), blocking both 3g placements, and at 0 and 2 in placement order, 3g@4 free.
    assert sum(o.large for o in packed) > sum(o.large for o in plain)
    assert sum(o.room["4g.40gb"] for o in packed) > sum(o.room["4g.40gb"] for o in plain)
    assert sum(o.refused for o in packed) <= sum(o.refused for o in plain)
    assert sum(q.large > p.large for p, q in zip(plain, packed, strict=True)) > sum(
        q.large < p.large for p, q in zip(plain, packed, strict=True)
    )


def test_first_fit_follows_the_published_order_and_the_counters() -> None:
    model = build_devices(inv.node(inv.h100(0)), mig_mode="partitionable")
    plain, packed = FirstFit(model, placement_order(model)), FirstFit(model, model.devices)
    assert [plain.allocate("1g.10gb") for _ in range(2)] == ["gpu-0-mig-1g10gb-0", "gpu-0-mig-1g10gb-1"]
    assert [packed.allocate("1g.10gb") for _ in range(2)] == ["gpu-0-mig-1g10gb-6", "gpu-0-mig-1g10gb-5"]
    assert (plain.room("4g.40gb"), packed.room("4g.40gb")) == (0, 1)
    assert (plain.room("3g.40gb"), packed.room("3g.40gb")) == (1, 1)  # 3g@4 there, 3g@0 here
    assert packed.allocate("7g.80gb") is None
    packed.release("gpu-0-mig-1g10gb-6")
    packed.release("gpu-0-mig-1g10gb-5")
    assert packed.room("7g.80gb") == 1
