"""The code judge: the one service that runs untrusted programs, and nothing else.

The reward service sends it each code answer's program with the problem's tests; it runs the
program in its sandbox (`magic.codejudge.sandbox`: bubblewrap, seccomp, a uid and scratch space
per slot, memory/CPU/process limits) and answers the verdict::

    POST /v1/judge   {"program": "print(int(input()) + 1)", "ground_truth": "{\\"type\\": \\"stdin_stdout\\", ...}"}
    200              {"status": "correct", "answer": "print(...", "details": "passed 3/3 tests", "seconds": 0.21}

It holds no Redis credentials and no model, reads no stream: a pod of its own, which a platform
can put in a namespace and node pool of its own (the sandbox needs ``CAP_SYS_ADMIN``), reached
only by the reward pods over the network policy (docs/security.md). Served on ``MAGIC_JUDGE_PORT``
with ``Authorization: Bearer $MAGIC_API_TOKEN`` (none set: 403 to every request); GET /metrics,
/livez and /readyz on ``MAGIC_METRICS_PORT`` (ready once the sandbox ran its self-check; a
sandbox that cannot start leaves the judge not ready and answers 503, never runs code less
confined). A body that is not JSON is 400, one that does not match the schema 422, more requests
than ``max_concurrent`` wait their turn.

    magic serve codejudge          # or: python -m magic.codejudge
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from magic.codejudge.sandbox.runner import Sandbox, SandboxError
from magic.codejudge.settings import CodeJudgeSettings
from magic.codejudge.verifier import MAX_CODE_CHARS, CodeVerifier
from magic.observability.logs import setup_logging
from magic.observability.metrics import CODE_JUDGE_VERDICTS, SANDBOX_KILLS, registry_of, serve_http
from magic.protocol.verdict import Status, Verdict
from magic.runtime import httpserver

log = logging.getLogger(__name__)

SERVICE = "codejudge"
PATH = "/v1/judge"
JSON = "application/json"
SELF_CHECK = ("print(int(input()) + 1)\n", '{"type": "stdin_stdout", "inputs": ["1"], "outputs": ["2"]}')
"""A program and its test every judge runs before it is ready."""


class JudgeRequest(BaseModel):
    """One program to run on one problem's tests."""

    model_config = ConfigDict(extra="forbid")

    program: str = Field(max_length=MAX_CODE_CHARS + 1)
    """The program (the reward service took it out of the response)."""
    ground_truth: str = Field(max_length=64 * 1024 * 1024)
    """The problem's tests as JSON (`magic.codejudge.cases`)."""


def verdict_json(v: Verdict) -> dict:
    return {"status": v.status.value, "answer": v.answer, "details": v.details, "seconds": round(v.seconds, 6)}


class CodeJudge:
    """The sandbox, its verifier and the POST /v1/judge handler (see the module docstring)."""

    def __init__(self, settings: CodeJudgeSettings):
        self.settings = settings
        self.sandbox: Sandbox | None = None
        self.verifier: CodeVerifier | None = None
        self._ready = threading.Event()
        self._turns = threading.BoundedSemaphore(settings.max_concurrent or settings.sandbox.slots)

    def start(self) -> None:
        """Start the sandbox and run the self-check; ready afterwards. Raises `SandboxError` (or
        what the self-check found) when code cannot be run safely here."""
        self.sandbox = Sandbox(self.settings.sandbox, on_kill=lambda reason, n: SANDBOX_KILLS.labels(reason=reason).inc(n))
        self.verifier = CodeVerifier(self.sandbox)
        v = self.verifier.verify(*SELF_CHECK)
        if not v.correct:
            raise RuntimeError(f"the sandbox failed its self-check: {v.status.value} ({v.details})")
        self._ready.set()
        log.info("code judge ready; sandbox: %s", self.sandbox.describe())

    def ready(self) -> bool:
        return self._ready.is_set()

    def judge(self, program: str, ground_truth: str) -> Verdict:
        """One verdict, waiting for a turn (the sandbox's slots bound how many run at once)."""
        with self._turns:
            v = self.verifier.verify(program, ground_truth)
        CODE_JUDGE_VERDICTS.labels(verdict=v.status.value).inc()
        return v

    def handle(self, body: bytes, headers: Mapping[str, str]) -> httpserver.Reply:
        refused = httpserver.authorize(headers.get("Authorization"), self.settings.api_token, f"POST {PATH}")
        if refused:
            return refused
        if not self.ready():
            return httpserver.error(503, "the code judge is not ready (its sandbox has not passed its self-check)")
        try:
            raw = json.loads(body)
        except (ValueError, RecursionError) as exc:
            return httpserver.error(400, f"the body is not JSON: {str(exc)[:200]}")
        try:
            req = JudgeRequest.model_validate(raw)
        except ValidationError as exc:
            return 422, json.dumps({"error": "invalid request", "details": exc.errors(include_url=False, include_input=False)}).encode(), JSON
        try:
            v = self.judge(req.program, req.ground_truth)
        except Exception as exc:  # noqa: BLE001 — a failure of the judge is this program's `error`, never a 500 without a verdict
            log.exception("judging a program failed")
            v = Verdict(Status.error, req.program[:200], f"code judge failed: {type(exc).__name__}: {str(exc)[:200]}")
        return 200, json.dumps(verdict_json(v)).encode(), JSON

    def close(self) -> None:
        self._ready.clear()
        if self.sandbox is not None:
            self.sandbox.close()


def run(settings: CodeJudgeSettings | None = None) -> int:
    settings = settings or CodeJudgeSettings()
    setup_logging(SERVICE, settings.worker_name, settings.log_level)
    judge = CodeJudge(settings)
    if settings.metrics_port is not None:
        serve_http(settings.metrics_port, judge.ready, registry=registry_of(SERVICE))
    if settings.api_token is None:
        log.warning("MAGIC_API_TOKEN is not set: POST %s refuses every request", PATH)
    try:
        judge.start()
    except (SandboxError, RuntimeError) as exc:
        log.error("%s; the code judge stays not ready and runs no program", exc)
    except Exception:  # noqa: BLE001 — likewise, with the traceback
        log.exception("the sandbox failed to start; the code judge stays not ready and runs no program")
    server = httpserver.serve(settings.judge_port, "judge-http", post={PATH: judge.handle}) if settings.judge_port is not None else None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("stopping")
    if server is not None:
        server.shutdown()
    judge.close()
    return 0
