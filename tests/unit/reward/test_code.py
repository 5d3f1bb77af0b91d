"""The reward service's side of code answers: the program taken out of the response, and the
client of the code judge when there is no judge, or none that answers."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import doctest
import json

import pytest
from pydantic import SecretStr

from magic.protocol.verdict import Status
from magic.reward import code, penalties
from magic.reward.code import CodeJudgeClient, extract_code
from magic.reward.settings import CodeJudgeClientSettings


@pytest.mark.parametrize(
    "response, code",
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("```py\nx=1\n```\ntext\n```\ny=2\n```", "y=2\n"),
        ("<think>```python\nbad\n```</think>", None),
        ("```cpp\nint main(){}\n```", None),
        ("<think>unfinished ```python\nprint(1)\n```", None),
    ],
)
def test_extract_code(response, code):
    assert extract_code(response) == code


@pytest.mark.parametrize("module", [code, penalties])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_the_program_is_the_last_fenced_block_after_the_reasoning():
    response = "<think>```python\nprint(0)\n```</think>First:\n```python\nprint(1)\n```\nBetter:\n```py\nprint(2)\n```"
    assert extract_code(response) == "print(2)\n"
    assert extract_code("<think>```python\nprint(0)\n```</think>no code after thinking") is None
    assert extract_code("I would loop over the array.") is None


def test_without_a_judge_code_is_never_run_and_says_why():
    client = CodeJudgeClient(CodeJudgeClientSettings())
    v = client.verify("```python\nprint(1)\n```", '{"type": "stdin_stdout", "inputs": [""], "outputs": ["1"]}')
    assert v.status is Status.error and "MAGIC_CODE_JUDGE__URL" in v.details
    assert client.verify("no program here", "{}").status is Status.no_answer


def test_an_unreachable_judge_is_waited_for_then_error():
    from magic.runtime.ports import free_port

    client = CodeJudgeClient(CodeJudgeClientSettings(url=f"http://127.0.0.1:{free_port()}", wait_seconds=1.5))
    t0 = time.monotonic()
    v = client.verify("```python\nprint(1)\n```", "{}")
    assert v.status is Status.error and "code judge" in v.details
    assert 1.0 <= time.monotonic() - t0 < 10


def serve_replies(replies: list[tuple[int, bytes]]):
    """A real HTTP server answering POSTs with `replies` in turn (the last one repeated); returns
    (url, the Authorization headers seen, the server; `server.bodies`: the requests' JSON bodies)."""
    seen, bodies = [], []

    class Reply(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            status, body = replies[min(len(seen), len(replies)) - 1]
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Reply)
    server.bodies = bodies
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", seen, server


def test_a_bad_request_is_not_waited_for_and_the_token_is_sent():
    url, seen, server = serve_replies([(422, b'{"error": "invalid request"}')])
    try:
        client = CodeJudgeClient(CodeJudgeClientSettings(url=url, api_token=SecretStr("t" * 16), wait_seconds=60))
        t0 = time.monotonic()
        v = client.verify("```python\nprint(1)\n```", "{}")
        assert v.status is Status.error and "HTTP 422" in v.details and time.monotonic() - t0 < 5
        assert seen == ["Bearer " + "t" * 16]
    finally:
        server.shutdown()


def test_a_judge_that_cannot_take_the_program_yet_is_waited_for_and_then_judges():
    """503 (not ready, shutting down) and 401 (a token an operator is fixing): the program was not
    judged, so the client waits; once the judge answers, its verdict counts."""
    verdict = json.dumps({"status": "correct", "answer": "print(1)", "details": "passed 1/1 tests", "seconds": 0.1}).encode()
    url, seen, server = serve_replies([(503, b"{}"), (401, b"{}"), (200, verdict)])
    try:
        v = CodeJudgeClient(CodeJudgeClientSettings(url=url, wait_seconds=30)).verify("```python\nprint(1)\n```", "{}")
        assert v.status is Status.correct and len(seen) == 3
    finally:
        server.shutdown()


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"status": "maybe"}', b"null", b'{"details": "x"}'])
def test_an_unreadable_verdict_is_an_error_once_never_a_second_run(body):
    url, seen, server = serve_replies([(200, body)])
    try:
        v = CodeJudgeClient(CodeJudgeClientSettings(url=url, wait_seconds=30)).verify("```python\nprint(1)\n```", "{}")
        assert v.status is Status.error and "unreadable reply" in v.details and len(seen) == 1
    finally:
        server.shutdown()


def test_a_program_longer_than_the_judge_takes_is_sent_cut_at_its_limit():
    from magic.protocol.codejudge import MAX_CODE_CHARS

    url, _, server = serve_replies([(200, json.dumps({"status": "wrong", "details": "program longer than ..."}).encode())])
    try:
        v = CodeJudgeClient(CodeJudgeClientSettings(url=url)).verify("```python\n" + "x = 1\n" * 100_000 + "```", "{}")
        assert v.status is Status.wrong and len(server.bodies[0]["program"]) == MAX_CODE_CHARS + 1
    finally:
        server.shutdown()
