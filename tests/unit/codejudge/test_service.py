"""The code judge's request handling without a sandbox (a stand-in verifier): a judge shutting down
takes no new program and answers 503 for one it could not finish, so the reward service sends it
again rather than counting it."""

from __future__ import annotations

import json
import threading
import time

from pydantic import SecretStr

from magic.codejudge.service import CodeJudge
from magic.codejudge.settings import CodeJudgeSettings
from magic.protocol.verdict import Status, Verdict

TOKEN = "judge-unit-token-0123456789"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
BODY = json.dumps({"program": "print(1)", "ground_truth": "{}"}).encode()


class SlowVerifier:
    def __init__(self, seconds: float, fail_when_closed: bool = False):
        self.seconds, self.fail_when_closed, self.judge = seconds, fail_when_closed, None

    def verify(self, program, ground_truth):
        time.sleep(self.seconds)
        if self.fail_when_closed and self.judge._closing.is_set():
            raise ValueError("I/O operation on closed file")  # what a sandbox closed under a running test raises
        return Verdict(Status.correct, program, "passed 1/1 tests", self.seconds)


def ready_judge(verifier) -> CodeJudge:
    judge = CodeJudge(CodeJudgeSettings(api_token=SecretStr(TOKEN), sandbox={"slots": 2}))
    judge.verifier, verifier.judge = verifier, judge
    judge._ready.set()
    return judge


def test_a_program_finishes_through_the_drain_and_new_ones_get_503():
    judge = ready_judge(SlowVerifier(0.5))
    replies = []
    running = threading.Thread(target=lambda: replies.append(judge.handle(BODY, HEADERS)))
    running.start()
    time.sleep(0.1)
    left = judge.drain(seconds=5)
    running.join()
    assert left == 0 and replies[0][0] == 200 and json.loads(replies[0][1])["status"] == "correct"
    assert judge.handle(BODY, HEADERS)[0] == 503 and not judge.ready()


def test_a_program_cut_short_by_the_shutdown_is_503_not_an_error_verdict():
    judge = ready_judge(SlowVerifier(0.5, fail_when_closed=True))
    replies = []
    running = threading.Thread(target=lambda: replies.append(judge.handle(BODY, HEADERS)))
    running.start()
    time.sleep(0.1)
    judge._closing.set()  # the shutdown closes the sandbox under it
    running.join()
    status, body, _ = replies[0]
    assert status == 503 and b"not judged" in body


def test_a_sandbox_that_cannot_start_is_tried_again_and_the_judge_stays_not_ready(monkeypatch):
    import magic.codejudge.service as service

    monkeypatch.setattr(service, "START_RETRY_SECONDS", 0.05)
    judge = CodeJudge(CodeJudgeSettings(api_token=SecretStr(TOKEN)))
    tries = []

    def start():
        tries.append(1)
        if len(tries) < 3:
            raise RuntimeError("bubblewrap is not installed")
        judge._ready.set()

    judge.start = start
    judge.start_until_ready()
    assert len(tries) == 3 and judge.ready()
