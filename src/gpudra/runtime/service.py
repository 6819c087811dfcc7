"""Background services: one shape, one failure policy, one way to start and stop them. I/O: threads.

Every long-running part of a daemon (the claim watch, the slice sync, the health probe, the gRPC
servers, the metrics listener) is a `Service`: `start()` returns once it runs, `stop(timeout)` returns
once it has stopped or the timeout passed. `running()` starts a list of services in order and stops
them in reverse; when one fails to start, the ones already started are stopped before the error
leaves, so a daemon never keeps half of itself alive.

`Loop` is the one retry policy for work that repeats: it calls `step()` in its own thread until
stopped. A step returns how long to wait before the next one. A step that raises is logged (a
`GpudraError` as a warning, anything else with its traceback, since it is a bug) and retried after a
backoff that doubles from `min_backoff` to `max_backoff` and resets after a success. The thread never
dies of an exception: a silent thread death is how a cache goes stale without anyone noticing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Protocol

from gpudra.errors import GpudraError

log = logging.getLogger(__name__)


class Service(Protocol):
    def start(self) -> None: ...

    def stop(self, timeout: float) -> None: ...


@contextmanager
def running(services: Sequence[Service], *, stop_timeout: float) -> Iterator[None]:
    """Start `services` in order; on exit (or when a start fails) stop the started ones in reverse."""
    with ExitStack() as stack:
        for service in services:
            service.start()
            stack.callback(service.stop, stop_timeout)
        yield


class Loop:
    """Calls `step()` in a thread named `name` until `stop()`; see the module docstring for errors.

    `step` returns the seconds to wait before the next call (0: at once). `wake()` ends a wait early.
    `on_error(err)` runs after each failed step (e.g. to forget cached facts or count the failure).
    `failures` counts failed steps since start; `last_error` is None after a successful step;
    `last_success` is the wall-clock time (`time.time()`) the last successful step ended, None before one.
    A step that handles an error itself, to keep its own pace, calls `step_failed(err)` so that the step
    counts as failed all the same (it logs the error itself; the wait is the one it returns).
    """

    def __init__(
        self,
        name: str,
        step: Callable[[], float],
        *,
        min_backoff: float = 0.5,
        max_backoff: float = 30.0,
        on_error: Callable[[BaseException], None] = lambda err: None,
    ) -> None:
        self.name = name
        self._step = step
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._on_error = on_error
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.failures = 0
        self.last_error: str | None = None
        self.last_success: float | None = None
        self._handled: BaseException | None = None  # what the current step reported by step_failed()

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def step_failed(self, err: BaseException) -> None:
        """Called by the step running now: it failed with `err`, which it handled (logged) itself."""
        self._handled = err

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("background loop did not stop in time", extra={"loop": self.name, "timeout": timeout})

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def ended(self) -> bool:
        """The thread ran and is gone without being asked to stop (it never should: see `_run`)."""
        return self._thread.ident is not None and not self._thread.is_alive() and not self.stopping.is_set()

    def _run(self) -> None:
        backoff = self._min_backoff
        while not self.stopping.is_set():
            self._wake.clear()  # a wake() during the step ends the wait that follows it
            self._handled = None
            try:
                wait = self._step()
            except Exception as err:
                self.failures += 1
                self.last_error = str(err) or type(err).__name__
                if isinstance(err, GpudraError):
                    log.warning(
                        "background step failed; retrying",
                        extra={"loop": self.name, "error": self.last_error, "retry_in": backoff},
                    )
                else:
                    log.exception(
                        "background step failed unexpectedly; retrying",
                        extra={"loop": self.name, "retry_in": backoff},
                    )
                self._call_on_error(err)
                wait, backoff = backoff, min(backoff * 2, self._max_backoff)
            else:
                if self._handled is not None:
                    self.failures += 1
                    self.last_error = str(self._handled) or type(self._handled).__name__
                    self._call_on_error(self._handled)
                else:
                    self.last_error = None
                    self.last_success = time.time()
                    backoff = self._min_backoff
            if wait > 0:
                self._wake.wait(wait)

    def _call_on_error(self, err: BaseException) -> None:
        try:
            self._on_error(err)
        except Exception:
            log.exception("error hook failed", extra={"loop": self.name})
