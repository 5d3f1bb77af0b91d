"""An optional LLM judge for math answers the rules reject (the TinyV approach, arXiv 2505.14625).

Rule-based verifiers reject some correct answers (forms no rule reads); TinyV asks a small model
only about those: "is this answer equivalent to the reference?". Off by default
(`JudgeSettings.enabled`): a judge's false positives depend on its model and cannot be measured
without one (`benchmarks/math_judge.py` measures them against a server you run).

    judge = LlmJudge(settings.math.judge)
    judge.decide(problem, gold, answer)   # True, False, or None (undecided: the rules' verdict stands)

The judge posts to an OpenAI-compatible ``/v1/completions`` (a vLLM server, as the rollout
runs) with greedy decoding and reads the first word of the completion: "True"/"Yes" accept,
"False"/"No" reject, anything else — or a failed request — leaves the rules' verdict.
"""

from __future__ import annotations

import logging

import httpx

from magic.reward.settings import JudgeSettings

log = logging.getLogger(__name__)

PROMPT = """You are checking a student's final answer to a math problem against the reference answer.
Decide whether the student's answer is mathematically equivalent to the reference answer: the same
value or set of values, possibly written in another form, order or notation, or with units that
convert to the same quantity. Answer with one word: True if it is equivalent, False if it is not.

Problem: {problem}

Reference answer: {gold}

Student's answer: {answer}

Is the student's answer equivalent to the reference answer? Answer:"""
"""The question, ending where the judge writes its one word."""

MAX_FIELD_CHARS = 2000
"""Problem, reference and answer are cut to this many characters each in the prompt."""


def read_decision(text: str) -> bool | None:
    """The judge's decision from its completion: its first word, "True"/"Yes" or "False"/"No".

    >>> read_decision(" True"), read_decision("false."), read_decision("Yes, because"), read_decision("x7")
    (True, False, True, None)
    """
    words = text.strip().split()
    first = words[0].strip(".,:;!*\"'").lower() if words else ""
    if first in ("true", "yes"):
        return True
    if first in ("false", "no"):
        return False
    return None


class LlmJudge:
    """Asks an OpenAI-compatible server whether a rejected answer is equivalent to the gold."""

    def __init__(self, settings: JudgeSettings):
        self.settings = settings
        headers = {"Authorization": f"Bearer {settings.api_key.get_secret_value()}"} if settings.api_key else {}
        self.http = httpx.Client(base_url=settings.url.rstrip("/"), timeout=settings.timeout_seconds, headers=headers)

    def prompt(self, problem: str, gold: str, answer: str) -> str:
        cut = MAX_FIELD_CHARS
        return PROMPT.format(problem=(problem or "(not given)")[:cut], gold=gold[:cut], answer=answer[:cut])

    def decide(self, problem: str, gold: str, answer: str) -> bool | None:
        """True (equivalent), False (not) or None (undecided); JudgeFailed when the server did
        not answer usably (logged)."""
        body = {
            "model": self.settings.model,
            "prompt": self.prompt(problem, gold, answer),
            "max_tokens": self.settings.max_tokens,
            "temperature": 0.0,
        }
        try:
            resp = self.http.post("/v1/completions", json=body)
            resp.raise_for_status()
            text = resp.json()["choices"][0]["text"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            log.warning("the LLM judge failed (%s): the rules' verdict stands", exc)
            raise JudgeFailed(str(exc)) from None
        return read_decision(text if isinstance(text, str) else "")

    def close(self) -> None:
        self.http.close()


class JudgeFailed(RuntimeError):
    """The judge's server did not answer usably."""
