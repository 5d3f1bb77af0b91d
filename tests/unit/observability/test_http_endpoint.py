"""The services' small HTTP endpoint (/metrics, probes, POST routes): idle connections are closed."""

from __future__ import annotations

import socket
import time

from magic.observability.metrics import serve_http


def test_an_idle_connection_is_closed_after_the_idle_timeout():
    server = serve_http(0, lambda: True, host="127.0.0.1", idle_timeout_seconds=0.3)
    try:
        conns = [socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) for _ in range(5)]
        time.sleep(1.0)
        for c in conns:  # the server gave up on each: EOF (or a reset), no thread left waiting
            try:
                assert c.recv(1) == b""
            except ConnectionResetError:
                pass
            c.close()
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as c:  # and it still answers
            c.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
            assert c.recv(100).startswith(b"HTTP/1.0 200")
    finally:
        server.shutdown()


def test_livez_says_why_the_process_is_hung():
    import httpx

    why: list[str | None] = [None]
    server = serve_http(0, lambda: True, host="127.0.0.1", stalled=lambda: why[0])
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/livez"
        assert httpx.get(url).status_code == 200
        why[0] = "the main loop has made no progress for 700 s (limit 600 s)"
        resp = httpx.get(url)
        assert resp.status_code == 503 and resp.text == f"hung: {why[0]}\n"
        assert httpx.get(f"http://127.0.0.1:{server.server_address[1]}/readyz").status_code == 200  # readiness is another question
    finally:
        server.shutdown()
