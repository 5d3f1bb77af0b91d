"""The shared HTTP client plumbing against a real local HTTP/1.1 server that closes a connection
without answering, as a server does with an idle keep-alive connection it times out just as a
request is on its way."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from magic.runtime import httpclient


@pytest.fixture
def server():
    state = {"drop": {}, "seen": []}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _handle(self):
            length = int(self.headers.get("content-length", 0))
            self.rfile.read(length)
            state["seen"].append((self.command, self.path))
            key = (self.command, self.path.split("?")[0])
            if state["drop"].get(key, 0) > 0:
                state["drop"][key] -= 1
                self.close_connection = True  # no answer: the client sees the connection closed
                return
            body = json.dumps({"runs": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _handle  # noqa: N815

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield state
    httpd.shutdown()
    httpd.server_close()


def test_an_idempotent_call_is_sent_again_once(server):
    server["drop"] = {("GET", "/x"): 1}
    with httpx.Client(base_url=server["url"], limits=httpclient.LIMITS) as client:
        assert httpclient.send(client, "GET", "/x", idempotent=True).status_code == 200
    assert server["seen"] == [("GET", "/x"), ("GET", "/x")]


def test_a_call_that_is_not_idempotent_is_not(server):
    server["drop"] = {("POST", "/x"): 1}
    with httpx.Client(base_url=server["url"]) as client, pytest.raises(httpx.RemoteProtocolError):
        httpclient.send(client, "POST", "/x", idempotent=False, json={})
    assert server["seen"] == [("POST", "/x")]


def test_a_second_failure_is_the_callers(server):
    server["drop"] = {("GET", "/x"): 2}
    with httpx.Client(base_url=server["url"]) as client, pytest.raises(httpx.RemoteProtocolError):
        httpclient.send(client, "GET", "/x", idempotent=True)
    assert len(server["seen"]) == 2


def test_the_controller_client_retries_reads_but_not_writes(server, monkeypatch):
    from magic.controller.client import ClientError, ControllerClient

    monkeypatch.delenv("MAGIC_API_TOKEN", raising=False)
    server["drop"] = {("GET", "/v1/runs"): 1, ("POST", "/v1/runs/r/pause"): 1}
    with ControllerClient(server["url"]) as client:
        assert client.get("/v1/runs") == {"runs": []}
        with pytest.raises(ClientError, match="request to the controller .* failed"):
            client.post("/v1/runs/r/pause")
    assert [m for m, p in server["seen"]].count("POST") == 1
