"""An NVML session per call on a simulated machine, for tests that build a DeviceState.

The plugin keeps one NVML session open for its life. A test cannot: pynvml holds one simulated
machine per process, so a session left open would keep the next test from simulating another. This
opens one for each call instead; the simulator's state file makes every call see the same machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from gpudra.model.inventory import Gpu
from gpudra.node import gpu_driver
from gpudra.node.mig import MigHardware, MigPartitions


class SessionPerCall:
    def __init__(self, spec: str, state_file: Path) -> None:
        self.spec = spec
        self.state_file = state_file

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(**kwargs: Any) -> Any:
            with gpu_driver.connect(self.spec, state_file=self.state_file) as session:
                return getattr(session, name)(**kwargs)

        return call


def mig_partitions(spec: str, state_file: Path, gpus: tuple[Gpu, ...]) -> MigPartitions:
    return MigPartitions(
        cast(MigHardware, SessionPerCall(spec, state_file)), gpus={gpu.uuid: gpu for gpu in gpus}
    )
