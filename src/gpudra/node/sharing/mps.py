"""MPS: a claim's CUDA processes run through one control daemon with limits. I/O: GPU tools, MPS daemons.

- A whole GPU the claim has alone: the compute mode is set to EXCLUSIVE_PROCESS (only the MPS server
  may then hold a context, so no process of the claim can bypass the daemon's limits), and the mode found
  before is put back on unprepare.
- A MIG device whose config asks MPS: its daemon limits the claim's processes on that partition; the
  compute mode is left alone.
- A share (one allocation of a device several claims share, `share_id` set; of a whole GPU, or of a
  MIG partition, whose daemon then sees the MIG device only): MPS is its default strategy. Its consumed
  capacity becomes the claim's limits (memory: the pinned device memory limit; compute, when asked: the
  active thread percentage); a config may lower them, never raise them. Several claims' daemons share
  the GPU (or partition) in its DEFAULT compute mode, which shares do not change.

All MPS devices of one claim are served by one daemon (`MpsDaemons`, in `<state dir>/mps/<daemon id>/`;
run by `gpudra mps-host` through `MpsHostDaemons` when the plugin is given its socket, so that it outlives
the plugin's container),
so a process that uses several of them reaches all through the one pipe directory the container is given.
The plan gives the daemon its token (`mps_processes`), by which it is found again: every record of the
claim holds the same root and token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from gpudra.api import GpuConfig, MigDeviceConfig
from gpudra.api.v1beta1 import PER_DEVICE_LIMITS_FIELD, MpsConfig
from gpudra.errors import ConfigError
from gpudra.gpu.tools import COMPUTE_MODES, GpuTools
from gpudra.model.devices import bytes_quantity
from gpudra.node import checkpoint as ckpt
from gpudra.node.allocation import ResolvedDevice
from gpudra.node.cdi import CdiDevice, Mount
from gpudra.node.sharing import mps_processes
from gpudra.node.sharing.mps_daemons import (
    CONTAINER_PIPE_DIR,
    Daemon,
    MpsDaemons,
    Tampering,
    daemon_root,
    pipe_dir,
    shm_dir,
    trash_dir,
)
from gpudra.node.sharing.mps_host_client import MpsHostDaemons
from gpudra.node.sharing.trash import Trash

EXCLUSIVE_PROCESS = COMPUTE_MODES["Exclusive_Process"]
DEFAULT_COMPUTE_MODE = COMPUTE_MODES["Default"]
_MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "bind")


class Mps:
    name: ClassVar[str] = "MPS"
    runs_process: ClassVar[bool] = True

    def __init__(
        self,
        tools: GpuTools,
        *,
        mps_root: Path,
        mps_host: Path | None = None,
        on_tampering: Callable[[Tampering], None] | None = None,
        on_shared_pipe: Callable[[Path], None] | None = None,
    ) -> None:
        self.tools = tools
        self.mps_root = mps_root
        # This process's: daemons' directories it stops, and those `discard` removes (with mps-host too).
        self.trash = Trash(trash_dir(mps_root))
        self.daemons: MpsDaemons | MpsHostDaemons = (
            MpsDaemons(tools, trash=self.trash, on_tampering=on_tampering, on_shared_pipe=on_shared_pipe)
            if mps_host is None
            else MpsHostDaemons(mps_host, on_tampering=on_tampering, on_shared_pipe=on_shared_pipe)
        )

    def wants(self, device: ResolvedDevice) -> bool:
        config = device.config
        if isinstance(config, MigDeviceConfig):
            # TimeSlicing on a MIG device sets nothing (gpudra.api.MigDeviceSharing): no strategy wants it
            if config.sharing is None:
                return device.share_id is not None  # a share of a partition: MPS keeps it to its share
            return config.sharing.mps is not None
        sharing = config.sharing
        if sharing is None:
            return device.share_id is not None  # MPS is a share's default
        return sharing.mps is not None or (device.share_id is not None and sharing.time_slicing is None)

    # --- plan ----------------------------------------------------------------------------------

    def plan(
        self,
        claim_uid: str,
        devices: Sequence[ResolvedDevice],
        *,
        claim: Sequence[ResolvedDevice],
        others: Sequence[ckpt.ClaimEntry],
    ) -> list[ckpt.SharingRecord]:
        token = mps_processes.new_token()  # one daemon per claim
        records = [self._plan(claim_uid, device, claim, token) for device in devices]
        percentages = {
            record.active_thread_percentage: device for device, record in zip(devices, records, strict=True)
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
        return list(records)

    def _plan(
        self, claim_uid: str, device: ResolvedDevice, claim: Sequence[ResolvedDevice], token: str
    ) -> ckpt.MpsRecord:
        mps = _settings(device)
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
            token=token,
            active_thread_percentage=threads,
            pinned_memory_limit=limit,
            restore_compute_mode=self.tools.compute_mode(gpu_uuid=device.gpu.uuid) if exclusive else None,
        )

    # --- apply and undo ------------------------------------------------------------------------

    def apply(
        self,
        devices: Sequence[ckpt.PreparedDevice],
        *,
        visible: Mapping[str, str],
        others: Sequence[ckpt.ClaimEntry],
    ) -> None:
        mps: list[tuple[str, ckpt.MpsRecord]] = []
        for device in devices:
            record = _record(device)
            # The mode found at plan time is in the record: no tool run when it is EXCLUSIVE_PROCESS.
            if record.restore_compute_mode not in (None, EXCLUSIVE_PROCESS):
                self.tools.set_compute_mode(gpu_uuid=device.gpu_uuids[0], mode=EXCLUSIVE_PROCESS)
            mps.append((visible[device.device], record))
        if mps:
            uuids = sorted({uuid for uuid, _ in mps})
            self.daemons.start(
                Daemon(mps[0][1].root, mps[0][1].token),
                visible=uuids,
                active_thread_percentage=mps[0][1].active_thread_percentage,
                pinned_memory_limits={
                    uuid: record.pinned_memory_limit for uuid, record in mps if record.pinned_memory_limit
                },
            )

    def undo(self, devices: Sequence[ckpt.PreparedDevice], *, others: Sequence[ckpt.ClaimEntry]) -> None:
        """Stop the claim's daemon, then restore the compute modes."""
        for daemon in _daemons(devices):
            self.daemons.stop(daemon)
        for device in devices:
            restore = _record(device).restore_compute_mode
            # Only where it differs: a rollback before the GPU left MIG mode (where the GPU's compute
            # mode cannot be set) finds it unchanged.
            if restore is not None and self.tools.compute_mode(gpu_uuid=device.gpu_uuids[0]) != restore:
                self.tools.set_compute_mode(gpu_uuid=device.gpu_uuids[0], mode=restore)

    def answers(self, devices: Sequence[ckpt.PreparedDevice]) -> bool:
        """Whether the claim's daemon runs: no tool run, nothing in the pipe directory read."""
        return all(self.daemons.running(daemon) is not None for daemon in _daemons(devices))

    def discard(self, devices: Sequence[ckpt.PreparedDevice]) -> None:
        for root in _roots(devices):
            self.trash.put(root)  # a tenant's pipe directory may hold millions of files
        self.trash.empty_later()

    def reset(self, gpu_uuids: Sequence[str]) -> None:
        return None  # a rebuilt record says the compute mode to restore (see `rebuild`)

    def stop_unrecorded(self, claims: Sequence[ckpt.ClaimEntry]) -> list[Path]:
        """Stop the daemon in every claim directory under the MPS root that no record names (left by a
        prepare whose record was lost with a damaged checkpoint)."""
        known = {root for entry in claims for root in _roots(entry.devices)}
        try:
            roots = sorted(path for path in self.mps_root.iterdir() if path.is_dir())
        except FileNotFoundError:
            return []
        stopped = [root for root in roots if root not in known]
        for root in stopped:
            self.daemons.stop(Daemon(root, token=None))  # found by its pipe directory in its environment
        return stopped

    @staticmethod
    def container_edits(record: ckpt.SharingRecord) -> tuple[dict[str, str], tuple[Mount, ...]]:
        """The MPS pipe and the daemon's shm."""
        assert isinstance(record, ckpt.MpsRecord)
        return {"CUDA_MPS_PIPE_DIRECTORY": CONTAINER_PIPE_DIR}, (
            Mount(
                host_path=str(pipe_dir(record.root)),
                container_path=CONTAINER_PIPE_DIR,
                options=_MOUNT_OPTIONS,
            ),
            Mount(host_path=str(shm_dir(record.root)), container_path="/dev/shm", options=_MOUNT_OPTIONS),
        )

    @staticmethod
    def rebuild(cdi_device: CdiDevice, *, whole_alone: bool) -> ckpt.SharingRecord | None:
        """A device whose spec mounts a pipe directory ran under MPS; the daemon's directory is the pipe's
        parent. A whole GPU the claim had alone ran in EXCLUSIVE_PROCESS; the mode it had before is not in
        the spec: Default, the usual one. Nor is the daemon's token (the spec is not secret): the record
        has none, and the daemon is found by its pipe directory (see `mps_processes`)."""
        pipe = next(
            (
                m.host_path
                for m in cdi_device.container_edits.mounts
                if m.container_path == CONTAINER_PIPE_DIR
            ),
            None,
        )
        if pipe is None:
            return None
        restore = DEFAULT_COMPUTE_MODE if whole_alone else None
        return ckpt.MpsRecord(strategy="MPS", root=Path(pipe).parent, restore_compute_mode=restore)


def daemon_roots(entry: ckpt.ClaimEntry) -> list[Path]:
    """The directories of the MPS daemons `entry` runs (for logs and events)."""
    return _roots(entry.devices)


def _settings(device: ResolvedDevice) -> MpsConfig:
    config = device.config
    if isinstance(config, GpuConfig):
        sharing = config.sharing
        return sharing.mps if sharing is not None and sharing.mps is not None else MpsConfig()
    if config.sharing is None:  # a share of a MIG partition without a config (see wants)
        return MpsConfig()
    assert config.sharing.mps is not None  # see wants
    return config.sharing.mps


def _record(device: ckpt.PreparedDevice) -> ckpt.MpsRecord:
    assert isinstance(device.sharing, ckpt.MpsRecord)  # SharingCoordinator hands over only its own
    return device.sharing


def _roots(devices: Sequence[ckpt.PreparedDevice]) -> list[Path]:
    return sorted({daemon.root for daemon in _daemons(devices)})


def _daemons(devices: Sequence[ckpt.PreparedDevice]) -> list[Daemon]:
    records = [d.sharing for d in devices if isinstance(d.sharing, ckpt.MpsRecord)]
    found = {Daemon(record.root, record.token) for record in records}
    return sorted(found, key=lambda daemon: (daemon.root, daemon.token or ""))


def _limit_key(device: ResolvedDevice) -> str:
    """How a per-device limit names the device: its UUID (GPU-…, MIG-…) where known."""
    return device.uuid or device.device
