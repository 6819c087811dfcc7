"""A loopback HTTP proxy that adds a bearer token to each GET and passes it to a controller's HTTPS port:
a browser sends no token of its own, and the controller's GPU map answers none without one. I/O: one
listening socket on 127.0.0.1 and a connection upstream per request. For the demo's screenshot and the
map's browser tests; people use `gpudra status --web` instead (docs/gpu-map.md)."""

from __future__ import annotations

import http.server
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_INSECURE = ssl.create_default_context()
_INSECURE.check_hostname = False
_INSECURE.verify_mode = ssl.CERT_NONE  # the throwaway cluster's controller; its CA is checked elsewhere


@contextmanager
def token_proxy(upstream: str, token: str) -> Iterator[str]:
    """http://127.0.0.1:PORT, forwarding to `upstream` (https://HOST:PORT) with `token`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            request = urllib.request.Request(
                upstream + self.path, headers={"Authorization": f"Bearer {token}"}
            )
            try:
                with urllib.request.urlopen(request, timeout=30, context=_INSECURE) as response:
                    status, headers, body = response.status, response.headers, response.read()
            except urllib.error.HTTPError as err:
                status, headers, body = err.code, err.headers, err.read()
            self.send_response(status)
            for name in ("Content-Type", "Content-Security-Policy", "Cache-Control"):
                if headers.get(name):
                    self.send_header(name, headers[name])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
