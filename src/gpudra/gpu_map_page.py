"""The GPU map page over HTTP: `/` (one HTML file, its CSS and script inline: no external assets, works
offline), `/gpu-map.json`, which the page reads every 10 seconds with its filters as query parameters
(`gpudra.scheduling.gpu_map.MapQuery`), and `/gpu-map-explain.json?claim=NAMESPACE/NAME`, explain's
reason for one pending claim, which the page asks for each pending claim it shows, one after another.
One explanation runs at a time (it walks every node): a request while one runs is answered 503 and the
page asks again at its next refresh, so no number of open pages can take more than one core. The
controller serves it on its status port, `gpudra status --web` on loopback. I/O: none of its own; a
WSGI application.

The page is read-only and draws only with `textContent` and attributes, since claim names and namespaces
are a tenant's. A Content-Security-Policy allows the page's own inline style and script by their hashes
and nothing else (no other script, no frames, requests only to its own origin), so markup smuggled into
a name could not run even if it were ever parsed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from gpudra.errors import GpudraError
from gpudra.scheduling.gpu_map import MAX_QUERY_VALUE, MapQuery, QueryError, Survey, draw, reason

PAGE = resources.files("gpudra").joinpath("gpu_map.html").read_bytes()
PAGE_PATHS = ("/", "/index.html")
JSON_PATH = "/gpu-map.json"
EXPLAIN_PATH = "/gpu-map-explain.json"
PATHS = (*PAGE_PATHS, JSON_PATH, EXPLAIN_PATH)
# A query string longer than this is no filter a person typed.
MAX_QUERY_STRING = 2048


def _hashes(tag: str) -> str:
    found = re.findall(rf"<{tag}>(.*?)</{tag}>".encode(), PAGE, flags=re.DOTALL)
    return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(body).digest()).decode()}'" for body in found)


CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; script-src {_hashes('script')}; style-src {_hashes('style')}; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_COMMON = [("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff")]


class GpuMapPage:
    """The page and its JSON, drawn from the `survey` callable (a cached survey in the controller, the
    API server read with the caller's kubeconfig in the CLI). A GpudraError from it is answered 503
    with its one line."""

    def __init__(self, survey: Callable[[], Survey]) -> None:
        self.survey = survey
        self._explaining = threading.Lock()

    def app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _json(start_response, "405 Method Not Allowed", {"error": "the GPU map is read-only"})
        if path in PAGE_PATHS:
            start_response(
                "200 OK",
                [
                    ("Content-Type", "text/html; charset=utf-8"),
                    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
                    ("X-Frame-Options", "DENY"),
                    *_COMMON,
                ],
            )
            return [PAGE]
        if path not in (JSON_PATH, EXPLAIN_PATH):
            return _json(start_response, "404 Not Found", {"error": "no such page; the map is at /"})
        text = str(environ.get("QUERY_STRING", ""))
        try:
            if len(text) > MAX_QUERY_STRING:
                raise QueryError(f"the query string is {len(text)} characters; at most {MAX_QUERY_STRING}")
            params = parse_qs(text, keep_blank_values=True, max_num_fields=10)
            if path == EXPLAIN_PATH:
                return self._explain(start_response, _claim_param(params))
            body = draw(self.survey(), MapQuery.parse(params)).model_dump_json(by_alias=True).encode()
        except (QueryError, ValueError) as err:
            return _json(start_response, "400 Bad Request", {"error": str(err)})
        except GpudraError as err:
            return _json(start_response, "503 Service Unavailable", {"error": str(err)})
        start_response("200 OK", [("Content-Type", "application/json"), *_COMMON])
        return [body]

    def _explain(self, start_response: Callable[..., Any], claim: str) -> list[bytes]:
        if not self._explaining.acquire(blocking=False):
            busy = {"error": "explaining another claim; asked again at the next refresh"}
            return _json(start_response, "503 Service Unavailable", busy)
        try:
            found = reason(self.survey(), claim)
        finally:
            self._explaining.release()
        return _json(start_response, "200 OK", {"claim": claim, "reason": found})


def _claim_param(params: dict[str, list[str]]) -> str:
    if set(params) != {"claim"} or len(params["claim"]) != 1:
        raise QueryError("give one query parameter claim=NAMESPACE/NAME")
    claim = params["claim"][0]
    if len(claim) > 2 * MAX_QUERY_VALUE + 1 or "/" not in claim:
        raise QueryError("query parameter claim must be NAMESPACE/NAME")
    return claim


def _json(start_response: Callable[..., Any], status: str, document: dict[str, str]) -> list[bytes]:
    start_response(status, [("Content-Type", "application/json"), *_COMMON])
    return [json.dumps(document).encode()]
