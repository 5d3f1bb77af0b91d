"""Scoring samples: pick the verifier by data source, bound its time, add the penalties.

    with Scorer(RewardSettings()) as scorer:
        scores = scorer.score_many([Sample("math", response, "42")])   # -> list[pb.Score]

`Scorer` owns what the verifiers need — `TimeboxedPool` processes for math (a hard wall-clock
bound per response, from any thread) and the client of the code judge (`magic.reward.code`: code
runs only in that service's sandbox, never here) — and is safe to share between the stream worker
and the HTTP endpoint. A sample never raises: whatever goes wrong becomes its
verdict (``error`` when the fault is not the response's), so one bad sample never fails the
batch around it.

The reward of a sample is ``correctness + sum(penalties)``; `pb.Score` carries both, the
penalties by name. The penalties are the sample's own (its stage's, carried on the prompt
group) or else the service's settings.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from magic.config.schema import PenaltySettings
from magic.observability.metrics import REWARD_INFLIGHT, REWARD_JUDGE, REWARD_LATENCY, REWARD_PENALTIES, REWARD_TIMEOUTS, REWARD_VERDICTS
from magic.protocol.pb import messages_pb2 as pb
from magic.protocol.verdict import Status, Verdict
from magic.reward.code import CodeJudgeClient
from magic.reward.math import verifier as math_verifier
from magic.reward.math.judge import JudgeFailed, LlmJudge
from magic.reward.penalties import PenaltyInput, compute_penalties
from magic.reward.settings import RewardSettings
from magic.reward.timeboxed import TimeboxedPool

log = logging.getLogger(__name__)

MATH_CHUNK = 16
"""Math samples handed to a verifier process in one message (`TimeboxedPool.call_many`): a
group at the recipe's gs. Larger saves little more and lets one slow chunk hold back the others."""
SLOW_SECONDS = 2.0
"""Verifications slower than this are logged."""
PB_VERDICT = {
    Status.correct: pb.VERDICT_CORRECT,
    Status.wrong: pb.VERDICT_WRONG,
    Status.no_answer: pb.VERDICT_NO_ANSWER,
    Status.timeout: pb.VERDICT_TIMEOUT,
    Status.error: pb.VERDICT_ERROR,
}


@dataclass(frozen=True)
class Sample:
    """One response to score, with what its verifier and penalties need."""

    data_source: str
    response: str
    ground_truth: str
    problem: str = ""  # the prompt's last user message (multiple-choice options are read from it)
    response_tokens: int | None = None
    max_tokens: int | None = None  # the context length T it was sampled with
    penalties: PenaltySettings | None = None  # the stage's penalties; None: the service's settings


def verify_math(name: str, response: str, gold: str, problem: str) -> Verdict:
    """Run the registered math verifier `name` (called inside a timeboxed worker process)."""
    return math_verifier.get_verifier(name)(response, gold, problem)


class Scorer:
    """Scores samples with the verifier their data source calls for (see the module docstring)."""

    def __init__(self, settings: RewardSettings):
        self.settings = settings
        math_verifier.get_verifier(settings.math.verifier)  # fail now on a misspelt name
        self._code_patterns = [p.lower() for p in settings.code_data_sources]
        self.math_pool = TimeboxedPool(
            workers=settings.math.workers,
            timeout=settings.math.timeout_seconds,
            preload=["magic.reward.scoring", "magic.reward.math.equiv", "math_verify"],
            memory_mb=settings.math.memory_mb,
            on_kill=lambda: REWARD_TIMEOUTS.labels(kind="math").inc(),
        )
        self.judge = LlmJudge(settings.math.judge) if settings.math.judge.enabled else None
        judge_token = settings.code_judge.api_token or settings.code_judge_token
        self.code = CodeJudgeClient(settings.code_judge.model_copy(update={"api_token": judge_token}))
        self._ready = threading.Event()
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=settings.math.workers + settings.code_concurrency, thread_name_prefix="score")

    # -- routing ---------------------------------------------------------------------------

    def kind(self, data_source: str) -> str:
        """"code" when `data_source` matches a code pattern of the settings, else "math".

        >>> from magic.reward.settings import RewardSettings
        >>> s = Scorer.__new__(Scorer); s._code_patterns = ["code", "*livecodebench*"]
        >>> s.kind("LiveCodeBench/v5"), s.kind("math"), s.kind("magic/chain-sum")
        ('code', 'math', 'math')
        """
        ds = data_source.lower()
        return "code" if any(fnmatch.fnmatchcase(ds, p) for p in self._code_patterns) else "math"

    # -- scoring ---------------------------------------------------------------------------

    def verdict(self, sample: Sample) -> tuple[str, Verdict]:
        """The verdict on one sample and the kind of verifier that gave it; never raises."""
        return self.verdicts([sample])[0]

    def verdicts(self, samples: list[Sample]) -> list[tuple[str, Verdict]]:
        """The verdicts on `samples` (in their order) and the kind of verifier that gave each;
        never raises. Math samples go to the timeboxed workers in chunks of up to `MATH_CHUNK`
        (one round trip a chunk), code samples to the code judge one by one, concurrently."""
        kinds = [self.kind(s.data_source) for s in samples]
        math = [i for i, k in enumerate(kinds) if k == "math"]
        # every worker busy for a small batch; one at a time with the LLM judge on (its calls, one
        # per rejected answer, then run concurrently, not one after another within a chunk)
        chunk = 1 if self.judge is not None else max(1, min(MATH_CHUNK, -(-len(math) // self.math_pool.size)))
        jobs = [("math", math[j : j + chunk]) for j in range(0, len(math), chunk)]
        jobs += [("code", [i]) for i, k in enumerate(kinds) if k == "code"]
        out: list[tuple[str, Verdict]] = [("", Verdict(Status.error, "", "not judged"))] * len(samples)

        def judge(job: tuple[str, list[int]]) -> None:
            kind, idx = job
            for i, v in zip(idx, self._judged(kind, [samples[i] for i in idx])):
                out[i] = (kind, v)

        if len(jobs) == 1:
            judge(jobs[0])
        else:
            list(self._executor.map(judge, jobs))
        return out

    def _judged(self, kind: str, samples: list[Sample]) -> list[Verdict]:
        REWARD_INFLIGHT.labels(kind=kind).inc(len(samples))
        try:
            return self._verify(kind, samples)
        except Exception as exc:  # noqa: BLE001 — a verifier failure is a sample's verdict, never its batch's
            if len(samples) > 1:  # again one by one
                return [self._judged_alone(kind, s) for s in samples]
            return [self._failed(kind, exc)]
        finally:
            REWARD_INFLIGHT.labels(kind=kind).dec(len(samples))

    def _judged_alone(self, kind: str, sample: Sample) -> Verdict:
        try:
            return self._verify(kind, [sample])[0]
        except Exception as exc:  # noqa: BLE001
            return self._failed(kind, exc)

    @staticmethod
    def _failed(kind: str, exc: Exception) -> Verdict:
        # (math runs in worker processes, so this is never a sympy object's message)
        log.exception("verifying a %s sample failed", kind)
        return Verdict(Status.error, "", f"verifier failed: {type(exc).__name__}: {str(exc)[:200]}")

    def _verify(self, kind: str, samples: list[Sample]) -> list[Verdict]:
        if kind == "code":
            return [self.code.verify(s.response, s.ground_truth) for s in samples]
        return self._verify_math(samples)

    def _verify_math(self, samples: list[Sample]) -> list[Verdict]:
        calls = [(self.settings.math.verifier, s.response, s.ground_truth, s.problem) for s in samples]
        return [self._math_verdict(s, r) for s, r in zip(samples, self.math_pool.call_many(verify_math, calls))]

    def _math_verdict(self, sample: Sample, result) -> Verdict:
        if result.status == "ok":
            return self._second_opinion(sample, result.value)
        if result.status == "timeout":
            return Verdict(Status.timeout, "", f"verification exceeded {self.settings.math.timeout_seconds:g}s", result.seconds)
        return Verdict(Status.error, "", f"verifier {result.status}: {result.error}", result.seconds)

    def _second_opinion(self, sample: Sample, v: Verdict) -> Verdict:
        """The LLM judge's decision on an answer the rules rejected (when the judge is on): only a
        `wrong` verdict with an extracted answer is asked about; an accepted one becomes correct,
        anything else leaves the rules' verdict."""
        if self.judge is None or v.status is not Status.wrong or not v.answer:
            return v
        try:
            decision = self.judge.decide(sample.problem, sample.ground_truth, v.answer)
        except JudgeFailed:
            REWARD_JUDGE.labels(outcome="failed").inc()
            return v
        REWARD_JUDGE.labels(outcome={True: "accepted", False: "rejected", None: "undecided"}[decision]).inc()
        if decision:
            return Verdict(Status.correct, v.answer, f"the rules rejected it ({v.details}); the LLM judge accepted it", v.seconds)
        return v

    def score(self, sample: Sample) -> pb.Score:
        """Score one sample: its verdict, the penalties, and the reward."""
        return self.score_many([sample])[0]

    def score_many(self, samples: list[Sample]) -> list[pb.Score]:
        """Score samples concurrently (bounded by the pools); results in the same order."""
        return [self._scored(s, kind, v) for s, (kind, v) in zip(samples, self.verdicts(samples))]

    def _scored(self, sample: Sample, kind: str, v: Verdict) -> pb.Score:
        correctness = 1.0 if v.correct else 0.0
        settings = sample.penalties if sample.penalties is not None else self.settings.penalties
        penalties = compute_penalties(PenaltyInput(sample.response, sample.response_tokens, sample.max_tokens), settings)
        for name, value in penalties.items():
            if value:
                REWARD_PENALTIES.labels(name=name).inc()
        REWARD_LATENCY.labels(kind=kind).observe(v.seconds)
        if v.seconds > SLOW_SECONDS:
            log.warning("slow %s verification: %.1fs, %s (%s)", kind, v.seconds, v.status.value, v.details[:120])
        REWARD_VERDICTS.labels(kind=kind, verdict=v.status.value).inc()
        if kind == "code" and v.status is Status.wrong and "time limit" in v.details:
            REWARD_TIMEOUTS.labels(kind="code").inc()
        details = v.details if not v.answer else f"{v.details}; answer={v.answer[:80]!r}"
        return pb.Score(
            reward=correctness + sum(penalties.values()),
            correctness=correctness,
            verdict=PB_VERDICT[v.status],
            penalties=penalties,
            details=details[:500],
            seconds=v.seconds,
            answer=v.answer[:200] if kind == "math" else "",  # the vote of maj@n: a program's text is none
        )

    def warm_up(self) -> None:
        """Verify a trivial answer, so the first real sample pays no start-up cost and a
        misconfiguration shows at start; then `ready()`. (The code judge checks its own sandbox:
        its readiness is its own.)"""
        v = self._verify_math([Sample("math", "\\boxed{1}", "1")])[0]
        if not v.correct:
            raise RuntimeError(f"the math verifier failed its self-check: {v.status.value} ({v.details})")
        self._ready.set()

    def ready(self) -> bool:
        """True once `warm_up` succeeded and until `close`."""
        return self._ready.is_set() and not self._closed

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=True)
        self.math_pool.close()
        if self.judge is not None:
            self.judge.close()
        self.code.close()

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
