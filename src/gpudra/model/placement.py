"""MIG placement arithmetic on one GPU: which profiles still fit, and the order that packs them. Pure.

A new GPU instance needs one of its profile's placements free of every occupied memory slice, fewer
instances of its profile than the profile allows, and engines left over: together the instances may use
no more of each engine kind than the profile spanning the whole GPU has (so two `+me` instances never
share the one OFA of an A30). Memory and SMs need no check of their own: in the known MIG tables they follow
from the slices. These are the rules the device model's counter sets encode for the scheduler; this
module answers the same question directly, for one GPU and one layout.

"Occupied" means GPU instances that exist, or that the scheduler has allocated and the node plugin will
create: both hold their slices.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from gpudra.model.inventory import Gpu, MigPlacement, MigProfile


class Instance(NamedTuple):
    """A GPU instance that holds its placement: the name of its GPU-instance profile, and where it sits."""

    profile: str
    placement: MigPlacement


def existing_instances(gpu: Gpu) -> tuple[Instance, ...]:
    """The GPU instances behind `gpu`'s MIG devices, once each (a GPU instance may hold several).

    A MIG device names its compute-instance profile when that is smaller than its GPU instance
    (`1c.2g.20gb`); the GPU-instance profile, found by ID, is what counts against instance limits.
    """
    names = {p.id: p.name for p in gpu.mig_profiles}
    found: dict[int, Instance] = {}
    for device in gpu.mig_devices:
        name = names.get(device.profile_id, device.profile_name)
        found.setdefault(device.gpu_instance_id, Instance(name, device.placement))
    return tuple(found.values())


def free_placements(gpu: Gpu, profile: MigProfile, occupied: Iterable[Instance]) -> tuple[MigPlacement, ...]:
    """The placements a new instance of `profile` could take beside `occupied`, in `packing_order`.

    Empty when the profile is at its instance limit or the GPU has not the engines left for it.
    """
    held = tuple(occupied)
    if sum(1 for i in held if i.profile == profile.name) >= profile.instance_count:
        return ()
    if not _engines_left(gpu, profile, held):
        return ()
    used = {s for i in held for s in i.placement.slices}
    return tuple(p for p in packing_order(gpu, profile) if used.isdisjoint(p.slices))


def placeable(gpu: Gpu, occupied: Iterable[Instance]) -> tuple[MigProfile, ...]:
    """The profiles of `gpu` of which one more instance fits beside `occupied`, in the GPU's order."""
    held = tuple(occupied)
    return tuple(p for p in gpu.mig_profiles if free_placements(gpu, p, held))


def largest_placeable(gpu: Gpu, occupied: Iterable[Instance]) -> MigProfile | None:
    """The largest profile that still fits, by GPU slices then memory; None when none does.

    Of equals (`1g.10gb` and `1g.10gb+me`) the first in the GPU's list wins, which in NVML's order is the
    plain one.
    """
    return max(placeable(gpu, occupied), key=_size, default=None)


def packing_order(gpu: Gpu, profile: MigProfile) -> tuple[MigPlacement, ...]:
    """`profile`'s placements in the order a first-fit allocator should try them.

    The kube-scheduler allocates the first published device that fits, so the order of a profile's
    placements decides where its instances land. A placement is ranked by the placements of larger
    profiles it would block (those it overlaps), largest first, compared lexicographically: the one that
    spoils the least valuable larger placements comes first. On A100/H100 the large profiles sit low
    (7g@0, 4g@0, 3g@0|4), so small instances fill the GPU from its top slices down and the biggest profiles
    stay placeable longest; the rule reads that from the table rather than from profile names, so a GPU
    whose large placements sit elsewhere is packed away from them too. Ties go to the higher start, which
    on those tables keeps the packed end contiguous.
    """
    larger = [(_size(p), q) for p in gpu.mig_profiles if _size(p) > _size(profile) for q in p.placements]

    def blocked(placement: MigPlacement) -> list[tuple[int, int]]:
        hit = (size for size, q in larger if not set(placement.slices).isdisjoint(q.slices))
        return sorted(hit, reverse=True)

    return tuple(sorted(profile.placements, key=lambda p: (blocked(p), -p.start)))


def _size(profile: MigProfile) -> tuple[int, int]:
    return (profile.slice_count, profile.memory_mib)


def _engine_counts(profile: MigProfile) -> tuple[int, ...]:
    return (profile.copy_engines, profile.decoders, profile.encoders, profile.jpegs, profile.ofas)


def _engines_left(gpu: Gpu, profile: MigProfile, held: tuple[Instance, ...]) -> bool:
    """Whether the engines of the profile spanning `gpu` cover `held` plus one `profile` (True if unknown)."""
    spanning = MigPlacement(0, gpu.mig_memory_slices)
    full = max(
        (p for p in gpu.mig_profiles if spanning in p.placements),
        key=lambda p: p.multiprocessors,
        default=None,
    )
    if full is None:
        return True
    by_name = {p.name: p for p in gpu.mig_profiles}
    used: Counter[int] = Counter()
    for instance in held:
        known = by_name.get(instance.profile)
        if known is not None:  # an instance of an unlisted profile holds its slices; its engines are unknown
            used.update(dict(enumerate(_engine_counts(known))))
    need = _engine_counts(profile)
    return all(used[i] + need[i] <= limit for i, limit in enumerate(_engine_counts(full)))
