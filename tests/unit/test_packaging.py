"""The wheel (what the image installs) holds the product only: no test harness, no tests."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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
