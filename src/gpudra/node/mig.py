"""MIG partitions for prepared claims: created on demand, or handed out from a static layout. I/O: NVML.

Partitionable mode: the scheduler allocated a (profile, placement) of a GPU whose counters were free, so
prepare creates exactly that GPU instance and its full compute instance, and unprepare destroys them.
The state machine records the `MigSpec` (parent, profile, placement) before `create` and the `MigLive`
ids after, so a crash at any step is settled by `destroy`, which finds the instance by its live ids when
they were recorded and by its placement otherwise.

What is never adopted or destroyed: a GPU instance gpudra did not create, with a compute instance or
without one. Ownership comes from the checkpoint alone:
- `plan` refuses a claim whose placement any GPU instance overlaps other than one holding only MIG
  devices the checkpoint names (`owned`), before anything is recorded: a GPU instance without a
  compute instance is never anyone's there, since gpudra's own (a crash between the two steps of
  `create`) are settled by recovery, or by the repeated prepare's teardown, before a claim is planned;
- `create` never adopts an instance already at the placement (NVML refuses it);
- `destroy` with live ids touches only the instance whose MIG UUID is the recorded one, or, when its
  compute instance is gone (a crash inside destroy), the GPU instance of the recorded id, profile and
  placement that holds no compute instance; without live ids (a crash before they were saved), the
  instance at exactly the recorded profile and placement, which `plan` found free before the record.
(The one window left: an instance created by hand at that exact placement between the record and the
create. Instances made by hand otherwise are noticed by gpudra.node.health.foreign_mig, which stops offering
the placements they take.)

MIG mode. On a GPU whose mode changes without a reset (`Gpu.mig_mode_switchable`: Hopper and newer on
bare metal) the mode is switched when a claim needs the other one: on for a partition, off for the
whole GPU, and only while no process uses the GPU and no GPU instance exists; the claim's error says
why a switch was refused. It is never switched back eagerly: a mode change costs a driver reconfigure,
and the next claim may want the same mode. Where a change needs a reset (Ampere, any GPU under
virtualization) gpudra never switches: such a GPU offers its partitions only while MIG is on and itself
only while it is off (`model.devices`), so a claim can only meet the wrong mode when someone changed it
after the plugin started.

Static mode: the MIG devices that existed when the plugin started are published with their UUIDs;
prepare checks the device still exists and hands it out, unprepare leaves it.

Calls on one GPU are serialized (mode switches and instance changes must not interleave); different
GPUs proceed in parallel.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol, TypeVar

from gpudra.errors import ClaimError, GpudraError
from gpudra.model.devices import Device, partition_of
from gpudra.model.inventory import Gpu, GpuInstance, MigCapabilities, MigDevice
from gpudra.node import cdi
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import ResolvedDevice

_T = TypeVar("_T")
_R_co = TypeVar("_R_co", covariant=True)


class _GpuCall(Protocol[_R_co]):
    def __call__(self, *, gpu_uuid: str) -> _R_co: ...


class MigHardware(Protocol):
    """The NVML calls MIG prepare needs: gpudra.gpu.nvml.Nvml."""

    def mig_enabled(self, *, gpu_uuid: str) -> bool: ...

    def set_mig_mode(self, *, gpu_uuid: str, enabled: bool) -> None: ...

    def compute_processes(self, *, gpu_uuid: str) -> tuple[int, ...]: ...

    def mig_devices(self, *, gpu_uuid: str) -> tuple[MigDevice, ...]: ...

    def gpu_instances(self, *, gpu_uuid: str) -> tuple[GpuInstance, ...]: ...

    def create_mig_device(self, *, gpu_uuid: str, profile_id: int, placement_start: int) -> MigDevice: ...

    def destroy_mig_device(self, *, gpu_uuid: str, gpu_instance_id: int) -> None: ...

    def destroy_at_placement(self, *, gpu_uuid: str, profile_id: int, placement_start: int) -> bool: ...

    def mig_capabilities(
        self, *, gpu_minor: int, gpu_instance_id: int, compute_instance_id: int
    ) -> MigCapabilities: ...


class MigPartitions:
    """Creates, finds and destroys the MIG devices of prepared claims on one node's GPUs."""

    def __init__(self, hardware: MigHardware, *, gpus: Mapping[str, Gpu]) -> None:
        self.hardware = hardware
        self.gpus = dict(gpus)
        self._locks = {uuid: threading.Lock() for uuid in self.gpus}

    # --- planning (no side effects) --------------------------------------------------------------

    def plan(
        self, device: ResolvedDevice, published: Device, *, owned: set[str], joins: ckpt.MigLive | None = None
    ) -> ckpt.MigRecord | None:
        """The record of the partition `device` will be, or None for a static MIG device.

        `published` is the device as the slice shows it; `owned` are the MIG UUIDs the checkpoint
        holds. Refuses a placement that a GPU instance gpudra does not own overlaps, one without a
        compute instance included (see the module docstring). `joins`: the live ids of the partition
        another share of the device created, which this record then holds too (it must still exist).
        """
        if "uuid" in published["attributes"]:  # static: it exists already
            return None
        gpu = device.gpu
        record = ckpt.MigRecord(spec=self.spec_of(device.device, published, gpu), live=joins)
        profile_name, placement = partition_of(published)
        if joins is not None:
            instances = self._call(device.device, gpu, "list GPU instances", self.hardware.gpu_instances)
            if not any(joins.uuid in existing.mig_devices for existing in instances):
                raise ClaimError(
                    f"{_where(device.device, gpu, record.spec, profile_name)}: MIG device {joins.uuid}, "
                    "which another share of this partition created, no longer exists (a GPU reset?); "
                    "the kubelet retries once that claim is unprepared"
                )
            return record
        if self._mig_enabled(device.device, gpu):
            wanted = set(placement.slices)
            for existing in self._call(device.device, gpu, "list GPU instances", self.hardware.gpu_instances):
                mine = bool(existing.mig_devices) and set(existing.mig_devices) <= owned
                if not mine and set(existing.placement.slices) & wanted:
                    where = _where(device.device, gpu, record.spec, profile_name)
                    raise ClaimError(
                        f"{where}: the placement is taken by {_named(existing)}, which gpudra did not "
                        "create. gpudra never destroys or adopts it; remove it by hand "
                        f"(nvidia-smi mig -dci/-dgi -gi {existing.id} -i {gpu.minor}) or run the plugin "
                        "with --mig-mode static"
                    )
        return record

    @staticmethod
    def spec_of(device: str, published: Device, gpu: Gpu) -> ckpt.MigSpec:
        """What identifies partition `device` (as published) before it exists."""
        profile_name, placement = partition_of(published)
        profile = next((p for p in gpu.mig_profiles if p.name == profile_name), None)
        if profile is None:
            raise ClaimError(f"device {device}: GPU {gpu.uuid} has no MIG profile {profile_name}")
        return ckpt.MigSpec(gpu_uuid=gpu.uuid, profile_id=profile.id, placement_start=placement.start)

    # --- side effects ------------------------------------------------------------------------------

    def create(self, device: str, record: ckpt.MigRecord) -> ckpt.MigRecord:
        """Create the GPU and compute instance of `record`, switching MIG on where allowed; the record
        with its live ids. An instance already at the placement is refused, never adopted."""
        spec = record.spec
        gpu = self.gpus[spec.gpu_uuid]
        with self._locks[gpu.uuid]:
            if not self._mig_enabled(device, gpu):
                self._switch(device, gpu, enabled=True, why=f"for partition {device}")
            try:
                created = self.hardware.create_mig_device(
                    gpu_uuid=gpu.uuid, profile_id=spec.profile_id, placement_start=spec.placement_start
                )
            except GpudraError as err:
                raise ClaimError(f"{_where(device, gpu, spec)}: cannot create the MIG device: {err}") from err
        return record.model_copy(
            update={
                "live": ckpt.MigLive(
                    gpu_instance_id=created.gpu_instance_id,
                    compute_instance_id=created.compute_instance_id,
                    uuid=created.uuid,
                )
            }
        )

    def destroy(self, device: str, record: ckpt.MigRecord) -> None:
        """Destroy what `record` says gpudra created; nothing there is success (idempotent).

        With live ids, only the instance whose UUID is the recorded one is destroyed (a GPU instance id
        is reused once freed), or, once its compute instance is gone, the GPU instance of the recorded
        id, profile and placement that holds none. Without them (a crash before they were saved), the
        instance of the recorded profile at the recorded placement is: `plan` made sure no other was
        there."""
        spec = record.spec
        gpu = self.gpus.get(spec.gpu_uuid)
        if gpu is None:  # the GPU is gone from this node (or the inventory): nothing left to destroy
            return
        with self._locks[gpu.uuid]:
            try:
                if record.live is None:
                    self.hardware.destroy_at_placement(
                        gpu_uuid=gpu.uuid, profile_id=spec.profile_id, placement_start=spec.placement_start
                    )
                    return
                live = record.live
                # None with MIG off: a reset or mode change already destroyed every instance.
                for existing in self.hardware.gpu_instances(gpu_uuid=gpu.uuid):
                    if live.uuid in existing.mig_devices or (
                        # Created, but its compute instance is gone (a crash inside destroy)
                        not existing.mig_devices
                        and existing.id == live.gpu_instance_id
                        and existing.profile_id == spec.profile_id
                        and existing.placement.start == spec.placement_start
                    ):
                        self.hardware.destroy_mig_device(gpu_uuid=gpu.uuid, gpu_instance_id=existing.id)
                        return
            except GpudraError as err:
                raise ClaimError(
                    f"{_where(device, gpu, spec)}: cannot destroy the MIG device: {err}"
                ) from err

    def use_whole(self, device: str, gpu: Gpu) -> None:
        """Make the whole GPU usable: MIG off, switched where allowed. For a whole-GPU prepare."""
        if not gpu.mig_capable:
            return
        with self._locks[gpu.uuid]:
            if self._mig_enabled(device, gpu):
                self._switch(device, gpu, enabled=False, why=f"for the whole GPU {device}")

    # --- the CDI view, and the record rebuilt from it ---------------------------------------------

    def reach(self, device: str, gpu: Gpu, found: ckpt.MigLive | str) -> tuple[str, cdi.MigAccess]:
        """The MIG UUID a container sees and its capability device nodes, for the MIG device prepare
        created (`found`: its live ids) or one that exists already (`found`: its UUID, which must still
        exist: a static layout's, or another claim's partition reached with admin access)."""
        live = found if isinstance(found, ckpt.MigLive) else _live(self._existing(device, gpu, found))
        try:
            caps = self.hardware.mig_capabilities(
                gpu_minor=gpu.minor,
                gpu_instance_id=live.gpu_instance_id,
                compute_instance_id=live.compute_instance_id,
            )
        except GpudraError as err:
            raise ClaimError(f"device {device} on GPU {gpu.uuid}: {err}") from err
        access = cdi.MigAccess(
            parent_uuid=gpu.uuid,
            caps_major=caps.major,
            gi_cap_minor=caps.gi_minor,
            ci_cap_minor=caps.ci_minor,
        )
        return live.uuid, access

    def rebuilt(self, device: str, published: Device, gpu: Gpu, mig_uuid: str | None) -> ckpt.MigRecord:
        """The record of partition `device` as a claim's CDI spec names it (`mig_uuid`: the MIG UUID the
        spec makes visible), for a checkpoint rebuilt from the specs: its live ids where that MIG device
        still exists, else its spec alone (destroy then finds nothing, or a bare GPU instance, at the
        placement)."""
        record = ckpt.MigRecord(spec=self.spec_of(device, published, gpu))
        try:
            found = self._existing(device, gpu, mig_uuid) if mig_uuid else None
        except GpudraError:
            found = None
        return record if found is None else record.model_copy(update={"live": _live(found)})

    # --- helpers -----------------------------------------------------------------------------------

    def _existing(self, device: str, gpu: Gpu, mig_uuid: str) -> MigDevice:
        """The MIG device `mig_uuid`, which must still exist."""
        found = [
            d
            for d in self._call(device, gpu, "list MIG devices", self.hardware.mig_devices)
            if d.uuid == mig_uuid
        ]
        if not found:
            raise ClaimError(
                f"device {device}: MIG device {mig_uuid} no longer exists on GPU {gpu.uuid}. A static MIG "
                "layout must not change while gpudra runs; restart the plugin to publish the new layout"
            )
        return found[0]

    def _mig_enabled(self, device: str, gpu: Gpu) -> bool:
        return self._call(device, gpu, "read the MIG mode", self.hardware.mig_enabled)

    def _switch(self, device: str, gpu: Gpu, *, enabled: bool, why: str) -> None:
        """Switch MIG mode `why`; call with the GPU's lock held."""
        target = "on" if enabled else "off"
        refused = f"device {device}: MIG mode of GPU {gpu.uuid} ({gpu.name}) must be {target} {why}, but"
        if not gpu.mig_mode_switchable:
            raise ClaimError(
                f"{refused} gpudra never switches it on this GPU: the change needs a GPU reset here "
                f"({gpu.architecture}, or a virtualized GPU). An administrator switched it after the plugin "
                "started; restart the plugin so that it publishes what the GPU offers now"
            )
        if not enabled:
            left = self._call(device, gpu, "list MIG devices", self.hardware.mig_devices)
            if left:
                names = ", ".join(f"{d.uuid} ({d.profile_name} at {d.placement.start})" for d in left)
                raise ClaimError(f"{refused} MIG devices still exist on it: {names}")
        processes = self._call(device, gpu, "list processes", self.hardware.compute_processes)
        if processes:
            raise ClaimError(
                f"{refused} {len(processes)} process(es) use the GPU "
                f"(pids {', '.join(map(str, processes))}); gpudra switches MIG mode only on an idle GPU. "
                "The kubelet retries"
            )
        try:
            self.hardware.set_mig_mode(gpu_uuid=gpu.uuid, enabled=enabled)
        except GpudraError as err:
            raise ClaimError(f"{refused} switching failed: {err}") from err

    def _call(self, device: str, gpu: Gpu, what: str, call: _GpuCall[_T]) -> _T:
        try:
            return call(gpu_uuid=gpu.uuid)
        except GpudraError as err:
            raise ClaimError(f"device {device}: cannot {what} of GPU {gpu.uuid}: {err}") from err


def _live(device: MigDevice) -> ckpt.MigLive:
    return ckpt.MigLive(
        gpu_instance_id=device.gpu_instance_id,
        compute_instance_id=device.compute_instance_id,
        uuid=device.uuid,
    )


def _named(instance: GpuInstance) -> str:
    """A GPU instance as a refusal names it: its MIG device, or the instance without one."""
    at = f"{instance.profile_name} at {instance.placement.start}"
    if instance.mig_devices:
        return f"MIG device {', '.join(instance.mig_devices)} ({at})"
    return f"GPU instance {instance.id} ({at}, without a compute instance)"


def _where(device: str, gpu: Gpu, spec: ckpt.MigSpec, profile: str | None = None) -> str:
    """Names the GPU, profile and placement, as every per-claim MIG error does."""
    named = profile or next(
        (p.name for p in gpu.mig_profiles if p.id == spec.profile_id), f"ID {spec.profile_id}"
    )
    return f"device {device}: MIG {named} at placement {spec.placement_start} on GPU {gpu.uuid} ({gpu.name})"
