"""The vLLM engine against a real vLLM server (the CPU build, `make vllm-venv`), one server for the module.

What runs for real: `python -m vllm.entrypoints.openai.api_server` from `.venv-vllm` (started and
supervised by `magic.rollout.vllm_server`, as the rollout service does with `MAGIC_VLLM_LAUNCH`),
a tiny Qwen2 model with tied embeddings (head_dim 32: the CPU attention kernels' smallest), the
engine's HTTP calls, reloads through the worker extension, and the learner's logprob code.

Without the vLLM virtualenv these tests are skipped locally and FAIL in CI (CI=true).
The last test kills the server: keep it last.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest
import torch
from vllm_venv import VLLM_PYTHON, require_vllm

from magic import modeling
from magic.rollout.engine import GenerationRequest
from magic.rollout.vllm_engine import VllmEngine, VllmError, VllmServerDied
from magic.rollout.vllm_server import VllmServer, VllmServerConfig, VllmServerError
from magic.runtime.ports import free_port
from magic.weights import Checkpoint, WeightIntegrityError

MAX_MODEL_LEN = 128




@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory) -> Path:
    """The smallest Qwen2 the CPU backend runs: hidden 64, 2 heads of 32, tied embeddings."""
    from transformers.utils import logging as hf_logging

    from magic.demo.prepare import build_model

    hf_logging.disable_progress_bar()
    out = tmp_path_factory.mktemp("vllm-model")
    model, _ = build_model(out, seed=0, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    assert model.config.tie_word_embeddings
    return out


@pytest.fixture(scope="module")
def server(vllm_model_dir, tmp_path_factory):
    require_vllm()
    config = VllmServerConfig(model=str(vllm_model_dir), python=VLLM_PYTHON, max_model_len=MAX_MODEL_LEN)
    srv = VllmServer(config, tmp_path_factory.mktemp("vllm-log") / "server.log").start(timeout=900)
    yield srv
    srv.stop()


@pytest.fixture
def engine(server, vllm_model_dir):
    e = VllmEngine(server.url, str(vllm_model_dir), max_batch_sequences=256, timeout=300, server=server)
    e.server = None  # the module owns the server: closing this engine must not stop it
    e.supervised = server
    yield e
    e.abort()
    e._pool.shutdown(wait=True, cancel_futures=True)
    e.http.close()


def perturbed(model_dir: Path, out: Path, version: int, scale: float = 0.5) -> Checkpoint:
    """A checkpoint directory like the filesystem transport's: the model with every weight moved by noise."""
    model = modeling.load_model(model_dir)
    gen = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp(min=0.02))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (model_dir / name).exists() and not (out / name).exists():
            shutil.copy(model_dir / name, out / name)
    return Checkpoint(version, out)


def learner_logprobs(model, prompt: list[int], samples, temperature: float) -> list[list[float]]:
    """What the learner computes for each sample: log pi(token | prefix) at `temperature`."""
    out = []
    for s in samples:
        ids = torch.tensor([prompt + s.token_ids])
        with torch.no_grad():
            logp, _ = modeling.token_logprobs(model, ids, torch.ones_like(ids), temperature, with_entropy=False)
        out.append(logp[0, len(prompt) - 1 :].tolist())
    return out


def max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def server_metric(server: VllmServer, name: str) -> float:
    """The sum of one of the server's own Prometheus series over its labels."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M))


def running_requests(server: VllmServer) -> float:
    """The server's own count of requests running and waiting (its Prometheus gauges)."""
    return server_metric(server, "vllm:num_requests_running") + server_metric(server, "vllm:num_requests_waiting")


def freeze(server: VllmServer) -> None:
    """Stop the server's scheduler with what it holds kept in place (`/pause?mode=keep`): a request
    it receives now stays on the server, unfinished, until `thaw`. The tiny test model generates a
    whole group in well under a second on a quiet machine, so a test that needs a group still on
    the server when something happens to it must not race the generation."""
    httpx.post(f"{server.url}/pause", params={"mode": "keep"}, timeout=30).raise_for_status()


def thaw(server: VllmServer) -> None:
    httpx.post(f"{server.url}/resume", timeout=30).raise_for_status()


def until_sent(engine: VllmEngine, grace: float = 2.0) -> None:
    """Wait until every request of `engine` is being posted by its thread, then `grace` seconds for
    the posts to reach the server (localhost)."""
    deadline = time.monotonic() + 60
    while not all(f.running() or f.done() for f in engine._futures.values()):
        assert time.monotonic() < deadline, "the engine's threads never posted the requests"
        time.sleep(0.01)
    time.sleep(grace)


PROMPT = [{"role": "user", "content": "12+7="}]


def test_vllm_listens_on_localhost_and_its_series_reach_the_workers_metrics_port(server):
    """The dev-mode routes (/collective_rpc, reloads) are not reachable from outside the pod; its
    /metrics is, through the worker's metrics port (`VllmMetrics`), which serves nothing else."""
    import socket

    from prometheus_client import CollectorRegistry

    from magic.observability.metrics import serve_http
    from magic.rollout.vllm_metrics import VllmMetrics

    assert server.config.host == "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # this machine's outward address (no packet is sent)
        s.connect(("192.0.2.1", 9))
        outward = s.getsockname()[0]
    if not outward.startswith("127."):
        with pytest.raises(httpx.ConnectError):
            httpx.post(f"http://{outward}:{server.port}/collective_rpc", json={"method": "refresh_cpu_head"}, timeout=5)
    registry = CollectorRegistry()
    registry.register(VllmMetrics(server.url))
    metrics = serve_http(0, lambda: True, host="127.0.0.1", registry=registry)
    try:
        text = httpx.get(f"http://127.0.0.1:{metrics.server_address[1]}/metrics", timeout=10).text
    finally:
        metrics.shutdown()
        metrics.server_close()
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket"):
        assert re.search(rf"^{re.escape(name)}\{{", text, re.M), name
    assert "magic_vllm_up 1.0" in text


def test_generates_groups_with_token_ids_logprobs_and_finish_reasons(engine):
    prompt = engine.render_prompt(PROMPT)
    results, stats = engine.generate([GenerationRequest(prompt, n=4, temperature=1.0, max_tokens=16, seed=i) for i in range(3)])
    assert [len(group) for group in results] == [4, 4, 4]
    for group in results:
        for s in group:
            assert 1 <= len(s.token_ids) <= 16 and len(s.logprobs) == len(s.token_ids)
            assert all(lp <= 0.0 for lp in s.logprobs)
    assert stats.tokens == sum(len(s.token_ids) for g in results for s in g)
    assert engine.server_version == "0.32.0" and engine.device == "cpu" and engine.max_model_len == MAX_MODEL_LEN


def test_a_step_sized_batch_of_seeded_groups_is_generated(engine, server):
    """A demo step's worth of seeded groups: far more prompt tokens than one scheduler step takes.
    With chunked prefill (vLLM's default) the CPU worker died on the first partial prefill of a
    seeded request (`CPU Generator does not use offset`); the CPU server runs without it."""
    prompts = [engine.render_prompt([{"role": "user", "content": f"{i} + {i * 7 % 13} + {i % 5} + 11 = ? Work it out step by step."}]) for i in range(64)]
    assert sum(len(p) for p in prompts) * 8 > 8192  # more than any default token budget of one step
    results, _ = engine.generate([GenerationRequest(p, n=8, temperature=1.0, max_tokens=4, seed=i) for i, p in enumerate(prompts)])
    assert [len(g) for g in results] == [8] * 64 and server.problem() is None and engine.healthy()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_agree_with_the_learner(engine, vllm_model_dir, temperature):
    model = modeling.load_model(vllm_model_dir)
    prompt = engine.render_prompt(PROMPT)
    [group], _ = engine.generate([GenerationRequest(prompt, n=6, temperature=temperature, max_tokens=24, seed=3)])
    assert max_gap([s.logprobs for s in group], learner_logprobs(model, prompt, group, temperature)) <= 1e-4


def test_a_weight_push_per_step_serves_exactly_that_version(engine, server, vllm_model_dir, tmp_path):
    """Three pushes in a row, tied head included: after each, vLLM's logprobs are the learner's on
    that version (what a fresh server on it gives, up to 1e-4); groups carry that version only."""
    prompt = engine.render_prompt(PROMPT)
    for version in (1, 2, 3):
        checkpoint = perturbed(vllm_model_dir, tmp_path / f"v{version}", version)
        engine.load_checkpoint(checkpoint)
        assert engine.version == version
        assert httpx.get(f"{server.url}/weight_info", timeout=10).json().get("weight_version") in (str(version), None)
        [group], _ = engine.generate([GenerationRequest(prompt, n=4, temperature=1.0, max_tokens=16, seed=version)])
        model = modeling.load_model(checkpoint.directory)
        assert max_gap([s.logprobs for s in group], learner_logprobs(model, prompt, group, 1.0)) <= 1e-4
        base = modeling.load_model(vllm_model_dir)
        assert max_gap([s.logprobs for s in group], learner_logprobs(base, prompt, group, 1.0)) > 1e-2  # really new weights
    engine.load_checkpoint(Checkpoint(0, vllm_model_dir))  # back to the base weights for the tests below


def test_the_head_refresh_is_what_makes_a_tied_reload_right(engine, vllm_model_dir, tmp_path):
    """The CPU backend's stale packed head, shown: reload_weights alone leaves the old head."""
    prompt = engine.render_prompt(PROMPT)
    checkpoint = perturbed(vllm_model_dir, tmp_path / "v9", 9)
    model = modeling.load_model(checkpoint.directory)
    engine.pause()
    engine._post("/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(checkpoint.directory)}})
    engine.resume()
    [stale], _ = engine.generate([GenerationRequest(prompt, n=4, temperature=1.0, max_tokens=16, seed=9)])
    assert max_gap([s.logprobs for s in stale], learner_logprobs(model, prompt, stale, 1.0)) > 1e-2
    engine.load_checkpoint(checkpoint)  # reload + refresh_cpu_head
    [fresh], _ = engine.generate([GenerationRequest(prompt, n=4, temperature=1.0, max_tokens=16, seed=9)])
    assert max_gap([s.logprobs for s in fresh], learner_logprobs(model, prompt, fresh, 1.0)) <= 1e-4
    engine.load_checkpoint(Checkpoint(0, vllm_model_dir))


def test_a_reload_from_a_corrupt_directory_serves_no_version(engine, vllm_model_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(vllm_model_dir / "config.json", bad / "config.json")
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    other = tmp_path / "other"  # a readable checkpoint of another model
    from magic.demo.prepare import build_model

    build_model(other, seed=1, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    engine.load_checkpoint(Checkpoint(5, vllm_model_dir))
    with pytest.raises(WeightIntegrityError, match="not a readable safetensors file"):
        engine.load_checkpoint(Checkpoint(6, bad))
    with pytest.raises(WeightIntegrityError, match=r"other shape: \['model.layers.0.mlp"):
        engine.load_checkpoint(Checkpoint(6, other))
    assert engine.version == 5 and engine.healthy()  # refused before the server saw them: v5 still served
    engine.load_checkpoint(Checkpoint(7, vllm_model_dir))
    assert engine.version == 7


def test_abort_really_stops_the_requests_on_the_server(engine, server):
    """Aborted groups generate nothing more on the server: 8 groups (64 sequences) held on the
    server, aborted, then released together with one group that is not aborted: the server's
    generated-token counter grows by exactly that group's tokens."""
    prompt = engine.render_prompt(PROMPT)
    keys = [f"g{i}" for i in range(8)]
    freeze(server)
    try:
        for i, key in enumerate(keys):
            engine.submit(key, GenerationRequest(prompt, n=8, temperature=1.0, max_tokens=MAX_MODEL_LEN - len(prompt), seed=i))
        until_sent(engine)
        assert sorted(engine.abort(keys)) == sorted(keys) and engine.in_flight() == []
        tokens_before = server_metric(server, "vllm:generation_tokens_total")
    finally:
        thaw(server)
    [control], _ = engine.generate([GenerationRequest(prompt, n=2, max_tokens=4, seed=1)])  # still serves
    assert len(control) == 2
    time.sleep(1.0)  # an aborted request that the server still ran would add its tokens by now
    generated = server_metric(server, "vllm:generation_tokens_total") - tokens_before
    assert generated == sum(len(s.token_ids) for s in control), f"the aborted groups generated {generated - 8:.0f} tokens"
    assert running_requests(server) == 0


def test_a_refused_group_leaves_nothing_in_flight(engine):
    prompt = engine.render_prompt(PROMPT)
    requests = [GenerationRequest(prompt, n=2, max_tokens=8, seed=0), GenerationRequest(prompt, n=2, max_tokens=MAX_MODEL_LEN, seed=1)]
    with pytest.raises(VllmError, match="exceeds the server's max_model_len"):
        engine.generate(requests)
    assert engine.in_flight() == []
    [group], _ = engine.generate(requests[:1])
    assert len(group) == 2


def test_servers_the_engine_cannot_use_are_refused(vllm_model_dir, tmp_path):
    with pytest.raises(VllmError, match="cannot reach the vLLM server"):
        VllmEngine("http://127.0.0.1:9", str(vllm_model_dir), timeout=5)
    config = VllmServerConfig(model=str(vllm_model_dir), python=VLLM_PYTHON, max_model_len=100_000)
    with pytest.raises(VllmServerError, match="exited with code"):  # longer than the model's 256 positions
        VllmServer(config, tmp_path / "too-long.log").start(timeout=600)


RUN = "v"


def _publish_weights(r, tmp_path, model_dir: Path, version: int):
    from magic.store.channels import RunChannels
    from magic.weights import make_sender
    from magic.weights.config import FilesystemTransportConfig

    model = modeling.load_model(model_dir)
    sender = make_sender(FilesystemTransportConfig(), channels=RunChannels(r, RUN, "learner"), root=tmp_path / "weights",
                         config_json=model.config.to_json_string(), keep=3)
    return sender.publish(version, {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"})


def _publish_prompt(r, group_id: str, version: int, max_tokens: int):
    from magic.protocol.pb import messages_pb2 as pb
    from magic.store.steps import StepStore

    g = pb.PromptGroup(run_id=RUN, group_id=group_id, policy_version=version, published_at=time.time(),
                       sampling=pb.SamplingParams(n=4, temperature=1.0, top_p=1.0, max_tokens=max_tokens, seed=1))
    g.messages.add(role="user", content="3+4=")
    pipe = r.pipeline(transaction=True)  # as the controller publishes: with the group's digest (magic.store.steps)
    StepStore(r, RUN).publish_groups(pipe, int(g.step), [g])
    pipe.execute()


def _worker(r, engine, tmp_path, name="w"):
    from magic.rollout.settings import RolloutSettings
    from magic.rollout.worker import RolloutWorker
    from magic.store.channels import RunChannels
    from magic.weights import make_receiver

    s = RolloutSettings(worker_name=name, engine="vllm", max_batch_sequences=64)
    return RolloutWorker(RunChannels(r, RUN, "rollout", name, s.max_deliveries), s, engine, make_receiver(s.weight_transport, worker_name=name, cache_dir=tmp_path / f"cache-{name}"))


def _rollouts(r):
    from magic.protocol import keys
    from magic.protocol.pb import messages_pb2 as pb
    from magic.store.streams import Stream

    return [g for _, g in Stream(r, keys.RunKeys(RUN).rollouts).read_after("0", pb.RolloutGroup, count=100)]


def _pending(r) -> int:
    from magic.protocol import keys

    return r.xpending(keys.RunKeys(RUN).prompts, "rollout")["pending"]


def _worker_generating(r, server, engine, tmp_path, model_dir, group_id: str):
    """A rollout worker on `engine` that has loaded v0 and taken group `group_id` into generation,
    with the server frozen (`freeze`): the group is on the server, unfinished."""
    from magic.protocol import keys

    worker = _worker(r, engine, tmp_path)
    _publish_weights(r, tmp_path, model_dir, 0)
    deadline = time.monotonic() + 120
    while engine.version != 0:  # the worker loads v0 (pause, reload, resume) before it takes work
        assert time.monotonic() < deadline, "the worker never loaded v0"
        worker.poll()
    freeze(server)  # the group stays on the server, unfinished, until the test thaws it (or kills it)
    _publish_prompt(r, group_id, 0, max_tokens=MAX_MODEL_LEN - 40)
    while not worker._work:
        assert time.monotonic() < deadline, f"the worker never took group {group_id} ({_rollouts(r)=}, {r.xlen(keys.RunKeys(RUN).dead_of('rollout'))=})"
        worker.poll()
    return worker


def _served(url: str) -> str | None:
    return httpx.get(f"{url}/weight_info", timeout=30).json().get("weight_version")


def test_a_server_that_dies_at_any_moment_is_resynced_never_failing_the_run(r, vllm_model_dir, tmp_path):
    """A sidecar vLLM server (not started by the engine) killed between the pause and the reload of
    a new version, and killed while its worker is idle: the worker's poll raises VllmServerDied — a
    WorkerRestart, so the runtime attaches the worker again and the run goes on — never a
    ConnectError (a fatal error that failed the run). Restarted on the same address it serves its
    initial weights under no label: an engine that believes it serves v2 refuses to sample there,
    and the worker attached again loads v2 before it generates anything. (Two server starts: the
    idle kill comes last, so no third start is needed.)"""
    config = VllmServerConfig(model=str(vllm_model_dir), python=VLLM_PYTHON, max_model_len=MAX_MODEL_LEN, port=free_port())
    sidecar = VllmServer(config, tmp_path / "sidecar.log").start(timeout=900)
    try:
        engine = VllmEngine(sidecar.url, str(vllm_model_dir), max_batch_sequences=64, timeout=300)
        worker = _worker(r, engine, tmp_path)
        _publish_weights(r, tmp_path, perturbed(vllm_model_dir, tmp_path / "m1", 1).directory, 1)
        deadline = time.monotonic() + 120
        while worker.engine.version != 1:
            assert time.monotonic() < deadline, "the worker never loaded v1"
            worker.poll()
        assert _served(sidecar.url) == "1"
        # killed between the pause and the reload of v2 (mid-reload)
        post = engine._post

        def dies_after_pause(path, **kw):
            out = post(path, **kw)
            if path == "/pause":
                os.kill(sidecar.proc.pid, signal.SIGKILL)
                sidecar.proc.wait(30)
            return out

        engine._post = dies_after_pause
        _publish_weights(r, tmp_path, perturbed(vllm_model_dir, tmp_path / "m2", 2).directory, 2)
        with pytest.raises(VllmServerDied):
            for _ in range(50):
                worker.poll()
        worker.close()
        sidecar.start(timeout=900)  # the kubelet restarts the container: same address, initial weights, no label
        stale = VllmEngine(sidecar.url, str(vllm_model_dir), max_batch_sequences=64, timeout=300)
        stale.version = 2  # an engine that did not notice the restart
        with pytest.raises(VllmServerDied, match="not v2: it restarted"):
            stale.submit("g", GenerationRequest([1, 2, 3], n=1, max_tokens=4))
        stale.close()
        back = _worker(r, VllmEngine(sidecar.url, str(vllm_model_dir), max_batch_sequences=64, timeout=300), tmp_path)
        deadline = time.monotonic() + 120
        while back.engine.version != 2:  # attached again: the newest version first
            assert time.monotonic() < deadline, "the worker attached again never loaded v2"
            back.poll()
        assert _served(sidecar.url) == "2"
        _publish_prompt(r, "2:0", 2, max_tokens=8)
        while not _rollouts(r):
            assert time.monotonic() < deadline, "the group of v2 was not generated"
            back.poll()
        [group] = _rollouts(r)
        assert {s.policy_version for s in group.samples} == {2}
        # killed while the worker is idle: the next version's reload meets the dead server
        os.kill(sidecar.proc.pid, signal.SIGKILL)
        sidecar.proc.wait(30)
        _publish_weights(r, tmp_path, perturbed(vllm_model_dir, tmp_path / "m3", 3).directory, 3)
        with pytest.raises(VllmServerDied, match="loading v3 .* failed"):
            for _ in range(50):
                back.poll()
        back.close()
    finally:
        sidecar.stop()


def test_a_worker_killed_mid_group_and_restarted_publishes_the_group_once(r, server, vllm_model_dir, tmp_path):
    first = VllmEngine(server.url, str(vllm_model_dir), max_batch_sequences=64, timeout=300)
    worker = _worker_generating(r, server, first, tmp_path, vllm_model_dir, "0:0")
    assert worker._work and _pending(r) == 1 and _rollouts(r) == []  # generating, nothing acknowledged
    first.abort()  # the process dies: its requests end with it, nothing was acknowledged
    first.close()
    thaw(server)
    restarted = _worker(r, VllmEngine(server.url, str(vllm_model_dir), max_batch_sequences=64, timeout=300), tmp_path)
    deadline = time.monotonic() + 120
    while not _rollouts(r):
        assert time.monotonic() < deadline, "the restarted worker never published the group"
        restarted.poll()
    [group] = _rollouts(r)
    assert group.prompt.group_id == "0:0" and len(group.samples) == 4 and {s.policy_version for s in group.samples} == {0}
    assert _pending(r) == 0
    restarted.close()


def test_a_server_that_dies_is_reported_and_its_group_redelivered(r, server, vllm_model_dir, tmp_path):
    """Keep last: it kills the module's server. The worker's poll raises VllmServerDied with the
    exit code (the runtime then closes the worker and attaches a new one), /readyz turns unready,
    the group is neither acknowledged nor dead-lettered, and the worker attached again under the
    same name generates it."""
    from magic.rollout.engine import TorchEngine

    engine = VllmEngine(server.url, str(vllm_model_dir), max_batch_sequences=64, timeout=300, server=server)
    worker = _worker_generating(r, server, engine, tmp_path, vllm_model_dir, "0:1")
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(30)
    with pytest.raises(VllmServerDied, match="exited with code -9"):
        for _ in range(100):
            worker.poll()
    assert worker.problem() and "exited with code -9" in worker.problem() and not engine.healthy()
    worker.close()
    assert _pending(r) == 1 and _rollouts(r) == []
    from magic.protocol import keys

    assert r.xlen(keys.RunKeys(RUN).dead_of("rollout")) == 0
    back = _worker(r, TorchEngine(str(vllm_model_dir), max_batch_sequences=64), tmp_path)  # any engine will do for the proof
    deadline = time.monotonic() + 120
    while not _rollouts(r):
        assert time.monotonic() < deadline, "the group was not redelivered"
        back.poll()
    assert [g.prompt.group_id for g in _rollouts(r)] == ["0:1"] and _pending(r) == 0
