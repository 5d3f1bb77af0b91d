"""vLLM's series on the rollout worker's metrics port (`magic.rollout.vllm_metrics`): a real local
HTTP server plays vLLM's /metrics, the worker's real /metrics endpoint re-exports it."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from magic.observability.metrics import serve_http
from magic.rollout.vllm_metrics import VllmMetrics

EXPOSITION = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 3.0
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1234.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.9
# HELP http_requests_total Total number of requests by method, status and handler.
# TYPE http_requests_total counter
http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 7.0
"""


@pytest.fixture
def fake_vllm():
    state = {"status": 200, "body": EXPOSITION}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = state["body"].encode()
            self.send_response(state["status"] if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()
    server.server_close()


def scrape(collector: VllmMetrics) -> dict[str, float]:
    """The worker's /metrics (its real endpoint, over HTTP) as {sample with labels: value}."""
    registry = CollectorRegistry()
    registry.register(collector)
    server = serve_http(0, lambda: True, host="127.0.0.1", registry=registry)
    try:
        text = httpx.get(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=10).text
    finally:
        server.shutdown()
        server.server_close()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name + str(sorted(s.labels.items()))] = s.value
    return out


def test_vllm_series_are_passed_on_and_nothing_else_of_its_exposition(fake_vllm):
    url, _ = fake_vllm
    got = scrape(VllmMetrics(url))
    labels = "[('engine', '0'), ('model_name', 'm')]"
    assert got["vllm:num_requests_running" + labels] == 3.0
    assert got["vllm:generation_tokens_total" + labels] == 1234.0
    assert got["vllm:time_to_first_token_seconds_count" + labels] == 5.0
    assert got["vllm:time_to_first_token_seconds_bucket[('engine', '0'), ('le', '0.1'), ('model_name', 'm')]"] == 2.0
    assert got["magic_vllm_up[]"] == 1.0
    assert not [k for k in got if k.startswith(("python_gc", "process_", "http_requests"))], got  # the worker's own, or none


def test_a_server_that_does_not_answer_is_reported_down_with_no_stale_series(fake_vllm):
    url, state = fake_vllm
    state["status"] = 503
    got = scrape(VllmMetrics(url))
    assert got == {"magic_vllm_up[]": 0.0}
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as closed:
        port = closed.server_address[1]  # bound, then closed below: nothing listens there
    assert scrape(VllmMetrics(f"http://127.0.0.1:{port}", timeout=1)) == {"magic_vllm_up[]": 0.0}


def test_no_server_no_series():
    """A launched server between runs: neither its series nor a misleading `magic_vllm_up 0`."""
    assert scrape(VllmMetrics(None)) == {}
