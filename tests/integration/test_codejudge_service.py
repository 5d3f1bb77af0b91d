"""The code judge as its own process: POST /v1/judge runs programs in its sandbox and answers
verdicts; bad requests get their status; a judge whose sandbox cannot start runs nothing."""

from __future__ import annotations

import json

import httpx
import pytest
from codejudge_process import AUTH, code_judge
from waiting import wait_for

pytestmark = pytest.mark.integration

STDIN = json.dumps({"type": "stdin_stdout", "inputs": ["2\n", "5\n"], "outputs": ["4\n", "10\n"]})


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    with code_judge(tmp_path_factory.mktemp("codejudge"), uid_base=62250) as urls:
        yield urls


def post(url: str, body, headers=AUTH) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}/v1/judge", content=content, headers={"content-type": "application/json", **headers}, timeout=60)


def test_programs_are_judged_over_http(judge):
    url, metrics, sup = judge
    right = post(url, {"program": "print(int(input()) * 2)\n", "ground_truth": STDIN})
    assert right.status_code == 200 and right.json()["status"] == "correct", right.text
    wrong = post(url, {"program": "print(4)\n", "ground_truth": STDIN}).json()
    assert wrong["status"] == "wrong" and "test 2/2: wrong answer" in wrong["details"]
    stored = post(url, {"program": "import sysv_ipc\n", "ground_truth": STDIN}).json()  # any failure is this program's, never the judge's
    assert stored["status"] == "wrong"
    assert post(url, {"program": "print(1)\n", "ground_truth": "{not json"}).json()["status"] == "error"
    fork_bomb = post(url, {"program": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", "ground_truth": STDIN}).json()
    assert fork_bomb["status"] == "wrong"
    assert sup.first_exit() is None
    text = httpx.get(f"{metrics}/metrics").text
    assert 'magic_code_judge_verdicts_total{verdict="correct"}' in text and "magic_sandbox_kills_total" in text


@pytest.mark.parametrize(
    "body, headers, status, says",
    [
        ({"program": "print(1)", "ground_truth": STDIN}, {}, 401, "bearer"),
        ({"program": "print(1)", "ground_truth": STDIN}, {"Authorization": "Bearer wrong-token-0123456789"}, 401, "wrong"),
        (b"{not json", AUTH, 400, "not JSON"),
        ({"program": "print(1)"}, AUTH, 422, "invalid"),
        ({"program": "print(1)", "ground_truth": STDIN, "extra": 1}, AUTH, 422, "invalid"),
        ({"program": "x" * (256 * 1024 + 2), "ground_truth": STDIN}, AUTH, 422, "invalid"),
    ],
)
def test_bad_requests_get_their_status(judge, body, headers, status, says):
    r = post(judge[0], body, headers)
    assert r.status_code == status and says in r.text, r.text


def test_a_judge_whose_sandbox_cannot_start_runs_nothing(tmp_path):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")  # the sandbox's root cannot be made here
    from magic.runtime.ports import free_port
    from magic.local.supervisor import Supervisor

    port, metrics = free_port(), free_port()
    sup = Supervisor(tmp_path / "logs", {"MAGIC_JUDGE_PORT": str(port), "MAGIC_METRICS_PORT": str(metrics), "MAGIC_API_TOKEN": AUTH["Authorization"].split()[1],
                                         "MAGIC_SANDBOX__ROOT": str(blocked / "root"), "MAGIC_SANDBOX__UID_BASE": "62300"})
    sup.start("codejudge", "magic.codejudge")
    try:
        def refused():
            try:
                return post(f"http://127.0.0.1:{port}", {"program": "print(1)", "ground_truth": STDIN}).status_code == 503
            except httpx.TransportError:
                return False
        wait_for(refused, 60, "a 503 from a judge without a sandbox", sup=sup)
        assert httpx.get(f"http://127.0.0.1:{metrics}/readyz").status_code == 503
        # it answers 503 from its first moment; the reason is said once the sandbox's start has failed
        wait_for(lambda: "stays not ready" in sup.get("codejudge").log_tail(50), 60, "the reason it is not ready, in its log", sup=sup)
        assert post(f"http://127.0.0.1:{port}", {"program": "print(1)", "ground_truth": STDIN}).status_code == 503
    finally:
        sup.stop_all()
