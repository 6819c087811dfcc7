"""The chart rendered as release `gpudra` with the Helm of tests/localcluster, and the values that turn
its monitoring objects on (the chart's ci/monitoring-values.yaml): what the chart's monitoring tests
and the Prometheus demo read the dashboard and the alerts from."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from tests.localcluster import helm as localhelm

from .conftest import REPO

CHART = REPO / "deploy" / "helm" / "gpudra"
MONITORING = ("-f", str(CHART / "ci" / "monitoring-values.yaml"))


def render(*args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(localhelm.helm_binary()), "template", "gpudra", str(CHART), "--namespace", "gpudra", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [o for o in yaml.safe_load_all(out) if o]
