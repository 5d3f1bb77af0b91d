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
import time
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from magic.codejudge.sandbox.runner import Sandbox
from magic.codejudge.settings import CodeJudgeSettings
from magic.codejudge.verifier import CodeVerifier
from magic.observability.logs import setup_logging
from magic.observability.metrics import CODE_JUDGE_VERDICTS, SANDBOX_KILLS, registry_of, serve_http
from magic.protocol.codejudge import JUDGE_PATH, MAX_CODE_CHARS
from magic.protocol.verdict import Status, Verdict
from magic.runtime import httpserver

log = logging.getLogger(__name__)

SERVICE = "codejudge"
PATH = JUDGE_PATH
START_RETRY_SECONDS = 30.0
"""A sandbox that failed to start is tried again this often (the judge stays not ready meanwhile)."""
DRAIN_SECONDS = 50.0
"""On SIGTERM, the programs running are given this long to finish (the chart's grace period is 60 s)."""
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
        self._closing = threading.Event()
        self._turns = threading.BoundedSemaphore(settings.max_concurrent or settings.sandbox.slots)
        self._running = 0
        self._running_lock = threading.Condition()

    def start(self) -> None:
        """Start the sandbox and run the self-check; ready afterwards. Raises `SandboxError` (or
        what the self-check found) when code cannot be run safely here."""
        sandbox = Sandbox(self.settings.sandbox, on_kill=lambda reason, n: SANDBOX_KILLS.labels(reason=reason).inc(n))
        verifier = CodeVerifier(sandbox)
        v = verifier.verify(*SELF_CHECK)
        if not v.correct:
            sandbox.close()
            raise RuntimeError(f"the sandbox failed its self-check: {v.status.value} ({v.details})")
        self.sandbox, self.verifier = sandbox, verifier
        self._ready.set()
        log.info("code judge ready; sandbox: %s", self.sandbox.describe())

    def start_until_ready(self) -> None:
        """`start`, again every `START_RETRY_SECONDS` while it fails (never a sandbox less confined:
        the judge stays not ready and says why) until it succeeds or the judge is closing."""
        while not self._closing.is_set():
            try:
                self.start()
                return
            except Exception as exc:  # noqa: BLE001 — SandboxError (no bubblewrap, no root) or a failed self-check: said, then tried again
                log.error("%s; the code judge stays not ready, runs no program, and tries again in %.0fs", exc, START_RETRY_SECONDS)
            self._closing.wait(START_RETRY_SECONDS)

    def ready(self) -> bool:
        return self._ready.is_set() and not self._closing.is_set()

    def judge(self, program: str, ground_truth: str) -> Verdict | None:
        """One verdict, waiting for a turn (the sandbox's slots bound how many run at once); None
        when the judge began shutting down before the program ran to its end (not judged)."""
        with self._running_lock:
            self._running += 1
        try:
            with self._turns:
                if self._closing.is_set():
                    return None
                try:
                    v = self.verifier.verify(program, ground_truth)
                except Exception:
                    if self._closing.is_set():
                        return None  # cut short by the shutdown: the client sends it again elsewhere
                    raise
                if self._closing.is_set() and v.status is Status.error:
                    return None
        finally:
            with self._running_lock:
                self._running -= 1
                self._running_lock.notify_all()
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
        if v is None:
            return httpserver.error(503, "the code judge is shutting down: the program was not judged (send it again)")
        return 200, json.dumps(verdict_json(v)).encode(), JSON

    def drain(self, seconds: float = DRAIN_SECONDS) -> int:
        """Stop taking programs (503, not ready) and wait up to `seconds` for those running;
        returns how many were still running."""
        self._closing.set()
        deadline = time.monotonic() + seconds
        with self._running_lock:
            while self._running and time.monotonic() < deadline:
                self._running_lock.wait(max(0.0, deadline - time.monotonic()))
            return self._running

    def close(self) -> None:
        self._closing.set()
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
    threading.Thread(target=judge.start_until_ready, name="sandbox-start", daemon=True).start()
    server = httpserver.serve(settings.judge_port, "judge-http", post={PATH: judge.handle}) if settings.judge_port is not None else None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    left = judge.drain()  # new requests get 503 (the reward service sends them to another judge, or later)
    log.info("stopping (%d program(s) still running were not judged)", left)
    if server is not None:
        server.shutdown()
        server.server_close()
    judge.close()
    return 0
