"""How a prepared device is shared: time-slicing and MPS. I/O: GPU tools and MPS daemons.

`plan` decides, per claim and without touching the GPU, what each device gets, so the checkpoint holds
the records before `apply` runs; `apply` and `undo` are idempotent, so a crash between any two of their
calls is settled by calling again.

- A whole GPU the claim has alone: time-slicing sets the claim's interval; MPS sets the compute mode
  to EXCLUSIVE_PROCESS (only the MPS server may then hold a context, so no process of the claim can
  bypass the daemon's limits) and puts the mode found before back on unprepare. Without a sharing
  config the GPU gets nothing: no tool runs.
- gpudra owns the time-slice of the GPUs it publishes, and no tool runs for a setting already in place.
  The checkpoint's records say what each GPU runs with: the interval a prepared claim's record set, else
  Default, since the undo of every record that set another interval puts Default back (a reboot does too).
  NVML cannot read the interval back (gpu-mechanics.md section 1.4), so this is the only way to know it
  without a call to nvidia-smi, which costs tens to hundreds of milliseconds.
- A MIG device: the time-slice belongs to the physical GPU, whose other partitions may serve other
  claims, so a partition gets nothing without a config, and MPS with one. The compute mode is left alone.
- A share (one allocation of a device several claims share, `share_id` set): its consumed capacity
  becomes the claim's MPS limits (memory: the pinned device memory limit; compute, when asked: the active
  thread percentage); a config may lower them, never raise them. Strategy MPS is the default of a share;
  TimeSlicing gives the share the GPU's time-slice interval instead, with no limits. Several MPS daemons
  share the GPU in its DEFAULT compute mode, which shares do not change. Claims sharing one GPU must ask
  the same interval; the GPU returns to Default when the last claim that set one is unprepared.

All MPS devices of one claim are served by one daemon (`MpsDaemons`), so a process that uses several
of them reaches all through the one pipe directory the container is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from gpudra.api import GpuConfig, MigDeviceConfig
from gpudra.api.v1beta1 import PER_DEVICE_LIMITS_FIELD, TIMESLICE, MpsConfig
from gpudra.errors import ConfigError, NotSupported
from gpudra.gpu.tools import COMPUTE_MODES, GpuTools
from gpudra.model.devices import bytes_quantity
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import Allocated
from gpudra.node.cdi import Mount
from gpudra.node.sharing.mps_daemons import CONTAINER_PIPE_DIR, MpsDaemons, daemon_root, pipe_dir, shm_dir

EXCLUSIVE_PROCESS = COMPUTE_MODES["Exclusive_Process"]
_MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "bind")


class GpuSharing:
    def __init__(self, tools: GpuTools, *, mps_root: Path) -> None:
        self.tools = tools
        self.mps_root = mps_root
        self.daemons = MpsDaemons(tools)

    # --- plan ----------------------------------------------------------------------------------

    def plan(
        self, claim_uid: str, devices: Sequence[Allocated], *, others: Sequence[ckpt.ClaimEntry]
    ) -> list[ckpt.SharingRecord | None]:
        """What each of the claim's devices gets. ConfigError naming the field for a config that this
        device cannot take; `others` are the other claims prepared on this node."""
        records = [self._plan(claim_uid, device, devices, others) for device in devices]
        percentages = {
            record.active_thread_percentage: device
            for device, record in zip(devices, records, strict=True)
            if isinstance(record, ckpt.MpsRecord)
        }
        if len(percentages) > 1:
            described = ", ".join(
                f"{p if p is not None else 'none'} for {d.device}" for p, d in percentages.items()
            )
            raise ConfigError(
                f"the claim's MPS devices share one control daemon, whose active thread percentage is one "
                f"value; they ask {described}: give them the same",
                field=f"{list(percentages.values())[-1].config_field}.sharing.mpsConfig.defaultActiveThreadPercentage",
            )
        return records

    def _plan(
        self,
        claim_uid: str,
        device: Allocated,
        claim: Sequence[Allocated],
        others: Sequence[ckpt.ClaimEntry],
    ) -> ckpt.SharingRecord | None:
        if device.admin_access:  # monitoring access: the device belongs to someone else's claim
            return None
        config = device.config
        if isinstance(config, GpuConfig):
            sharing = config.sharing
            interval = sharing.time_slicing if sharing is not None else None
            if device.share_id is not None and interval is not None:
                return self._shared_time_slice(device, interval.interval, others)
            if device.share_id is not None or (sharing is not None and sharing.mps is not None):
                mps = sharing.mps if sharing is not None and sharing.mps is not None else MpsConfig()
                return self._mps(claim_uid, device, mps, claim)
            if interval is None:
                return None
            return ckpt.TimeSlicingRecord(strategy="TimeSlicing", interval=interval.interval)
        assert isinstance(config, MigDeviceConfig)
        if config.sharing is None:
            return None
        return self._mps(claim_uid, device, config.sharing.mps, claim)

    def _shared_time_slice(
        self, device: Allocated, interval: ckpt.TimeSliceInterval, others: Sequence[ckpt.ClaimEntry]
    ) -> ckpt.TimeSlicingRecord:
        for entry, running in _time_slices(device.gpu.uuid, others):
            if running != interval:
                raise ConfigError(
                    f"GPU {device.gpu.uuid} runs with time-slice interval {running} for "
                    f"ResourceClaim {entry.namespace}/{entry.name}, which shares it; this claim asks "
                    f"{interval}. Claims sharing a GPU must ask the same interval; allowed now: {running}",
                    field=f"{device.config_field}.sharing.timeSlicingConfig.interval",
                )
        return ckpt.TimeSlicingRecord(strategy="TimeSlicing", interval=interval)

    def _mps(
        self, claim_uid: str, device: Allocated, mps: MpsConfig, claim: Sequence[Allocated]
    ) -> ckpt.MpsRecord:
        field = f"{device.config_field}.sharing.mpsConfig"
        # Index keys count over the devices this config applies to, sorted by UUID (a MIG device made
        # on demand has none yet: its device name stands in).
        same_config = [d for d in claim if d.config_entry == device.config_entry and not d.admin_access]
        limits = mps.pinned_memory_limits([_limit_key(d) for d in same_config])
        limit = limits.get(_limit_key(device))
        limit_field = (
            f"{field}.{PER_DEVICE_LIMITS_FIELD}"
            if mps.default_per_device_pinned_memory_limit
            else f"{field}.defaultPinnedDeviceMemoryLimit"
        )
        threads = mps.default_active_thread_percentage
        if device.share_id is not None:
            memory, compute = device.consumed.get("memory"), device.consumed.get("compute")
            if memory is not None:
                share = bytes_quantity(int(memory))
                if limit is not None and limit > memory:
                    raise ConfigError(
                        f"{bytes_quantity(limit)} is above the {share} of memory this share of "
                        f"{device.device} was allocated; allowed: 1Mi to {share}",
                        field=limit_field,
                    )
                limit = int(memory) if limit is None else limit
            if compute:
                if threads is not None and threads > compute:
                    raise ConfigError(
                        f"{threads} is above the compute share of {compute}% this share of {device.device} "
                        f"was allocated; allowed: 1 to {int(compute)}",
                        field=f"{field}.defaultActiveThreadPercentage",
                    )
                threads = int(compute) if threads is None else threads
        if limit is not None and device.memory_bytes is not None and limit > device.memory_bytes:
            raise ConfigError(
                f"{bytes_quantity(limit)} is above the {bytes_quantity(device.memory_bytes)} of memory of "
                f"{device.device}; allowed: 1Mi to {bytes_quantity(device.memory_bytes)}",
                field=limit_field,
            )
        exclusive = device.kind == "gpu" and device.share_id is None
        return ckpt.MpsRecord(
            strategy="MPS",
            root=daemon_root(self.mps_root, claim_uid),
            active_thread_percentage=threads,
            pinned_memory_limit=limit,
            restore_compute_mode=self.tools.compute_mode(gpu_uuid=device.gpu.uuid) if exclusive else None,
        )

    # --- apply and undo ------------------------------------------------------------------------

    def apply(
        self, entry: ckpt.ClaimEntry, *, visible: Mapping[str, str], others: Sequence[ckpt.ClaimEntry]
    ) -> None:
        """Set up what the entry's records say; `visible` maps each device to the UUID CUDA sees,
        `others` are the other claims prepared on this node (what the GPUs run with now)."""
        mps: list[tuple[str, ckpt.MpsRecord]] = []
        for device in entry.devices:
            record = device.sharing
            if isinstance(record, ckpt.TimeSlicingRecord):
                for uuid in device.gpu_uuids:
                    if record.interval != _interval_now(uuid, others):
                        self._set_timeslice(uuid, record.interval)
            elif isinstance(record, ckpt.MpsRecord):
                # The mode found at plan time is in the record: no tool run when it is EXCLUSIVE_PROCESS.
                if record.restore_compute_mode not in (None, EXCLUSIVE_PROCESS):
                    self.tools.set_compute_mode(gpu_uuid=device.gpu_uuids[0], mode=EXCLUSIVE_PROCESS)
                mps.append((visible[device.device], record))
        if mps:
            uuids = sorted({uuid for uuid, _ in mps})
            self.daemons.start(
                mps[0][1].root,
                visible=uuids,
                active_thread_percentage=mps[0][1].active_thread_percentage,
                pinned_memory_limits={
                    uuid: record.pinned_memory_limit for uuid, record in mps if record.pinned_memory_limit
                },
            )

    def undo(self, entry: ckpt.ClaimEntry, *, others: Sequence[ckpt.ClaimEntry]) -> None:
        """Undo the entry's records: stop its daemon, restore compute modes, and put each GPU's time-slice
        back to the interval the claims still sharing it run with (Default when none)."""
        for root in sorted({d.sharing.root for d in entry.devices if isinstance(d.sharing, ckpt.MpsRecord)}):
            self.daemons.stop(root)
        for device in entry.devices:
            record = device.sharing
            restore = record.restore_compute_mode if isinstance(record, ckpt.MpsRecord) else None
            # Only where it differs: a rollback before the GPU left MIG mode (where the GPU's compute
            # mode cannot be set) finds it unchanged.
            if restore is not None and self.tools.compute_mode(gpu_uuid=device.gpu_uuids[0]) != restore:
                self.tools.set_compute_mode(gpu_uuid=device.gpu_uuids[0], mode=restore)
            if isinstance(record, ckpt.TimeSlicingRecord):
                for uuid in device.gpu_uuids:
                    # What the claims still sharing the GPU run with; nothing to do when that is already it.
                    wanted = _interval_kept(uuid, others)
                    if record.interval != wanted or _interval_now(uuid, others) is None:
                        self._set_timeslice(uuid, wanted)

    def _set_timeslice(self, gpu_uuid: str, interval: ckpt.TimeSliceInterval) -> None:
        try:
            self.tools.set_timeslice(gpu_uuid=gpu_uuid, level=TIMESLICE[interval])
        except NotSupported:
            # A GPU whose driver offers no time-slice setting runs with the default one: asking for
            # Default (a whole GPU without config, an undo) is then done; another interval fails.
            if interval != "Default":
                raise

    def answers(self, entry: ckpt.ClaimEntry) -> bool:
        """Whether the entry's MPS daemon answers (True for an entry without one): one tool run per
        daemon, nothing else changes."""
        roots = {d.sharing.root for d in entry.devices if isinstance(d.sharing, ckpt.MpsRecord)}
        return all(self.daemons.answers(root) for root in roots)

    def adopt(
        self, entry: ckpt.ClaimEntry, *, visible: Mapping[str, str], others: Sequence[ckpt.ClaimEntry]
    ) -> bool:
        """After a plugin restart, or when a check finds the daemon gone: False when the claim's MPS
        daemon answers (it was adopted as it is); True when it had died and was started again with the
        recorded limits."""
        if self.answers(entry):
            return False
        self.apply(entry, visible=visible, others=others)
        return True

    def reset_time_slices(self, gpu_uuids: Sequence[str]) -> None:
        """Put the GPUs' time-slice to Default whatever it is now: for GPUs whose interval no record
        says (claims rebuilt from their CDI specs after the checkpoint was damaged)."""
        for uuid in gpu_uuids:
            self._set_timeslice(uuid, "Default")

    def stop_others(self, known: set[Path]) -> list[Path]:
        """Stop the daemon in every claim directory under the MPS root that is not in `known` (left by
        a prepare whose record was lost with a damaged checkpoint); the directories stopped."""
        try:
            roots = sorted(path for path in self.mps_root.iterdir() if path.is_dir())
        except FileNotFoundError:
            return []
        stopped = [root for root in roots if root not in known]
        for root in stopped:
            self.daemons.stop(root)
        return stopped

    @staticmethod
    def container_edits(device: ckpt.PreparedDevice) -> tuple[dict[str, str], tuple[Mount, ...]]:
        """The env and mounts a container needs for the device's sharing (the MPS pipe and shm)."""
        record = device.sharing
        if not isinstance(record, ckpt.MpsRecord):
            return {}, ()
        return {"CUDA_MPS_PIPE_DIRECTORY": CONTAINER_PIPE_DIR}, (
            Mount(
                host_path=str(pipe_dir(record.root)),
                container_path=CONTAINER_PIPE_DIR,
                options=_MOUNT_OPTIONS,
            ),
            Mount(host_path=str(shm_dir(record.root)), container_path="/dev/shm", options=_MOUNT_OPTIONS),
        )


def _time_slices(
    gpu_uuid: str, claims: Sequence[ckpt.ClaimEntry]
) -> list[tuple[ckpt.ClaimEntry, ckpt.TimeSliceInterval]]:
    """(claim, interval) for each time-slice record of `claims` on GPU `gpu_uuid`."""
    return [
        (entry, held.sharing.interval)
        for entry in claims
        for held in entry.devices
        if held.gpu_uuids[:1] == (gpu_uuid,) and isinstance(held.sharing, ckpt.TimeSlicingRecord)
    ]


def _interval_kept(gpu_uuid: str, claims: Sequence[ckpt.ClaimEntry]) -> ckpt.TimeSliceInterval:
    """The interval GPU `gpu_uuid` must run with for those of `claims` that stay prepared (claims
    sharing a GPU agree on it, see `_shared_time_slice`); Default when none set one."""
    kept = [
        interval for entry, interval in _time_slices(gpu_uuid, claims) if entry.state != "UnprepareStarted"
    ]
    return kept[0] if kept else "Default"


def _interval_now(gpu_uuid: str, claims: Sequence[ckpt.ClaimEntry]) -> ckpt.TimeSliceInterval | None:
    """The time-slice GPU `gpu_uuid` runs with while `claims` are prepared (`_interval_kept`). None while
    a claim with a record on it is being unprepared: its undo may have stopped half way, so only the
    tool knows."""
    if any(entry.state == "UnprepareStarted" for entry, _ in _time_slices(gpu_uuid, claims)):
        return None
    return _interval_kept(gpu_uuid, claims)


def _limit_key(device: Allocated) -> str:
    """How a per-device limit names the device: its UUID (GPU-…, MIG-…) where known."""
    return device.uuid or device.device
