"""A real MPS control daemon started by gpudra, with a real CUDA client under its limits. Needs a GPU.

Leaves the card's settings alone: no compute mode is set (the sharing layer sets EXCLUSIVE_PROCESS on a
claim's GPU; here the daemon layer below it is driven directly). The daemon is a user-space process in
a private pipe directory, stopped at the end of each test, and reaches no other process on the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudra.gpu.tools import MPS_CONTROL, GpuTools
from gpudra.node import gpu_driver
from gpudra.node.sharing import mps_daemons as mps
from gpudra.node.sharing import mps_processes
from gpudra.node.sharing.trash import Trash

pytestmark = pytest.mark.gpu

MIB = 1024**2
LIMIT_MIB = 1024
THREAD_PERCENTAGE = 25


def _client(*sizes_mib: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "tests.gpu.cuda_client", *map(str, sizes_mib)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, **(env or {})},
    )
    answer: dict[str, Any] = json.loads(result.stdout)
    return answer


def _daemons_alive(root: Path) -> list[int]:
    """Pids of MPS control daemons and servers whose environment names this test's pipe directory."""
    found = []
    marker = f"CUDA_MPS_PIPE_DIRECTORY={mps.pipe_dir(root)}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def gpu() -> tuple[str, int, int]:
    """The first GPU's UUID, multiprocessor count and memory in MiB, as gpudra's discovery reports them."""
    with gpu_driver.connect("real") as session:
        first = session.inventory().gpus[0]
    assert first.multiprocessors is not None
    return first.uuid, first.multiprocessors, first.memory_bytes // MIB


def test_discovery_agrees_with_what_a_cuda_context_sees(gpu: tuple[str, int, int]) -> None:
    uuid, multiprocessors, memory_mib = gpu
    seen = _client(env={"CUDA_VISIBLE_DEVICES": uuid})
    assert seen["multiprocessors"] == multiprocessors
    # NVML's total includes memory the driver reserves before any context exists.
    assert 0.9 * memory_mib <= seen["total_mib"] <= memory_mib


def test_mps_daemon_limits_its_clients_and_stops_clean(gpu: tuple[str, int, int], tmp_path: Path) -> None:
    uuid, multiprocessors, _ = gpu
    daemons = mps.MpsDaemons(GpuTools(), trash=Trash(tmp_path / "trash"))
    assert daemons.tools.command(MPS_CONTROL)  # the driver's MPS tool is installed on a GPU machine
    root = mps.daemon_root(tmp_path, "claim-under-test")
    daemon = mps.Daemon(root, mps_processes.new_token())
    limits = {uuid: LIMIT_MIB * MIB}
    daemons.start(
        daemon, visible=[uuid], active_thread_percentage=THREAD_PERCENTAGE, pinned_memory_limits=limits
    )
    try:
        # Found by the token in its environment: the process that wrote the pid file.
        running = daemons.running(daemon)
        assert running is not None
        assert int((mps.pipe_dir(root) / mps.PID_FILE).read_text()) == running.pid
        # A second start (the plugin restarted mid-prepare) adopts the daemon instead of starting another.
        daemons.start(
            daemon, visible=[uuid], active_thread_percentage=THREAD_PERCENTAGE, pinned_memory_limits=limits
        )
        assert daemons.running(daemon) == running

        seen = _client(LIMIT_MIB // 2, LIMIT_MIB, env={"CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe_dir(root))})
        print("client under MPS:", seen)
        first, second = seen["allocations"]
        assert first["code"] == 0, first
        # Half the limit fits; another whole limit on top of it does not.
        assert second["error"] == "CUDA_ERROR_OUT_OF_MEMORY", second
        # The context's free memory is what is left of the pinned limit, not of the card.
        assert seen["free_mib"] <= LIMIT_MIB
        # The SM share is granted in whole TPCs (2 SMs on Hopper and Ampere): 25% of an H100's 132 is 32.
        assert abs(seen["multiprocessors"] - multiprocessors * THREAD_PERCENTAGE / 100) <= 2
        server_list = daemons.tools.mps_control(["get_server_list"], pipe_dir=mps.pipe_dir(root))
        assert server_list.split(), "the client's MPS server is listed"
        servers = {int(pid) for pid in server_list.split()}

        # What the usage sampler reads while a client of the claim's daemon works: NVML lists both the
        # MPS server and its client as compute processes of the GPU (seen on an H100, driver 580).
        busy = subprocess.Popen(
            [sys.executable, "-m", "tests.gpu.cuda_client", "--busy", str(LIMIT_MIB // 2)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe_dir(root))},
        )
        assert busy.stdin is not None and busy.stdout is not None
        try:
            assert json.loads(busy.stdout.readline())["allocations"][0]["code"] == 0
            with gpu_driver.connect("real") as session:
                processes = set(session.device_usage(uuid=uuid).processes)
            print("compute processes under MPS:", processes, "servers:", servers, "client:", busy.pid)
            assert servers | {busy.pid} <= processes
        finally:
            busy.stdin.close()
            assert busy.wait(timeout=30) == 0
            busy.stdout.close()
    finally:
        daemons.stop(daemon)
    assert not root.exists()
    assert _daemons_alive(root) == []


def _entries(directory: Path) -> dict[str, str]:
    """Each entry of `directory` with its type, as `ls -l` would name it."""
    kinds = {0o140000: "socket", 0o010000: "fifo", 0o100000: "file", 0o040000: "directory", 0o120000: "link"}
    return {
        e.name: kinds.get(e.stat(follow_symlinks=False).st_mode & 0o170000, "other")
        for e in directory.iterdir()
    }


def test_whether_a_client_needs_to_write_in_the_pipe_directory(
    gpu: tuple[str, int, int], tmp_path: Path
) -> None:
    """What decides whether gpudra may mount a claim's pipe directory read-only into its containers
    (gpudra.node.sharing.mps_daemons says why it is read-write until this passes): what a client leaves
    in the directory, and whether a client that sees it only through a read-only bind mount still runs
    under the daemon (its SM count is the daemon's share, not the card's). Needs root for the mount."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    uuid, multiprocessors, _ = gpu
    daemons = mps.MpsDaemons(GpuTools(), trash=Trash(tmp_path / "trash"))
    root = mps.daemon_root(tmp_path, "claim-read-only")
    daemon = mps.Daemon(root, mps_processes.new_token())
    daemons.start(daemon, visible=[uuid], active_thread_percentage=THREAD_PERCENTAGE, pinned_memory_limits={})
    pipe = mps.pipe_dir(root)
    try:
        before = _entries(pipe)
        _client(64, env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
        after = _entries(pipe)
        print("pipe directory before a client:", before, "after:", after)
        view = tmp_path / "read-only-view"
        view.mkdir()
        mount = f"mount --bind {pipe} {view} && mount -o remount,bind,ro {view}"
        script = f"{mount} && exec {sys.executable} -m tests.gpu.cuda_client 64"
        result = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(view)},
        )
        print("client through a read-only mount:", result.returncode, result.stdout, result.stderr)
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout)
        assert seen["allocations"][0]["code"] == 0, seen
        assert abs(seen["multiprocessors"] - multiprocessors * THREAD_PERCENTAGE / 100) <= 2, seen
    finally:
        daemons.stop(daemon)


def test_the_control_tool_works_through_the_private_directory(
    gpu: tuple[str, int, int], tmp_path: Path
) -> None:
    """gpudra sends every command with `tool/` as the tool's pipe directory, which holds only hard links
    to the daemon's checked sockets (`control`, and `control_privileged` where it is a socket), so that a
    tenant who swaps `pipe/control` after the check reaches nothing (mps_daemons says why). A real tool
    that needs more there falls back to the shared pipe directory: none of this test's commands (the
    limits set and read back, `get_server_list`, `quit`) may have."""
    uuid, _, _ = gpu
    through_pipe: list[Path] = []
    daemons = mps.MpsDaemons(GpuTools(), trash=Trash(tmp_path / "trash"), on_shared_pipe=through_pipe.append)
    root = mps.daemon_root(tmp_path, "claim-tool-directory")
    daemon = mps.Daemon(root, mps_processes.new_token())
    limits = {uuid: LIMIT_MIB * MIB}
    daemons.start(
        daemon, visible=[uuid], active_thread_percentage=THREAD_PERCENTAGE, pinned_memory_limits=limits
    )
    try:
        print("pipe directory of a real daemon:", _entries(mps.pipe_dir(root)), "run as uid", os.geteuid())
        assert through_pipe == []
        assert list(mps.tool_dir(root).iterdir()) == []  # the links are removed once the tool returned
        # The same by hand: a directory with nothing but a link to the control socket is enough.
        linked = tmp_path / "linked"
        linked.mkdir(mode=0o700)
        os.link(mps.pipe_dir(root) / mps.CONTROL, linked / mps.CONTROL)
        reply = daemons.tools.mps_control(["get_default_active_thread_percentage"], pipe_dir=linked)
        assert float(reply) == THREAD_PERCENTAGE
    finally:
        daemons.stop(daemon)
    assert through_pipe == []  # `quit` went through `tool/` too
    assert _daemons_alive(root) == []
