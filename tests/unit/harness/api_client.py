"""The kubernetes client's side of `Kube`: the two calls of kubernetes.client.ApiClient that Kube makes,
and the response they return, so that the unit tests run Kube's own requests, decoding and counting."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

import urllib3

REPLY: dict[str, Any] = {
    "kind": "List",
    "minor": "34",
    "metadata": {"name": "x", "namespace": "ns", "uid": "u-1", "resourceVersion": "7"},
    "items": [],
    "spec": {},
}


class FakeResponse:
    """What `ApiClient.call_api` returns, and the urllib3 response under it (`response`: itself) that a
    WATCH streams from: `body` for a read; for a stream, `chunks` as they arrive, then a wait of up to
    `hold` seconds until shut down (a watch with nothing to say stays open, as the API server's does),
    then `end` raised (None: a clean end). Records whether it was closed and shut down."""

    def __init__(
        self,
        body: bytes = b"",
        *,
        status: int = 200,
        reason: str = "OK",
        chunks: list[bytes] | None = None,
        end: Exception | None = None,
        hold: float = 0.0,
    ) -> None:
        self.status, self.reason, self.body = status, reason, body
        self.chunks = chunks or []
        self.end = end
        self.hold = hold
        self.response = self  # what Kube.watch reads the stream from
        self.closed = False
        self._shut = threading.Event()

    @property
    def shut(self) -> bool:
        return self._shut.is_set()

    def read(self) -> bytes:
        return self.body

    def stream(self, amt: int | None = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self.chunks
        self._shut.wait(self.hold)
        if self.end is not None:
            raise self.end

    def close(self) -> None:
        self.closed = True

    def shutdown(self) -> None:
        self._shut.set()


class FakeApiClient:
    """The two calls of kubernetes.client.ApiClient that Kube makes; `sent` records what each asked
    (method, path, query). A WATCH takes the next chunks of `events` (by path; none left: a watch that
    stays open `hold` seconds with nothing to say); any other request answers the body of `objects`, else
    of `lists` (by path), else REPLY. Every answer has `status`; every call raises `error` when one is
    set, and fails as a refused connection does while `down`."""

    def __init__(self, status: int = 200, error: Exception | None = None) -> None:
        self.status = status
        self.error = error
        self.down = False
        self.sent: list[tuple[str, str, list[tuple[str, Any]]]] = []
        self.lists: dict[str, bytes] = {}
        self.events: dict[str, list[list[bytes]]] = {}
        self.objects: dict[str, bytes] = {}
        self.hold = 0.0

    def param_serialize(
        self, *, method: str, resource_path: str, query_params: Any, **_: Any
    ) -> tuple[Any, ...]:
        self.sent.append((method, resource_path, list(query_params)))
        return (method, resource_path, dict(query_params))

    def call_api(self, method: str, path: str, query: dict[str, Any], _request_timeout: Any) -> FakeResponse:
        if self.error is not None:
            raise self.error
        if self.down:
            raise urllib3.exceptions.ProtocolError("Connection refused")
        reason = HTTPStatus(self.status).phrase
        if query.get("watch") == "true":
            waiting = self.events.get(path) or []
            chunks = waiting.pop(0) if waiting else []
            return FakeResponse(status=self.status, reason=reason, chunks=chunks, hold=self.hold)
        body = self.objects.get(path, self.lists.get(path, json.dumps(REPLY).encode()))
        return FakeResponse(body, status=self.status, reason=reason)
