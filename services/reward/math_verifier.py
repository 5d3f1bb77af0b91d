"""Math answers: the Skywork-OR1 procedure (§7) on top of Math-Verify.

1. Take the final answer after the reasoning: the text after `</think>` if present, and in it
   the last `\\boxed{...}`.
2. If it matches the gold answer as a string (after trimming), it is correct.
3. Otherwise parse both with Math-Verify (the gold wrapped in `\\boxed{}`) and ask whether they
   are mathematically equivalent.

Math-Verify's own timeouts use SIGALRM, which works only in the main thread; the reward worker
calls this from its main thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from magic.common.pb import messages_pb2 as pb


@dataclass
class MathVerdict:
    verdict: int  # pb.Verdict value
    answer: str
    seconds: float

    @property
    def correct(self) -> bool:
        return self.verdict == pb.VERDICT_CORRECT


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text`, braces balanced; None if there is none.

    >>> last_boxed(r"so \\boxed{\\frac{1}{2}} and finally \\boxed{3}")
    '3'
    >>> last_boxed(r"\\boxed{\\frac{1}{2}}")
    '\\\\frac{1}{2}'
    >>> last_boxed("no answer") is None
    True
    """
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def final_answer_region(response: str) -> str:
    """The part of a response after the reasoning (after the last `</think>`, if any)."""
    marker = "</think>"
    pos = response.rfind(marker)
    return response[pos + len(marker) :] if pos >= 0 else response


def verify(response: str, ground_truth: str, timeout_seconds: int = 5) -> MathVerdict:
    """Judge `response` against `ground_truth` following the paper's procedure."""
    from math_verify import parse, verify as mv_verify

    t0 = time.perf_counter()
    answer = last_boxed(final_answer_region(response))
    if answer is None:
        return MathVerdict(pb.VERDICT_NO_ANSWER, "", time.perf_counter() - t0)
    if answer.strip() == ground_truth.strip():
        return MathVerdict(pb.VERDICT_CORRECT, answer, time.perf_counter() - t0)
    try:
        gold = parse("\\boxed{" + ground_truth + "}", parsing_timeout=timeout_seconds)
        pred = parse("\\boxed{" + answer + "}", parsing_timeout=timeout_seconds)
        ok = bool(gold) and bool(pred) and mv_verify(gold, pred, timeout_seconds=timeout_seconds)
    except TimeoutError:
        return MathVerdict(pb.VERDICT_TIMEOUT, answer, time.perf_counter() - t0)
    except Exception:  # noqa: BLE001 — a verifier crash is a verdict, not a worker crash
        return MathVerdict(pb.VERDICT_ERROR, answer, time.perf_counter() - t0)
    return MathVerdict(pb.VERDICT_CORRECT if ok else pb.VERDICT_WRONG, answer, time.perf_counter() - t0)
