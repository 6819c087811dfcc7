"""The driver root: libnvidia-ml and the tools found under it, symlinks followed inside it, the tools run
chrooted into it, MPS directories checked against it, and the kubelet plugin's --driver-root option."""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
from pathlib import Path, PurePosixPath

import pytest

from gpudra import cli
from gpudra.errors import HardwareError, NvmlUnavailable
from gpudra.gpu import driver_root as roots
from gpudra.gpu.tools import GpuTools
from gpudra.node import daemon, gpu_driver
from gpudra.node.options import PluginOptions

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler to build a test library")
GPU = "GPU-5f9c62d1-8b1e-4a3f-9c1e-2b7d8e6f0a11"


def _file(path: Path, text: str = "", *, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def _link(path: Path, target: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


def _library(path: Path, *, soname: str, source: str) -> Path:
    """A shared library built from C `source` with the SONAME `soname`."""
    assert CC is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    c_file = path.parent / f"{path.name}.c"
    c_file.write_text(source)
    subprocess.run(
        [CC, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(c_file)],
        check=True,
        capture_output=True,
    )
    c_file.unlink()
    return path


# --- finding files inside the root ----------------------------------------------------------------


@pytest.mark.parametrize("directory", roots.LIBRARY_DIRS)
def test_the_library_is_found_in_each_library_directory(tmp_path: Path, directory: str) -> None:
    _file(tmp_path / directory / "libnvidia-ml.so.1")
    assert roots.find(tmp_path, "libnvidia-ml.so.1", roots.LIBRARY_DIRS) == PurePosixPath(
        "/", directory, "libnvidia-ml.so.1"
    )


def test_library_directories_are_searched_in_order(tmp_path: Path) -> None:
    for directory in roots.LIBRARY_DIRS:
        _file(tmp_path / directory / "libnvidia-ml.so.1")
    for directory in roots.LIBRARY_DIRS:
        found = roots.find(tmp_path, "libnvidia-ml.so.1", roots.LIBRARY_DIRS)
        assert found == PurePosixPath("/", directory, "libnvidia-ml.so.1")
        (tmp_path / directory / "libnvidia-ml.so.1").unlink()
    assert roots.find(tmp_path, "libnvidia-ml.so.1", roots.LIBRARY_DIRS) is None


def test_a_directory_holding_something_else_by_that_name_is_passed_over(tmp_path: Path) -> None:
    (tmp_path / "usr/lib64/libnvidia-ml.so.1").mkdir(parents=True)
    _file(tmp_path / "lib64/libnvidia-ml.so.1")
    assert roots.find(tmp_path, "libnvidia-ml.so.1", roots.LIBRARY_DIRS) == PurePosixPath(
        "/lib64/libnvidia-ml.so.1"
    )


def test_absolute_symlinks_are_followed_inside_the_root(tmp_path: Path) -> None:
    # A merged-/usr driver container: /lib64 -> usr/lib64, and the soname -> the versioned file, absolute.
    _file(tmp_path / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15")
    _link(tmp_path / "lib", "/usr/lib")
    _link(tmp_path / "usr/lib64", "lib/x86_64-linux-gnu")
    _link(tmp_path / "usr/lib64/libnvidia-ml.so.1", "/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15")
    found = roots.find(tmp_path, "libnvidia-ml.so.1", roots.LIBRARY_DIRS)
    assert found == PurePosixPath("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15")
    assert roots.here(tmp_path, found) == tmp_path / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15"


def test_an_absolute_symlink_never_reaches_the_containers_own_files(tmp_path: Path) -> None:
    outside = _file(tmp_path / "container/libnvidia-ml.so.550.54.15")  # exists here, not in the root
    root = tmp_path / "root"
    _link(root / "usr/lib64/libnvidia-ml.so.1", str(outside))
    assert roots.find(root, "libnvidia-ml.so.1", roots.LIBRARY_DIRS) is None


def test_dot_dot_stops_at_the_root(tmp_path: Path) -> None:
    _file(tmp_path / "libnvidia-ml.so.2")
    _link(tmp_path / "usr/lib64/libnvidia-ml.so.1", "../../../../../../libnvidia-ml.so.2")
    assert roots.resolve(tmp_path, PurePosixPath("/usr/lib64/libnvidia-ml.so.1")) == PurePosixPath(
        "/libnvidia-ml.so.2"
    )


def test_dangling_and_looping_symlinks_find_nothing(tmp_path: Path) -> None:
    _link(tmp_path / "usr/lib64/libnvidia-ml.so.1", "libnvidia-ml.so.550.54.15")
    _link(tmp_path / "lib64/libnvidia-ml.so.1", "/lib64/libnvidia-ml.so.1")
    assert roots.resolve(tmp_path, PurePosixPath("/usr/lib64/libnvidia-ml.so.1")) is None
    assert roots.resolve(tmp_path, PurePosixPath("/lib64/libnvidia-ml.so.1")) is None
    assert roots.find(tmp_path, "libnvidia-ml.so.1", roots.LIBRARY_DIRS) is None


def test_only_the_containers_own_root_is_the_host(tmp_path: Path) -> None:
    assert roots.is_host(Path("/"))
    assert roots.is_host(_link(tmp_path / "slash", "/"))
    assert not roots.is_host(tmp_path)


# --- loading the library ----------------------------------------------------------------------------


def test_a_missing_library_names_the_option_and_every_directory_searched(tmp_path: Path) -> None:
    with pytest.raises(NvmlUnavailable) as caught:
        roots.load_library(tmp_path)
    searched = ", ".join(f"{tmp_path}/{directory}" for directory in roots.LIBRARY_DIRS)
    assert str(caught.value) == (
        f"libnvidia-ml.so.1 not found under the driver root {tmp_path} (--driver-root); searched {searched}"
    )


@needs_cc
def test_a_loaded_library_answers_a_later_load_by_its_soname(tmp_path: Path) -> None:
    # A name no other test and no system library uses: the process keeps what it loaded.
    soname = f"libgpudra-probe-{secrets.token_hex(4)}.so.1"
    versioned = f"{soname}.2.3"
    _library(
        tmp_path / "usr/lib/x86_64-linux-gnu" / versioned,
        soname=soname,
        source="int gpudra_probe(void) { return 4242; }\n",
    )
    _link(tmp_path / "usr/lib64" / soname, f"/usr/lib/x86_64-linux-gnu/{versioned}")
    with pytest.raises(OSError):
        ctypes.CDLL(soname)  # not on the loader's search path: only loading it by path makes it known

    loaded = roots.load_library(tmp_path, soname)

    assert loaded == tmp_path / "usr/lib/x86_64-linux-gnu" / versioned
    assert ctypes.CDLL(soname).gpudra_probe() == 4242


@needs_cc
def test_a_library_with_another_soname_is_refused(tmp_path: Path) -> None:
    soname = f"libgpudra-probe-{secrets.token_hex(4)}.so.1"
    library = _library(
        tmp_path / "usr/lib64" / soname,
        soname=f"libgpudra-other-{secrets.token_hex(4)}.so.7",
        source="int gpudra_probe(void) { return 1; }\n",
    )
    with pytest.raises(NvmlUnavailable) as caught:
        roots.load_library(tmp_path, soname)
    assert str(caught.value) == (
        f"{library} from the driver root {tmp_path} (--driver-root) does not have the SONAME {soname}"
    )


@needs_cc
def test_pynvml_opens_the_library_under_the_driver_root(tmp_path: Path) -> None:
    _library(
        tmp_path / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.999.1",
        soname="libnvidia-ml.so.1",
        source=(
            "int nvmlInitWithFlags(unsigned int flags) { return 0; }\n"
            "int nvmlShutdown(void) { return 0; }\n"
            "int gpudra_probe(void) { return 4242; }\n"
        ),
    )
    _link(tmp_path / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "libnvidia-ml.so.999.1")
    # In a process of its own: pynvml keeps the library it loads for the process's life.
    script = (
        "import sys, pynvml\n"
        "from pathlib import Path\n"
        "from gpudra.gpu import nvml\n"
        "with nvml.connect(driver_root=Path(sys.argv[1])):\n"
        "    print(pynvml.nvmlLib.gpudra_probe())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "4242\n", "")


def test_the_simulator_ignores_the_driver_root(tmp_path: Path) -> None:
    with gpu_driver.connect(
        "sim:mixed", state_file=tmp_path / "sim/state.json", driver_root=tmp_path / "no-driver"
    ) as session:
        assert session.inventory().gpus


# --- the tools --------------------------------------------------------------------------------------


def test_without_a_driver_root_a_tool_is_found_on_the_search_path(tmp_path: Path) -> None:
    smi = _file(tmp_path / "bin/nvidia-smi", mode=0o755)
    assert GpuTools(search_path=str(tmp_path / "bin")).command("nvidia-smi") == [str(smi)]


@pytest.mark.parametrize("directory", roots.TOOL_DIRS)
def test_a_driver_roots_tool_runs_chrooted(tmp_path: Path, directory: str) -> None:
    chroot = _file(tmp_path / "container/bin/chroot", mode=0o755)
    root = tmp_path / "root"
    _file(root / directory / "nvidia-smi", mode=0o755)
    tools = GpuTools(search_path=str(chroot.parent), driver_root=root)
    assert tools.command("nvidia-smi") == [str(chroot), str(root), f"/{directory}/nvidia-smi"]


def test_tool_directories_are_searched_in_order_and_links_followed_inside_the_root(tmp_path: Path) -> None:
    chroot = _file(tmp_path / "container/bin/chroot", mode=0o755)
    root = tmp_path / "root"
    for directory in roots.TOOL_DIRS:
        _file(root / directory / "nvidia-cuda-mps-control", mode=0o755)
    _link(root / "usr/bin/nvidia-smi", "/opt/bin/nvidia-smi.real")
    _file(root / "opt/bin/nvidia-smi.real", mode=0o755)
    tools = GpuTools(search_path=str(chroot.parent), driver_root=root)
    assert tools.command("nvidia-cuda-mps-control")[2] == "/usr/bin/nvidia-cuda-mps-control"
    assert tools.command("nvidia-smi")[2] == "/opt/bin/nvidia-smi.real"


def test_a_tool_missing_from_the_driver_root_names_the_option_and_the_directories(tmp_path: Path) -> None:
    chroot = _file(tmp_path / "container/bin/chroot", mode=0o755)
    root = tmp_path / "root"
    _file(root / "usr/bin/nvidia-smi", mode=0o644)  # not executable
    _file(tmp_path / "container/bin/nvidia-smi", mode=0o755)  # the container's own: not used
    tools = GpuTools(search_path=str(chroot.parent), driver_root=root)
    with pytest.raises(NvmlUnavailable) as caught:
        tools.command("nvidia-smi")
    searched = ", ".join(f"{root}/{directory}" for directory in roots.TOOL_DIRS)
    assert str(caught.value) == (
        f"nvidia-smi not found under the driver root {root} (--driver-root); searched {searched}"
    )


def test_a_missing_chroot_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _file(root / "usr/bin/nvidia-smi", mode=0o755)
    tools = GpuTools(search_path=str(tmp_path / "empty"), driver_root=root)
    with pytest.raises(NvmlUnavailable, match=r"^chroot not found on PATH .*runs nvidia-smi in the driver"):
        tools.command("nvidia-smi")


class _Chroot:
    """A stand-in `chroot` on the search path that records its arguments and the MPS variables."""

    def __init__(self, tmp_path: Path, *, output: str = "") -> None:
        self.record = tmp_path / "chroot-calls.jsonl"
        self.bin = tmp_path / "container-bin"
        _file(
            self.bin / "chroot",
            f"#!{sys.executable}\n"
            "import json, os, sys\n"
            f"with open({str(self.record)!r}, 'a') as record:\n"
            "    env = {k: v for k, v in os.environ.items() if k.startswith('CUDA_')}\n"
            "    record.write(json.dumps({'argv': sys.argv[1:], 'env': env}) + '\\n')\n"
            f"sys.stdout.write({output!r})\n",
            mode=0o755,
        )

    def calls(self) -> list[dict[str, object]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]


@pytest.fixture
def driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for variable in [name for name in os.environ if name.startswith("CUDA_")]:
        monkeypatch.delenv(variable)  # the stand-in chroot records what the tools were given, only that
    root = tmp_path / "root"
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control"):
        _file(root / "usr/bin" / tool, mode=0o755)
    return root


def test_nvidia_smi_command_lines_run_in_the_driver_root(tmp_path: Path, driver: Path) -> None:
    chroot = _Chroot(tmp_path, output="Default\n")
    tools = GpuTools(search_path=str(chroot.bin), driver_root=driver)
    tools.set_timeslice(gpu_uuid=GPU, level=2)
    assert tools.compute_mode(gpu_uuid=GPU) == 0
    assert [call["argv"] for call in chroot.calls()] == [
        [str(driver), "/usr/bin/nvidia-smi", "compute-policy", "-i", GPU, "--set-timeslice", "2"],
        [str(driver), "/usr/bin/nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader", "-i", GPU],
    ]


def _state_dir_also_inside(root: Path, state: Path) -> None:
    """Make `state` (a directory in `root`) reachable inside `root` at its path here, as the host's
    state directory is under a driver root that is the host's /: a link back to the root's top."""
    parent = state.parent.relative_to("/")
    (root / parent).mkdir(parents=True)
    _link(root / parent / state.name, "../" * len(parent.parts) + str(state.relative_to(root)))


def test_mps_runs_in_the_driver_root_when_the_state_directory_is_there_too(
    tmp_path: Path, driver: Path
) -> None:
    state = driver / "var/lib/kubelet/plugins/gpu.gpudra.io"
    (state / "mps/0123456789ab/pipe").mkdir(parents=True)
    (state / "mps/0123456789ab/log").mkdir(parents=True)
    _state_dir_also_inside(driver, state)
    assert roots.shared(driver, state / "mps/0123456789ab/pipe")
    chroot = _Chroot(tmp_path)
    tools = GpuTools(search_path=str(chroot.bin), driver_root=driver)
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(state / "mps/0123456789ab/pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(state / "mps/0123456789ab/log"),
        "CUDA_VISIBLE_DEVICES": GPU,
    }
    tools.start_mps_daemon(env=env)
    tools.mps_control(["get_server_list"], pipe_dir=state / "mps/0123456789ab/pipe")
    assert chroot.calls() == [
        {"argv": [str(driver), "/usr/bin/nvidia-cuda-mps-control", "-d"], "env": env},
        {
            "argv": [str(driver), "/usr/bin/nvidia-cuda-mps-control"],
            "env": {"CUDA_MPS_PIPE_DIRECTORY": env["CUDA_MPS_PIPE_DIRECTORY"]},
        },
    ]


def test_mps_refuses_a_state_directory_the_driver_root_does_not_have(tmp_path: Path, driver: Path) -> None:
    state = tmp_path / "plugin-state"
    (state / "mps/0123456789ab/pipe").mkdir(parents=True)
    (state / "mps/0123456789ab/log").mkdir(parents=True)
    # The same path inside the root is another directory: a daemon there would be out of reach.
    (driver / state.relative_to("/") / "mps/0123456789ab/pipe").mkdir(parents=True)
    assert not roots.shared(driver, state / "mps/0123456789ab/pipe")
    chroot = _Chroot(tmp_path)
    tools = GpuTools(search_path=str(chroot.bin), driver_root=driver)
    with pytest.raises(HardwareError) as caught:
        tools.start_mps_daemon(
            env={
                "CUDA_MPS_PIPE_DIRECTORY": str(state / "mps/0123456789ab/pipe"),
                "CUDA_MPS_LOG_DIRECTORY": str(state / "mps/0123456789ab/log"),
            }
        )
    with pytest.raises(HardwareError):
        tools.mps_control(["get_server_list"], pipe_dir=state / "mps/0123456789ab/pipe")
    assert chroot.calls() == []
    assert str(caught.value) == (
        f"CUDA_MPS_PIPE_DIRECTORY {state}/mps/0123456789ab/pipe is not the same writable directory "
        f"inside the driver root {driver} (--driver-root), where the NVIDIA tools run: MPS needs the "
        "plugin's state directory (--state-dir) at the same path inside the driver root, as when the "
        "driver root is the host's / and the state directory is mounted at its host path"
    )


def test_without_a_driver_root_mps_directories_are_not_checked(tmp_path: Path) -> None:
    chroot = _Chroot(tmp_path)  # records nothing: the tool runs directly
    mps = _file(
        tmp_path / "bin/nvidia-cuda-mps-control",
        f"#!{sys.executable}\nimport os, sys\nsys.stdout.write(os.environ['CUDA_MPS_PIPE_DIRECTORY'])\n",
        mode=0o755,
    )
    tools = GpuTools(search_path=os.pathsep.join([str(mps.parent), str(chroot.bin)]))
    assert tools.mps_control([], pipe_dir=Path("/nowhere/pipe")) == "/nowhere/pipe"
    assert chroot.calls() == []


# --- the option -------------------------------------------------------------------------------------


def test_the_plugin_gets_the_driver_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[PluginOptions] = []
    monkeypatch.setattr(daemon, "run", lambda options, stop: seen.append(options))
    monkeypatch.setattr(cli, "_run_daemon", lambda args, run: run(threading.Event()) or 0)
    code = cli.main(
        ["kubelet-plugin", "--node-name=node-a", f"--state-dir={tmp_path}", "--driver-root=/driver-root"]
    )
    assert code == 0
    assert [options.driver_root for options in seen] == [Path("/driver-root")]


def test_a_relative_driver_root_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["kubelet-plugin", "--node-name=node-a", "--driver-root=driver-root"]) == 2
    assert capsys.readouterr().err == (
        "gpudra kubelet-plugin: argument --driver-root: 'driver-root' is not an absolute path (one starting "
        "with /) (see gpudra kubelet-plugin --help)\n"
    )
