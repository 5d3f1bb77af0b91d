"""HTTP client plumbing shared by the long-lived clients of uvicorn servers (the vLLM engine's
client of a vLLM server, the CLI's and `magic local`'s client of the controller)."""

from __future__ import annotations

import logging

import httpx

log = logging.getLogger(__name__)

KEEPALIVE_EXPIRY = 2.0
"""Seconds an idle connection stays in a client's pool: below the servers' own keep-alive
(uvicorn closes idle connections after 5 s by default: vLLM's `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, the
controller's uvicorn). With both at 5 s (httpx's default), a request sent on a connection idle
for about 5 s raced the server closing it — "Server disconnected without sending a response" —
and ended a vLLM demo run whose steps took 6 s."""

LIMITS = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY)


def send(client: httpx.Client, method: str, path: str, *, idempotent: bool, **kwargs) -> httpx.Response:
    """`client.request`, sent once more on a new connection if the server closed the connection
    without answering and the call is `idempotent` (a pooled connection the server had just
    closed: a proxy's keep-alive may be shorter than ours). Other errors are the caller's."""
    try:
        return client.request(method, path, **kwargs)
    except httpx.RemoteProtocolError as exc:
        if not idempotent:
            raise
        log.warning("%s %s: %s; sending it again on a new connection", method, path, exc)
        return client.request(method, path, **kwargs)
