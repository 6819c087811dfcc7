"""service: the one retry policy for background loops, and start/stop order of a daemon's services."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest

from gpudra.errors import ClusterError
from gpudra.runtime.service import Loop, running


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_a_loop_survives_any_exception_with_backoff_and_resets_after_success(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures: list[BaseException] = [
        ClusterError("listing: connection refused"),
        RuntimeError("a bug"),
        RecursionError("deep"),
    ]
    times: list[float] = []
    errors: list[BaseException] = []

    def step() -> float:
        times.append(time.monotonic())
        if failures:
            raise failures.pop(0)
        return 0.01

    loop = Loop("test", step, min_backoff=0.05, max_backoff=0.15, on_error=errors.append)
    with caplog.at_level(logging.WARNING, logger="gpudra.runtime.service"):
        loop.start()
        wait_for(lambda: len(times) >= 6)
        loop.stop(2)
    assert not loop.alive
    assert loop.failures == 3
    assert loop.last_error is None  # the last step succeeded
    assert [type(e) for e in errors] == [ClusterError, RuntimeError, RecursionError]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # the backoff doubles from 0.05 and is capped at 0.15 (lower bounds only: a loaded machine is slow)
    assert gaps[0] >= 0.045 and gaps[1] >= 0.095 and gaps[2] >= 0.145
    assert gaps[3] < gaps[2]  # after a success the step's own wait (0.01) applies, not the backoff
    records = [r for r in caplog.records if r.name == "gpudra.runtime.service"]
    # a gpudra error is an expected answer; anything else is a bug and gets its traceback
    assert [r.exc_info is not None for r in records] == [False, True, True]


def test_the_last_success_is_the_time_the_last_good_step_ended_and_a_failure_keeps_it() -> None:
    outcomes: list[Exception | None] = [None, ClusterError("listing: connection refused")]
    calls: list[float] = []

    def step() -> float:
        calls.append(time.time())
        outcome = outcomes.pop(0) if outcomes else None
        if outcome is not None:
            raise outcome
        return 0.01 if outcomes else 60.0

    loop = Loop("test", step, min_backoff=0.01)
    assert loop.last_success is None
    loop.start()
    wait_for(lambda: len(calls) == 3)
    wait_for(lambda: loop.last_success is not None and loop.last_success >= calls[2])
    loop.stop(2)
    assert loop.failures == 1 and loop.last_error is None
    assert loop.last_success is not None and calls[2] <= loop.last_success <= time.time()


def test_a_failure_the_step_handled_itself_counts_and_keeps_the_steps_wait() -> None:
    """The leader election catches its Lease errors to keep its own pace, and reports them."""
    errors: list[BaseException] = []
    times: list[float] = []
    loop: Loop

    def step() -> float:
        times.append(time.monotonic())
        if len(times) <= 2:
            loop.step_failed(ClusterError("reading Lease: timed out"))
        return 0.01 if len(times) == 1 else 60  # the step's own wait, not the backoff (10 s)

    loop = Loop("test", step, min_backoff=10, max_backoff=10, on_error=errors.append)
    loop.start()
    wait_for(lambda: loop.failures == 2)
    assert times[1] - times[0] < 5
    assert loop.last_error == "reading Lease: timed out" and loop.last_success is None and len(errors) == 2
    loop.wake()
    wait_for(lambda: loop.last_success is not None)
    loop.stop(2)
    assert loop.failures == 2 and loop.last_error is None


def test_wake_ends_a_wait_and_stop_ends_the_thread_at_once() -> None:
    calls: list[float] = []

    def step() -> float:
        calls.append(time.monotonic())
        return 60.0

    loop = Loop("test", step)
    loop.start()
    wait_for(lambda: len(calls) == 1)
    loop.wake()
    wait_for(lambda: len(calls) == 2)
    # The step asked for a 60 s wait: a stop that did not end it would leave the thread alive after
    # stop's own 20 s join.
    loop.stop(20)
    assert not loop.alive


def test_a_wake_during_a_step_is_not_lost() -> None:
    in_step, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def step() -> float:
        calls.append(1)
        if len(calls) == 1:
            in_step.set()
            release.wait(2)
        return 60.0

    loop = Loop("test", step)
    loop.start()
    assert in_step.wait(2)
    loop.wake()
    release.set()
    wait_for(lambda: len(calls) == 2, timeout=2)
    loop.stop(2)


def test_a_failing_error_hook_does_not_kill_the_loop() -> None:
    calls: list[int] = []

    def step() -> float:
        calls.append(1)
        if len(calls) == 1:
            raise ClusterError("down")
        return 0.01

    def hook(err: BaseException) -> None:
        raise KeyError("hook bug")

    loop = Loop("test", step, min_backoff=0.01, on_error=hook)
    loop.start()
    wait_for(lambda: len(calls) >= 3)
    loop.stop(2)
    assert loop.failures == 1


def test_stop_before_start_and_twice_is_fine() -> None:
    loop = Loop("test", lambda: 1.0)
    loop.stop(1)
    loop.stop(1)


class Recorder:
    def __init__(self, name: str, log: list[str], *, fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail

    def start(self) -> None:
        if self.fail:
            raise ClusterError(f"{self.name} cannot start")
        self.log.append(f"start {self.name}")

    def stop(self, timeout: float) -> None:
        self.log.append(f"stop {self.name} {timeout}")


def test_running_stops_in_reverse_order() -> None:
    log: list[str] = []
    with running([Recorder("a", log), Recorder("b", log)], stop_timeout=3):
        log.append("run")
    assert log == ["start a", "start b", "run", "stop b 3", "stop a 3"]


def test_a_failed_start_stops_what_already_started() -> None:
    log: list[str] = []
    services = [Recorder("a", log), Recorder("b", log), Recorder("c", log, fail=True), Recorder("d", log)]
    with pytest.raises(ClusterError, match="c cannot start"), running(services, stop_timeout=1):
        log.append("run")
    assert log == ["start a", "start b", "stop b 1", "stop a 1"]
