"""The reward service's HTTP endpoint: score a batch on demand (evaluation, debugging).

Served on its own port, ``MAGIC_SCORE_PORT`` (unset: not served), apart from /metrics, /livez and
/readyz (``MAGIC_METRICS_PORT``): the metrics port can be opened to Prometheus without opening an
endpoint that runs submitted code. The score port answers nothing but ``POST /v1/score``::

    curl -s localhost:9500/v1/score -H "Authorization: Bearer $MAGIC_API_TOKEN" -H 'content-type: application/json' -d '{"samples": [
      {"data_source": "math", "response": "... \\\\boxed{42}", "ground_truth": "42"},
      {"data_source": "code", "response": "```python\\nprint(int(input())*2)\\n```",
       "ground_truth": "{\\"type\\": \\"stdin_stdout\\", \\"inputs\\": [\\"2\\"], \\"outputs\\": [\\"4\\"]}"}]}'

    {"scores": [{"kind": "math", "reward": 1.0, "correctness": 1.0, "verdict": "correct",
                 "penalties": {}, "details": "same text as the gold; answer='42'", "seconds": 0.001}, ...]}

Every request needs ``Authorization: Bearer $MAGIC_API_TOKEN``: without it 401; a service
with no token configured refuses every request with 403 (the endpoint runs submitted code, so
it never runs open). A request that is not JSON gets 400, one that does not match the schema
422 (with pydantic's errors), more than ``max_request_samples`` samples 413, and 503 until the
service is ready.
A sample that cannot be judged is still answered, with verdict ``error`` and the reason.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from http.server import ThreadingHTTPServer

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from magic.protocol.pb import messages_pb2 as pb
from magic.reward.scoring import Sample, Scorer
from magic.runtime import httpserver

log = logging.getLogger(__name__)

JSON = "application/json"
PATH = "/v1/score"


class SampleIn(BaseModel):
    """One response to score."""

    model_config = ConfigDict(extra="forbid")

    data_source: str = Field(default="math", max_length=256)
    """Selects the verifier (code sources per `RewardSettings.code_data_sources`, else math)."""
    response: str
    """The model's full response (reasoning included)."""
    ground_truth: str
    """``reward_model.ground_truth``: the gold answer, or a code problem's tests as JSON."""
    problem: str = ""
    """The problem statement; multiple-choice options are read from it."""
    response_tokens: int | None = Field(default=None, ge=0)
    """Length of the response in tokens (for the overlong penalty)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """The context length T it was sampled with (for the overlong penalty)."""


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    samples: list[SampleIn] = Field(min_length=1)
    """The responses to score, answered in the same order."""


def score_json(score: pb.Score, kind: str) -> dict:
    return {
        "kind": kind,
        "reward": round(score.reward, 6),
        "correctness": score.correctness,
        "verdict": pb.Verdict.Name(score.verdict).removeprefix("VERDICT_").lower(),
        "penalties": {k: round(v, 6) for k, v in score.penalties.items()},
        "details": score.details,
        "seconds": round(score.seconds, 6),
    }


class ScoreAPI:
    """POST /v1/score over a shared `Scorer`."""

    def __init__(self, scorer: Scorer, max_samples: int, token: SecretStr | None):
        self.scorer = scorer
        self.max_samples = max_samples
        self.token = token

    def handle(self, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes, str]:
        refused = authorize(headers.get("Authorization"), self.token)
        if refused:
            return refused
        if not self.scorer.ready():
            return _error(503, "the reward service is not ready yet")
        try:
            raw = json.loads(body)
        except (ValueError, RecursionError) as exc:
            return _error(400, f"the body is not JSON: {str(exc)[:200]}")
        if isinstance(raw, dict) and isinstance(raw.get("samples"), list) and len(raw["samples"]) > self.max_samples:
            return _error(413, f"{len(raw['samples'])} samples in one request; at most {self.max_samples}")
        try:
            req = ScoreRequest.model_validate(raw)
        except ValidationError as exc:
            return 422, json.dumps({"error": "invalid request", "details": exc.errors(include_url=False, include_input=False)}).encode(), JSON
        samples = [Sample(**s.model_dump()) for s in req.samples]
        scores = self.scorer.score_many(samples)
        out = [score_json(sc, self.scorer.kind(s.data_source)) for sc, s in zip(scores, samples)]
        return 200, json.dumps({"scores": out}).encode(), JSON


def authorize(header: str | None, token: SecretStr | None) -> tuple[int, bytes, str] | None:
    """None when `header` carries the bearer `token`; else the refusal (403 when no token is set)."""
    return httpserver.authorize(header, token, "POST /v1/score")


def _error(status: int, message: str) -> tuple[int, bytes, str]:
    return httpserver.error(status, message)


def serve_score(
    port: int, handler: httpserver.PostRoute, host: str = "0.0.0.0", max_body_bytes: int = 64 * 1024 * 1024, idle_timeout_seconds: float = 30.0
) -> ThreadingHTTPServer:
    """Serve POST /v1/score (`handler`, e.g. `ScoreAPI.handle`) on `port` and nothing else
    (`magic.runtime.httpserver`: every other request is 404; the probes and /metrics are on the
    metrics port); returns the server."""
    return httpserver.serve(port, "score-http", post={PATH: handler}, host=host, max_body_bytes=max_body_bytes, idle_timeout_seconds=idle_timeout_seconds)
