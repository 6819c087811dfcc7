"""MIG placement arithmetic: what still fits beside occupied GPU instances, on the H100, A100, A30 tables."""

from __future__ import annotations

import dataclasses

import pytest

from gpudra.model.inventory import Gpu, MigPlacement, MigProfile
from gpudra.model.placement import (
    Instance,
    existing_instances,
    free_placements,
    largest_placeable,
    packing_order,
    placeable,
)
from tests.unit import inventories as inv


def occupied(gpu: Gpu, *layout: tuple[str, int]) -> tuple[Instance, ...]:
    sizes = {p.name: p.memory_slices for p in gpu.mig_profiles}
    return tuple(Instance(name, MigPlacement(start, sizes[name])) for name, start in layout)


def largest(gpu: Gpu, *layout: tuple[str, int]) -> str | None:
    return _name(largest_placeable(gpu, occupied(gpu, *layout)))


H100_CASES = [
    ("empty", [], "7g.80gb"),
    ("1g-low", [("1g.10gb", 0)], "3g.40gb"),  # 4g@0 and 3g@0 hold slice 0; 3g@4 is left
    ("1g-high", [("1g.10gb", 6)], "4g.40gb"),
    ("4g-and-3g", [("4g.40gb", 0), ("3g.40gb", 4)], None),
    ("two-3g", [("3g.40gb", 0), ("3g.40gb", 4)], None),
    ("2g-in-each-half", [("2g.20gb", 2), ("2g.20gb", 4)], "2g.20gb"),  # 2g@0 is free
    ("7g", [("7g.80gb", 0)], None),
    ("six-1g", [("1g.10gb", s) for s in range(6)], "1g.20gb"),  # 1g.20gb@6 still has slices 6 and 7
    ("seven-1g", [("1g.10gb", s) for s in range(7)], None),  # slice 7 alone fits nothing
    ("upper-half-full", [("2g.20gb", 4), ("1g.20gb", 6)], "4g.40gb"),
]


@pytest.mark.parametrize(("layout", "expected"), [c[1:] for c in H100_CASES], ids=[c[0] for c in H100_CASES])
def test_largest_placeable_on_h100(layout: list[tuple[str, int]], expected: str | None) -> None:
    assert largest(inv.h100(0), *layout) == expected


A100_CASES = [
    ("empty", [], "7g.40gb"),
    ("3g-low", [("3g.20gb", 0)], "3g.20gb"),
    ("3g-high", [("3g.20gb", 4)], "4g.20gb"),
    ("2g-low", [("2g.10gb", 0)], "3g.20gb"),
    ("1g10gb-high", [("1g.10gb", 6)], "4g.20gb"),
]


@pytest.mark.parametrize(("layout", "expected"), [c[1:] for c in A100_CASES], ids=[c[0] for c in A100_CASES])
def test_largest_placeable_on_a100(layout: list[tuple[str, int]], expected: str | None) -> None:
    assert largest(inv.a100(0), *layout) == expected


def test_placeable_profiles_beside_a_1g_at_the_bottom_of_an_h100() -> None:
    gpu = inv.h100(0)
    names = [p.name for p in placeable(gpu, occupied(gpu, ("1g.10gb", 0)))]
    assert names == ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb"]


def test_instance_limits_count_as_much_as_slices() -> None:
    gpu = inv.h100(0)
    one_me = occupied(gpu, ("1g.10gb+me", 6))
    assert free_placements(gpu, _profile(gpu, "1g.10gb+me"), one_me) == ()  # one allowed, slices free
    assert len(free_placements(gpu, _profile(gpu, "1g.10gb"), one_me)) == 6


def test_free_placements_skip_occupied_slices_in_packing_order() -> None:
    gpu = inv.h100(0)
    free = free_placements(gpu, _profile(gpu, "1g.20gb"), occupied(gpu, ("2g.20gb", 4)))
    assert free == (MigPlacement(6, 2), MigPlacement(2, 2), MigPlacement(0, 2))


def test_the_gpu_engines_bound_instances_whose_slices_are_free() -> None:
    # A30 has one JPEG and one OFA engine: the 1g and 2g media extensions cannot coexist
    gpu = inv.a30(0)
    names = [p.name for p in placeable(gpu, occupied(gpu, ("1g.6gb+me", 0)))]
    assert names == ["1g.6gb", "2g.12gb"]


def test_an_instance_of_an_unlisted_profile_holds_its_slices() -> None:
    gpu = inv.h100(0)
    assert _name(largest_placeable(gpu, [Instance("9g.99gb", MigPlacement(0, 4))])) == "3g.40gb"


def test_more_memory_wins_among_equal_slices_and_then_the_first_listed() -> None:
    gpu = inv.h100(0)
    three_2g = occupied(gpu, ("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4))
    assert _name(largest_placeable(gpu, three_2g)) == "1g.20gb"  # not 1g.10gb, same GPU slices
    only_slice_6 = (*three_2g, Instance("unlisted", MigPlacement(7, 1)))
    assert [p.name for p in placeable(gpu, only_slice_6)] == ["1g.10gb", "1g.10gb+me"]
    assert _name(largest_placeable(gpu, only_slice_6)) == "1g.10gb"


def test_existing_instances_are_one_per_gpu_instance_under_its_gpu_instance_profile() -> None:
    gpu = inv.h100(0, mig_enabled=True, layout=[("2g.20gb", 0), ("1g.10gb", 6)])
    two_g, one_g = gpu.mig_devices
    # a second compute instance in the 2g GPU instance, named after its own (smaller) profile
    second = dataclasses.replace(two_g, uuid="MIG-ci", compute_instance_id=1, profile_name="1c.2g.20gb")
    gpu = dataclasses.replace(gpu, mig_devices=(two_g, second, one_g))
    assert existing_instances(gpu) == (
        Instance("2g.20gb", MigPlacement(0, 2)),
        Instance("1g.10gb", MigPlacement(6, 1)),
    )
    assert _name(largest_placeable(gpu, existing_instances(gpu))) == "2g.20gb"  # slices 2-5 free


def test_a_gpu_without_profiles_has_nothing_placeable() -> None:
    assert largest_placeable(inv.plain(0, "l4"), []) is None


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (
            "h100",
            {
                "1g.10gb": [6, 5, 4, 3, 2, 1, 0],
                "1g.20gb": [6, 4, 2, 0],
                "2g.20gb": [4, 2, 0],
                "3g.40gb": [4, 0],
            },
        ),
        ("a100", {"1g.5gb": [6, 5, 4, 3, 2, 1, 0], "1g.10gb": [6, 4, 2, 0], "2g.10gb": [4, 2, 0]}),
        ("a30", {"1g.6gb": [3, 2, 1, 0], "2g.12gb": [2, 0], "4g.24gb": [0]}),
    ],
)
def test_packing_order_keeps_clear_of_the_large_placements(kind: str, expected: dict[str, list[int]]) -> None:
    gpu = {"h100": inv.h100(0), "a100": inv.a100(0), "a30": inv.a30(0)}[kind]
    for name, starts in expected.items():
        assert [p.start for p in packing_order(gpu, _profile(gpu, name))] == starts, name


def test_packing_order_reads_the_table_not_the_profile_names() -> None:
    # the H100 table mirrored: the large profiles sit at the top, so small ones fill from the bottom
    gpu = inv.h100(0)
    mirrored = tuple(
        dataclasses.replace(
            p, placements=tuple(MigPlacement(8 - q.start - q.size, q.size) for q in p.placements)
        )
        for p in gpu.mig_profiles
    )
    gpu = dataclasses.replace(gpu, mig_profiles=mirrored)
    ones = [p.start for p in packing_order(gpu, _profile(gpu, "1g.10gb"))]
    assert ones[0] == 1 and sorted(ones[:3]) == [1, 2, 3]  # the lower half first, 4g now sits at 4
    assert packing_order(gpu, _profile(gpu, "2g.20gb"))[0].start == 2
    assert [p.start for p in packing_order(gpu, _profile(gpu, "3g.40gb"))] == [0, 4]


def _profile(gpu: Gpu, name: str) -> MigProfile:
    (found,) = [p for p in gpu.mig_profiles if p.name == name]
    return found


def _name(profile: MigProfile | None) -> str | None:
    return None if profile is None else profile.name
