"""The reward service's side of code answers: the program taken out of the response, and the
client of the code judge when there is no judge, or none that answers."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import doctest

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
    from magic.local.redis_server import free_port  # a port nothing listens on

    client = CodeJudgeClient(CodeJudgeClientSettings(url=f"http://127.0.0.1:{free_port()}", wait_seconds=1.5))
    t0 = time.monotonic()
    v = client.verify("```python\nprint(1)\n```", "{}")
    assert v.status is Status.error and "code judge" in v.details
    assert 1.0 <= time.monotonic() - t0 < 10


def test_a_refusal_is_not_waited_for_and_the_token_is_sent():
    seen = []

    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(401)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"no")

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        client = CodeJudgeClient(CodeJudgeClientSettings(url=url, api_token=SecretStr("t" * 16), wait_seconds=60))
        t0 = time.monotonic()
        v = client.verify("```python\nprint(1)\n```", "{}")
        assert v.status is Status.error and "HTTP 401" in v.details and time.monotonic() - t0 < 5
        assert seen == ["Bearer " + "t" * 16]
    finally:
        server.shutdown()
