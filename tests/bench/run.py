"""A whole benchmark run: the control plane, interleaved rounds of every subject, the idle windows,
then the report. I/O: everything, through the modules it wires."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tests.bench import report, request_counts
from tests.bench.claims import MPS_CONFIG
from tests.bench.control_plane import ControlPlane, Objects
from tests.bench.errors import BenchError
from tests.bench.explain_hook import explain_over_1000_nodes
from tests.bench.peer_build import peer_binary
from tests.bench.plugin_process import PluginRun
from tests.bench.procfs import load_average, machine, rss_mib
from tests.bench.request_counts import RequestKind, Requests
from tests.bench.results import Idle, Round, SubjectResults
from tests.bench.subjects import GPUS, PEER_DESCRIPTION, Gpudra, NodeDirs, Peer, Subject
from tests.bench.workload import ClaimMaker, batched, repeated, single_cycles, throughput, warm_up

# After a start, before an idle window: the last writes of publishing and the first watch settle.
SETTLE_SECONDS = 2.0


@dataclass(frozen=True)
class Settings:
    cycles: int
    rounds: int
    idle_seconds: float
    throughput_seconds: float
    report: Path
    plot: Path
    workdir: Path | None  # None: a temporary directory, removed after a run without problems

    @property
    def batches(self) -> int:
        """Calls with 8 claims per round, and gpudra's MIG and MPS cycles: a tenth of the claims each."""
        return max(3, self.cycles // 30)

    @property
    def idle_resync_seconds(self) -> float:
        """gpudra's resync period while idle: 100 periods fit the window (issue 15's target)."""
        return max(0.1, self.idle_seconds / 100)


def progress(started: float, message: str) -> None:
    print(f"[{time.monotonic() - started:6.1f}s] {message}", file=sys.stderr, flush=True)


class Bench:
    """The measurements, each on a fresh node of one control plane."""

    def __init__(
        self, settings: Settings, control_plane: ControlPlane, workdir: Path, started: float
    ) -> None:
        self.settings = settings
        self.control_plane = control_plane
        self.api = control_plane.api()
        self.objects = Objects(self.api)
        self.workdir = workdir
        self.started = started
        self.problems: dict[str, list[str]] = {}

    def close(self) -> None:
        self.api.close()

    def _plugin(self, subject: Subject, node: str, *, resync_seconds: float | None) -> PluginRun:
        return PluginRun(
            subject,
            NodeDirs(node, self.workdir / node),
            objects=self.objects,
            new_api=self.control_plane.api,
            kubeconfig=self.control_plane.kubeconfig,
            resync_seconds=resync_seconds,
        )

    def _stop(self, plugin: PluginRun) -> None:
        """Stop `plugin`, keeping what went wrong for the report."""
        found = self.problems.setdefault(plugin.subject.key, [])
        found += [f"{plugin.dirs.node}: {p}" for p in plugin.stop()]
        found += [f"{plugin.dirs.node}: {line}" for line in plugin.log_errors()]

    def _requests(self) -> Counter[RequestKind]:
        return request_counts.parse(self.control_plane.metrics_text())

    def round(self, subject: Subject, number: int) -> Round:
        node = f"{subject.key}-r{number}"
        settings = self.settings
        plugin = self._plugin(subject, node, resync_seconds=None)
        before = self._requests()
        started = plugin.start()
        try:
            slice_writes = Requests.between(before, self._requests()).writes_to("resourceslices")
            progress(
                self.started,
                f"{node}: GetInfo {started.getinfo_seconds:.2f}s, slices {started.slices_seconds:.2f}s",
            )
            self.objects.create_namespace(node)
            maker = ClaimMaker(self.objects, subject, node=node, namespace=node)
            client = plugin.client
            warm_up(client, maker)
            single, cpu = single_cycles(client, maker, settings.cycles, pid=plugin.pid)
            rss_after = rss_mib(plugin.pid)
            progress(self.started, f"{node}: {settings.cycles} cycles")
            batch = batched(client, maker, settings.batches)
            rate = throughput(
                client, maker, max(1, settings.cycles // GPUS), seconds=settings.throughput_seconds
            )
            progress(self.started, f"{node}: batches, throughput {rate:.1f} claims/s")
            mig = mps = None
            if isinstance(subject, Gpudra):
                mig = repeated(
                    client,
                    lambda: maker.make(subject.mig_device, device_class=subject.mig_class),
                    settings.batches,
                )
                mps = repeated(
                    client, lambda: maker.make(Subject.gpu(1), config=MPS_CONFIG), settings.batches
                )
                progress(self.started, f"{node}: MIG and MPS cycles")
        finally:
            self._stop(plugin)
        self.objects.delete_claims(node)
        return Round(
            getinfo_seconds=started.getinfo_seconds,
            slices_seconds=started.slices_seconds,
            slices=started.slices,
            devices=started.devices,
            slice_writes=slice_writes,
            rss_after_start_mib=started.rss_mib,
            single=single,
            cpu=cpu,
            rss_after_cycles_mib=rss_after,
            batched=batch,
            claims_per_second=rate,
            mig=mig,
            mps=mps,
        )

    def idle(self, subject: Subject) -> Idle:
        """Requests over the idle window, the plugin alone (every other one stopped)."""
        resync = self.settings.idle_resync_seconds if isinstance(subject, Gpudra) else None
        plugin = self._plugin(subject, f"{subject.key}-idle", resync_seconds=resync)
        plugin.start()
        try:
            time.sleep(SETTLE_SECONDS)
            before = self._requests()
            time.sleep(self.settings.idle_seconds)
            after = self._requests()
            if not plugin.alive():
                raise BenchError(f"{subject.label} exited while idle\n{plugin.log_tail()}")
        finally:
            self._stop(plugin)
        requests = Requests.between(before, after)
        progress(self.started, f"{subject.key} idle: {requests.describe()}")
        return Idle(seconds=self.settings.idle_seconds, resync_seconds=resync, requests=requests)


def rotated(subjects: Sequence[Subject], by: int) -> list[Subject]:
    """The order of one round: each round starts one subject later, so none always goes first."""
    shift = by % len(subjects)
    return [*subjects[shift:], *subjects[:shift]]


def main(settings: Settings) -> int:
    started = time.monotonic()
    load_before = load_average()
    try:
        binary = peer_binary()
    except BenchError as err:
        print(f"bench: {err}", file=sys.stderr)
        return 1
    subjects: list[Subject] = [Gpudra(), Peer(binary, raised=False), Peer(binary, raised=True)]
    labels = {s.key: s.label for s in subjects}
    results = {s.key: SubjectResults() for s in subjects}
    workdir = settings.workdir or Path(tempfile.mkdtemp(prefix="gpudra-bench-"))
    problems: dict[str, list[str]] = {}
    try:
        with ControlPlane(workdir / "cluster") as control_plane:
            progress(started, f"control plane up at {control_plane.server}; work directory {workdir}")
            bench = Bench(settings, control_plane, workdir, started)
            try:
                for number in range(1, settings.rounds + 1):
                    for subject in rotated(subjects, number - 1):
                        results[subject.key].rounds.append(bench.round(subject, number))
                for subject in subjects:
                    results[subject.key].idle = bench.idle(subject)
            finally:
                bench.close()
                problems = bench.problems
    except BenchError as err:
        print(f"bench failed: {err}\nlogs and state are in {workdir}", file=sys.stderr)
        return 1
    run = report.Run(
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=machine(),
        load_before=load_before,
        load_after=load_average(),
        minutes=(time.monotonic() - started) / 60,
        cycles=settings.cycles,
        rounds=settings.rounds,
        batches=settings.batches,
        throughput_seconds=settings.throughput_seconds,
        idle_seconds=settings.idle_seconds,
        idle_resync_seconds=settings.idle_resync_seconds,
        idle_settle_seconds=SETTLE_SECONDS,
        peer=PEER_DESCRIPTION,
    )
    text = report.figures(results, labels, run, explain=explain_over_1000_nodes(), problems=problems)
    print(text)
    report.plot(results, labels, run, settings.plot)
    report.write_report(
        settings.report,
        f"{text}\n{report.image_link(settings.report, settings.plot)}\n\n{report.method(run)}",
    )
    print(f"wrote {settings.report} and {settings.plot}", file=sys.stderr)
    if any(problems.values()):
        print(f"plugin logs and state are in {workdir}", file=sys.stderr)
    elif settings.workdir is None:
        shutil.rmtree(workdir)
    return 0
