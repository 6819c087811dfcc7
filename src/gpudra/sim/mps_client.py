"""A stand-in CUDA application under MPS, for the simulated machine: `python -m gpudra.sim.mps_client`.

It attaches to the MPS control daemon of $CUDA_MPS_PIPE_DIRECTORY (what CDI gives a container of an
MPS claim) and prints one line, `attached <daemon pid> threads=<default active thread percentage>
memory=<default pinned memory limits>`, then stays attached. When the daemon ends, as a real client
loses its MPS server and its CUDA context, it prints `lost the MPS control daemon` and exits 1; SIGTERM
(the pod's deletion) ends it with 0. Tests run it in containers to see whether a daemon survived an
upgrade of gpudra with its clients attached.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path
from types import FrameType

from gpudra.sim.mps_control import ATTACH


def main() -> int:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(str(pipe / "control"))
        except OSError as err:
            print(f"no MPS control daemon in {pipe}: {err}", flush=True)
            return 1
        conn.sendall(f"{ATTACH} {os.getpid()}\n".encode())
        reply = b""
        while b"\n" not in reply and (chunk := conn.recv(4096)):
            reply += chunk
        if b"\n" not in reply:
            print("lost the MPS control daemon", flush=True)
            return 1
        print(reply.split(b"\n", 1)[0].decode(), flush=True)
        while conn.recv(4096):
            pass  # the daemon says nothing more: only its end ends the connection
    print("lost the MPS control daemon", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
