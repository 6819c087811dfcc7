"""MPS control daemons, one per claim. I/O: directories under the plugin's state dir, GPU tools, signals.

A claim whose devices run under MPS gets one control daemon, in `<state dir>/mps/<daemon id>/` (the id
is 12 hex digits of the claim UID's SHA-256: unix socket paths are limited to 107 bytes, and a UUID
would take 36 of them):

    pipe/   CUDA_MPS_PIPE_DIRECTORY: the daemon's control socket and pid file; containers mount it
    log/    CUDA_MPS_LOG_DIRECTORY: control.log and server.log
    shm/    mounted as the containers' /dev/shm: MPS clients and their server share memory through it

The daemon is started with `nvidia-cuda-mps-control -d`, which detaches it into its own session, so a
plugin restart or upgrade (a SIGKILL included) leaves it and its clients running. It is found again by
its pipe directory alone, which the checkpoint records before the daemon exists: `start` is a no-op
for a daemon that answers there (it is adopted: only its limits are set again), and `stop` asks the
daemon in the directory to quit, kills the pid in its pid file if it does not, and removes the
directory. Both are idempotent, so a crash between any two steps is settled by calling again.

Limits are set as the daemon's defaults before any client can connect (the CDI spec that lets a container
reach the pipe is written only after `start` returns), and read back as the readiness check.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from gpudra.errors import HardwareError
from gpudra.gpu.tools import GpuTools
from gpudra.node import faults

log = logging.getLogger(__name__)

PID_FILE: Final = "nvidia-cuda-mps-control.pid"
CONTAINER_PIPE_DIR: Final = "/tmp/nvidia-mps"  # CUDA_MPS_PIPE_DIRECTORY inside containers
MIB: Final = 2**20
# A unix socket path holds at most 107 bytes; MPS puts several sockets in the pipe directory.
_MAX_SOCKET_PATH: Final = 107
_LONGEST_SOCKET: Final = "control_privileged"
_STOP_TIMEOUT_S: Final = 10.0
_READY_TIMEOUT_S: Final = 10.0


def pipe_dir(root: Path) -> Path:
    return root / "pipe"


def log_dir(root: Path) -> Path:
    return root / "log"


def shm_dir(root: Path) -> Path:
    return root / "shm"


def daemon_root(state_root: Path, claim_uid: str) -> Path:
    """The claim's daemon directory; HardwareError when its sockets' paths would be too long."""
    root = state_root / hashlib.sha256(claim_uid.encode()).hexdigest()[:12]
    longest = pipe_dir(root) / _LONGEST_SOCKET
    if len(os.fsencode(longest)) > _MAX_SOCKET_PATH:
        raise HardwareError(
            f"the MPS pipe directory {pipe_dir(root)} is too long for unix sockets ({len(str(longest))} "
            f"bytes with {_LONGEST_SOCKET}, at most {_MAX_SOCKET_PATH}): use a shorter --state-dir"
        )
    return root


def memory_limit(limit: int) -> str:
    """A limit in bytes as MPS takes it: whole MiB with suffix M (rounded down)."""
    return f"{limit // MIB}M"


class MpsDaemons:
    def __init__(self, tools: GpuTools) -> None:
        self.tools = tools

    def answers(self, root: Path) -> bool:
        """Whether a control daemon listens in the claim's pipe directory."""
        if not (pipe_dir(root) / PID_FILE).exists():
            return False
        try:
            self.tools.mps_control(["get_server_list"], pipe_dir=pipe_dir(root))
        except HardwareError:
            return False
        return True

    def start(
        self,
        root: Path,
        *,
        visible: Sequence[str],
        active_thread_percentage: int | None,
        pinned_memory_limits: Mapping[str, int],
    ) -> None:
        """Start (or adopt) the claim's daemon for the devices `visible` (UUIDs) with these limits."""
        for directory in (pipe_dir(root), log_dir(root)):
            directory.mkdir(parents=True, exist_ok=True)
        shm_dir(root).mkdir(exist_ok=True)
        # Containers may run as any user: like /dev/shm, everyone may create files, only owners delete.
        os.chmod(shm_dir(root), 0o1777)
        faults.reached("prepare-mps-directories")
        if not self.answers(root):
            self.tools.start_mps_daemon(
                env={
                    "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir(root)),
                    "CUDA_MPS_LOG_DIRECTORY": str(log_dir(root)),
                    "CUDA_VISIBLE_DEVICES": ",".join(visible),
                }
            )
        faults.reached("prepare-mps-started")
        commands = [
            *(
                [f"set_default_active_thread_percentage {active_thread_percentage}"]
                if active_thread_percentage is not None
                else []
            ),
            *(
                f"set_default_device_pinned_mem_limit {uuid} {memory_limit(limit)}"
                for uuid, limit in sorted(pinned_memory_limits.items())
            ),
        ]
        self._send_until_ready(root, commands)
        self._check_limits(root, active_thread_percentage, pinned_memory_limits)

    def _send_until_ready(self, root: Path, commands: Sequence[str]) -> None:
        # The daemon may still be opening its socket when `-d` returns: retry until it answers.
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            try:
                replies = self.tools.mps_control([*commands, "get_server_list"], pipe_dir=pipe_dir(root))
                break
            except HardwareError as err:
                if time.monotonic() > deadline:
                    raise HardwareError(
                        f"the MPS control daemon in {pipe_dir(root)} did not answer within "
                        f"{_READY_TIMEOUT_S:g}s: {err}"
                    ) from err
                time.sleep(0.05)
        refused = [line for line in replies.splitlines() if line.strip() and not _is_value(line)]
        if refused:
            raise HardwareError(
                f"the MPS control daemon in {pipe_dir(root)} refused a limit: {'; '.join(refused)}"
            )

    def _check_limits(
        self, root: Path, active_thread_percentage: int | None, pinned_memory_limits: Mapping[str, int]
    ) -> None:
        if active_thread_percentage is None:
            return
        reply = self.tools.mps_control(
            ["get_default_active_thread_percentage"], pipe_dir=pipe_dir(root)
        ).strip()
        try:
            matches = float(reply) == float(active_thread_percentage)
        except ValueError:
            matches = False
        if not matches:
            raise HardwareError(
                f"the MPS control daemon in {pipe_dir(root)} reports an active thread percentage of "
                f"{reply!r}, not the {active_thread_percentage} it was given"
            )

    def stop(self, root: Path) -> None:
        """Stop the claim's daemon (if one runs) and remove its directory. Idempotent."""
        pipe = pipe_dir(root)
        pid = _daemon_pid(pipe)  # before quit: the daemon removes its pid file as it exits
        if self.answers(root):
            try:
                self.tools.mps_control(["quit"], pipe_dir=pipe)
            except HardwareError as err:
                log.warning("MPS daemon did not take quit", extra={"pipe": str(pipe), "error": str(err)})
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        while pid is not None and _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if pid is not None and _alive(pid):
            log.warning("MPS daemon did not quit; killing it", extra={"pipe": str(pipe), "pid": pid})
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        faults.reached("unprepare-mps-stopped")
        shutil.rmtree(root, ignore_errors=True)
        if root.exists():
            raise HardwareError(f"cannot remove the MPS directory {root}")


def _is_value(line: str) -> bool:
    """Whether a reply line is a value (a set command's echo), not a refusal."""
    return line.strip().replace(".", "", 1).isdigit()


def _daemon_pid(pipe: Path) -> int | None:
    """The pid in the pipe directory's pid file, if that process is an MPS control daemon."""
    try:
        pid = int((pipe / PID_FILE).read_text().strip())
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    # A pid file left by a daemon that died may name a pid reused since: never kill anything else.
    return pid if b"mps" in command else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1]
    except OSError:
        return False
    return not state.startswith("Z")  # a zombie has exited: only its parent's wait is missing
