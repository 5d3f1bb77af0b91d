"""Code answers, the reward service's side: take the program out of the response and have the
code judge (`magic.codejudge`, a service of its own) run it on the problem's tests.

    judge = CodeJudgeClient(settings.code_judge)
    verdict = judge.verify(response, ground_truth)   # -> Verdict

The reward service never runs a program: untrusted code runs only in the code judge's sandbox, a
pod that can live in a namespace and node pool of its own (docs/security.md), so the reward pod
itself runs at Pod Security "restricted". A judge that cannot be reached (restarting, rolled out)
is waited for up to `wait_seconds` — its outage is not the response's fault — then the verdict is
``error`` with the reason.
"""

from __future__ import annotations

import logging
import re
import time

import httpx

from magic.protocol.verdict import Status, Verdict
from magic.reward.math.extract import answer_region
from magic.reward.settings import CodeJudgeClientSettings

log = logging.getLogger(__name__)

JUDGE_PATH = "/v1/judge"
_FENCE = re.compile(r"```[ \t]*(python3?|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)
_RETRY_STATUSES = (502, 503, 504)


def extract_code(response: str) -> str | None:
    """The last fenced Python (or unlabelled) code block after the reasoning; None if none.

    >>> extract_code("<think>```python\\nx = 1\\n```</think>Here:\\n```python\\nprint(2)\\n```")
    'print(2)\\n'
    >>> extract_code("no code") is None
    True
    """
    region = answer_region(response)
    if region is None:
        return None
    blocks = [m.group(2) for m in _FENCE.finditer(region)]
    return blocks[-1] if blocks else None


class CodeJudgeClient:
    """POST /v1/judge of the code judge, one program at a time (see the module docstring)."""

    def __init__(self, settings: CodeJudgeClientSettings):
        self.settings = settings
        headers = {"Authorization": f"Bearer {settings.api_token.get_secret_value()}"} if settings.api_token else {}
        self._http = httpx.Client(base_url=settings.url.rstrip("/"), headers=headers, timeout=settings.timeout_seconds) if settings.url else None

    @property
    def configured(self) -> bool:
        return self._http is not None

    def verify(self, response: str, ground_truth: str) -> Verdict:
        """The verdict on the program of `response` against `ground_truth`'s tests; never raises."""
        t0 = time.perf_counter()
        code = extract_code(response)
        if code is None:
            return Verdict(Status.no_answer, "", "no fenced code block after the reasoning", time.perf_counter() - t0)
        if self._http is None:
            return Verdict(Status.error, code[:200], "no code judge configured (MAGIC_CODE_JUDGE__URL): code is never run here", time.perf_counter() - t0)
        return self.judge(code, ground_truth, t0)

    def judge(self, code: str, ground_truth: str, t0: float | None = None) -> Verdict:
        """Send one program; wait out an unreachable judge up to `wait_seconds`."""
        t0 = time.perf_counter() if t0 is None else t0
        deadline = time.monotonic() + self.settings.wait_seconds
        delay, why = 0.5, ""
        while True:
            try:
                r = self._http.post(JUDGE_PATH, json={"program": code, "ground_truth": ground_truth})
                if r.status_code == 200:
                    body = r.json()
                    return Verdict(Status(body["status"]), str(body.get("answer", ""))[:200], str(body.get("details", ""))[:500], time.perf_counter() - t0)
                why = f"HTTP {r.status_code}: {r.text[:200]}"
                if r.status_code not in _RETRY_STATUSES:
                    break  # a refusal (401, 403, 413, 422) does not get better by waiting
            except (httpx.TransportError, ValueError, KeyError) as exc:
                why = f"{type(exc).__name__}: {str(exc)[:200]}"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 10.0)
        log.warning("the code judge at %s gave no verdict: %s", self.settings.url, why)
        return Verdict(Status.error, code[:200], f"code judge: {why}", time.perf_counter() - t0)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
