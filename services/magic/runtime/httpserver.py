"""The small HTTP server of the worker services: fixed routes, from a daemon thread.

Two ports use it, each serving one kind of thing so that a NetworkPolicy can open one without the
other: the metrics port (GET /metrics, /livez, /readyz: `magic.observability.metrics.serve_http`)
the reward's score port (POST /v1/score: `magic.reward.api.serve_score`) and the code judge's port
(POST /v1/judge: `magic.codejudge.service`). A route is matched
on the path without its query; anything else is 404. A POST needs a Content-Length (411) of at
most `max_body_bytes` (413). A connection idle (or sending its request slower) than
`idle_timeout_seconds` is closed, so idle clients cannot pin threads. Requests are not logged
(probes every few seconds).
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

Reply = tuple[int, bytes, str]
"""(status, body, content type)."""
GetRoute = Callable[[], Reply]
PostRoute = Callable[[bytes, Mapping[str, str]], Reply]
"""(request body, request headers) -> reply."""


def authorize(header: str | None, token, endpoint: str) -> Reply | None:
    """None when `header` carries the bearer `token` (a pydantic `SecretStr`); else the refusal:
    403 when no token is set (an endpoint that runs submitted code never runs open), 401 otherwise.

    >>> from pydantic import SecretStr
    >>> t = SecretStr("s" * 16)
    >>> authorize("Bearer " + "s" * 16, t, "x") is None, authorize(None, t, "x")[0], authorize("Bearer x", t, "x")[0], authorize("Bearer x", None, "x")[0]
    (True, 401, 401, 403)
    """
    if token is None:
        return error(403, f"{endpoint} is disabled: no MAGIC_API_TOKEN is set (it runs submitted code)")
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return error(401, "missing bearer token (Authorization: Bearer $MAGIC_API_TOKEN)")
    if not hmac.compare_digest(given.strip().encode(), token.get_secret_value().encode()):
        return error(401, "wrong bearer token")
    return None


def error(status: int, message: str) -> Reply:
    """A JSON error reply."""
    return status, json.dumps({"error": message}).encode(), "application/json"


def serve(
    port: int,
    name: str,
    get: Mapping[str, GetRoute] | None = None,
    post: Mapping[str, PostRoute] | None = None,
    host: str = "0.0.0.0",
    max_body_bytes: int = 64 * 1024 * 1024,
    idle_timeout_seconds: float = 30.0,
) -> ThreadingHTTPServer:
    """Serve `get` and `post` routes on `port` from a daemon thread named `name`; returns the
    server (its `server_address` has the real port when `port` is 0)."""
    gets, posts = dict(get or {}), dict(post or {})

    class Handler(BaseHTTPRequestHandler):
        timeout = idle_timeout_seconds  # socket timeout of each connection (StreamRequestHandler)

        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            route = gets.get(self.path.split("?", 1)[0])
            self._reply(*(route() if route else (404, b"not found\n", "text/plain")))

        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            route = posts.get(self.path.split("?", 1)[0])
            if route is None:
                return self._reply(404, b"not found\n", "text/plain")
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                return self._reply(411, b"a Content-Length header is required\n", "text/plain")
            if int(length) > max_body_bytes:
                self.close_connection = True
                return self._reply(413, f"request body over {max_body_bytes} bytes\n".encode(), "text/plain")
            self._reply(*route(self.rfile.read(int(length)), self.headers))

        def _reply(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    log.info("%s on http://%s:%d (%s)", name, host, server.server_address[1], ", ".join([*(f"GET {p}" for p in gets), *(f"POST {p}" for p in posts)]))
    return server
