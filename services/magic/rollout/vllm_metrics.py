"""vLLM's own Prometheus series, served on the rollout worker's metrics port.

vLLM serves `/metrics` on the port of its OpenAI server, beside generation and — in the dev mode
the engine needs — the pause, `/collective_rpc` and weight-reload routes. So vLLM listens on
127.0.0.1 only (the chart's `--host=127.0.0.1`; `VllmServerConfig.host` locally), and the worker,
in the same pod, fetches vLLM's `/metrics` over localhost at each scrape of its own `/metrics`:
Prometheus reaches vLLM's figures through a port that serves nothing but metrics and probes.

Only the `vllm:` families are passed on (vLLM's process, Python and HTTP-handler series would
collide with the worker's own). `magic_vllm_up` says whether the last fetch worked: 1, or 0 when
vLLM did not answer within `timeout` (the series of that scrape are then missing, not stale).
"""

from __future__ import annotations

import logging

import httpx
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

PREFIX = "vllm:"
UP = "magic_vllm_up"


class VllmMetrics(Collector):
    """A collector that re-exports the `vllm:` series of the vLLM server at `url` (None: no server
    now, e.g. a locally launched one between runs: nothing is exported, not even `magic_vllm_up`)."""

    def __init__(self, url: str | None, timeout: float = 2.0):
        self.url = url
        self.timeout = timeout

    def describe(self):
        """Nothing up front: registering must not fetch from a server that may not be up yet."""
        return []

    def collect(self):
        url = self.url
        if url is None:
            return
        up = GaugeMetricFamily(UP, "1 if the rollout worker could read its vLLM server's /metrics at this scrape, else 0")
        try:
            resp = httpx.get(f"{url.rstrip('/')}/metrics", timeout=self.timeout)
            resp.raise_for_status()
            families = [f for f in text_string_to_metric_families(resp.text) if f.name.startswith(PREFIX)]
        except (httpx.HTTPError, ValueError) as exc:  # down, restarting, or an exposition we cannot parse
            log.debug("cannot read vLLM's metrics at %s: %s", url, exc)
            up.add_metric([], 0)
            yield up
            return
        yield from families
        up.add_metric([], 1)
        yield up
