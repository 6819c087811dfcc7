"""The DRA calls as gpudra answers them, whatever the kubelet's API version: typed claims in, typed
answers out. gpudra.node.kubelet_grpc's adapters (one per DRA API version) turn the protobuf messages
into these and back; nothing here knows gRPC or protobuf. Pure but for threads.

One claim's failure is that claim's answer; the others in the same call proceed. The claims of one
call are prepared (and unprepared) concurrently: a pod with several claims waits for the slowest one,
not for their sum. DeviceState keeps claims that touch the same GPU apart.

A call that arrives before the plugin has loaded its device state (`serve()` hands it over) waits for
it while its deadline allows, up to STARTUP_WAIT_SECONDS; then each claim fails with "starting" and the
kubelet retries.

A hung API server holds up only the calls that need it. A claim prepared already is answered from the
checkpoint on the calling worker itself, and an unprepare needs no API server; a claim to prepare reads
its claim object, so a call with one takes a turn (`_Turns`) first: at most half of the workers run
such calls at once and a quarter more wait for a turn, and a call beyond both is refused at once (the
kubelet retries it). The other workers stay free for the calls that need no API server, however long
the API server hangs; a call that waits behind them is not held longer than its deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from gpudra.errors import ClusterError, ConfigError, GpudraError
from gpudra.node.allocation import ClaimRef

if TYPE_CHECKING:  # types only: the plugin opens its sockets before the rest of it loads
    from gpudra.node import checkpoint as ckpt

log = logging.getLogger(__name__)
A = TypeVar("A")

# How long a DRA call that arrives before serve() waits for it; the kubelet's own timeout is longer.
STARTUP_WAIT_SECONDS = 30.0


class PrepareBackend(Protocol):
    """What the service calls: gpudra.node.prepare.DeviceState. `prepared` answers a claim prepared
    already from the checkpoint, without the API server (None: `prepare_from_claim` must read the
    claim, and is asked only then, so that the checkpoint is not looked at twice before the read)."""

    def prepared(self, ref: ClaimRef) -> tuple[ckpt.PreparedDevice, ...] | None: ...

    def prepare_from_claim(self, ref: ClaimRef) -> tuple[ckpt.PreparedDevice, ...]: ...

    def unprepare(self, ref: ClaimRef) -> None: ...


@dataclass
class Observer:
    """Hooks for metrics: outcome per claim ('ok' or an error reason) and call durations."""

    prepared: Callable[[str, float], None] = lambda outcome, seconds: None
    unprepared: Callable[[str, float], None] = lambda outcome, seconds: None


@dataclass(frozen=True)
class Answer:
    """What one claim of a call gets: its devices, or why not (`error`, and no devices)."""

    devices: tuple[ckpt.PreparedDevice, ...] = ()
    error: str | None = None


class _NoTurn(ClusterError):
    """A call that needs the API server got no turn (`_Turns`)."""


class _Turns:
    """Turns for the calls that need the API server, so that however long it hangs they never hold
    every worker: at most `running` such calls at once and `waiting` more waiting for a turn; a call
    beyond both is refused at once, and a waiting call gives up at its deadline."""

    def __init__(self, *, running: int, waiting: int) -> None:
        self.running, self.waiting = running, waiting
        self._free = threading.Semaphore(running)
        self._lock = threading.Lock()
        self._waiters = 0

    @contextmanager
    def turn(self, patience: float) -> Iterator[None]:
        if not self._free.acquire(blocking=False):
            with self._lock:
                full = self._waiters >= self.waiting
                if not full:
                    self._waiters += 1
            if full:
                raise _NoTurn(self._busy("this call is refused rather than queued"))
            try:
                granted = self._free.acquire(timeout=patience)
            finally:
                with self._lock:
                    self._waiters -= 1
            if not granted:
                raise _NoTurn(self._busy(f"this call waited {patience:.1f} s for its turn"))
        try:
            yield
        finally:
            self._free.release()

    def _busy(self, outcome: str) -> str:
        return (
            f"the API server answers slowly: {self.running} calls are preparing claims it must read and "
            f"{self.waiting} more wait for their turn; {outcome} (the kubelet retries it)"
        )


class DraService:
    """NodePrepareResources and NodeUnprepareResources for `workers` calling threads: claims to
    prepare run in one pool (they read the API server), unprepares in another, so neither waits behind
    the other; the calls that need the API server take turns (`_Turns`). `remaining` is the call's
    deadline in seconds from now (None: none)."""

    def __init__(self, *, workers: int) -> None:
        self.ready = threading.Event()
        self._backend: PrepareBackend | None = None
        self.observer = Observer()
        self._claims = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="claim")
        self._api = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="claim-api")
        self._turns = _Turns(running=max(1, workers // 2), waiting=max(1, workers // 4))

    def serve(self, backend: PrepareBackend, observer: Observer | None = None) -> None:
        """Answer the calls from now on, those that are waiting included."""
        self._backend = backend
        self.observer = observer or Observer()
        self.ready.set()

    def prepare(self, claims: Iterable[ClaimRef], *, remaining: float | None) -> dict[str, Answer]:
        """Each distinct claim's answer, by UID."""
        refs = list(_distinct(claims))
        try:
            backend = self._wait(remaining)
        except GpudraError as err:
            return self._refused(refs, err, "prepare or unprepare")
        answers: dict[str, Answer] = {}
        # Claims prepared already are answered here, from the checkpoint: they never wait for a turn,
        # and so never behind claims that wait for the API server.
        pending: list[ClaimRef] = []
        for ref in refs:
            known = self._prepare(ref, backend.prepared)
            if known is None:
                pending.append(ref)
            else:
                answers[ref.uid] = known
        if pending:
            try:
                with self._turns.turn(_patience(remaining)):
                    done = self._run(
                        lambda ref: self._prepare(ref, backend.prepare_from_claim), pending, self._api
                    )
            except _NoTurn as err:
                answers.update(self._refused(pending, err, "prepare", observed=True))
            else:
                for ref, answer in zip(pending, done, strict=True):
                    if answer is not None:  # always: `prepare` answers every claim
                        answers[ref.uid] = answer
        return {ref.uid: answers[ref.uid] for ref in refs}

    def unprepare(self, claims: Iterable[ClaimRef], *, remaining: float | None) -> dict[str, Answer]:
        """Each distinct claim's answer (devices always empty), by UID."""
        refs = list(_distinct(claims))
        try:
            backend = self._wait(remaining)
        except GpudraError as err:
            return self._refused(refs, err, "prepare or unprepare")
        done = self._run(lambda ref: self._unprepare(ref, backend), refs, self._claims)
        return {ref.uid: answer for ref, answer in zip(refs, done, strict=True)}

    def shutdown(self) -> None:
        """Stop the claim pools; what they still run is not waited for."""
        for pool in (self._claims, self._api):
            pool.shutdown(wait=False, cancel_futures=True)

    def _wait(self, remaining: float | None) -> PrepareBackend:
        """The backend, waiting for it while the call's deadline and STARTUP_WAIT_SECONDS allow."""
        if not self.ready.wait(_patience(remaining)) or self._backend is None:
            raise GpudraError(
                "gpudra is starting: its device state is not loaded yet (the kubelet retries this claim)"
            )
        return self._backend

    def _prepare(
        self, ref: ClaimRef, lookup: Callable[[ClaimRef], tuple[ckpt.PreparedDevice, ...] | None]
    ) -> Answer | None:
        """`ref`'s answer from the backend's `prepare_from_claim`, or from its `prepared`: then only for
        a claim prepared already, answered from the checkpoint, and None (nothing done) for any other."""
        started, outcome = time.monotonic(), "ok"
        try:
            devices = lookup(ref)
            if devices is None:
                return None
            answer = Answer(devices=devices)
        except Exception as err:
            outcome = _error_reason(err)
            answer = Answer(error=_message(err))
            _log_failure("prepare", ref, err)
        self.observer.prepared(outcome, time.monotonic() - started)
        return answer

    def _unprepare(self, ref: ClaimRef, backend: PrepareBackend) -> Answer:
        started, outcome, answer = time.monotonic(), "ok", Answer()
        try:
            backend.unprepare(ref)
        except Exception as err:
            outcome = _error_reason(err)
            answer = Answer(error=_message(err))
            _log_failure("unprepare", ref, err)
        self.observer.unprepared(outcome, time.monotonic() - started)
        return answer

    def _refused(
        self, refs: Sequence[ClaimRef], err: GpudraError, action: str, *, observed: bool = False
    ) -> dict[str, Answer]:
        for ref in refs:
            _log_failure(action, ref, err)
            if observed:
                self.observer.prepared(_error_reason(err), 0.0)
        return {ref.uid: Answer(error=str(err)) for ref in refs}

    @staticmethod
    def _run(step: Callable[[ClaimRef], A], refs: Sequence[ClaimRef], pool: futures.Executor) -> list[A]:
        if len(refs) == 1:  # the usual call: no hand-over to another thread
            return [step(refs[0])]
        return [done.result() for done in [pool.submit(step, ref) for ref in refs]]


def _patience(remaining: float | None) -> float:
    """How long a call may wait before its work starts: while its deadline allows (less a second to
    answer in), and STARTUP_WAIT_SECONDS at most."""
    return STARTUP_WAIT_SECONDS if remaining is None else min(STARTUP_WAIT_SECONDS, max(remaining - 1, 0))


def _distinct(claims: Iterable[ClaimRef]) -> Iterator[ClaimRef]:
    """Each claim once: a claim named twice in one call is answered (and prepared) once."""
    seen: set[str] = set()
    for claim in claims:
        if claim.uid not in seen:
            seen.add(claim.uid)
            yield claim


def _error_reason(err: BaseException) -> str:
    return "config" if isinstance(err, ConfigError) else type(err).__name__


def _message(err: BaseException) -> str:
    return str(err) if isinstance(err, GpudraError) else f"internal error: {type(err).__name__}: {err}"


def _log_failure(action: str, ref: ClaimRef, err: BaseException) -> None:
    extra = {"claim": ref.uid, "claim_namespace": ref.namespace, "claim_name": ref.name, "error": str(err)}
    if isinstance(err, GpudraError):
        log.warning(f"{action} failed", extra=extra)
    else:
        log.exception(f"{action} failed unexpectedly", extra=extra)
