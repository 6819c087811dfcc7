"""The stand-in `nvidia-smi` and `nvidia-cuda-mps-control`, run by name from PATH like gpudra runs them."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra import sim
from gpudra.gpu.tools import MPS_NO_DAEMON
from gpudra.node import gpu_driver
from gpudra.sim import state

PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "machine.json"


def _boot(profile: str, state_file: Path) -> list[str]:
    with gpu_driver.connect(f"sim:{profile}", state_file=state_file) as session:
        return [gpu.uuid for gpu in session.inventory().gpus]


@pytest.fixture
def env(tmp_path: Path, state_file: Path) -> dict[str, str]:
    tools = sim.write_tools(tmp_path / "bin", state_file=state_file)
    return {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}


def _run(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), check=False, env=env, input=stdin, capture_output=True, text=True, timeout=60
    )


def test_write_tools_writes_the_two_executables(tmp_path: Path, state_file: Path) -> None:
    directory = sim.write_tools(tmp_path / "bin", state_file=state_file)
    assert directory == tmp_path / "bin"
    assert sorted(p.name for p in directory.iterdir()) == ["nvidia-cuda-mps-control", "nvidia-smi"]
    assert all(os.access(p, os.X_OK) for p in directory.iterdir())
    assert str(state_file) in (directory / "nvidia-smi").read_text()


def test_query_gpu(env: dict[str, str], state_file: Path) -> None:
    uuids = _boot("dgx-h100", state_file)
    fields = "uuid,name,memory.total,pci.bus_id,compute_mode"
    result = _run(env, "nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader")
    assert result.returncode == 0, result.stderr
    rows = [line.split(", ") for line in result.stdout.splitlines()]
    assert [r[0] for r in rows] == uuids
    assert rows[0][1:] == ["NVIDIA H100 80GB HBM3", "81559 MiB", "00000000:18:00.0", "Default"]
    with_header = _run(
        env, "nvidia-smi", "--query-gpu=memory.total,driver_version", "--format=csv,nounits", "-i", "7"
    )
    assert with_header.stdout.splitlines() == ["memory.total [MiB], driver_version", "81559, 580.65.06"]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--query-gpu=uuid,bogus", "--format=csv"], 2, 'Field "bogus" is not a valid field to query.'),
        (["--query-gpu=uuid", "--format=json"], 2, "csv"),
        (["-i", "42", "-c", "DEFAULT"], 6, "No devices were found"),
        (["-i", "0", "-c", "EXCLUSIVE_THREAD"], 2, "Invalid compute mode"),
        (["-i", "0", "-c", "SHARED"], 2, "Invalid compute mode"),
        (["-i", "0"], 2, "Invalid combination of input arguments"),
        (["-c"], 2, "needs a value"),
        (["compute-policy", "-i", "0", "--set-timeslice", "4"], 2, "Invalid timeslice"),
        (["compute-policy", "--set-timeslice", "1"], 2, "Invalid combination"),
    ],
    ids=[
        "field",
        "format",
        "device",
        "exclusive-thread",
        "mode",
        "no-action",
        "no-value",
        "timeslice",
        "no-id",
    ],
)
def test_bad_command_lines(
    env: dict[str, str], state_file: Path, args: list[str], code: int, message: str
) -> None:
    _boot("mixed", state_file)
    before = state_file.read_bytes()
    result = _run(env, "nvidia-smi", *args)
    assert result.returncode == code
    assert message in result.stderr
    assert state_file.read_bytes() == before


def test_nvidia_smi_without_a_driver(env: dict[str, str]) -> None:
    result = _run(env, "nvidia-smi", "--query-gpu=uuid", "--format=csv")
    assert result.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in result.stderr


@pytest.mark.parametrize(
    ("mode", "stored", "shown"),
    [
        ("EXCLUSIVE_PROCESS", 3, "Exclusive_Process"),
        ("3", 3, "Exclusive_Process"),
        ("PROHIBITED", 2, "Prohibited"),
    ],
    ids=["name", "number", "prohibited"],
)
def test_compute_mode(env: dict[str, str], state_file: Path, mode: str, stored: int, shown: str) -> None:
    uuids = _boot("mixed", state_file)
    result = _run(env, "nvidia-smi", "-i", uuids[2], "-c", mode)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "All done."
    assert [g.compute_mode for g in state.StateFile(state_file).read().gpus] == [0, 0, stored, 0, 0, 0]
    query = _run(env, "nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader", "-i", "2")
    assert query.stdout.strip() == shown
    again = _run(env, "nvidia-smi", "-i", "0000:4b:00.0", "-c", mode)
    assert "already set" in again.stdout
    back = _run(env, "nvidia-smi", "-i", uuids[2], "-c", "DEFAULT")
    assert back.returncode == 0
    assert state.StateFile(state_file).read().gpus[2].compute_mode == 0


def test_compute_mode_on_a_mig_enabled_gpu_is_refused_but_allowed_on_its_mig_device(
    env: dict[str, str], state_file: Path
) -> None:
    with gpu_driver.connect("sim:dgx-h100", state_file=state_file) as session:
        gpu = session.inventory().gpus[0]
        device = session.create_mig_device(gpu_uuid=gpu.uuid, profile_id=9, placement_start=0)
    before = state_file.read_bytes()
    refused = _run(env, "nvidia-smi", "-i", gpu.uuid, "-c", "EXCLUSIVE_PROCESS")
    assert refused.returncode == 3
    assert "MIG mode is enabled" in refused.stderr
    assert state_file.read_bytes() == before
    allowed = _run(env, "nvidia-smi", "-i", device.uuid, "-c", "EXCLUSIVE_PROCESS")
    assert allowed.returncode == 0, allowed.stderr
    [gi] = state.StateFile(state_file).read().gpus[0].gpu_instances
    assert gi.compute_instances[0].compute_mode == 3


def test_timeslice(env: dict[str, str], state_file: Path) -> None:
    uuids = _boot("mixed", state_file)
    result = _run(env, "nvidia-smi", "compute-policy", "-i", uuids[1], "--set-timeslice", "2")
    assert result.returncode == 0, result.stderr
    assert [g.timeslice for g in state.StateFile(state_file).read().gpus] == [0, 2, 0, 0, 0, 0]
    listing = _run(env, "nvidia-smi", "compute-policy", "-l")
    values = [line.split()[3] for line in listing.stdout.splitlines() if "Timeslice" in line]
    assert values == ["Default", "Medium", "Default", "Default", "Default", "Default"]
    one = _run(env, "nvidia-smi", "compute-policy", "--list", "--id=1")
    assert [line.split()[3] for line in one.stdout.splitlines() if "Timeslice" in line] == ["Medium"]


def test_timeslice_on_a_mig_device_is_refused(env: dict[str, str], state_file: Path) -> None:
    with gpu_driver.connect("sim:dgx-a100", state_file=state_file) as session:
        gpu = session.inventory().gpus[0]
        device = session.create_mig_device(gpu_uuid=gpu.uuid, profile_id=19, placement_start=0)
    before = state_file.read_bytes()
    result = _run(env, "nvidia-smi", "compute-policy", "-i", device.uuid, "--set-timeslice", "1")
    assert result.returncode == 3
    assert "Not Supported" in result.stderr
    assert state_file.read_bytes() == before


# --- MPS ---------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


@pytest.fixture
def mps_env(env: dict[str, str], tmp_path: Path, state_file: Path) -> Iterator[dict[str, str]]:
    """Environment for one MPS daemon in private directories; the daemon is reaped or killed afterwards.

    The daemon detaches from the `-d` process, so this process becomes the subreaper of orphans for
    the test, to collect the daemon's exit status instead of leaving a zombie behind.
    """
    _boot("mixed", state_file)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    pipe = tmp_path / "pipe"
    yield {**env, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log")}
    try:
        for daemon in state.StateFile(state_file).read().mps_daemons:
            if _alive(daemon.pid):
                os.kill(daemon.pid, signal.SIGTERM)
            assert _wait_gone(daemon.pid)
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):  # not our child: another reaper has it
            os.waitpid(pid, os.WNOHANG)
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_mps_daemon_start_commands_quit(mps_env: dict[str, str], tmp_path: Path, state_file: Path) -> None:
    started = _run({**mps_env, "CUDA_VISIBLE_DEVICES": "0,3"}, "nvidia-cuda-mps-control", "-d")
    assert started.returncode == 0, started.stderr
    pipe = tmp_path / "pipe"
    pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    assert _alive(pid)
    assert (pipe / "control").is_socket()
    [daemon] = state.StateFile(state_file).read().mps_daemons
    assert (daemon.pid, daemon.pipe_directory, daemon.visible_devices) == (pid, str(pipe), "0,3")
    commands = "\n".join(
        [
            "get_default_active_thread_percentage",
            "set_default_active_thread_percentage 25",
            "get_default_active_thread_percentage",
            "set_default_device_pinned_mem_limit 0 10G",
            "set_default_device_pinned_mem_limit GPU-abc 512M",
            "get_default_device_pinned_mem_limit 0",
            "get_server_list",
        ]
    )
    replies = _run(mps_env, "nvidia-cuda-mps-control", stdin=commands)
    assert replies.returncode == 0, replies.stderr
    assert replies.stdout.splitlines() == ["100.0", "25.0", "25.0", "10G"]
    [daemon] = state.StateFile(state_file).read().mps_daemons
    assert daemon.default_active_thread_percentage == 25.0
    assert daemon.default_pinned_memory_limits == {"0": "10G", "GPU-abc": "512M"}
    assert "Starting control daemon using socket" in (tmp_path / "log" / "control.log").read_text()

    quit_ = _run(mps_env, "nvidia-cuda-mps-control", stdin="quit\n")
    assert quit_.returncode == 0
    assert _wait_gone(pid)
    assert not (pipe / "control").exists()
    assert not (pipe / "nvidia-cuda-mps-control.pid").exists()
    assert state.StateFile(state_file).read().mps_daemons == []


def test_mps_refuses_a_second_daemon_and_bad_values(mps_env: dict[str, str], tmp_path: Path) -> None:
    assert _run(mps_env, "nvidia-cuda-mps-control", "-d").returncode == 0
    pid = int((tmp_path / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
    second = _run(mps_env, "nvidia-cuda-mps-control", "-d")
    assert second.returncode == 1
    assert "already running" in second.stderr
    replies = _run(
        mps_env,
        "nvidia-cuda-mps-control",
        stdin="set_default_active_thread_percentage 0\nset_default_device_pinned_mem_limit 0 10GB\nstart\n",
    )
    lines = replies.stdout.splitlines()
    assert lines[0].startswith("Invalid active thread percentage")
    assert lines[1].startswith("Invalid memory limit")
    assert lines[2].startswith("Unrecognized command")
    _run(mps_env, "nvidia-cuda-mps-control", stdin="quit\n")
    assert _wait_gone(pid)


def test_an_attached_client_stays_attached_while_the_daemon_answers_others_and_sees_its_end(
    mps_env: dict[str, str], tmp_path: Path
) -> None:
    assert _run(mps_env, "nvidia-cuda-mps-control", "-d").returncode == 0
    pid = int((tmp_path / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
    limits = "set_default_active_thread_percentage 40\nset_default_device_pinned_mem_limit 0 8G\n"
    assert _run(mps_env, "nvidia-cuda-mps-control", stdin=limits).returncode == 0
    with subprocess.Popen(
        [sys.executable, "-m", "gpudra.sim.mps_client"], env=mps_env, stdout=subprocess.PIPE, text=True
    ) as client:
        try:
            assert client.stdout is not None
            assert client.stdout.readline() == f"attached {pid} threads=40.0 memory=0=8G\n"
            # The daemon goes on answering while the client holds its connection.
            threads = _run(mps_env, "nvidia-cuda-mps-control", stdin="get_default_active_thread_percentage\n")
            assert threads.stdout == "40.0\n"
            assert client.poll() is None
            _run(mps_env, "nvidia-cuda-mps-control", stdin="quit\n")
            assert client.wait(10) == 1
            assert client.stdout.read() == "lost the MPS control daemon\n"
        finally:
            if client.poll() is None:
                client.kill()
    assert _wait_gone(pid)


def test_an_mps_client_without_a_daemon_says_so(mps_env: dict[str, str]) -> None:
    client = subprocess.run(
        [sys.executable, "-m", "gpudra.sim.mps_client"],
        env=mps_env,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert client.returncode == 1
    assert client.stdout.startswith("no MPS control daemon in ")


def test_mps_client_without_a_daemon(mps_env: dict[str, str]) -> None:
    result = _run(mps_env, "nvidia-cuda-mps-control", stdin="get_server_list\n")
    assert result.returncode == 1
    assert result.stdout.strip() == MPS_NO_DAEMON  # what gpudra reads as "no daemon reached"


def test_the_mps_client_needs_only_the_control_socket_in_its_pipe_directory(
    mps_env: dict[str, str], tmp_path: Path
) -> None:
    """As gpudra runs it (gpudra.node.sharing.mps_daemons): in a directory that holds nothing but a hard
    link to the daemon's control socket, the client reaches the daemon."""
    assert _run(mps_env, "nvidia-cuda-mps-control", "-d").returncode == 0
    linked = tmp_path / "tool"
    linked.mkdir(mode=0o700)
    os.link(tmp_path / "pipe" / "control", linked / "control")
    through_link = {**mps_env, "CUDA_MPS_PIPE_DIRECTORY": str(linked)}
    replies = _run(through_link, "nvidia-cuda-mps-control", stdin="set_default_active_thread_percentage 40\n")
    assert (replies.returncode, replies.stdout.strip()) == (0, "40.0")
    assert _run(mps_env, "nvidia-cuda-mps-control", stdin="quit\n").returncode == 0


def test_mps_daemon_without_a_driver(env: dict[str, str], tmp_path: Path) -> None:
    result = _run({**env, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")}, "nvidia-cuda-mps-control", "-d")
    assert result.returncode == 1
    assert not (tmp_path / "pipe").exists()
