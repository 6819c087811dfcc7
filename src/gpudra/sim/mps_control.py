"""Stand-in `nvidia-cuda-mps-control` for the simulated machine. I/O: socket, pid/log files, state file.

  nvidia-cuda-mps-control -d    start the control daemon in the background, return once it listens
  nvidia-cuda-mps-control -f    run it in the foreground
  nvidia-cuda-mps-control       read commands on stdin and send each to the daemon

The daemon honours CUDA_MPS_PIPE_DIRECTORY (control socket `control` and `nvidia-cuda-mps-control.pid`),
CUDA_MPS_LOG_DIRECTORY (`control.log`) and CUDA_VISIBLE_DEVICES, registers itself and its default
limits in the simulated machine's state, and exits on `quit` (or SIGTERM), removing its socket, pid file
and entry. It keeps the environment it was started with, where gpudra finds its token (as on the real
one).
Without an option it needs nothing of the pipe directory but the `control` socket, which it connects to
by path (`$CUDA_MPS_PIPE_DIRECTORY/control`), as gpudra expects of the real one (it gives the tool a
directory holding only links to the daemon's sockets; tests/gpu/test_real_mps.py checks the real one).
It starts no MPS servers (there is no CUDA to serve), so `get_server_list` prints nothing. A stand-in
CUDA application (gpudra.sim.mps_client) attaches with `attach_client`: the daemon answers with its pid
and limits and holds the connection open until it exits, so the client sees the daemon's end as a real
one sees its server's.

The client imports nothing but the standard library, and the wrapper (gpudra.sim.tools) runs this file
by path: gpudra starts it for every command it sends, thousands of times in `make test`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudra.sim import state

_PID_FILE = "nvidia-cuda-mps-control.pid"
_NO_DAEMON = "Cannot find MPS control daemon process"
_MEMORY_LIMIT = re.compile(r"^[0-9]+[MG]$")
_START_TIMEOUT_S = 10.0
# Not a command of the real daemon's: the stand-in CUDA application's (gpudra.sim.mps_client) attach.
ATTACH = "attach_client"


def _pipe_directory() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))


def _log_directory() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))


def _ask(pipe: Path, command: str) -> str | None:
    """Sends one command to the daemon listening in `pipe`; None when none listens there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(str(pipe / "control"))
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        conn.sendall(command.encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
        return _receive_all(conn)


def _receive_all(conn: socket.socket) -> str:
    chunks = []
    while chunk := conn.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks).decode()


def _receive_line(conn: socket.socket) -> str:
    """One command: up to its newline (an attaching client keeps its end open) or the end of input."""
    received = b""
    while b"\n" not in received and (chunk := conn.recv(4096)):
        received += chunk
    return received.split(b"\n", 1)[0].decode()


class _Daemon:
    def __init__(self, *, store: state.StateFile, pipe: Path, log: Path) -> None:
        self.store = store
        self.pipe = pipe
        self.log_file = log / "control.log"
        self.pid = os.getpid()

    def log(self, message: str) -> None:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        with self.log_file.open("a") as out:
            out.write(f"[{stamp} Control {self.pid:>5}] {message}\n")

    @contextlib.contextmanager
    def entry(self) -> Iterator[state.MpsDaemon]:
        with self.store.update() as machine_state:
            yield next(d for d in machine_state.mps_daemons if d.pid == self.pid)

    def answer(self, command: str) -> tuple[str, bool]:
        """The reply to one command, and whether the daemon should exit."""
        words = command.split()
        match words:
            case ["quit", *_]:
                return "", True
            case ["get_server_list"]:
                return "", False
            case ["get_default_active_thread_percentage"]:
                return f"{self.store_entry().default_active_thread_percentage:.1f}", False
            case ["set_default_active_thread_percentage", value]:
                try:
                    percentage = float(value)
                except ValueError:
                    percentage = -1.0
                if not 0 < percentage <= 100:
                    return f"Invalid active thread percentage {value}; valid: 1 to 100", False
                with self.entry() as daemon:
                    daemon.default_active_thread_percentage = percentage
                return f"{percentage:.1f}", False
            case ["get_default_device_pinned_mem_limit", device]:
                return self.store_entry().default_pinned_memory_limits.get(device, "0"), False
            case ["set_default_device_pinned_mem_limit", device, value]:
                if not _MEMORY_LIMIT.match(value):
                    return f"Invalid memory limit {value}; expected an integer with suffix M or G", False
                with self.entry() as daemon:
                    daemon.default_pinned_memory_limits[device] = value
                return "", False
        return f"Unrecognized command: {command}", False

    def store_entry(self) -> state.MpsDaemon:
        return next(d for d in self.store.read().mps_daemons if d.pid == self.pid)

    def serve(self) -> None:
        from gpudra.sim.state import MpsDaemon  # noqa: PLC0415 (see main)

        control = self.pipe / "control"
        control.unlink(missing_ok=True)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(str(control))
            server.listen()
            with self.store.update() as machine_state:
                machine_state.mps_daemons.append(
                    MpsDaemon(
                        pid=self.pid,
                        pipe_directory=str(self.pipe),
                        log_directory=str(self.log_file.parent),
                        visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                    )
                )
            (self.pipe / _PID_FILE).write_text(f"{self.pid}\n")
            self.log(f"Starting control daemon using socket {control}")
            self.log(
                f"To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={self.pipe}"
            )
            try:
                self._loop(server)
            finally:
                # Whatever a client put in their place (the directory is theirs too) is no reason to
                # stay registered: the daemon exits all the same.
                for path in (self.pipe / _PID_FILE, control):
                    with contextlib.suppress(OSError):
                        path.unlink()
                with self.store.update() as machine_state:
                    machine_state.mps_daemons = [d for d in machine_state.mps_daemons if d.pid != self.pid]
                self.log("Exit")

    def _loop(self, server: socket.socket) -> None:
        while True:
            conn, _ = server.accept()
            command = _receive_line(conn).strip()
            if not command:  # a client that left without a word (gpudra's look at who listens)
                conn.close()
                continue
            if command.split()[:1] == [ATTACH]:
                # Held open by a thread of its own: the daemon goes on answering its other clients, and
                # the client's connection ends only with the daemon (its process exit closes it).
                threading.Thread(target=self._attached, args=(conn, command), daemon=True).start()
                continue
            with conn:
                self.log(f"Command: {command}")
                reply, done = self.answer(command)
                with contextlib.suppress(OSError):  # a client that left before the reply
                    conn.sendall(reply.encode())
            if done:
                return

    def _attached(self, conn: socket.socket, command: str) -> None:
        with conn:
            self.log(f"Client attached: {command}")
            entry = self.store_entry()
            limits = " ".join(f"{d}={m}" for d, m in sorted(entry.default_pinned_memory_limits.items()))
            conn.sendall(
                f"attached {self.pid} threads={entry.default_active_thread_percentage:.1f} "
                f"memory={limits or 'none'}\n".encode()
            )
            with contextlib.suppress(OSError):
                while conn.recv(4096):
                    pass  # a client says nothing more: its exit (a close) detaches it
            self.log(f"Client detached: {command}")


def _foreground(store: state.StateFile) -> int:
    pipe, log = _pipe_directory(), _log_directory()
    if _ask(pipe, "get_server_list") is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    _Daemon(store=store, pipe=pipe, log=log).serve()
    return 0


def _background() -> int:
    pipe = _pipe_directory()
    if _ask(pipe, "get_server_list") is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    # The daemon must not hold the caller's stdout/stderr open, or a caller reading them to EOF hangs.
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpudra.sim.mps_control", "-f"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if (pipe / _PID_FILE).exists() and _ask(pipe, "get_server_list") is not None:
            return 0
        if daemon.poll() is not None:
            print("MPS control daemon failed to start", file=sys.stderr)
            return 1
        time.sleep(0.02)
    daemon.terminate()
    print("MPS control daemon did not start in time", file=sys.stderr)
    return 1


def _client() -> int:
    pipe = _pipe_directory()
    for line in sys.stdin:
        command = line.strip()
        if not command:
            continue
        reply = _ask(pipe, command)
        if reply is None:
            print(_NO_DAEMON)
            return 1
        if reply:
            print(reply)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        return _client()
    # Imported here, not above: the client needs only the socket (see the module docstring); with the
    # state file's pydantic models loaded, each of its starts cost five times the CPU.
    from gpudra.sim import machines, state  # noqa: PLC0415

    store = state.from_environment()
    if store is None:
        print("MPS control daemon: no NVIDIA driver (simulated machine state not found)", file=sys.stderr)
        return 1
    if args[0] in ("-d", "-f") and not machines.MACHINES[store.read().machine].sharing_supported:
        print("MPS control daemon: MPS is not supported on this system's GPUs", file=sys.stderr)
        return 1
    match args:
        case ["-d"]:
            return _background()
        case ["-f"]:
            return _foreground(store)
    print(f"Unknown option {' '.join(args)}; usage: nvidia-cuda-mps-control [-d | -f]", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
