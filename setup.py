"""Stamps the git revision into every wheel built from a checkout (gpudra/REVISION), so that a wheel
installed by pip reports its revision as the image does (gpudra.build). Everything else about the
package is in pyproject.toml.

The revision is $GPUDRA_REVISION when set (the image build passes its own), else `git rev-parse HEAD`
of the checkout being built; an sdist built into a wheel away from git carries none ("unknown").
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

_GIT_TIMEOUT_SECONDS = 10


def _git_revision() -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


class BuildPyWithRevision(build_py):
    def run(self) -> None:
        super().run()
        # An editable install copies no module into build_lib (its source tree is the package): it has
        # no revision to carry, as build.py says.
        if self.dry_run or getattr(self, "editable_mode", False):
            return
        revision = os.environ.get("GPUDRA_REVISION") or _git_revision()
        if revision:
            (Path(self.build_lib) / "gpudra" / "REVISION").write_text(f"{revision}\n")


setup(cmdclass={"build_py": BuildPyWithRevision})
