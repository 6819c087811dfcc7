"""Child processes of the local cluster and waiting on their readiness. I/O: processes, HTTP.

Each component runs in its own process group (so a component's own children die with it) with its
output in a log file. Readiness is polled, never slept on: a wait ends as soon as the component
answers, or fails with the tail of its log when it exits or the deadline passes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpudra.errors import ClusterError

_INSECURE = ssl.create_default_context()
_INSECURE.check_hostname = False
_INSECURE.verify_mode = ssl.CERT_NONE


@dataclass
class Component:
    """A running cluster component."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def spawn(name: str, argv: Sequence[str], *, log: Path, env: dict[str, str] | None = None) -> Component:
    """Start `argv` in a new session with stdout and stderr going to `log`."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    return Component(name=name, process=process, log=log)


def stop_groups(pgids: Sequence[int], *, timeout: float = 3.0) -> None:
    """SIGTERM every process group at once, then SIGKILL the groups still alive after `timeout`.

    The kubelets, controllers and fake runtimes exit within about two seconds; kube-apiserver drains
    for much longer and etcd waits for it, and their data is thrown away, so the grace stays short.
    """
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        alive = [pgid for pgid in pgids if group_alive(pgid)]
        for pgid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            alive = [pgid for pgid in alive if group_alive(pgid)]
            time.sleep(0.05)
        if not alive:
            return


def group_alive(pgid: int) -> bool:
    """True while any process of group `pgid` exists (zombies of our own children are reaped)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(-pgid, os.WNOHANG)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_processes() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every process on the machine that is not a zombie (gone ones are skipped)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if state != "Z":
            yield int(entry.name), argv


def http_get(url: str, *, token: str | None = None, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET `url` (TLS unverified: the local cluster's certificates are self-signed)."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=_INSECURE) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


def wait_until(component: Component, ready: Callable[[], bool], *, what: str, timeout: float = 90.0) -> None:
    """Poll `ready` until it returns True; fail early if the component exits."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        code = component.process.poll()
        if code is not None:
            raise ClusterError(f"{component.name} exited with {code} before {what}:\n{component.tail()}")
        try:
            if ready():
                return
        except (OSError, urllib.error.URLError, json.JSONDecodeError):
            pass
        if time.monotonic() > deadline:
            raise ClusterError(f"{component.name}: {what} not reached in {timeout:.0f}s:\n{component.tail()}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def http_ok(url: str, *, token: str | None = None) -> Callable[[], bool]:
    def check() -> bool:
        status, _ = http_get(url, token=token)
        return status == 200

    return check


def scrape(url: str, what: str) -> dict[str, float]:
    """Prometheus samples at `url`, `name{labels}` -> value."""
    status, body = http_get(url)
    if status != 200:
        raise ClusterError(f"metrics of {what}: HTTP {status}")
    samples = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def terminate(process: subprocess.Popen[bytes] | None, *, timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL after `timeout`: a graceful stop that cannot hang a test."""
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
