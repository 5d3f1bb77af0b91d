"""The `magic` CLI drives a two-stage run with online filtering through the controller's API,
with the four services as separate processes over a real Redis.

The policy is a tiny model taught to answer four easy prompts (memorised in a few seconds of
supervised training) and not the four hard ones, so stage 1 solves the easy prompts in every
sample: online filtering must drop exactly the prompts whose every stage-1 sample was correct
(checked against the scored stream itself), and stage 2 must never see them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis
from waiting import answers, wait_for

from magic.demo import task
from magic.local.redis_server import RedisServer
from magic.local.supervisor import Supervisor
from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.runtime.exits import Exit
from magic.runtime.ports import free_port
from magic.store.streams import Stream

pytestmark = pytest.mark.e2e

TOKEN = "cli-e2e-token-0123456789abcdef"
EASY = [[1, 2], [2, 3], [3, 4], [4, 1]]
HARD = [[9, 8, 7, 6, 5, 4], [8, 9, 7, 5, 6, 4], [7, 7, 9, 8, 6, 5], [6, 9, 8, 7, 9, 5]]


def memorised_model(out: Path) -> Path:
    """A tiny model that answers the EASY prompts with their boxed sum (and knows nothing else)."""
    import torch

    from magic.demo.prepare import build_model

    model, tok = build_model(out, seed=0, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    examples = []
    for terms in EASY:
        prompt = tok.apply_chat_template([{"role": "user", "content": task.prompt_text(terms)}], tokenize=True, add_generation_prompt=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        answer = tok(f"\\boxed{{{sum(terms)}}}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        examples.append((prompt, answer))
    width = max(len(p) + len(a) for p, a in examples)
    ids = torch.full((len(examples), width), tok.pad_token_id)
    labels = torch.full((len(examples), width), -100)
    for i, (p, a) in enumerate(examples):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(200):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.02, loss.item()
    model.save_pretrained(str(out))
    return out


def magic(*args: str, env: dict, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "magic.cli", *args], env=env, capture_output=True, text=True, timeout=120)
    if ok:
        assert proc.returncode == 0, f"magic {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_cli_drives_a_two_stage_plan_with_online_filtering(tmp_path):
    model = memorised_model(tmp_path / "model")
    data = tmp_path / "train.jsonl"
    task.write_jsonl(data, [task.record(t, "train", i) for i, t in enumerate(EASY + HARD)])
    server = RedisServer().start()
    r = redis.Redis.from_url(server.url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sup = Supervisor(tmp_path / "logs", {"MAGIC_REDIS_URL": server.url, "MAGIC_DATA_DIR": str(tmp_path / "data"), "MAGIC_TORCH_THREADS": "1"})
    cli_env = {**os.environ, "MAGIC_CONTROLLER_URL": url, "MAGIC_API_TOKEN": TOKEN}
    try:
        sup.start("controller", "magic.controller", {"MAGIC_PORT": str(port), "MAGIC_TRIM_STREAMS": "false", "MAGIC_API_TOKEN": TOKEN, "MAGIC_READ_REQUIRES_TOKEN": "true"})
        sup.start("learner", "magic.learner")
        sup.start("rollout-0", "magic.rollout")
        sup.start("reward-0", "magic.reward")
        wait_for(lambda: answers(f"{url}/readyz"), 60, "the controller to start", sup)

        # helpful errors: no token, a wrong token, no controller
        no_token = magic("dataset", "register", "chain", str(data), env={**cli_env, "MAGIC_API_TOKEN": ""}, ok=False)
        assert no_token.returncode == Exit.auth and "no token was sent" in no_token.stderr and "MAGIC_API_TOKEN" in no_token.stderr
        wrong = magic("run", "list", "--url", f"http://127.0.0.1:{free_port()}", env=cli_env, ok=False)
        assert wrong.returncode == Exit.unreachable and "cannot reach the controller" in wrong.stderr and "MAGIC_CONTROLLER_URL" in wrong.stderr
        bad = magic("dataset", "register", "chain", str(data), "--token", "wrong", env=cli_env, ok=False)
        assert bad.returncode == Exit.auth and "the token was refused" in bad.stderr
        unread = magic("run", "list", env={**cli_env, "MAGIC_API_TOKEN": ""}, ok=False)  # reads need the token too here
        assert unread.returncode == Exit.auth and "no token was sent" in unread.stderr
        assert magic("run", "get", "nope", env=cli_env, ok=False).returncode == Exit.not_found

        out = magic("dataset", "register", "chain", str(data), env=cli_env).stdout
        assert "8 records" in out
        spec = tmp_path / "run.json"
        spec.write_text(json.dumps({"name": "cli", "model": str(model), "datasets": ["chain"]}))
        assert "status" in magic("run", "create", "-f", str(spec), env=cli_env).stdout
        invalid = magic("stage", "start", "cli", "--name", "s1", "--steps", "1", "--T", "16", "--D_R", "8", "--D_T", "3", "--gs", "4", env=cli_env, ok=False)
        assert invalid.returncode == Exit.usage and "D_T" in invalid.stderr and "not divisible" in invalid.stderr
        # stage 1: every prompt once, short T; stage 2 (a plan that finishes the run): longer T
        magic("stage", "start", "cli", "--name", "s1", "--steps", "1", "--T", "16", "--D_R", "8", "--gs", "4", "--tau", "0.5", "--lr", "1e-5", env=cli_env)
        again = magic("stage", "start", "cli", "--name", "s1", "--steps", "1", "--T", "16", "--D_R", "8", "--gs", "4", env=cli_env, ok=False)
        assert again.returncode == Exit.conflict and "s1" in again.stderr
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"stages": [{"name": "s2", "steps": 2, "T": 24, "D_R": 4, "gs": 4, "tau": 0.5, "lr": 1e-5}], "on_plan_end": "finish"}))
        magic("plan", "submit", "cli", "-f", str(plan), env=cli_env)
        watch = magic("status", "cli", "--watch", "--interval", "0.5", env=cli_env)
        assert "run cli: finished" in watch.stdout and "stage 1 's2' T=24" in watch.stdout

        view = json.loads(magic("run", "get", "cli", env=cli_env).stdout)
        assert view["status"] == "finished", view.get("error")
        k = keys.RunKeys("cli")
        groups = [g for _, g in Stream(r, k.scored).read_after("0", pb.ScoredGroup, count=1000)]
        stage1 = [g for g in groups if g.rollout.prompt.stage == 0]
        assert len(stage1) == 8
        solved = {g.rollout.prompt.prompt_uid for g in stage1 if all(s.correctness == 1.0 for s in g.scores)}
        assert solved and solved <= {f"chain:{i + 1}" for i in range(len(EASY))}, solved  # the easy ones, in every sample
        assert httpx.get(f"{url}/v1/runs/cli/pass-rates").status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        dropped = set(httpx.get(f"{url}/v1/runs/cli/pass-rates", headers=auth).json()["dropped"])
        assert dropped == solved
        s1, s2 = view["stages"]
        assert (s1["start_step"], s1["end_step"], s1["end_reason"], s1["prompts"]) == (0, 1, "steps", 8)
        assert (s2["start_step"], s2["dropped_online"], s2["prompts"]) == (1, len(solved), 8 - len(solved))
        assert view["filtering"]["dropped_online"] == len(solved)
        stage2_prompts = {g.prompt_uid for _, g in Stream(r, k.prompts).read_after("0", pb.PromptGroup, count=1000) if g.stage == 1}
        assert stage2_prompts and not stage2_prompts & solved
        records = httpx.get(f"{url}/v1/runs/cli/metrics", headers=auth).json()
        assert [x["context_length"] for x in records] == [16, 24, 24]
    finally:
        sup.stop_all()
        server.stop()
