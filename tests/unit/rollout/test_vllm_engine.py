"""The vLLM engine against a real local HTTP server answering with vLLM 0.33.0's shapes."""

import re
import time
from pathlib import Path

import pytest

from magic.protocol.pb import messages_pb2 as pb
from magic.rollout.engine import GenerationRequest
from magic.rollout.vllm_engine import VllmEngine, VllmError, VllmServerDied, completion_request, parse_completion
from magic.runtime.httpclient import KEEPALIVE_EXPIRY
from magic.weights import Checkpoint, WeightIntegrityError

from .vllm_server import FakeVllm

# Field names of CompletionRequest in vLLM 0.33.0 (vllm/entrypoints/openai/completion/protocol.py)
# that this engine may send; the server ignores unknown fields with a warning, so a typo would
# silently fall back to a default — this list catches it.
COMPLETION_REQUEST_FIELDS = {
    "model", "prompt", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n", "presence_penalty",
    "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user", "use_beam_search", "top_k",
    "min_p", "repetition_penalty", "length_penalty", "stop_token_ids", "include_stop_str_in_output", "ignore_eos",
    "min_tokens", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens", "allowed_token_ids",
    "prompt_logprobs", "add_special_tokens", "request_id", "return_tokens_as_token_ids", "return_token_ids",
    "return_weight_versions", "cache_salt", "priority", "vllm_xargs",
}


@pytest.fixture
def fake():
    server = FakeVllm()
    yield server
    server.close()


@pytest.fixture
def engine(fake, tiny_model_dir):
    e = VllmEngine(fake.url, str(tiny_model_dir), model="policy", max_batch_sequences=16, timeout=10)
    yield e
    e.close()


def test_the_request_names_only_vllm_fields_and_neutralises_generation_config_defaults():
    body = completion_request(GenerationRequest([1, 2, 3], n=4, temperature=1.0, top_p=1.0, max_tokens=64, seed=7), "rid", "policy")
    assert set(body) <= COMPLETION_REQUEST_FIELDS
    assert body["prompt"] == [1, 2, 3] and body["n"] == 4 and body["max_tokens"] == 64 and body["seed"] == 7
    assert body["logprobs"] == 0 and body["return_token_ids"] and body["return_weight_versions"]
    assert (body["top_k"], body["min_p"], body["repetition_penalty"], body["presence_penalty"], body["frequency_penalty"]) == (0, 0.0, 1.0, 0.0, 0.0)


def test_server_with_raw_logprobs_is_refused(tiny_model_dir):
    server = FakeVllm(logprobs_mode="raw_logprobs")
    try:
        with pytest.raises(VllmError, match="--logprobs-mode processed_logprobs"):
            VllmEngine(server.url, str(tiny_model_dir), timeout=10)
    finally:
        server.close()


def test_generate_parses_token_ids_logprobs_and_finish_reasons(fake, engine, tmp_path, tiny_model_dir):
    engine.load_checkpoint(Checkpoint(3, tiny_model_dir))
    fake.script = [([5, 6, 2], [-0.5, -1.25, -0.01], "stop"), ([7, 8, 9, 10], [-2.0, -0.1, -0.3, -4.0], "length")]
    results, stats = engine.generate([GenerationRequest([1, 2], n=2, max_tokens=4, seed=11), GenerationRequest([3], n=3, max_tokens=4)])
    assert [len(r) for r in results] == [2, 3]
    first, second = results[0]
    assert first.token_ids == [5, 6, 2] and first.logprobs == [-0.5, -1.25, -0.01] and first.finish_reason == pb.FINISH_REASON_STOP
    assert second.token_ids == [7, 8, 9, 10] and second.finish_reason == pb.FINISH_REASON_LENGTH
    assert stats.sequences == 5 and stats.tokens == 3 + 4 + 3 + 4 + 3
    bodies = [body for m, p, _, body in fake.calls if p == "/v1/completions"]
    assert sorted(b["n"] for b in bodies) == [2, 3] and all(b["model"] == "policy" for b in bodies)


def test_samples_from_another_weight_version_are_refused(fake, engine, tmp_path, tiny_model_dir):
    engine.load_checkpoint(Checkpoint(3, tiny_model_dir))
    fake.weight_version = "2"  # the server's weights changed under us
    response = fake.completion({"n": 1, "prompt": [1], "return_token_ids": True, "return_weight_versions": True})
    with pytest.raises(VllmError, match="weight versions \\['2'\\], expected only 3"):
        parse_completion(response, 1, 3)
    # before sampling, the engine checks the server still serves its version (a restarted server does not)
    with pytest.raises(VllmServerDied, match="serves weights '2', not v3"):
        engine.submit("g", GenerationRequest([1], n=1, max_tokens=3))
    assert engine.version == -1  # until a reload: the worker attaches again and loads the newest version
    engine.load_checkpoint(Checkpoint(3, tiny_model_dir))
    fake.delay = 0.5  # the group is answered after the change below
    engine.submit("g", GenerationRequest([1], n=1, max_tokens=3))
    fake.weight_version = "2"  # and while a group is in flight: its samples carry the other label
    finished = []
    while not finished:
        finished = engine.step()
    assert finished[0][0] == "g" and isinstance(finished[0][1], VllmError)


def test_a_failed_request_comes_back_as_an_error_for_that_group_only(fake, engine, tmp_path, tiny_model_dir):
    engine.load_checkpoint(Checkpoint(0, tiny_model_dir))
    fake.fail_completions = 1
    fake.delay = 0.05
    engine.submit("a", GenerationRequest([1], n=1, max_tokens=3))
    engine.submit("b", GenerationRequest([1], n=1, max_tokens=3))
    got = {}
    while len(got) < 2:
        got.update(engine.step())
    errors = [k for k, v in got.items() if isinstance(v, Exception)]
    assert len(errors) == 1 and "500" in str(got[errors[0]])


def test_a_control_call_the_server_closed_unanswered_is_sent_again(fake, engine, tiny_model_dir):
    """A pooled connection the server closed as the request went out ("Server disconnected
    without sending a response") ended a vLLM demo run; idempotent calls now go out once more."""
    fake.drop = {"/pause": 1, "/collective_rpc": 1, "/health": 1}
    engine.load_checkpoint(Checkpoint(5, tiny_model_dir))
    assert fake.paths() == ["/pause", "/pause", "/collective_rpc", "/collective_rpc", "/update_weight_version", "/resume"]
    assert engine.version == 5 and fake.weight_version == "5"
    assert engine.healthy()


def test_generation_is_not_sent_twice(fake, engine, tiny_model_dir):
    engine.load_checkpoint(Checkpoint(0, tiny_model_dir))
    fake.drop = {"/v1/completions": 1}
    engine.submit("a", GenerationRequest([1], n=1, max_tokens=3))
    got = {}
    while not got:
        got.update(engine.step())
    assert isinstance(got["a"], Exception) and fake.paths().count("/v1/completions") == 1


def test_idle_connections_are_dropped_before_the_servers_keep_alive_ends_them(fake, engine):
    assert KEEPALIVE_EXPIRY < 5  # vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE default
    engine.healthy(), engine.healthy()
    assert fake.ports[-1] == fake.ports[-2]  # reused while fresh
    time.sleep(KEEPALIVE_EXPIRY + 0.5)
    engine.healthy()
    assert fake.ports[-1] != fake.ports[-2]  # a new connection once idle past the expiry


def test_reload_from_path_pauses_reloads_labels_and_resumes(fake, engine, tmp_path, tiny_model_dir):
    engine.load_checkpoint(Checkpoint(5, tiny_model_dir))
    assert fake.paths() == ["/pause", "/collective_rpc", "/update_weight_version", "/resume"]
    rpc = next(b for _, p, _, b in fake.calls if p == "/collective_rpc")
    assert rpc == {"method": "reload_weights", "kwargs": {"weights_path": str(tiny_model_dir)}}
    assert next(q for _, p, q, _ in fake.calls if p == "/pause") == {"mode": ["wait"], "clear_cache": ["true"]}  # never the deprecated default
    assert engine.version == 5 and fake.weight_version == "5"


def test_nccl_join_and_receive_use_vllms_weight_transfer_routes(fake, engine, tiny_model_dir):
    assert engine.nccl_gpus() == 2
    group = pb.NcclGroup(id=1, master_address="learner", master_port=29600, world_size=5, rank_offsets={"w/abc": 3}, packed=True, packed_buffer_size_bytes=1 << 30, packed_num_buffers=2)
    engine.join_nccl_group(group, 3)
    init = next(b for _, p, _, b in fake.calls if p == "/init_weight_transfer_engine")
    assert init == {"init_info": {"master_address": "learner", "master_port": 29600, "rank_offset": 3, "world_size": 5, "packed": True, "packed_buffer_size_bytes": 1 << 30, "packed_num_buffers": 2}}
    update = pb.NcclUpdate(group_id=1, tensors=[pb.TensorSpec(name="model.embed_tokens.weight", dtype="bfloat16", shape=[10, 4])])
    engine.receive_nccl(7, update)
    assert fake.paths()[-5:] == ["/pause", "/start_weight_update", "/update_weights", "/finish_weight_update", "/resume"]
    body = next(b for _, p, _, b in fake.calls if p == "/update_weights")
    assert body == {"update_info": {"names": ["model.embed_tokens.weight"], "dtype_names": ["bfloat16"], "shapes": [[10, 4]]}}
    assert engine.version == 7 and fake.weight_version == "7"


def test_abort_sends_the_request_ids_of_running_groups(fake, engine, tmp_path, tiny_model_dir):
    engine.load_checkpoint(Checkpoint(0, tiny_model_dir))
    fake.delay = 0.5
    engine.submit("slow", GenerationRequest([1], n=1, max_tokens=3))
    import time

    time.sleep(0.1)
    assert engine.abort() == ["slow"] and engine.in_flight() == []
    aborted = next(b for _, p, _, b in fake.calls if p == "/abort_requests")
    # vLLM runs request <id>'s prompt as cmpl-<id>-0, the id /abort_requests matches (the bare id aborts nothing)
    assert len(aborted["request_ids"]) == 1 and re.fullmatch(r"cmpl-magic-[0-9a-f]{32}-0", aborted["request_ids"][0])


def test_a_response_without_weight_versions_is_fenced_by_the_reload_sequence(fake, engine, tmp_path, tiny_model_dir):
    """vLLM 0.32 ignores return_weight_versions: choices carry no spans, and the group is accepted on
    the strength of pause -> reload -> update_weight_version -> resume (nothing in flight across it)."""
    engine.load_checkpoint(Checkpoint(3, tiny_model_dir))
    response = fake.completion({"n": 1, "prompt": [1], "return_token_ids": True})
    for choice in response["choices"]:
        choice.pop("weight_versions", None)
    [sample] = parse_completion(response, 1, 3)
    assert sample.token_ids == [5, 6, 2]
    engine.submit("g", GenerationRequest([1], n=1, max_tokens=3))
    with pytest.raises(RuntimeError, match="groups in flight"):
        engine.load_checkpoint(Checkpoint(4, tiny_model_dir))


def test_abort_never_sends_an_empty_list(fake, engine, tmp_path, tiny_model_dir):
    """An empty request_ids aborts everything the server runs (vLLM's /abort_requests)."""
    engine.load_checkpoint(Checkpoint(0, tiny_model_dir))
    assert engine.abort(["unknown"]) == [] and engine.abort() == []
    assert "/abort_requests" not in fake.paths()


def test_a_500_from_a_server_whose_health_fails_is_the_servers_death_not_the_groups(fake, engine, tmp_path, tiny_model_dir):
    """vLLM answers 500 to every request once its engine core died, and 503 to /health: the groups
    are not failures of their own (they would be retried, then dead-lettered); the worker must end."""
    engine.load_checkpoint(Checkpoint(0, tiny_model_dir))
    fake.fail_completions = 1
    fake.health = 503
    engine.submit("a", GenerationRequest([1], n=1, max_tokens=3))
    with pytest.raises(VllmServerDied, match="stopped answering GET /health"):
        for _ in range(50):
            engine.step()
    assert engine.in_flight() == ["a"]
    from magic.runtime.service import WorkerRestart

    assert issubclass(VllmServerDied, WorkerRestart)  # the runtime re-attaches instead of failing the run


def test_a_checkpoint_that_is_not_the_model_never_reaches_the_server(fake, engine, tmp_path, tiny_model_dir):
    """vLLM 0.32's reload of an unreadable file kills its engine core: such a directory is refused first."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(WeightIntegrityError, match="not a readable safetensors file"):
        engine.load_checkpoint(Checkpoint(1, bad))
    with pytest.raises(WeightIntegrityError, match="no \\*.safetensors file"):
        engine.load_checkpoint(Checkpoint(1, tmp_path))
    assert "/collective_rpc" not in fake.paths() and engine.version == -1
