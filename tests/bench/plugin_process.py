"""One start of one plugin on a fresh node: spawned, timed until it answers GetInfo and until its
slices are all visible, driven, stopped. I/O: a child process, its files, the API server.

Every start gets a node of its own (Node object, registry, plugin and CDI directories, state): nothing
from an earlier start is reused, so every start publishes its pool from scratch, as on a new node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from tests.bench import pool
from tests.bench.control_plane import RESOURCE, Objects
from tests.bench.errors import BenchError
from tests.bench.kubelet_client import DraClient, notify_registered, wait_for_info
from tests.bench.procfs import rss_mib
from tests.bench.subjects import Command, NodeDirs, Subject
from tests.localcluster.processes import stop_groups

START_TIMEOUT_SECONDS = 120.0
STOP_TIMEOUT_SECONDS = 15.0


@dataclass(frozen=True)
class Started:
    """Seconds from spawn until GetInfo answered and until the pool was complete; what it published."""

    getinfo_seconds: float
    slices_seconds: float
    slices: int
    devices: int
    rss_mib: float  # once both happened


class _SliceWatch(threading.Thread):
    """Watches one node's slices of one driver and notes when its pool is first complete (a watch, not
    polling: no LIST every few ms taking CPU from the plugin that is starting). Like a reflector, it
    LISTs first, before the plugin is spawned, and watches from that version: a slice created before
    the watch request reaches the API server is still an event, not a late part of its initial state."""

    def __init__(self, api: client.ApiClient, *, driver: str, node: str) -> None:
        super().__init__(name=f"slices-{node}", daemon=True)
        self.custom = client.CustomObjectsApi(api)
        self.selector = f"spec.driver={driver},spec.nodeName={node}"
        listed = self.custom.list_cluster_custom_object(
            *RESOURCE, "resourceslices", field_selector=self.selector
        )
        self.version = listed["metadata"]["resourceVersion"]
        self.seen: dict[str, dict[str, Any]] = {s["metadata"]["name"]: s for s in listed["items"]}
        self.completed_at: float | None = None
        self.slices: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        stream = watch.Watch()
        try:
            for event in stream.stream(
                self.custom.list_cluster_custom_object,
                *RESOURCE,
                "resourceslices",
                field_selector=self.selector,
                resource_version=self.version,
                timeout_seconds=int(START_TIMEOUT_SECONDS),
            ):
                found = event["object"]
                if event["type"] == "ERROR":
                    raise BenchError(f"watching slices ({self.selector}): {found}")
                name = found["metadata"]["name"]
                if event["type"] == "DELETED":
                    self.seen.pop(name, None)
                else:
                    self.seen[name] = found
                if pool.complete(list(self.seen.values())):
                    self.completed_at = time.perf_counter()
                    self.slices = pool.newest(list(self.seen.values()))
                    stream.stop()
        except BaseException as err:  # handed to the waiting thread
            self.error = err


class PluginRun:
    """A subject's plugin process on node `dirs.node`."""

    def __init__(
        self,
        subject: Subject,
        dirs: NodeDirs,
        *,
        objects: Objects,
        new_api: Callable[[], client.ApiClient],
        kubeconfig: Path,
        resync_seconds: float | None,
    ) -> None:
        self.subject = subject
        self.dirs = dirs
        self.objects = objects
        self.new_api = new_api
        self.kubeconfig = kubeconfig
        self.resync_seconds = resync_seconds
        self.process: subprocess.Popen[bytes] | None = None
        self.beside: subprocess.Popen[bytes] | None = None
        self._client: DraClient | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def client(self) -> DraClient:
        assert self._client is not None, "start() first"
        return self._client

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> Started:
        for path in (self.dirs.registry, self.dirs.plugins, self.dirs.cdi_root, self.dirs.state):
            path.mkdir(parents=True, exist_ok=True)
        self.objects.create_node(self.dirs.node)
        command = self.subject.command(
            self.dirs, kubeconfig=self.kubeconfig, resync_seconds=self.resync_seconds
        )
        watch_api = self.new_api()
        slices = _SliceWatch(watch_api, driver=self.subject.driver, node=self.dirs.node)
        slices.start()
        try:
            if command.beside is not None:
                self._start_beside(command)
            with self.dirs.log.open("ab") as log:
                spawned = time.perf_counter()
                self.process = subprocess.Popen(
                    command.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **command.env},
                    start_new_session=True,
                )
            socket = self.subject.registration_socket(self.dirs)
            info = wait_for_info(socket, deadline=time.monotonic() + START_TIMEOUT_SECONDS, alive=self.alive)
            answered = time.perf_counter()
            notify_registered(socket)
            self._client = DraClient(info.endpoint)
            slices.join(START_TIMEOUT_SECONDS)
            if slices.error is not None:
                raise BenchError(f"{self.subject.label}: {slices.error}\n{self.log_tail()}")
            if slices.completed_at is None:
                raise BenchError(f"{self.subject.label}: slices not all visible\n{self.log_tail()}")
            if not self.alive():
                raise BenchError(f"{self.subject.label} exited after starting\n{self.log_tail()}")
        except BaseException:
            self.stop()
            raise
        finally:
            watch_api.close()
        return Started(
            getinfo_seconds=answered - spawned,
            slices_seconds=slices.completed_at - spawned,
            slices=len(slices.slices),
            devices=pool.device_count(slices.slices),
            rss_mib=rss_mib(self.pid),
        )

    def _start_beside(self, command: Command) -> None:
        assert command.beside is not None and command.beside_ready is not None
        with self.dirs.log.open("ab") as log:
            self.beside = subprocess.Popen(
                command.beside,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **command.env},
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not command.beside_ready.exists():
            if self.beside.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"{self.subject.label}: {command.beside_ready} not ready\n{self.log_tail()}")
            time.sleep(0.01)

    def stop(self) -> list[str]:
        """SIGTERM, as the kubelet stops a plugin; its slices are then removed as a kubelet would. What
        went wrong on the way out is returned for the report."""
        problems = []
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.process is not None:
            if self.process.poll() is not None:
                problems.append(f"exited by itself with status {self.process.returncode}")
            else:
                self.process.send_signal(signal.SIGTERM)
                try:
                    code = self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
                    if code != 0:
                        problems.append(f"exited with status {code} on SIGTERM")
                except subprocess.TimeoutExpired:
                    problems.append(f"still running {STOP_TIMEOUT_SECONDS:.0f}s after SIGTERM; killed")
            stop_groups([self.process.pid])  # whatever it started and left behind goes too
            self.process.wait()
            self.process = None
        if self.beside is not None:
            stop_groups([self.beside.pid])
            self.beside.wait()
            self.beside = None
        self.objects.delete_slices(node=self.dirs.node)
        return problems

    def log_errors(self) -> list[str]:
        """The lines of its log that report errors."""
        if not self.dirs.log.exists():
            return []
        text = self.dirs.log.read_text(errors="replace")
        return [line for line in text.splitlines() if self.subject.error_line.search(line)]

    def log_tail(self, lines: int = 30) -> str:
        if not self.dirs.log.exists():
            return ""
        return "\n".join(self.dirs.log.read_text(errors="replace").splitlines()[-lines:])
