"""What the plugin's usage sampler and health probe read from a real GPU with a real workload on it.

`gpudra kubelet-plugin --usage-interval-seconds` decides that a claim's whole GPU is busy from NVML's
utilization, and a MIG device's from its compute processes; the health probe reads memory info. These
tests run a CUDA client that holds memory and keeps a kernel running, and check that the same
`Nvml.device_usage` and `Nvml.gpu_health` calls see it. Read-only for the card. Needs a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from gpudra.gpu import nvml
from gpudra.node import gpu_driver

pytestmark = pytest.mark.gpu

MIB = 1024**2
HELD_MIB = 2048
_TIMEOUT_S = 10.0


@pytest.fixture
def session() -> Iterator[nvml.Nvml]:
    with gpu_driver.connect("real") as opened:
        yield opened


def _eventually(what: str, holds: Callable[[], bool]) -> None:
    # NVML's utilization is a fraction of its last sample period (1/6 s to 1 s): it lags the GPU.
    deadline = time.monotonic() + _TIMEOUT_S
    while not holds():
        assert time.monotonic() < deadline, f"not within {_TIMEOUT_S:g}s: {what}"
        time.sleep(0.1)


def test_usage_sees_a_workload_come_and_go(session: nvml.Nvml) -> None:
    uuid = session.inventory().gpus[0].uuid
    assert session.gpu_health(gpu_uuid=uuid) == (True, "")
    _eventually("the GPU reads idle", lambda: session.device_usage(uuid=uuid).utilization == 0)
    idle = session.device_usage(uuid=uuid)

    client = subprocess.Popen(
        [sys.executable, "-m", "tests.gpu.cuda_client", "--busy", str(HELD_MIB)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": uuid},
    )
    assert client.stdin is not None and client.stdout is not None
    try:
        figures = json.loads(client.stdout.readline())
        assert figures["allocations"][0]["code"] == 0, figures
        _eventually(
            "a kernel shows as utilization", lambda: (session.device_usage(uuid=uuid).utilization or 0) > 0
        )
        busy = session.device_usage(uuid=uuid)
        assert client.pid in busy.processes
        assert busy.memory_used - idle.memory_used >= HELD_MIB * MIB
        assert session.gpu_health(gpu_uuid=uuid) == (True, "")
    finally:
        client.stdin.close()
        assert client.wait(timeout=30) == 0
        client.stdout.close()
    _eventually(
        "the client's process is gone", lambda: client.pid not in session.device_usage(uuid=uuid).processes
    )
    _eventually("the GPU reads idle again", lambda: session.device_usage(uuid=uuid).utilization == 0)
