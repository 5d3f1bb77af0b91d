"""A real local HTTP server that answers like a vLLM 0.33.0 OpenAI server (recorded shapes).

The shapes follow vLLM 0.33.0's own definitions:
* `CompletionResponse`, `CompletionResponseChoice`, `CompletionLogProbs` and `UsageInfo` —
  vllm/entrypoints/openai/completion/protocol.py and vllm/entrypoints/serve/engine/protocol.py;
  `WeightVersionSpan` — vllm/outputs.py; the choice fields are filled as in
  `request_output_to_completion_response` (vllm/entrypoints/openai/completion/serving.py):
  `token_ids` only with return_token_ids, `weight_versions` only with return_weight_versions,
  token logprobs clamped at -9999.0, top_logprobs holding the sampled token when logprobs=0.
* the RL routes' answers — vllm/entrypoints/rl/online/api_router.py (`{"status": "paused"}`,
  `{"message": "Weights updated"}`, `{"success": true, "new_version": ...}`, `{"world_size": n}`),
  `/collective_rpc` — vllm/entrypoints/serve/dev/rpc/api_router.py (`{"results": [...]}`).

Sampling is scripted: each choice's tokens and logprobs come from `script` (a list per sample).
Every call is recorded in `calls` as (method, path, query, json body), and the client's port in
`ports`. Connections are kept alive (HTTP/1.1) as uvicorn keeps them; `drop` makes the server
close a connection without answering, as a server does with an idle connection it times out
while a request is on its way.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class FakeVllm:
    def __init__(self, logprobs_mode: str = "processed_logprobs", world_size: int = 2):
        self.calls: list[tuple[str, str, dict, dict | None]] = []
        self.weight_version: str | None = None
        self.logprobs_mode = logprobs_mode
        self.world_size = world_size
        self.script: list[tuple[list[int], list[float], str]] = [([5, 6, 2], [-0.5, -1.25, -0.01], "stop")]
        self.fail_completions = 0  # answer this many completion requests with HTTP 500
        self.delay = 0.0
        self.health = 200  # what GET /health answers (vLLM answers 503 once its engine core is dead)
        self.drop: dict[str, int] = {}  # path -> how many of its requests get the connection closed, unanswered
        self.ports: list[int] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, status: int, payload=None) -> None:
                body = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _record(self, body):
                url = urlparse(self.path)
                fake.calls.append((self.command, url.path, parse_qs(url.query), body))
                fake.ports.append(self.client_address[1])
                return url

            def _dropped(self, path: str) -> bool:
                if fake.drop.get(path, 0) <= 0:
                    return False
                fake.drop[path] -= 1
                self.close_connection = True
                return True

            def do_GET(self) -> None:  # noqa: N802
                url = self._record(None)
                if self._dropped(url.path):
                    return
                if url.path == "/version":
                    self._send(200, {"version": "0.33.0"})
                elif url.path == "/health":
                    self._send(fake.health)
                elif url.path == "/server_info":
                    self._send(200, {"vllm_config": {"model_config": {"logprobs_mode": fake.logprobs_mode}}, "vllm_env": {}, "system_env": {}})
                elif url.path == "/get_world_size":
                    self._send(200, {"world_size": fake.world_size})
                elif url.path == "/weight_info":
                    self._send(200, {"weight_version": fake.weight_version})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length)) if length else None
                url = self._record(body)
                if self._dropped(url.path):
                    return
                routes = {
                    "/pause": {"status": "paused"},
                    "/resume": {"status": "resumed"},
                    "/init_weight_transfer_engine": {"message": "Weight transfer initialized"},
                    "/start_weight_update": {"message": "Weight update started"},
                    "/update_weights": {"message": "Weights updated"},
                    "/abort_requests": {"status": "aborted", "aborted": len((body or {}).get("request_ids") or [])},
                }
                if url.path == "/v1/completions":
                    if fake.fail_completions > 0:
                        fake.fail_completions -= 1
                        self._send(500, {"error": {"message": "Internal server error", "type": "InternalServerError", "code": 500}})
                        return
                    time.sleep(fake.delay)
                    self._send(200, fake.completion(body))
                elif url.path == "/collective_rpc":
                    self._send(200, {"results": [None] * fake.world_size})
                elif url.path == "/update_weight_version":
                    fake.weight_version = body["new_version"]
                    self._send(200, {"success": True, "new_version": body["new_version"]})
                elif url.path == "/finish_weight_update":
                    fake.weight_version = (body or {}).get("weight_version", fake.weight_version)
                    self._send(200, {"message": "Weight update finished"})
                elif url.path in routes:
                    self._send(200, routes[url.path])
                else:
                    self._send(404, {"detail": "Not Found"})

            def log_message(self, fmt, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def completion(self, req: dict) -> dict:
        choices = []
        for i in range(req["n"]):
            tokens, logprobs, reason = self.script[i % len(self.script)]
            choice = {
                "index": i,
                "text": "".join(chr(97 + t % 26) for t in tokens[:-1] if reason == "stop") or "x",
                "logprobs": {
                    "text_offset": list(range(len(tokens))),
                    "token_logprobs": [max(lp, -9999.0) for lp in logprobs],
                    "tokens": [f"t{t}" for t in tokens],
                    "top_logprobs": [{f"t{t}": lp} for t, lp in zip(tokens, logprobs)],
                },
                "finish_reason": reason,
                "stop_reason": None,
                "token_ids": tokens if req.get("return_token_ids") else None,
                "prompt_logprobs": None,
                "prompt_token_ids": req["prompt"] if req.get("return_token_ids") else None,
                "routed_experts": None,
                "weight_versions": [{"version": self.weight_version, "start": 0, "end": len(tokens)}] if req.get("return_weight_versions") else None,
            }
            choices.append(choice)
        n_out = sum(len(c["logprobs"]["tokens"]) for c in choices)
        return {
            "id": f"cmpl-{req.get('request_id')}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": req.get("model") or "policy",
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {"prompt_tokens": len(req["prompt"]), "total_tokens": len(req["prompt"]) + n_out, "completion_tokens": n_out, "prompt_tokens_details": None, "completion_tokens_details": None},
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    def paths(self, method: str = "POST") -> list[str]:
        return [p for m, p, _, _ in self.calls if m == method]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
