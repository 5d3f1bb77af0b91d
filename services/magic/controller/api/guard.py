"""What the API checks before FastAPI reads a request body: its size, then the bearer token.

FastAPI parses a route's body before it resolves the route's dependencies, so a token check as a
dependency alone would let an unauthenticated client make the controller read and parse any
body. This ASGI middleware answers first: 401 for a mutating request without the right token
(and for a GET of the API under /v1 when `read_requires_token` is set: runs and datasets show
model and dataset paths), 413 for a body over `max_body_bytes` (by Content-Length, or counted
while reading a chunked body). The body is read here, bounded, and replayed to the app.
"""

from __future__ import annotations

import hmac
import json

from pydantic import SecretStr

MUTATING = {b"POST", b"PUT", b"PATCH", b"DELETE"}
READING = {b"GET", b"HEAD"}
API_PREFIX = "/v1/"
"""Reads under this prefix need the token with `read_requires_token`; the probes, /metrics and
the API docs stay open."""


def token_problem(authorization: str | None, token: SecretStr | None) -> tuple[str, str] | None:
    """None if `authorization` (the header's value) carries `token` (or no token is configured),
    else (detail, WWW-Authenticate value) of the 401."""
    if token is None:
        return None
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return "missing bearer token (Authorization: Bearer $MAGIC_API_TOKEN)", "Bearer"
    if not hmac.compare_digest(given.strip().encode(), token.get_secret_value().encode()):
        return "wrong bearer token", 'Bearer error="invalid_token"'
    return None


class RequestGuard:
    """ASGI middleware: token and body size checked before the app sees a request."""

    def __init__(self, app, token: SecretStr | None, max_body_bytes: int, read_requires_token: bool = False):
        self.app = app
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.read_requires_token = read_requires_token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method = scope["method"].encode()
        if method in READING and self.read_requires_token and (scope.get("path") or "").startswith(API_PREFIX):
            headers = dict(scope.get("headers") or [])
            problem = token_problem(headers.get(b"authorization", b"").decode("latin-1") or None, self.token)
            if problem is not None:
                return await _reply(send, 401, problem[0], [(b"www-authenticate", problem[1].encode())])
        if method not in MUTATING:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        problem = token_problem(headers.get(b"authorization", b"").decode("latin-1") or None, self.token)
        if problem is not None:
            return await _reply(send, 401, problem[0], [(b"www-authenticate", problem[1].encode())])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return await _reply(send, 413, f"request body over {self.max_body_bytes} bytes")
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                return await _reply(send, 413, f"request body over {self.max_body_bytes} bytes")
            if not message.get("more_body"):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        return await self.app(scope, replay, send)


async def _reply(send, status: int, detail: str, extra_headers: list[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), (b"connection", b"close"), *extra_headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
