"""The kubernetes client's side of `Kube`: the two calls of kubernetes.client.ApiClient that Kube makes,
and the response they return, so that the unit tests run Kube's own requests, decoding and counting."""

from __future__ import annotations

import json
from typing import Any

REPLY: dict[str, Any] = {
    "kind": "List",
    "minor": "34",
    "metadata": {"name": "x", "namespace": "ns", "uid": "u-1", "resourceVersion": "7"},
    "items": [],
    "spec": {},
}


class FakeResponse:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.reason, self.body = status, "Reason", body
        self.response = self  # what Kube.watch reads the stream from

    def read(self) -> bytes:
        return self.body

    def close(self) -> None:
        pass


class FakeApiClient:
    """The two calls of kubernetes.client.ApiClient that Kube makes; answers `status` with REPLY."""

    def __init__(self, status: int = 200, error: Exception | None = None) -> None:
        self.status = status
        self.error = error
        self.sent: list[tuple[str, str, list[tuple[str, Any]]]] = []

    def param_serialize(
        self, *, method: str, resource_path: str, query_params: Any, **_: Any
    ) -> tuple[Any, ...]:
        self.sent.append((method, resource_path, list(query_params)))
        return (method, resource_path)

    def call_api(self, *request: Any, _request_timeout: Any) -> FakeResponse:
        if self.error is not None:
            raise self.error
        return FakeResponse(self.status, json.dumps(REPLY).encode())
