"""Code answers, the reward service's side: take the program out of the response and have the
code judge (`magic.codejudge`, a service of its own) run it on the problem's tests.

    judge = CodeJudgeClient(settings.code_judge)
    verdict = judge.verify(response, ground_truth)   # -> Verdict

The reward service never runs a program: untrusted code runs only in the code judge's sandbox, a
pod that can live in a namespace and node pool of its own (docs/security.md), so the reward pod
itself runs at Pod Security "restricted".

A judge that cannot take the program — unreachable, restarting, not ready (503), refusing the
token (401/403: a misconfiguration, said in the log) — is waited for up to `wait_seconds` (an hour
by default): its outage is not the response's fault, so it never becomes a verdict of the
response while the judge may come back; the reward worker's liveness allows the wait
(`RewardWorker.score`). Once the request was sent, nothing is retried (a program is never run
twice): a judge that does not answer within `timeout_seconds`, or answers something unreadable,
gives ``error`` with the reason. A program longer than the judge takes is sent cut at its limit,
so the judge says ``wrong`` ("program longer than ...").
"""

from __future__ import annotations

import logging
import re
import time

import httpx

from magic.protocol.codejudge import JUDGE_PATH, MAX_CODE_CHARS, RETRY_STATUSES
from magic.protocol.verdict import Status, Verdict
from magic.reward.math.extract import answer_region
from magic.reward.settings import CodeJudgeClientSettings

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*(python3?|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


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
        """Send one program; wait out a judge that cannot take it yet, up to `wait_seconds`."""
        t0 = time.perf_counter() if t0 is None else t0
        code = code[: MAX_CODE_CHARS + 1]  # the judge says "wrong" for anything longer than it takes
        deadline = time.monotonic() + self.settings.wait_seconds
        delay, why, warned = 0.5, "", False
        while True:
            try:
                r = self._http.post(JUDGE_PATH, json={"program": code, "ground_truth": ground_truth})
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:  # not sent: the judge is away
                why = f"unreachable ({type(exc).__name__}: {str(exc)[:160]})"
            except httpx.TransportError as exc:  # sent, and no reply: never sent again (the program may have run)
                return Verdict(Status.error, code[:200], f"code judge: no reply ({type(exc).__name__}: {str(exc)[:160]})", time.perf_counter() - t0)
            else:
                if r.status_code == 200:
                    return self._verdict(r, code, t0)
                why = f"HTTP {r.status_code}: {r.text[:200]}"
                if r.status_code not in RETRY_STATUSES:  # the request itself (400, 413, 422): waiting changes nothing
                    return Verdict(Status.error, code[:200], f"code judge: {why}", time.perf_counter() - t0)
            if not warned:
                log.warning("the code judge at %s cannot take programs (%s): code answers wait for it", self.settings.url, why)
                warned = True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 10.0)
        log.warning("the code judge at %s gave no verdict in %.0fs: %s", self.settings.url, self.settings.wait_seconds, why)
        return Verdict(Status.error, code[:200], f"code judge: {why}", time.perf_counter() - t0)

    @staticmethod
    def _verdict(r: httpx.Response, code: str, t0: float) -> Verdict:
        try:
            body = r.json()
            status = Status(body["status"])
            return Verdict(status, str(body.get("answer", ""))[:200], str(body.get("details", ""))[:500], time.perf_counter() - t0)
        except (ValueError, KeyError, TypeError) as exc:  # a reply this client cannot read: final, the program ran
            return Verdict(Status.error, code[:200], f"code judge: unreadable reply ({type(exc).__name__}: {r.text[:120]!r})", time.perf_counter() - t0)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
