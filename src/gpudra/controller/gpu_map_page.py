"""The GPU map page over HTTP: `/` (one HTML file, its CSS and script inline: no external assets, works
offline), `/gpu-map.json`, which the page reads every 10 seconds with its filters as query parameters
(`gpudra.scheduling.gpu_map.MapQuery`), and `/gpu-map-explain.json?claim=NAMESPACE/NAME`, explain's
reason for one pending claim, which the page asks for each pending claim it shows, one after another.
One explanation runs at a time (it walks every node): a request while one runs is answered 503 and the
page asks again at its next refresh, so no number of open pages can take more than one core. The
controller serves it on its status port, `gpudra status --web` on loopback. I/O: none of its own; a
WSGI application, and `SurveyCache`'s one rebuilding thread.

A survey walks every slice and claim (seconds at a thousand nodes with every MIG placement published).
`SurveyCache` keeps the last one and answers every request with it at once, marked with its age; when it
is out of date a rebuild starts in the background, one at a time, and later requests get the new one.
Only the first request, with no survey yet, waits for a build.

The page is read-only and draws only with `textContent` and attributes, since claim names and namespaces
are a tenant's. A Content-Security-Policy allows the page's own inline style and script by their hashes
and nothing else (no other script, no frames, requests only to its own origin), so markup smuggled into
a name could not run even if it were ever parsed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from gpudra.errors import GpudraError
from gpudra.scheduling.gpu_map import MAX_QUERY_VALUE, MapQuery, QueryError, Survey, draw, reason

log = logging.getLogger(__name__)

PAGE = resources.files("gpudra.controller").joinpath("gpu_map.html").read_bytes()
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


@dataclass(frozen=True)
class Served:
    """A survey as `SurveyCache` serves it: how old it is, whether a newer one is being built, and why
    the last rebuild failed (then the survey served is the one before)."""

    survey: Survey
    age_seconds: float = 0.0
    rebuilding: bool = False
    failed: str | None = None


def _in_thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="gpu-map-survey", daemon=True).start()


class SurveyCache:
    """The last survey `build` made, served at once. It is out of date once `version()` (e.g. the
    watches' change count) differs from what it was when its build began, or `max_age_seconds` passed
    since then (idle times grow with the clock); then the next request starts a rebuild with `start`
    (a daemon thread), one at a time, and is answered with the survey it has. Only a request that finds
    no survey at all waits for a build (callers arriving together share it), and a GpudraError from
    that build is theirs; a background rebuild's failure is logged and served as `Served.failed`, and
    the next request tries again."""

    def __init__(
        self,
        build: Callable[[], Survey],
        *,
        max_age_seconds: float,
        version: Callable[[], Hashable] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
        start: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.build = build
        self.max_age_seconds = max_age_seconds
        self.version = version
        self.monotonic = monotonic
        self.start = start or _in_thread
        self._lock = threading.Lock()
        self._first = threading.Lock()  # the first build: every caller without a survey waits for it
        self._idle = threading.Condition(self._lock)
        self._kept: tuple[Survey, Hashable, float] | None = None  # the survey, its version and start
        self._rebuilding = False
        self._failed: str | None = None

    def get(self) -> Served:
        with self._lock:
            kept = self._kept
            begin = kept is not None and not self._rebuilding and self._out_of_date(kept)
            self._rebuilding = self._rebuilding or begin
            rebuilding, failed = self._rebuilding, self._failed
        if kept is None:
            with self._first:  # callers arriving together: one builds, the others get its survey
                with self._lock:
                    kept = self._kept
                if kept is None:
                    kept = self._rebuild()
            return Served(kept[0], self.monotonic() - kept[2])
        if begin:
            try:
                self.start(self._in_background)
            except BaseException:
                with self._idle:
                    self._rebuilding = False
                    self._idle.notify_all()
                raise
        return Served(kept[0], self.monotonic() - kept[2], rebuilding, failed)

    def wait(self, timeout: float) -> bool:
        """Until no rebuild runs (for tests); whether none does."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._rebuilding, timeout)

    def _out_of_date(self, kept: tuple[Survey, Hashable, float]) -> bool:
        _, version, began = kept
        return self.version() != version or self.monotonic() - began >= self.max_age_seconds

    def _rebuild(self) -> tuple[Survey, Hashable, float]:
        version, began = self.version(), self.monotonic()
        kept = (self.build(), version, began)
        with self._lock:
            self._kept, self._failed = kept, None
        return kept

    def _in_background(self) -> None:
        try:
            self._rebuild()
        except Exception as err:  # the survey served stays; the next request tries again
            log.warning("rebuilding the GPU map's survey failed; serving the last one", exc_info=True)
            with self._lock:
                self._failed = str(err) if isinstance(err, GpudraError) else f"{type(err).__name__}: {err}"
        finally:
            with self._idle:
                self._rebuilding = False
                self._idle.notify_all()


class GpuMapPage:
    """The page and its JSON, drawn from the `survey` callable: a `SurveyCache`'s `get` in the
    controller and the CLI (a plain Survey is served as new). A GpudraError from it is answered 503 with
    its one line."""

    def __init__(self, survey: Callable[[], Survey | Served]) -> None:
        self.survey = survey
        self._explaining = threading.Lock()

    def _served(self) -> Served:
        found = self.survey()
        return found if isinstance(found, Served) else Served(found)

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
            query = MapQuery.parse(params)
            served = self._served()
            notes = [f"the map could not be brought up to date: {served.failed}"] if served.failed else []
            drawn = draw(
                served.survey,
                query,
                age_seconds=served.age_seconds,
                rebuilding=served.rebuilding,
                notes=notes,
            )
            body = drawn.model_dump_json(by_alias=True).encode()
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
            found = reason(self._served().survey, claim)
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
