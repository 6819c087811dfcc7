"""The timed sections of a round, run against one started plugin. I/O: the API server (claims are
created before each timed section, never inside it) and the plugin's DRA socket.

A round starts with an untimed warm-up (every GPU prepared and unprepared once), and the MIG and MPS
sections with one untimed cycle each: first uses (a gRPC connection, lazy imports, gpudra switching MIG
off on a GPU the simulator boots with MIG on, or on again for a partition) happen once per node and are
not what a steady-state latency figure is about; the start-up figures cover the plugin's first moments.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.bench.claims import ClaimRef, Wanted
from tests.bench.control_plane import Objects
from tests.bench.kubelet_client import DraClient
from tests.bench.procfs import CpuTimes, cpu_times
from tests.bench.results import Latencies
from tests.bench.subjects import GPUS, Subject


class ClaimMaker:
    """Creates allocated claims in one namespace for one plugin's node."""

    def __init__(self, objects: Objects, subject: Subject, *, node: str, namespace: str) -> None:
        self.objects = objects
        self.subject = subject
        self.node = node
        self.namespace = namespace
        self.made = 0

    def make(
        self, device: str, *, device_class: str | None = None, config: dict[str, Any] | None = None
    ) -> ClaimRef:
        self.made += 1
        wanted = Wanted(
            namespace=self.namespace,
            name=f"claim-{self.made}",
            driver=self.subject.driver,
            pool=self.node,
            device=device,
            device_class=device_class or self.subject.device_class,
            config=config,
        )
        created = self.objects.create_allocated_claim(wanted.claim(), wanted.allocation())
        return ClaimRef(namespace=self.namespace, name=wanted.name, uid=created["metadata"]["uid"])

    def every_gpu(self) -> list[ClaimRef]:
        """One claim for each GPU of the node."""
        return [self.make(Subject.gpu(i)) for i in range(GPUS)]


def warm_up(client: DraClient, maker: ClaimMaker) -> None:
    """Prepare and unprepare every GPU once, in one call each."""
    claims = maker.every_gpu()
    client.prepare(claims)
    client.unprepare(claims)


def single_cycles(
    client: DraClient, maker: ClaimMaker, count: int, *, pid: int
) -> tuple[Latencies, CpuTimes]:
    """`count` prepare + unprepare cycles of one whole GPU with no config, one claim per call, the
    GPUs taken in turn; and the plugin's CPU time over them."""
    claims = [maker.make(Subject.gpu(i % GPUS)) for i in range(count)]
    before = cpu_times(pid)
    timed = _one_by_one(client, claims)
    return timed, cpu_times(pid) - before


def _one_by_one(client: DraClient, claims: Sequence[ClaimRef]) -> Latencies:
    timed = Latencies()
    for claim in claims:
        timed.prepare.append(client.prepare([claim]))
        timed.unprepare.append(client.unprepare([claim]))
    return timed


def batched(client: DraClient, maker: ClaimMaker, count: int) -> Latencies:
    """`count` calls that prepare a claim for every GPU at once, each followed by its unprepare call."""
    batches = [maker.every_gpu() for _ in range(count)]
    timed = Latencies()
    for claims in batches:
        timed.prepare.append(client.prepare(claims))
        timed.unprepare.append(client.unprepare(claims))
    return timed


def throughput(client: DraClient, maker: ClaimMaker, per_thread: int, *, seconds: float) -> float:
    """Claims per second (each prepared and unprepared) with one client thread per GPU, each cycling
    through its own claims on its own GPU, so the plugin may serve them side by side. A thread stops at
    its last claim or after `seconds`, whichever comes first: a throttled plugin still ends in time."""
    claims = [[maker.make(Subject.gpu(t)) for _ in range(per_thread)] for t in range(GPUS)]
    window: dict[str, float] = {}

    def open_window() -> None:  # runs once, when every thread is at the barrier
        window["start"] = time.perf_counter()
        window["deadline"] = window["start"] + seconds

    barrier = threading.Barrier(GPUS, action=open_window)

    def cycle(own: Sequence[ClaimRef]) -> tuple[int, float]:
        barrier.wait()
        done = 0
        for claim in own:
            if time.perf_counter() > window["deadline"]:
                break
            client.prepare([claim])
            client.unprepare([claim])
            done += 1
        return done, time.perf_counter()

    with ThreadPoolExecutor(max_workers=GPUS, thread_name_prefix="bench-client") as pool:
        outcomes = [f.result() for f in [pool.submit(cycle, own) for own in claims]]
    finished = max(at for _, at in outcomes)
    return sum(done for done, _ in outcomes) / (finished - window["start"])


def repeated(client: DraClient, make: Callable[[], ClaimRef], count: int) -> Latencies:
    """One untimed cycle, then `count` timed prepare + unprepare cycles of claims from `make`."""
    warm = make()
    client.prepare([warm])
    client.unprepare([warm])
    return _one_by_one(client, [make() for _ in range(count)])
