"""The device model: names, attributes, capacities, and counters that admit exactly the feasible layouts."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from gpudra.errors import ConfigError, HardwareError, NotSupported
from gpudra.model.devices import (
    UNHEALTHY_TAINT_KEY,
    Device,
    DeviceModel,
    DeviceTaint,
    build_devices,
    bytes_quantity,
    dns_label,
    gpu_uuid_of,
    partition_of,
    publish,
    semver,
    shares_of,
    with_health_taints,
)
from gpudra.model.gpu_health import device_taints
from gpudra.model.inventory import Gpu, Inventory, MigDevice, MigPlacement, MigProfile
from gpudra.model.publishing import MAX_SHARES_PER_GPU, Publishing, ServerFields, fit_to_server
from gpudra.model.slices import ResourceSlice, build_slices, validate_slices
from gpudra.node import gpu_driver
from gpudra.quantity import parse_quantity
from gpudra.sim import machines
from tests.unit import inventories as inv

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def quantity(text: str) -> int:
    value = parse_quantity(text)
    assert value.denominator == 1, text
    return int(value)


def partitionable(*gpus: Gpu) -> DeviceModel:
    return build_devices(inv.node(*gpus), mig_mode="partitionable")


def by_name(model: DeviceModel) -> dict[str, Device]:
    return {d["name"]: d for d in model.devices}


def attribute(device: Device, name: str) -> object:
    ((value,),) = [tuple(device["attributes"][name].values())]
    return value


# ---- a brute-force allocator over published slices, as the scheduler counts


class Pool:
    """The devices and counter sets of one published pool, with the scheduler's counter arithmetic."""

    def __init__(self, slices: Sequence[ResourceSlice]) -> None:
        self.capacity = {
            (s["name"], counter): quantity(c["value"])
            for slice_ in slices
            for s in slice_["spec"].get("sharedCounters", [])
            for counter, c in s["counters"].items()
        }
        self.devices = {d["name"]: d for slice_ in slices for d in slice_["spec"].get("devices", [])}

    def demand(self, name: str) -> Counter[tuple[str, str]]:
        return Counter(
            {
                (use["counterSet"], counter): quantity(c["value"])
                for use in self.devices[name].get("consumesCounters", [])
                for counter, c in use["counters"].items()
            }
        )

    def fits(self, names: Sequence[str]) -> bool:
        total: Counter[tuple[str, str]] = Counter()
        for name in names:
            total.update(self.demand(name))
        return all(amount <= self.capacity[key] for key, amount in total.items())

    def admitted(self, names: Sequence[str]) -> set[frozenset[str]]:
        """Every set of `names` the counters let the scheduler allocate together (fit is monotone)."""
        demands = [self.demand(name) for name in names]
        found: set[frozenset[str]] = set()

        def grow(chosen: list[int], total: Counter[tuple[str, str]], first: int) -> None:
            found.add(frozenset(names[i] for i in chosen))
            for i in range(first, len(names)):
                if all(total[key] + amount <= self.capacity[key] for key, amount in demands[i].items()):
                    grow([*chosen, i], total + demands[i], i + 1)

        grow([], Counter(), 0)
        return found


def valid_layouts(gpu: Gpu) -> set[frozenset[str]]:
    """Each set of partitions the GPU can hold at once, and the GPU alone, whole or shared.

    Partitions need disjoint placements, no more instances of a profile than it allows, and together
    no more memory, SMs or engines than the GPU has: the engines of the profile spanning the GPU.
    """
    (full,) = [p for p in gpu.mig_profiles if MigPlacement(0, gpu.mig_memory_slices) in p.placements]

    def needs(p: MigProfile) -> tuple[int, ...]:
        return (
            p.memory_mib * 1024**2,
            p.multiprocessors,
            p.copy_engines,
            p.decoders,
            p.encoders,
            p.jpegs,
            p.ofas,
        )

    has = (gpu.memory_bytes, gpu.multiprocessors or full.multiprocessors, *needs(full)[2:])
    options = [
        (f"gpu-{gpu.minor}-mig-{dns_label(p.name)}-{pl.start}", p, set(pl.slices))
        for p in gpu.mig_profiles
        for pl in p.placements
    ]
    found: set[frozenset[str]] = {frozenset({f"gpu-{gpu.minor}"}), frozenset({f"gpu-{gpu.minor}-shared"})}

    def grow(chosen: list[int], used: set[int], first: int) -> None:
        found.add(frozenset(options[i][0] for i in chosen))
        for i in range(first, len(options)):
            _, profile, slices = options[i]
            layout = [options[j][1] for j in [*chosen, i]]
            totals = [sum(column) for column in zip(*map(needs, layout), strict=True)]
            within = all(total <= limit for total, limit in zip(totals, has, strict=True))
            if not slices & used and layout.count(profile) <= profile.instance_count and within:
                grow([*chosen, i], used | slices, i + 1)

    grow([], set(), 0)
    return found


def gpu_pool(gpu: Gpu, server_minor: int) -> Pool:
    model = partitionable(gpu)
    return Pool(
        build_slices(model, driver="gpu.gpudra.io", node_name="n", generation=1, server_minor=server_minor)
    )


# ---- formatting helpers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("580.65.06", "580.65.6"),
        ("13.0", "13.0.0"),
        ("9.0", "9.0.0"),
        ("550", "550.0.0"),
        ("535.104.05", "535.104.5"),
    ],
    ids=["driver", "cuda", "compute-capability", "major-only", "leading-zero"],
)
def test_semver_normalises_dotted_versions(text: str, expected: str) -> None:
    assert semver(text, what="driver version") == expected


@pytest.mark.parametrize(
    "text", ["r580", "1.2.3.4", "", "580.65.06-beta"], ids=["prefix", "four", "empty", "suffix"]
)
def test_semver_refuses_what_is_not_a_dotted_version(text: str) -> None:
    with pytest.raises(HardwareError, match="driver version"):
        semver(text, what="driver version")


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (80 * 1024**3, "80Gi"),
        (81559 * 1024**2, "81559Mi"),
        (1024, "1Ki"),
        (1536, "1536"),
        (0, "0"),
        (2**60, "1Ei"),
    ],
    ids=["gi", "mi", "ki", "not-binary", "zero", "ei"],
)
def test_bytes_quantity_is_canonical(count: int, expected: str) -> None:
    assert bytes_quantity(count) == expected


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("1g.10gb", "1g10gb"),
        ("1g.10gb+me", "1g10gbme"),
        ("1g.24gb-me", "1g24gb-me"),
        ("1c.2g.20gb", "1c2g20gb"),
    ],
    ids=["plain", "media-extension", "dash-kept", "compute-instance"],
)
def test_dns_label_of_profile_names(name: str, label: str) -> None:
    assert dns_label(name) == label


# ---- whole GPUs and partitions


def test_whole_h100_device() -> None:
    gpu = inv.h100(3)
    device = by_name(partitionable(gpu))["gpu-3"]
    assert device["attributes"] == {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid},
        "index": {"int": 3},
        "minor": {"int": 3},
        "migCapable": {"bool": True},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.65.6"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:5d:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:5b"},
        "numaNode": {"int": 0},
        "resource.kubernetes.io/numaNode": {"int": 0},
        "nvlinkDomain": {"string": "nvswitch-0"},
    }
    assert device["capacity"] == {
        "memory": {"value": "81559Mi"},
        "multiprocessors": {"value": "132"},
        "copyEngines": {"value": "8"},
        "decoders": {"value": "7"},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": "7"},
        "ofaEngines": {"value": "1"},
    }


def test_partition_device_carries_its_profile_and_its_parents_attributes() -> None:
    gpu = inv.h100(2)
    devices = by_name(partitionable(gpu))
    device, parent = devices["gpu-2-mig-3g40gb-4"], devices["gpu-2"]
    attributes = device["attributes"]
    assert {k: attributes[k] for k in ("type", "profile", "parentUUID", "parentMinor")} == {
        "type": {"string": "mig"},
        "profile": {"string": "3g.40gb"},
        "parentUUID": {"string": gpu.uuid},
        "parentMinor": {"int": 2},
    }
    assert (attribute(device, "placementStart"), attribute(device, "placementSize")) == (4, 4)
    shared = [
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
        "resource.kubernetes.io/pciBusID",
        "resource.kubernetes.io/pcieRoot",
        "numaNode",
        "resource.kubernetes.io/numaNode",
        "nvlinkDomain",
    ]
    assert {k: attributes[k] for k in shared} == {k: parent["attributes"][k] for k in shared}
    assert "uuid" not in attributes  # a possible partition has no MIG device behind it yet
    assert device["capacity"] == {
        "memory": {"value": "40448Mi"},
        "multiprocessors": {"value": "60"},
        "copyEngines": {"value": "3"},
        "decoders": {"value": "3"},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": "3"},
        "ofaEngines": {"value": "0"},
        "memorySlices": {"value": "4"},
    }


def test_minimal_partition_attributes_name_the_partition_and_its_product_only() -> None:
    gpu = inv.h100(2)
    full_model = partitionable(gpu)
    full = by_name(full_model)
    model = build_devices(inv.node(gpu), mig_mode="partitionable", partition_attributes="minimal")
    minimal = by_name(model)
    device = minimal["gpu-2-mig-3g40gb-4"]
    assert device["attributes"] == {
        "type": {"string": "mig"},
        "profile": {"string": "3g.40gb"},
        "parentUUID": {"string": gpu.uuid},
        "parentMinor": {"int": 2},
        "placementStart": {"int": 4},
        "placementSize": {"int": 4},
        "productName": full["gpu-2"]["attributes"]["productName"],
    }
    assert device["capacity"] == {"memory": {"value": "40448Mi"}, "multiprocessors": {"value": "60"}}
    # Only the partitions change: the same devices, counters and consumption, the whole GPU as it was.
    assert list(minimal) == list(full)
    assert minimal["gpu-2"] == full["gpu-2"]
    assert device["consumesCounters"] == full["gpu-2-mig-3g40gb-4"]["consumesCounters"]
    assert model.counter_sets == full_model.counter_sets
    assert partition_of(device) == partition_of(full["gpu-2-mig-3g40gb-4"])
    assert gpu_uuid_of(device) == gpu.uuid
    # publish() passes the option through
    published = publish(inv.node(gpu), Publishing(mig_mode="partitionable", partition_attributes="minimal"))
    assert by_name(published)["gpu-2-mig-3g40gb-4"]["attributes"] == device["attributes"]


def test_optional_attributes_are_left_out_when_unknown() -> None:
    device = build_devices(inv.mixed_node(), mig_mode="partitionable").devices[0]
    optional = {
        "numaNode",
        "nvlinkDomain",
        "resource.kubernetes.io/numaNode",
        "resource.kubernetes.io/pcieRoot",
    }
    assert optional.isdisjoint(device["attributes"])
    assert device["capacity"] == {"memory": {"value": "23034Mi"}, "multiprocessors": {"value": "58"}}


def test_long_strings_are_cut_to_the_api_limit() -> None:
    gpu = dataclasses.replace(inv.plain(0, "l4"), name="N" * 96, nvlink_domain="d" * 80)
    device = partitionable(gpu).devices[0]
    assert attribute(device, "productName") == "N" * 64
    assert attribute(device, "nvlinkDomain") == "d" * 64


def test_unparseable_driver_version_is_a_clear_error() -> None:
    inventory = dataclasses.replace(inv.mixed_node(), driver_version="580.65.06.1")
    with pytest.raises(HardwareError, match=r"driver version '580\.65\.06\.1'"):
        build_devices(inventory, mig_mode="static")


def test_unknown_mig_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="partitionable, static") as raised:
        build_devices(inv.mixed_node(), mig_mode="dynamic")
    assert raised.value.field == "migMode"


@pytest.mark.parametrize("mode", ["partitionable", "static"])
@pytest.mark.parametrize("name", sorted(inv.REALISTIC))
def test_device_names_are_unique_dns_labels(name: str, mode: str) -> None:
    model = build_devices(inv.REALISTIC[name](), mig_mode=mode)
    names = [d["name"] for d in model.devices]
    assert len(names) == len(set(names))
    assert all(len(n) <= 63 and DNS_LABEL.fullmatch(n) for n in names), names
    assert all(DNS_LABEL.fullmatch(s["name"]) for s in model.counter_sets)


# ---- partitions per GPU


# The placement table, each profile's starts in the order they are published: first-fit packs from the top
# slices down, away from the low starts that 7g, 4g and 3g need.
H100_TABLE = {
    "1g.10gb": [6, 5, 4, 3, 2, 1, 0],
    "1g.10gb+me": [6, 5, 4, 3, 2, 1, 0],
    "1g.20gb": [6, 4, 2, 0],
    "2g.20gb": [4, 2, 0],
    "3g.40gb": [4, 0],
    "4g.40gb": [0],
    "7g.80gb": [0],
}


def starts_by_profile(model: DeviceModel) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for device in model.devices:
        if attribute(device, "type") == "mig":
            found.setdefault(str(attribute(device, "profile")), []).append(
                int(str(attribute(device, "placementStart")))
            )
    return found


def test_h100_partitions_follow_the_placement_table() -> None:
    model = partitionable(inv.h100(0))
    assert starts_by_profile(model) == H100_TABLE
    assert [d["name"] for d in model.devices][:4] == [
        "gpu-0",
        "gpu-0-shared",
        "gpu-0-mig-1g10gb-6",
        "gpu-0-mig-1g10gb-5",
    ]
    assert "gpu-0-mig-1g10gbme-6" in by_name(model)


def test_profiles_missing_from_the_inventory_are_not_offered() -> None:
    gpu = dataclasses.replace(
        inv.h100(0), mig_profiles=tuple(p for p in inv.H100_PROFILES if "+me" not in p.name)
    )
    assert starts_by_profile(partitionable(gpu)) == {k: v for k, v in H100_TABLE.items() if "+me" not in k}


def test_h100_counter_set() -> None:
    (counter_set,) = partitionable(inv.h100(1)).counter_sets
    assert counter_set["name"] == "gpu-1-counters"
    # Memory, SMs and every engine but the one OFA cannot run out with the memory slices apart: left out.
    assert {k: c["value"] for k, c in counter_set["counters"].items()} == {
        "ofa-engines": "1",
        "1g10gbme-instances": "1",
        **{f"memory-slice-{i}": "1" for i in range(8)},
    }


def test_two_profiles_need_the_memory_slices_only() -> None:
    model = build_devices(
        inv.node(inv.h100(0)), mig_mode="partitionable", mig_profiles=frozenset({"1g.10gb", "3g.40gb"})
    )
    (counter_set,) = model.counter_sets
    assert list(counter_set["counters"]) == [f"memory-slice-{i}" for i in range(8)]
    (use,) = by_name(model)["gpu-0-mig-1g10gb-6"]["consumesCounters"]
    assert use["counters"] == {"memory-slice-6": {"value": "1"}}


def _disjoint_sets(partitions: list[Device], slices: int, start: int = 0) -> list[list[Device]]:
    """Every set of `partitions` whose placements do not overlap (those from slice `start` on)."""
    if start >= slices:
        return [[]]
    found = _disjoint_sets(partitions, slices, start + 1)
    for device in partitions:
        attributes = device["attributes"]
        if attributes["placementStart"].get("int") == start:
            end = start + (attributes["placementSize"].get("int") or 0)
            found.extend([device, *rest] for rest in _disjoint_sets(partitions, slices, end))
    return found


@pytest.mark.parametrize("gpu", [inv.h100(0), inv.a100(0), inv.a30(0)], ids=["h100", "a100", "a30"])
def test_the_counters_kept_hold_every_limit_of_the_gpu(gpu: Gpu) -> None:
    """Any mix of partitions the published counters let through fits the GPU's memory, SMs, engines and
    each profile's instance count, as the full set of counters would have required."""
    model = partitionable(gpu)
    (counter_set,) = model.counter_sets
    limits = {name: parse_quantity(c["value"]) for name, c in counter_set["counters"].items()}
    full = max(gpu.mig_profiles, key=lambda p: p.multiprocessors)  # 7g: the engines of the whole chip
    whole = {
        "memory": gpu.memory_bytes,
        "multiprocessors": gpu.multiprocessors or full.multiprocessors,
        "copyEngines": full.copy_engines,
        "decoders": full.decoders,
        "encoders": full.encoders,
        "jpegEngines": full.jpegs,
        "ofaEngines": full.ofas,
    }
    instances = {p.name: p.instance_count for p in gpu.mig_profiles}
    partitions = [d for d in model.devices if d["attributes"]["type"].get("string") == "mig"]
    checked = 0
    for chosen in _disjoint_sets(partitions, gpu.mig_memory_slices):
        used: Counter[str] = Counter()
        for device in chosen:
            for name, counter in device["consumesCounters"][0]["counters"].items():
                used[name] += parse_quantity(counter["value"])
        if any(used[name] > limit for name, limit in limits.items()):
            continue
        checked += 1
        for name, total in whole.items():
            assert sum(parse_quantity(d["capacity"][name]["value"]) for d in chosen) <= total, (name, chosen)
        profiles = Counter(d["attributes"]["profile"].get("string") for d in chosen)
        assert all(count <= instances[str(name)] for name, count in profiles.items()), profiles
    assert checked >= 20  # the mixes the counters let through, each checked above


def test_a100_3g_partition_consumes_four_memory_slices() -> None:
    devices = by_name(partitionable(inv.a100(0)))
    for start in (0, 4):
        (use,) = devices[f"gpu-0-mig-3g20gb-{start}"]["consumesCounters"]
        assert use["counterSet"] == "gpu-0-counters"
        assert sorted(k for k in use["counters"] if k.startswith("memory-slice-")) == [
            f"memory-slice-{s}" for s in range(start, start + 4)
        ]
        # No mix of non-overlapping A100 partitions runs out of memory or SMs (decoders it can).
        assert not use["counters"].keys() & {"memory", "multiprocessors"}
        assert use["counters"]["decoders"] == {"value": "2"}


def test_whole_gpu_consumes_every_counter_in_full() -> None:
    model = partitionable(inv.h100(0))
    (use,) = by_name(model)["gpu-0"]["consumesCounters"]
    assert use == {"counterSet": "gpu-0-counters", "counters": model.counter_sets[0]["counters"]}


def test_gpus_without_mig_consume_nothing_without_shares() -> None:
    model = build_devices(inv.mixed_node(), mig_mode="partitionable", shares=False)
    assert model.counter_sets == []
    assert [d["name"] for d in model.devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert not any("consumesCounters" in d for d in model.devices)


@pytest.mark.parametrize("mode", ["partitionable", "static"])
def test_a_gpu_without_mig_and_its_shared_device_consume_one_memory_counter(mode: str) -> None:
    model = build_devices(inv.mixed_node(), mig_mode=mode)
    assert [d["name"] for d in model.devices] == [
        f"gpu-{m}{suffix}" for m in range(4) for suffix in ("", "-shared")
    ]
    memory = {gpu.minor: bytes_quantity(gpu.memory_bytes) for gpu in inv.mixed_node().gpus}
    assert model.counter_sets == [
        {"name": f"gpu-{m}-counters", "counters": {"memory": {"value": memory[m]}}} for m in range(4)
    ]
    for device in model.devices:
        minor = int(str(attribute(device, "minor")))
        assert device["consumesCounters"] == [
            {"counterSet": f"gpu-{minor}-counters", "counters": {"memory": {"value": memory[minor]}}}
        ]


def test_mig_capable_gpu_without_profiles_is_offered_whole() -> None:
    gpu = dataclasses.replace(inv.h100(0), mig_profiles=())
    model = partitionable(gpu)
    assert [d["name"] for d in model.devices] == ["gpu-0", "gpu-0-shared"]
    assert model.counter_sets == [{"name": "gpu-0-counters", "counters": {"memory": {"value": "81559Mi"}}}]
    unshared = build_devices(inv.node(gpu), mig_mode="partitionable", shares=False)
    assert ([d["name"] for d in unshared.devices], unshared.counter_sets) == (["gpu-0"], [])


# MIG mode fixed until a reset: Ampere, and any GPU in a VM, which cannot reset it
FIXED_MODE: dict[str, Callable[[bool], Gpu]] = {
    "ampere": lambda mig_enabled: inv.a100(0, mig_enabled=mig_enabled),
    "virtualized-hopper": lambda mig_enabled: inv.h100(0, mig_enabled=mig_enabled, virtualized=True),
}


@pytest.mark.parametrize("kind", sorted(FIXED_MODE))
@pytest.mark.parametrize(
    ("mig_enabled", "whole", "partitions"),
    [(True, False, 25), (False, True, 0)],
    ids=["mig-on-partitions-only", "mig-off-whole-only"],
)
def test_a_gpu_that_needs_a_reset_offers_its_partitions_or_itself_never_both(
    kind: str, mig_enabled: bool, whole: bool, partitions: int
) -> None:
    gpu = FIXED_MODE[kind](mig_enabled)
    model = partitionable(gpu)
    names = [d["name"] for d in model.devices]
    assert ("gpu-0" in names) is whole
    assert ("gpu-0-shared" in names) is whole
    assert len([n for n in names if "-mig-" in n]) == partitions
    (counter_set,) = model.counter_sets  # the partitions', or the one the GPU and its shared device use
    assert (len(counter_set["counters"]) > 1) is bool(partitions)
    unshared = build_devices(inv.node(gpu), mig_mode="partitionable", shares=False)
    assert len(unshared.counter_sets) == (1 if partitions else 0)


def test_hopper_on_bare_metal_offers_partitions_and_itself_whatever_the_mig_mode() -> None:
    on, off = partitionable(inv.h100(0, mig_enabled=True)), partitionable(inv.h100(0, mig_enabled=False))
    assert on == off
    assert len(on.devices) == 2 + sum(map(len, H100_TABLE.values()))


# ---- counters admit exactly the layouts the GPU can hold


NAMED_LAYOUTS = [
    ("two-3g", ["gpu-0-mig-3g40gb-0", "gpu-0-mig-3g40gb-4"], True),
    ("4g-and-3g", ["gpu-0-mig-4g40gb-0", "gpu-0-mig-3g40gb-4"], True),
    ("4g-and-3g-overlapping", ["gpu-0-mig-4g40gb-0", "gpu-0-mig-3g40gb-0"], False),
    ("seven-1g", [f"gpu-0-mig-1g10gb-{s}" for s in range(7)], True),
    ("four-1g20gb", [f"gpu-0-mig-1g20gb-{s}" for s in (0, 2, 4, 6)], True),
    (
        "2g-2g-2g-1g",
        ["gpu-0-mig-2g20gb-0", "gpu-0-mig-2g20gb-2", "gpu-0-mig-2g20gb-4", "gpu-0-mig-1g10gb-6"],
        True,
    ),
    ("1g20gb-and-1g-inside-it", ["gpu-0-mig-1g20gb-0", "gpu-0-mig-1g10gb-1"], False),
    ("7g-and-1g", ["gpu-0-mig-7g80gb-0", "gpu-0-mig-1g10gb-6"], False),
    ("whole-and-1g", ["gpu-0", "gpu-0-mig-1g10gb-6"], False),
    ("two-media-extensions", ["gpu-0-mig-1g10gbme-0", "gpu-0-mig-1g10gbme-3"], False),
    (
        "media-extension-and-six-1g",
        ["gpu-0-mig-1g10gbme-0", *(f"gpu-0-mig-1g10gb-{s}" for s in range(1, 7))],
        True,
    ),
]


@pytest.mark.parametrize("server_minor", [34, 36])
@pytest.mark.parametrize(
    ("names", "fits"), [case[1:] for case in NAMED_LAYOUTS], ids=[c[0] for c in NAMED_LAYOUTS]
)
def test_h100_layouts(names: list[str], fits: bool, server_minor: int) -> None:
    assert gpu_pool(inv.h100(0), server_minor).fits(names) is fits


GPUS: dict[str, Callable[[], Gpu]] = {
    "h100": lambda: inv.h100(0),
    "a100": lambda: inv.a100(0),
    "a30": lambda: inv.a30(0),
}


def test_a30_media_extensions_share_its_one_jpeg_and_ofa_engine() -> None:
    pool = gpu_pool(inv.a30(0), 36)
    assert pool.fits(["gpu-0-mig-1g6gbme-0", "gpu-0-mig-2g12gb-2"])
    assert not pool.fits(["gpu-0-mig-1g6gbme-0", "gpu-0-mig-2g12gbme-2"])


@pytest.mark.parametrize("kind", sorted(GPUS))
def test_pairs_fit_exactly_when_the_gpu_can_hold_both(kind: str) -> None:
    gpu = GPUS[kind]()
    pool = gpu_pool(gpu, 36)
    layouts = valid_layouts(gpu)
    names = sorted(pool.devices)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            assert pool.fits([first, second]) is (frozenset({first, second}) in layouts), (first, second)


@pytest.mark.parametrize("kind", sorted(GPUS))
def test_counters_admit_exactly_the_layouts_the_gpu_can_hold(kind: str) -> None:
    gpu = GPUS[kind]()
    pool = gpu_pool(gpu, 34)
    expected = valid_layouts(gpu)
    if not gpu.mig_mode_switchable:  # MIG is on and stays on, so the whole GPU is not offered
        expected -= {frozenset({f"gpu-{gpu.minor}"}), frozenset({f"gpu-{gpu.minor}-shared"})}
    assert pool.admitted(sorted(pool.devices)) == expected


def test_instance_limit_below_the_placements_becomes_a_counter() -> None:
    # no engines to tell the profile apart: only an instance counter stops a third one
    rows = [
        (1, "1g.8gb+gfx", 1, 2, range(8), 1, 10, 0, 0, 0, 0, 8192),
        (0, "8g.64gb", 8, 1, (0,), 8, 80, 0, 0, 0, 0, 65536),
    ]
    gpu = inv.synthetic_gpu(0, [inv.profile(r) for r in rows], memory_slices=8, memory_mib=65536)
    model = partitionable(gpu)
    assert model.counter_sets[0]["counters"]["1g8gbgfx-instances"] == {"value": "2"}
    pool = gpu_pool(gpu, 36)
    assert pool.fits(["gpu-0-mig-1g8gbgfx-0", "gpu-0-mig-1g8gbgfx-5"])
    assert not pool.fits(["gpu-0-mig-1g8gbgfx-0", "gpu-0-mig-1g8gbgfx-5", "gpu-0-mig-1g8gbgfx-7"])
    assert pool.admitted(sorted(pool.devices)) == valid_layouts(gpu)


# ---- static mode and existing MIG devices


def test_static_mode_offers_gpus_with_mig_off_and_existing_mig_devices() -> None:
    inventory = inv.h100_node()
    model = build_devices(inventory, mig_mode="static")
    assert [s["name"] for s in model.counter_sets] == [f"gpu-{m}-counters" for m in range(4)]
    assert [d["name"] for d in model.devices] == [
        "gpu-0", "gpu-0-shared", "gpu-1", "gpu-1-shared", "gpu-2", "gpu-2-shared", "gpu-3", "gpu-3-shared",
        "gpu-4-mig-2g20gb-0", "gpu-4-mig-1g10gb-2", "gpu-4-mig-1g10gbme-3", "gpu-4-mig-3g40gb-4",
        "gpu-5-mig-7g80gb-0",
    ]  # fmt: skip
    assert not any("consumesCounters" in d for d in model.devices if "-mig-" in d["name"])
    unshared = build_devices(inventory, mig_mode="static", shares=False)
    assert unshared.counter_sets == []
    assert [d["name"] for d in unshared.devices] == [
        d["name"] for d in model.devices if "shared" not in d["name"]
    ]
    assert not any("consumesCounters" in d for d in unshared.devices)
    mig = by_name(model)["gpu-4-mig-3g40gb-4"]
    assert attribute(mig, "uuid") == inventory.gpus[4].mig_devices[3].uuid
    assert attribute(mig, "parentUUID") == inventory.gpus[4].uuid


@pytest.mark.parametrize("name", ["h100", "a100"])
def test_existing_mig_devices_keep_their_names_across_modes_without_duplicates(name: str) -> None:
    inventory = inv.REALISTIC[name]()
    static = [d["name"] for d in build_devices(inventory, mig_mode="static").devices if "-mig-" in d["name"]]
    dynamic = build_devices(inventory, mig_mode="partitionable")
    bare = dataclasses.replace(
        inventory, gpus=tuple(dataclasses.replace(g, mig_devices=()) for g in inventory.gpus)
    )
    assert static
    assert set(static) <= set(by_name(dynamic))
    assert dynamic == build_devices(bare, mig_mode="partitionable")


def test_existing_mig_device_of_an_unlisted_profile_uses_its_own_figures() -> None:
    gpu = inv.h100(0, mig_enabled=True)
    device = MigDevice(
        uuid="MIG-x", profile_id=99, profile_name="1c.2g.20gb", placement=MigPlacement(2, 2),
        gpu_instance_id=1, compute_instance_id=1, memory_mib=20096, multiprocessors=16,
    )  # fmt: skip
    model = build_devices(inv.node(dataclasses.replace(gpu, mig_devices=(device,))), mig_mode="static")
    (mig,) = model.devices
    assert mig["name"] == "gpu-0-mig-1c2g20gb-2"
    assert mig["capacity"] == {
        "memory": {"value": "20096Mi"},
        "multiprocessors": {"value": "16"},
        "memorySlices": {"value": "2"},
    }


def test_two_compute_instances_in_one_gpu_instance_are_refused() -> None:
    gpu = inv.h100(0, mig_enabled=True, layout=[("2g.20gb", 0)])
    second = dataclasses.replace(gpu.mig_devices[0], uuid="MIG-second", compute_instance_id=1)
    inventory = inv.node(dataclasses.replace(gpu, mig_devices=(*gpu.mig_devices, second)))
    with pytest.raises(NotSupported, match="gpu-0-mig-2g20gb-0"):
        build_devices(inventory, mig_mode="static")


@pytest.mark.parametrize("name", sorted(inv.REALISTIC))
def test_realistic_inventories_build_identically_twice(name: str) -> None:
    inventory: Inventory = inv.REALISTIC[name]()
    assert build_devices(inventory, mig_mode="partitionable") == build_devices(
        inventory, mig_mode="partitionable"
    )


# ---- shared devices


def test_shared_h100_device() -> None:
    model = partitionable(inv.h100(3))
    devices = by_name(model)
    shared, whole = devices["gpu-3-shared"], devices["gpu-3"]
    assert shared == {
        "name": "gpu-3-shared",
        "attributes": {**whole["attributes"], "shared": {"bool": True}},  # what the classes tell them by
        "capacity": {
            "memory": {
                "value": "81559Mi",
                "requestPolicy": {
                    "default": "79Gi",
                    "validRange": {"min": "1Gi", "max": "79Gi", "step": "1Gi"},
                },
            },
            "compute": {
                "value": "100",
                "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
            },
        },
        "allowMultipleAllocations": True,
        "consumesCounters": whole["consumesCounters"],
    }
    assert shared["consumesCounters"] == [
        {"counterSet": "gpu-3-counters", "counters": model.counter_sets[0]["counters"]}
    ]
    assert not any("allowMultipleAllocations" in d for d in model.devices if d is not shared)


@pytest.mark.parametrize(
    ("mib", "largest"),
    [(81559, "79Gi"), (80 * 1024, "80Gi"), (1024 * 1024 + 1, "1Ti"), (2048, "2Gi")],
    ids=["h100", "whole-gib", "canonical", "smallest"],
)
def test_a_share_asks_whole_gib_up_to_the_gpus_memory_rounded_down(mib: int, largest: str) -> None:
    gpu = dataclasses.replace(inv.plain(0, "l4"), memory_bytes=mib * inv.MIB)
    memory = by_name(partitionable(gpu))["gpu-0-shared"]["capacity"]["memory"]
    assert memory["value"] == bytes_quantity(mib * inv.MIB)
    assert memory["requestPolicy"] == {
        "default": largest,
        "validRange": {"min": "1Gi", "max": largest, "step": "1Gi"},
    }


def test_shares_by_count_add_a_count_and_give_a_share_without_memory_1_nth_of_it() -> None:
    model = build_devices(inv.node(inv.h100(3)), mig_mode="partitionable", shares_per_gpu=4)
    capacity = by_name(model)["gpu-3-shared"]["capacity"]
    assert capacity["shares"] == {
        "value": "4",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
    }
    # 79 whole GiB / 4, rounded down: four such shares fit beside each other
    assert capacity["memory"]["requestPolicy"] == {
        "default": "19Gi",
        "validRange": {"min": "1Gi", "max": "79Gi", "step": "1Gi"},
    }
    assert capacity["compute"] == partitionable(inv.h100(3)).devices[1]["capacity"]["compute"]
    # one capacity more, no device and no counter more
    without = partitionable(inv.h100(3))
    assert [d["name"] for d in model.devices] == [d["name"] for d in without.devices]
    assert model.counter_sets == without.counter_sets


def test_a_gpu_offers_at_most_one_share_by_count_per_whole_gib() -> None:
    t4 = dataclasses.replace(inv.plain(0, "l4"), memory_bytes=15360 * inv.MIB)
    capacity = by_name(build_devices(inv.node(t4), mig_mode="static", shares_per_gpu=64))["gpu-0-shared"][
        "capacity"
    ]
    assert capacity["shares"]["value"] == "15"
    assert capacity["memory"]["requestPolicy"]["default"] == "1Gi"
    assert [shares_of(t4, n) for n in (0, 2, 15, 16)] == [0, 2, 15, 15]


def test_publishing_passes_the_count_and_a_server_without_shares_drops_it() -> None:
    asked = Publishing(shares=True, shares_per_gpu=8)
    assert "shares" in by_name(publish(inv.node(inv.h100(0)), asked))["gpu-0-shared"]["capacity"]
    assert asked.describe() == "whole GPUs, existing MIG devices, shares (8 per GPU by count)"
    fitted, _ = fit_to_server(asked, ServerFields.of_release(35))
    assert (fitted.shares, fitted.shares_per_gpu) == (False, 0)
    assert fit_to_server(asked, ServerFields.of_release(36))[0] == asked


def test_a_gpu_of_less_than_2_gib_is_not_shared() -> None:
    gpu = dataclasses.replace(inv.plain(0, "l4"), memory_bytes=2047 * inv.MIB)
    assert partitionable(gpu) == build_devices(inv.node(gpu), mig_mode="partitionable", shares=False)
    assert [d["name"] for d in partitionable(gpu).devices] == ["gpu-0"]


@pytest.mark.parametrize("server_minor", [34, 36])
@pytest.mark.parametrize("kind", ["h100", "a30", "l4"])
def test_the_shared_device_excludes_its_whole_gpu_and_every_partition(kind: str, server_minor: int) -> None:
    gpu = {"h100": lambda: inv.h100(0), "a30": lambda: inv.a30(0), "l4": lambda: inv.plain(0, "l4")}[kind]()
    if kind == "a30":  # MIG fixed on an Ampere: offered whole only with MIG off
        gpu = dataclasses.replace(gpu, mig_enabled=False)
    pool = gpu_pool(gpu, server_minor)
    assert pool.fits(["gpu-0-shared"]) and pool.fits(["gpu-0"])
    assert not pool.fits(["gpu-0-shared", "gpu-0"])
    for name in pool.devices:
        if "-mig-" in name:
            assert pool.fits([name]) and not pool.fits(["gpu-0-shared", name]), name
    # the scheduler counts a multi-allocatable device's counters once, however many shares it hands out
    assert pool.demand("gpu-0-shared") == pool.demand("gpu-0")


def without_shares(model: DeviceModel) -> DeviceModel:
    """`model` less its shared devices and the counter sets that only they brought."""
    memory_only = {s["name"] for s in model.counter_sets if list(s["counters"]) == ["memory"]}
    devices: list[Device] = []
    for device in model.devices:
        if device.get("allowMultipleAllocations"):
            continue
        kept: Device = {**device}
        uses = [u for u in device.get("consumesCounters", []) if u["counterSet"] not in memory_only]
        kept.pop("consumesCounters", None)
        if uses:
            kept["consumesCounters"] = uses
        devices.append(kept)
    return DeviceModel(devices, [s for s in model.counter_sets if s["name"] not in memory_only])


@pytest.mark.parametrize("mode", ["partitionable", "static"])
@pytest.mark.parametrize("name", sorted(inv.REALISTIC))
def test_without_shares_the_model_is_the_one_less_its_shared_devices(name: str, mode: str) -> None:
    inventory = inv.REALISTIC[name]()
    shared = build_devices(inventory, mig_mode=mode)
    unshared = build_devices(inventory, mig_mode=mode, shares=False)
    assert unshared == without_shares(shared)
    assert not any(d["name"].endswith("-shared") or "allowMultipleAllocations" in d for d in unshared.devices)
    whole = [d["name"] for d in unshared.devices if attribute(d, "type") == "gpu"]
    names = [d["name"] for d in shared.devices]
    for gpu in whole:  # each whole GPU is followed by its shared device
        assert names[names.index(gpu) + 1] == f"{gpu}-shared"
    assert len(names) == len(unshared.devices) + len(whole)


def policy_problems(capacity: dict[str, object]) -> list[str]:
    """The API server's rules on a validRange requestPolicy (validation.go, validateRequestPolicyRange)."""
    policy = capacity["requestPolicy"]
    assert isinstance(policy, dict) and set(policy) == {"default", "validRange"}
    valid_range = policy["validRange"]
    value, default = quantity(str(capacity["value"])), quantity(policy["default"])
    low, high, step = (quantity(valid_range[k]) for k in ("min", "max", "step"))
    rules = {
        "min <= value": low <= value,
        "default >= min": default >= low,
        "min <= max": low <= high,
        "max <= value": high <= value,
        "default <= max": default <= high,
        "min + step <= value": low + step <= value,
        "default - min is whole steps": (default - low) % step == 0,
        "max - min is whole steps": (high - low) % step == 0,
    }
    return [rule for rule, holds in rules.items() if not holds]


def machine_inventory(name: str, state_file: Path) -> Inventory:
    with gpu_driver.connect(f"sim:{name}", state_file=state_file) as session:
        return session.inventory()


@pytest.mark.parametrize("mode", ["partitionable", "static"])
@pytest.mark.parametrize("machine", sorted(machines.MACHINES))
def test_shared_devices_of_every_simulated_machine_follow_the_apis_request_policy_rules(
    machine: str, mode: str, tmp_path: Path
) -> None:
    inventory = machine_inventory(machine, tmp_path / "machine.json")
    model = build_devices(inventory, mig_mode=mode)
    shared = [d for d in model.devices if d.get("allowMultipleAllocations")]
    whole = [d for d in model.devices if attribute(d, "type") == "gpu" and d not in shared]
    assert [d["name"] for d in shared] == [f"{d['name']}-shared" for d in whole]
    for device in model.devices:
        capacity = device["capacity"]
        if device not in shared:
            assert not any("requestPolicy" in c for c in capacity.values()), device["name"]
            continue
        assert sorted(capacity) == ["compute", "memory"]
        for name, amount in capacity.items():
            assert policy_problems(dict(amount)) == [], (device["name"], name)
    counted = build_devices(inventory, mig_mode=mode, shares_per_gpu=MAX_SHARES_PER_GPU)
    for device in counted.devices:
        if device.get("allowMultipleAllocations"):
            for name, amount in device["capacity"].items():
                assert policy_problems(dict(amount)) == [], (device["name"], name)
    for server_minor in (34, 35, 36):
        slices = build_slices(
            model, driver="gpu.gpudra.io", node_name="n", generation=1, server_minor=server_minor
        )
        assert validate_slices(slices, server_minor=server_minor) == []


# ---- shares of MIG partitions


def mig_shares(*gpus: Gpu, shares_per_gpu: int = 0, profiles: frozenset[str] | None = None) -> DeviceModel:
    return build_devices(
        inv.node(*gpus),
        mig_mode="partitionable",
        mig_profiles=profiles,
        mig_share_profiles=frozenset({"1g.10gb"}),
        shares_per_gpu=shares_per_gpu,
    )


def test_a_shareable_profile_adds_a_shared_device_after_each_of_its_placements() -> None:
    model = mig_shares(inv.h100(0))
    plain = partitionable(inv.h100(0))
    names = [d["name"] for d in model.devices]
    one_g = [d["name"] for d in plain.devices if d["name"].startswith("gpu-0-mig-1g10gb-")]
    assert len(one_g) == 7
    for name in one_g:  # right after its exclusive form, so each class keeps packing order
        assert names[names.index(name) + 1] == f"{name}-shared"
    assert len(names) == len(plain.devices) + 7  # one device per placement, no counter more
    assert model.counter_sets == plain.counter_sets
    # the rest is the model without shareable profiles, unchanged and in its order
    assert [
        d for d in model.devices if not d.get("allowMultipleAllocations") or "-mig-" not in d["name"]
    ] == (plain.devices)


def test_the_shared_partition_carries_its_partitions_attributes_and_counters() -> None:
    devices = by_name(mig_shares(inv.h100(0), shares_per_gpu=4))
    partition, shared = devices["gpu-0-mig-1g10gb-6"], devices["gpu-0-mig-1g10gb-6-shared"]
    assert shared == {
        "name": "gpu-0-mig-1g10gb-6-shared",
        "attributes": {**partition["attributes"], "shared": {"bool": True}},
        "capacity": {
            "memory": {
                "value": partition["capacity"]["memory"]["value"],  # 9984Mi: 9 whole GiB
                "requestPolicy": {
                    "default": "2Gi",
                    "validRange": {"min": "1Gi", "max": "9Gi", "step": "1Gi"},
                },
            },
            "compute": {
                "value": "100",
                "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
            },
            "shares": {
                "value": "4",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
            },
        },
        "allowMultipleAllocations": True,
        "consumesCounters": partition["consumesCounters"],
    }
    # without shares by count: memory and compute only, a share that names no memory gets all of it
    plain = by_name(mig_shares(inv.h100(0)))["gpu-0-mig-1g10gb-6-shared"]["capacity"]
    assert sorted(plain) == ["compute", "memory"]
    assert plain["memory"]["requestPolicy"]["default"] == "9Gi"


def test_only_the_shareable_profiles_get_a_shared_form() -> None:
    model = mig_shares(inv.h100(0), profiles=frozenset({"1g.10gb", "3g.40gb"}))
    shared = [d["name"] for d in model.devices if d.get("allowMultipleAllocations") and "-mig-" in d["name"]]
    assert sorted(shared) == sorted(f"gpu-0-mig-1g10gb-{start}-shared" for start in range(7))
    assert all(attribute(by_name(model)[name], "profile") == "1g.10gb" for name in shared)


def test_static_mode_has_no_shared_partitions() -> None:
    node = inv.node(dataclasses.replace(inv.h100(0), mig_enabled=True))
    model = build_devices(node, mig_mode="static", mig_share_profiles=frozenset({"1g.10gb"}))
    assert not any(d["name"].endswith("-shared") and "-mig-" in d["name"] for d in model.devices)


@pytest.mark.parametrize("server_minor", [36, 37])
def test_a_placements_exclusive_and_shared_forms_exclude_each_other(server_minor: int) -> None:
    model = mig_shares(inv.h100(0))
    pool = Pool(
        build_slices(model, driver="gpu.gpudra.io", node_name="n", generation=1, server_minor=server_minor)
    )
    shared, exclusive = "gpu-0-mig-1g10gb-6-shared", "gpu-0-mig-1g10gb-6"
    assert pool.fits([shared]) and pool.fits([exclusive])
    assert not pool.fits([shared, exclusive])
    # the scheduler counts a multi-allocatable device's counters once: two shares fit as one
    assert pool.demand(shared) == pool.demand(exclusive)
    # beside another placement's partition or shared form, as partitions do
    assert pool.fits([shared, "gpu-0-mig-1g10gb-5", "gpu-0-mig-1g10gb-4-shared"])
    # and never beside the whole GPU, its shared device, or a partition overlapping the placement
    for other in ("gpu-0", "gpu-0-shared", "gpu-0-mig-7g80gb-0", "gpu-0-mig-3g40gb-4", "gpu-0-mig-1g20gb-6"):
        assert pool.fits([other]) and not pool.fits([shared, other]), other


def test_shared_partitions_of_every_simulated_machine_follow_the_apis_rules(tmp_path: Path) -> None:
    for machine in sorted(machines.MACHINES):
        inventory = machine_inventory(machine, tmp_path / f"{machine}.json")
        profiles = frozenset(p.name for g in inventory.gpus for p in g.mig_profiles)
        for per_gpu in (0, MAX_SHARES_PER_GPU):
            model = build_devices(
                inventory, mig_mode="partitionable", mig_share_profiles=profiles, shares_per_gpu=per_gpu
            )
            for device in model.devices:
                if device.get("allowMultipleAllocations"):
                    for name, amount in device["capacity"].items():
                        assert policy_problems(dict(amount)) == [], (machine, device["name"], name)
            for server_minor in (36, 37):
                slices = build_slices(
                    model, driver="gpu.gpudra.io", node_name="n", generation=1, server_minor=server_minor
                )
                assert validate_slices(slices, server_minor=server_minor) == [], machine


def test_publish_refuses_a_shareable_profile_that_is_not_offered() -> None:
    node = inv.node(inv.h100(0))
    offered = Publishing(
        mig_mode="partitionable",
        mig_profiles=frozenset({"1g.10gb", "3g.40gb"}),
        mig_share_profiles=frozenset({"2g.20gb"}),
    )
    with pytest.raises(ConfigError) as refused:
        publish(node, offered)
    assert refused.value.field == "--mig-share-profiles"
    assert "2g.20gb is not a MIG profile offered on this node; allowed: 1g.10gb, 3g.40gb" in str(
        refused.value
    )
    # a node without MIG-capable GPUs (one node group's values on another) publishes what it has
    plain = inv.node(inv.plain(0, "l4"))
    assert [d["name"] for d in publish(plain, offered).devices] == ["gpu-0"]


def test_a_server_without_shares_drops_the_shared_partitions_and_keeps_the_rest() -> None:
    asked = Publishing(
        mig_mode="partitionable",
        mig_share_profiles=frozenset({"1g.10gb"}),
        shares_per_gpu=4,
        partition_attributes="minimal",
    )
    assert asked.describe() == (
        "whole GPUs, MIG partitions on demand (every profile, minimal attributes), "
        "shares of MIG partitions (1g.10gb, 4 each by count), no shares"
    )
    assert fit_to_server(asked, ServerFields.of_release(36))[0] == asked
    fitted, withheld = fit_to_server(asked, ServerFields.of_release(35))
    assert (fitted.mig_share_profiles, fitted.shares_per_gpu) == (frozenset(), 0)
    assert "partitions" in [w.form for w in withheld]  # no partitions, so no shares of them
    # partitions kept (1.35 with the counter gate on), their minimal attributes too; shares withheld
    gates = {"DRAPartitionableDevices": True}
    fitted, withheld = fit_to_server(asked, ServerFields.of_release(35, gates))
    assert "shares" in [w.form for w in withheld]
    assert (fitted.mig_mode, fitted.partition_attributes, fitted.mig_share_profiles) == (
        "partitionable",
        "minimal",
        frozenset(),
    )


# ---- health taints


def _gpu_taints(model: DeviceModel, lost: dict[str, str]) -> dict[str, DeviceTaint]:
    """The taints of each device of the `lost` GPUs (UUID -> reason)."""
    return device_taints(device_gpus={d["name"]: gpu_uuid_of(d) for d in model.devices}, lost=lost, marks=())


LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


@pytest.mark.parametrize("mode", ["partitionable", "static"])
def test_an_unhealthy_gpu_taints_itself_and_its_partitions_only(mode: str) -> None:
    model = build_devices(inv.h100_node(), mig_mode=mode)
    gpus = {gpu.minor: gpu.uuid for gpu in inv.h100_node().gpus}
    lost = {gpus[4]: "NVMLError_GpuIsLost", gpus[1]: "NVMLError_ResetRequired"}
    tainted = with_health_taints(model, _gpu_taints(model, lost))

    assert tainted.counter_sets == model.counter_sets
    assert [d["name"] for d in tainted.devices] == [d["name"] for d in model.devices]
    for before, after in zip(model.devices, tainted.devices, strict=True):
        reason = lost.get(gpu_uuid_of(before))
        if reason is None:
            assert after is before
        else:
            assert after == {
                **before,
                "taints": [{"key": UNHEALTHY_TAINT_KEY, "value": reason, "effect": "NoSchedule"}],
            }
    on_gpu_4 = [d["name"] for d in tainted.devices if d.get("taints") and gpu_uuid_of(d) == gpus[4]]
    assert "-mig-" in " ".join(on_gpu_4)  # its partitions, possible or existing, are tainted too
    assert "gpu-1-shared" in [d["name"] for d in tainted.devices if d.get("taints")]  # and its shared device
    assert all("taints" not in d for d in model.devices)  # the model itself is left as it was


def test_no_unhealthy_gpu_leaves_the_model_as_it_is() -> None:
    model = partitionable(inv.h100(0))
    assert with_health_taints(model, {}) is model
    assert with_health_taints(model, _gpu_taints(model, {"GPU-not-here": "Lost"})).devices == model.devices


def test_a_taint_is_added_to_those_a_device_already_has() -> None:
    model = partitionable(inv.plain(0, "l4"))
    taint = {"key": "example.com/other", "effect": "NoSchedule"}
    model.devices[0]["taints"] = [taint]  # type: ignore[list-item]
    lost = {inv.plain(0, "l4").uuid: "NVMLError_GpuIsLost"}
    device, shared = with_health_taints(model, _gpu_taints(model, lost)).devices
    assert [t["key"] for t in device["taints"]] == ["example.com/other", UNHEALTHY_TAINT_KEY]
    assert [t["key"] for t in shared["taints"]] == [UNHEALTHY_TAINT_KEY]


@pytest.mark.parametrize(
    ("reason", "value"),
    [
        ("NVMLError_GpuIsLost", "NVMLError_GpuIsLost"),
        ("a reason: with spaces/slashes!", "areasonwithspacesslashes"),
        ("_" + "x" * 80, "x" * 62),
        ("", ""),
    ],
    ids=["nvml", "punctuation", "long", "empty"],
)
def test_the_taint_value_is_always_a_label_value(reason: str, value: str) -> None:
    gpu = inv.plain(0, "l4")
    model = partitionable(gpu)
    for device in with_health_taints(model, _gpu_taints(model, {gpu.uuid: reason})).devices:  # and its share
        (taint,) = device["taints"]
        assert taint["value"] == value
    assert len(value) <= 63 and LABEL_VALUE.fullmatch(value)
