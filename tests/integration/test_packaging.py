"""The wheel (what the image installs) holds the product only: no test harness, no tests."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _head() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_wheel_holds_no_harness_and_no_tests(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--wheel-dir",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("gpudra-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.startswith("gpudra-")}
    assert packages == {"gpudra"}
    assert not [n for n in names if "localcluster" in n or "/tests/" in n or n.startswith("tests/")]
    # the product is all there: both boundaries, the node plugin, the simulator
    for module in (
        "gpudra/cli/__init__.py",
        "gpudra/node/daemon.py",
        "gpudra/kube/client.py",
        "gpudra/gpu/nvml.py",
        "gpudra/sim/library.py",
        "gpudra/py.typed",
    ):
        assert module in names
    # The checkout's revision, which `gpudra --version` and the start-up line report from a pip install.
    assert zipfile.ZipFile(wheel).read("gpudra/REVISION").decode() == f"{_head()}\n"


# Installing the dependencies into a fresh venv takes about 3 minutes on 2 busy cores.
@pytest.mark.timeout(600)
def test_every_command_works_from_the_wheel_outside_the_checkout(tmp_path: Path) -> None:
    """`pip install gpudra-*.whl` into a fresh venv (dependencies from PyPI, through pip's cache that
    `make install` warms), run from a directory outside the checkout with nothing of it on the path:
    each command finds what it needs in the package (explain: gpudra's DeviceClasses)."""
    wheels, venv, work = tmp_path / "wheels", tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
    )
    [wheel] = wheels.glob("gpudra-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    # Without PYTHONPATH: pip would take a source tree on it (with its egg-info) for gpudra installed.
    outside = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", str(wheel)],
        check=True,
        capture_output=True,
        env=outside,
    )
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(work)}  # no PYTHONPATH: the wheel only

    def gpudra(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(venv / "bin" / "gpudra"), *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )

    version = gpudra("--version")
    assert version.stdout.strip().endswith(f"(revision {_head()})"), version.stdout
    where = gpudra("validate", "--help")
    assert where.returncode == 0 and "exit codes:" in where.stdout
    located = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import gpudra; print(gpudra.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert located.stdout.startswith(str(venv))
    slices = gpudra("inventory", "--nvml=sim:vm-h100", "--node-name=node-a", "-o", "yaml")
    assert slices.returncode == 0, slices.stderr
    (work / "slices.yaml").write_text(slices.stdout)
    claim = (REPO / "examples" / "single-gpu.yaml").read_text()
    (work / "claim.yaml").write_text(claim)
    assert gpudra("validate", "claim.yaml").returncode == 0
    unchanged = gpudra("migrate", "claim.yaml")  # gpudra's own manifests: nothing to rewrite
    assert unchanged.returncode == 0 and unchanged.stdout == claim, unchanged.stderr
    explained = gpudra("explain", "claim.yaml", "--slices", "slices.yaml")
    assert explained.returncode == 0, explained.stderr
    assert explained.stdout.startswith("fits on node-a")
    status = gpudra("status", "--controller-url=https://127.0.0.1:1", "--token=t")
    assert status.returncode == 2 and status.stderr.startswith("gpudra status: reading https://127.0.0.1:1")
    for daemon in ("kubelet-plugin", "controller"):
        assert gpudra(daemon, "--help").returncode == 0
    refused = gpudra("kubelet-plugin", "--node-name=n", "--log-level=LOUD")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
