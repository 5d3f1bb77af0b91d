"""The reward service: the stream worker over a real Redis, the HTTP endpoint, and the service
as its own process surviving hostile programs."""

from __future__ import annotations

import json
import os
import threading
import time

import httpx
import pytest
from pydantic import SecretStr
from codejudge_process import TOKEN as JUDGE_TOKEN
from codejudge_process import code_judge
from waiting import answers, wait_for

from magic.config.schema import PenaltySettings
from magic.observability.metrics import serve_http
from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.reward.api import ScoreAPI, serve_score
from magic.reward.scoring import Sample, Scorer
from magic.reward.settings import CodeJudgeClientSettings, MathRewardSettings, RewardSettings
from magic.reward.worker import RewardWorker
from magic.store.channels import RunChannels
from magic.store.steps import StepStore
from magic.store.streams import Stream

pytestmark = pytest.mark.integration

RUN = "rw"
K = keys.RunKeys(RUN)
STDIN_GT = json.dumps({"type": "stdin_stdout", "inputs": ["2\n", "5\n"], "outputs": ["4\n", "10\n"]})
DOUBLE = "```python\nprint(int(input()) * 2)\n```"
SANDBOX = dict(root="/tmp/magic-sandbox-test", uid_base=62100, uid_count=50, slots=1, test_timeout_seconds=2, memory_mb=256, processes=8)


@pytest.fixture(scope="module")
def judge_url(tmp_path_factory):
    """A code judge process: the reward service sends it every code answer."""
    with code_judge(tmp_path_factory.mktemp("codejudge"), **SANDBOX) as (url, _, _):
        yield url


def reward_settings(judge_url: str, **kw) -> RewardSettings:
    return RewardSettings(
        worker_name="reward-test",
        math=MathRewardSettings(workers=1, timeout_seconds=3),
        code_judge=CodeJudgeClientSettings(url=judge_url, api_token=JUDGE_TOKEN, wait_seconds=5),
        penalties=PenaltySettings(overlong_buffer_tokens=10, overlong_max=0.5),
        **kw,
    )


@pytest.fixture(scope="module")
def scorer(judge_url):
    with Scorer(reward_settings(judge_url)) as s:
        s.warm_up()
        yield s


def group(gid: str, data_source: str, gt: str, texts: list[str], problem: str = "", lengths: list[int] | None = None) -> pb.RolloutGroup:
    g = pb.RolloutGroup(
        prompt=pb.PromptGroup(run_id=RUN, group_id=gid, data_source=data_source, ground_truth=gt, sampling=pb.SamplingParams(n=len(texts), max_tokens=100)),
        worker="rollout-test",
    )
    g.prompt.messages.add(role="user", content=problem or "solve it")
    for k, t in enumerate(texts):
        g.samples.add(text=t, response_ids=list(range((lengths or [5] * len(texts))[k])))
    return g


def verdicts(scored: pb.ScoredGroup) -> list[str]:
    return [pb.Verdict.Name(s.verdict) for s in scored.scores]


def test_the_worker_scores_groups_and_a_bad_sample_never_fails_its_group(r, scorer):
    rollouts = Stream(r, K.rollouts)
    published = Stream(r, K.rollouts)

    class _Publishing:  # groups the controller published (their digests are in the step's `groups` hash)
        @staticmethod
        def add(g):
            pipe = r.pipeline(transaction=True)
            StepStore(r, RUN).publish_groups(pipe, 0, [g.prompt])
            pipe.execute()
            published.add(g)

    rollouts = _Publishing
    rollouts.add(group("0:0", "math", "4", ["so \\boxed{4}", "\\boxed{5}", "no answer here"], lengths=[5, 95, 100]))
    rollouts.add(group("0:1", "code", STDIN_GT, [DOUBLE, "```python\nprint(4)\n```", "```python\nwhile True: pass\n```"]))
    rollouts.add(group("0:2", "code", "{not json", [DOUBLE]))  # malformed ground truth: ERROR, the group still goes through
    rollouts.add(group("0:3", "math", "B", ["\\boxed{15}"], problem="Which?\n(A) 12\n(B) 15\n(C) 9"))
    own = group("0:4", "math", "4", ["\\boxed{4} " + "so so so so so so", "\\boxed{4}"], lengths=[99, 99])  # the stage's penalties replace the service's
    own.prompt.penalties_json = PenaltySettings(repetition_max=1.0, repetition_ngram=1, repetition_flat=True).model_dump_json()
    rollouts.add(own)
    bad = group("0:5", "math", "4", ["\\boxed{4}"])
    bad.prompt.penalties_json = '{"repetition_max": -3}'  # refused: dead-lettered, never scored with the service's settings
    rollouts.add(bad)
    r.xadd(K.rollouts, {b"type": b"RolloutGroup", b"pb": b"\xff\xfe not a protobuf"})  # poison
    published.add(group("0:9", "math", "4", ["\\boxed{4}"]))  # decodes, but the controller never published it

    worker = RewardWorker(RunChannels(r, RUN, "reward", "reward-test"), scorer.settings, scorer)
    deadline = time.monotonic() + 60
    while (len(Stream(r, K.scored)) < 5 or len(Stream(r, K.dead_of("reward"))) < 3) and time.monotonic() < deadline:
        worker.poll()
    scored = {g.rollout.prompt.group_id: g for _, g in Stream(r, K.scored).read_after("0", pb.ScoredGroup)}
    assert sorted(scored) == ["0:0", "0:1", "0:2", "0:3", "0:4"]
    assert verdicts(scored["0:0"]) == ["VERDICT_CORRECT", "VERDICT_WRONG", "VERDICT_NO_ANSWER"]
    assert verdicts(scored["0:1"]) == ["VERDICT_CORRECT", "VERDICT_WRONG", "VERDICT_WRONG"]
    assert "time limit" in scored["0:1"].scores[2].details
    assert verdicts(scored["0:2"]) == ["VERDICT_ERROR"] and "not JSON" in scored["0:2"].scores[0].details
    assert verdicts(scored["0:3"]) == ["VERDICT_CORRECT"]  # the option's text for its letter
    # penalties are reported apart from correctness: T = 100, buffer 10, lengths 5 / 95 / 100
    s0 = scored["0:0"].scores
    assert [dict(s.penalties) for s in s0] == [{"overlong": 0.0}, {"overlong": -0.25}, {"overlong": -0.5}]
    assert [round(s.reward, 3) for s in s0] == [1.0, -0.25, -0.5]
    assert [s.correctness for s in s0] == [1.0, 0.0, 0.0]
    assert worker.rollouts.pending_count() == 0
    assert [dict(s.penalties) for s in scored["0:4"].scores] == [{"repetition": -1.0}, {"repetition": 0.0}]  # no overlong
    assert [s.reward for s in scored["0:4"].scores] == [0.0, 1.0]
    dead = [d.reason for _, d in Stream(r, K.dead_of("reward")).read_after("0", pb.DeadLetter)]
    assert len(dead) == 3 and "poison" in dead[0], dead
    assert any("group 0:5: malformed penalties_json" in x for x in dead) and any("never published" in x for x in dead), dead


TOKEN = "reward-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def api_url(scorer):
    """POST /v1/score on its own port (`serve_score`); `api_url.tokenless`: a service without a token."""
    server = serve_score(0, ScoreAPI(scorer, max_samples=4, token=SecretStr(TOKEN)).handle, host="127.0.0.1")
    tokenless = serve_score(0, ScoreAPI(scorer, 4, token=None).handle, host="127.0.0.1")
    yield URLs(f"http://127.0.0.1:{server.server_address[1]}", f"http://127.0.0.1:{tokenless.server_address[1]}")
    server.shutdown()
    tokenless.shutdown()


class URLs(str):
    """The scoring URL, with the tokenless service's beside it."""

    def __new__(cls, url: str, tokenless: str):
        out = super().__new__(cls, url)
        out.tokenless = tokenless
        return out


@pytest.fixture(scope="module")
def metrics_url(scorer):
    server = serve_http(0, scorer.ready, host="127.0.0.1")
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_http_scoring_needs_the_token_and_is_closed_without_one(api_url):
    body = {"samples": [{"data_source": "code", "response": DOUBLE, "ground_truth": STDIN_GT}]}
    for headers, status in (({}, 401), ({"Authorization": "Bearer wrong-token-0123456789"}, 401), ({"Authorization": TOKEN}, 401), (AUTH, 200)):
        assert httpx.post(f"{api_url}/v1/score", json=body, headers=headers, timeout=60).status_code == status, headers
    closed = httpx.post(f"{api_url.tokenless}/v1/score", json=body, headers=AUTH, timeout=60)
    assert closed.status_code == 403 and "MAGIC_API_TOKEN" in closed.json()["error"]


def test_http_scores_a_batch_on_demand(api_url):
    body = {
        "samples": [
            {"data_source": "math", "response": "\\boxed{\\frac{1}{2}}", "ground_truth": "0.5"},
            {"data_source": "code", "response": DOUBLE, "ground_truth": STDIN_GT},
            {"response": "\\boxed{3}", "ground_truth": "4", "response_tokens": 100, "max_tokens": 100},
        ]
    }
    resp = httpx.post(f"{api_url}/v1/score", json=body, headers=AUTH, timeout=60)
    assert resp.status_code == 200, resp.text
    scores = resp.json()["scores"]
    assert [(s["kind"], s["verdict"], s["correctness"]) for s in scores] == [("math", "correct", 1.0), ("code", "correct", 1.0), ("math", "wrong", 0.0)]
    assert scores[2]["penalties"] == {"overlong": -0.5} and scores[2]["reward"] == -0.5


@pytest.mark.parametrize(
    "payload, status, message",
    [
        (b"{not json", 400, "not JSON"),
        (json.dumps({"samples": []}).encode(), 422, "invalid request"),
        (json.dumps({"samples": [{"response": "x"}]}).encode(), 422, "invalid request"),
        (json.dumps({"samples": [{"response": "x", "ground_truth": "1", "bogus": 1}]}).encode(), 422, "invalid request"),
        (json.dumps({"samples": [{"response": "x", "ground_truth": "1"}] * 5}).encode(), 413, "at most 4"),
    ],
)
def test_http_rejects_bad_requests_clearly(api_url, payload, status, message):
    resp = httpx.post(f"{api_url}/v1/score", content=payload, headers={"content-type": "application/json", **AUTH}, timeout=30)
    assert resp.status_code == status
    assert message in resp.json()["error"]


def test_the_score_port_serves_scoring_only_and_the_metrics_port_no_scoring(api_url, metrics_url):
    for path in ("/metrics", "/livez", "/readyz"):
        assert httpx.get(f"{api_url}{path}").status_code == 404, path
    assert httpx.post(f"{api_url}/v1/nothing", content=b"{}").status_code == 404
    body = {"samples": [{"data_source": "code", "response": DOUBLE, "ground_truth": STDIN_GT}]}
    assert httpx.post(f"{metrics_url}/v1/score", json=body, headers=AUTH).status_code in (404, 501)  # no POST route at all


def test_http_probes_and_metrics(api_url, metrics_url):
    assert httpx.get(f"{metrics_url}/livez").status_code == 200
    assert httpx.get(f"{metrics_url}/readyz").status_code == 200
    text = httpx.get(f"{metrics_url}/metrics").text
    for series in ('magic_reward_verdicts_total{kind="math",verdict="correct"}', 'magic_reward_latency_seconds_bucket{kind="code"', "magic_reward_timeouts_total", "magic_reward_inflight"):
        assert series in text, series


def test_the_service_process_stays_healthy_after_hostile_programs_and_waits_out_a_restarted_judge(redis_server, tmp_path):
    """The reward service and the code judge as processes: hostile programs are judged wrong and
    both stay up; a judge killed and started again while a sample waits costs that sample a delay,
    not a wrong verdict."""
    from magic.runtime.ports import free_port
    from magic.local.supervisor import Supervisor

    port, score_port = free_port(), free_port()
    with code_judge(tmp_path / "judge", **dict(SANDBOX, uid_base=62150)) as (judge, judge_metrics, judge_sup):
        env = {
            "MAGIC_REDIS_URL": redis_server.url,
            "MAGIC_METRICS_PORT": str(port),
            "MAGIC_SCORE_PORT": str(score_port),
            "MAGIC_MATH__WORKERS": "1",
            "MAGIC_MATH__TIMEOUT_SECONDS": "2",
            "MAGIC_CODE_JUDGE__URL": judge,
            "MAGIC_CODE_JUDGE__API_TOKEN": JUDGE_TOKEN,
            "MAGIC_CODE_JUDGE__WAIT_SECONDS": "120",
            "MAGIC_API_TOKEN": TOKEN,
        }
        sup = Supervisor(tmp_path / "logs", env)
        sup.start("reward-0", "magic.reward")
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: answers(f"{url}/readyz"), 60, "the reward service's /readyz", sup=sup)
            hostile = [
                "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                "x = []\nwhile True:\n    x.append(bytearray(10**8))",
                "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)",
                f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)",
            ]
            samples = [{"data_source": "code", "response": f"```python\n{code}\n```", "ground_truth": STDIN_GT} for code in hostile]
            samples.append({"data_source": "math", "response": "\\boxed{10^{10^{10^{10}}}}", "ground_truth": "4"})
            resp = httpx.post(f"http://127.0.0.1:{score_port}/v1/score", json={"samples": samples}, headers=AUTH, timeout=120)
            assert resp.status_code == 200, resp.text
            assert [s["verdict"] for s in resp.json()["scores"]] == ["wrong"] * 5, resp.json()
            assert sup.first_exit() is None and judge_sup.first_exit() is None
            assert httpx.get(f"{url}/livez").status_code == 200 and answers(f"{judge_metrics}/readyz")

            judge_sup.kill("codejudge")  # the judge is gone; a sample arrives; the judge comes back
            pending = {}
            asking = threading.Thread(target=lambda: pending.update(r=httpx.post(
                f"http://127.0.0.1:{score_port}/v1/score", json={"samples": [{"data_source": "code", "response": DOUBLE, "ground_truth": STDIN_GT}]},
                headers=AUTH, timeout=180)))
            asking.start()
            time.sleep(2)
            judge_sup.start("codejudge", "magic.codejudge")
            asking.join(180)
            assert pending["r"].json()["scores"][0]["verdict"] == "correct", pending["r"].json()
        finally:
            sup.stop_all()
    assert "Traceback" not in sup.get("reward-0").log_tail(200)


def test_a_batch_keeps_each_samples_verdict_and_order_and_a_failed_chunk_is_judged_one_by_one(scorer, monkeypatch):
    """Math samples go to the verifier processes in chunks (one message each), code samples to the
    judge; the verdicts come back in the samples' order. A chunk whose call fails as a whole is
    judged again sample by sample, so the failure stays one sample's verdict."""
    forms = [("\\boxed{4}", "correct"), ("\\boxed{5}", "wrong"), ("no answer here", "no_answer")]
    samples = [Sample("math", forms[i % 3][0], "4") for i in range(40)]
    samples.insert(17, Sample("code", DOUBLE, STDIN_GT))
    expected = [("math", forms[i % 3][1]) for i in range(40)]
    expected.insert(17, ("code", "correct"))
    assert [(kind, v.status.value) for kind, v in scorer.verdicts(samples)] == expected

    whole = scorer.math_pool.call_many

    def fails_for_a_chunk(fn, calls, timeout=None):
        if len(calls) > 1:
            raise RuntimeError("a chunk's call failed")
        if calls[0][1] == "\\boxed{5}":
            raise RuntimeError("this sample's call failed")
        return whole(fn, calls, timeout)

    monkeypatch.setattr(scorer.math_pool, "call_many", fails_for_a_chunk)
    got = [(kind, v.status.value) for kind, v in scorer.verdicts(samples)]
    assert got == [(k, "error" if s == "wrong" else s) for k, s in expected]
