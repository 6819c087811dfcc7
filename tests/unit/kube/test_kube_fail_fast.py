"""`gpudra.kube.client` against a hung API server, over a real socket: one call costs one timeout.

The server accepts connections and never answers, as a SIGSTOPped kube-apiserver does (the kernel still
completes the handshake). urllib3 left to its defaults tries each call four times, so a claim's GET
held its caller four read timeouts; `connect` turns its retries off.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from gpudra.errors import ClusterError
from gpudra.kube.client import NO_RETRIES, Kube, connect

READ_TIMEOUT = 0.5


@contextlib.contextmanager
def silent_server() -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback server that accepts every connection and never sends a byte; yields its port and the
    connections it accepted (held open until the end)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1]), accepted
    finally:
        stop.set()
        thread.join(timeout=5)
        for connection in accepted:
            connection.close()
        listener.close()


@contextlib.contextmanager
def full_backlog() -> Iterator[int]:
    """A loopback listener that never accepts, its backlog filled: a new connection is never
    completed (what clients meet once a stopped API server's queue is full); yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.1)
    try:
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def kubeconfig(directory: Path, port: int) -> str:
    path = directory / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: hung\n"
        f"clusters: [{{name: hung, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: hung, context: {cluster: hung, user: u}}]\n"
    )
    return str(path)


def test_connect_configures_no_retries(tmp_path: Path) -> None:
    api = connect(kubeconfig(tmp_path, 1))
    assert api.configuration.retries is NO_RETRIES
    assert api.rest_client.pool_manager.connection_pool_kw["retries"] is NO_RETRIES
    assert NO_RETRIES.total == 0 and not NO_RETRIES.raise_on_redirect


@pytest.mark.parametrize("call", ["get", "post"])
def test_a_call_to_a_hung_api_server_fails_after_one_read_timeout_on_one_connection(
    tmp_path: Path, call: str
) -> None:
    with silent_server() as (port, accepted):
        kube = Kube(connect(kubeconfig(tmp_path, port)), timeout=(1.0, READ_TIMEOUT))
        started = time.monotonic()
        with pytest.raises(ClusterError) as caught:
            if call == "get":
                kube.get_claim("team-a", "claim-1")
            else:
                kube.create_slice({"metadata": {"name": "s"}})
        took = time.monotonic() - started
    # urllib3 re-raises a POST's read error itself: it would never retry one
    assert "timed out (" in str(caught.value) and "ReadTimeoutError" in str(caught.value)
    assert len(accepted) == 1  # sent once: no retry (urllib3's default retries on new connections)
    assert took >= READ_TIMEOUT


def test_a_connection_the_api_server_never_completes_fails_after_one_connect_timeout(tmp_path: Path) -> None:
    with full_backlog() as port:
        kube = Kube(connect(kubeconfig(tmp_path, port)), timeout=(READ_TIMEOUT, 5.0))
        started = time.monotonic()
        with pytest.raises(ClusterError, match=r"timed out \(MaxRetryError > ConnectTimeoutError"):
            kube.get_claim("team-a", "claim-1")
        took = time.monotonic() - started
    # One connect timeout; urllib3's default would try 4 times, 4 timeouts (2 s): the time is the only
    # witness here, since the server never accepts.
    assert READ_TIMEOUT <= took < 3 * READ_TIMEOUT


def test_the_timeout_would_be_four_times_longer_with_urllib3_s_default_retries(tmp_path: Path) -> None:
    """What the fix is against: the same GET with the client's own default (urllib3 Retry.DEFAULT)."""
    with silent_server() as (port, accepted):
        api = connect(kubeconfig(tmp_path, port))
        api.rest_client.pool_manager.connection_pool_kw["retries"] = urllib3.Retry.DEFAULT
        kube = Kube(api, timeout=(1.0, READ_TIMEOUT))
        started = time.monotonic()
        with pytest.raises(ClusterError):
            kube.get_claim("team-a", "claim-1")
        took = time.monotonic() - started
    assert len(accepted) == 4
    assert took >= 4 * READ_TIMEOUT
