"""Headless Chromium for the GPU map's tests, screenshot and benchmark: the DOM after the page's script ran
(`--dump-dom`), parsed into a small tree, and screenshots; over the DevTools protocol, the page's own
load time (`drawn_ms`) and its DOM and screenshot from one page load (`capture`). I/O: a Chromium
process per call.

Chromium comes from Debian (deploy/local/install-chromium.sh, idempotent, run on first use here so a
fresh CI machine gets it). `--virtual-time-budget` lets the page's fetch of its JSON and its drawing
finish before the DOM is dumped, and stops before the first 10-second refresh.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import re
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from tests.localcluster import binaries

BUDGET_MS = 5000
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@functools.cache
def chromium() -> str:
    script = binaries.repo_root() / "deploy" / "local" / "install-chromium.sh"
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def _run(*args: str, timeout: float) -> str:
    with tempfile.TemporaryDirectory(prefix="gpudra-chromium-", ignore_cleanup_errors=True) as profile:
        done = subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",  # root in CI; the page is our own, on loopback
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                f"--user-data-dir={profile}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"chromium {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def dump_dom(url: str, *, budget_ms: int = BUDGET_MS, timeout: float = 120) -> Element:
    """The page's DOM once its scripts ran (for `budget_ms` of virtual time)."""
    return parse(_run(f"--virtual-time-budget={budget_ms}", "--dump-dom", url, timeout=timeout))


def screenshot(url: str, path: Path, *, width: int = 1400, height: int = 1000, timeout: float = 120) -> None:
    _run(
        f"--virtual-time-budget={BUDGET_MS}",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
        f"--screenshot={path}",
        url,
        timeout=timeout,
    )


def drawn_ms(url: str, *, timeout: float = 120) -> float:
    """Milliseconds from navigating to `url` until the GPU map page first drew its JSON (the page's
    `data-drawn-ms`, its own performance.now()), in real time over the DevTools protocol."""
    with _devtools(timeout) as call:
        call("Page.navigate", url=url)
        return float(
            _wait_for(call, "document.body ? document.body.dataset.drawnMs || '' : ''", url, timeout)
        )


# The GPU map page has drawn its JSON and asked for every reason it shows (or says it cannot load).
_SETTLED = (
    "document.body && (document.body.dataset.explained || "
    "(document.getElementById('error') && !document.getElementById('error').hidden)) ? 'yes' : ''"
)


def capture(
    url: str, *, screenshot: Path | None = None, width: int = 1400, height: int = 1000, timeout: float = 120
) -> Element:
    """The GPU map page's DOM once it drew its JSON and the reasons of the pending claims it shows, and,
    from the same page load, a PNG screenshot of `width` x `height` saved at `screenshot`."""
    with _devtools(timeout, f"--window-size={width},{height}", "--hide-scrollbars") as call:
        call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        call("Page.navigate", url=url)
        _wait_for(call, _SETTLED, url, timeout)
        html = call("Runtime.evaluate", expression="document.documentElement.outerHTML", returnByValue=True)
        if screenshot is not None:
            shot = call("Page.captureScreenshot", format="png")
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        return parse(str(html["result"]["value"]))


def _wait_for(call: Callable[..., Any], expression: str, url: str, timeout: float) -> str:
    """Until `expression` is truthy in the page (polled): its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = call("Runtime.evaluate", expression=expression, returnByValue=True)
        value = found.get("result", {}).get("value", "")
        if value:
            return str(value)
        time.sleep(0.02)
    raise RuntimeError(f"{url} did not draw in {timeout:.0f} s")


@contextlib.contextmanager
def _devtools(timeout: float, *flags: str) -> Iterator[Callable[..., Any]]:
    """Headless Chromium on about:blank, driven over the DevTools protocol: `call(method, **params)`
    sends one command to its page and returns its result."""
    # websocket-client comes with the kubernetes client (its watch over websockets).
    import websocket  # noqa: PLC0415 (only the benchmark and the screenshot speak the DevTools protocol)

    # Chromium's helper processes may still write to the profile as it is removed.
    with tempfile.TemporaryDirectory(prefix="gpudra-chromium-", ignore_cleanup_errors=True) as profile:
        process = subprocess.Popen(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                *flags,
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stderr is not None
            port = _devtools_port(process.stderr.readline, timeout)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as reply:
                page = next(t for t in json.loads(reply.read()) if t["type"] == "page")
            socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout)
            try:
                ids = iter(range(1, 1_000_000))

                def call(method: str, **params: Any) -> Any:
                    number = next(ids)
                    socket.send(json.dumps({"id": number, "method": method, "params": params}))
                    while True:
                        answer = json.loads(socket.recv())
                        if answer.get("id") == number:
                            if "error" in answer:
                                raise RuntimeError(f"chromium {method}: {answer['error']}")
                            return answer.get("result", {})

                yield call
            finally:
                socket.close()
        finally:
            process.terminate()
            process.wait(timeout=30)
            if process.stderr is not None:
                process.stderr.close()


def _devtools_port(readline: Callable[[], str], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = readline()
        found = re.search(r"DevTools listening on ws://[^:]+:([0-9]+)/", line)
        if found:
            return int(found.group(1))
        if not line:
            break
    raise RuntimeError("chromium did not say where DevTools listens")


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    def walk(self) -> Iterator[Element]:
        yield self
        for child in self.children:
            if isinstance(child, Element):
                yield from child.walk()

    def find_all(self, match: Callable[[Element], bool]) -> list[Element]:
        return [e for e in self.walk() if match(e)]

    def by_class(self, name: str) -> list[Element]:
        return self.find_all(lambda e: name in e.attrs.get("class", "").split())

    def by_id(self, name: str) -> Element:
        return next(e for e in self.walk() if e.attrs.get("id") == name)


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(html: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root
