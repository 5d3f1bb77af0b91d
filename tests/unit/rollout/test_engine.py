import pytest
import torch

from magic import modeling
from magic.protocol.pb import messages_pb2 as pb
from magic.rollout.engine import GenerationRequest, TorchEngine


def test_samples_have_one_logprob_per_token_and_stop_or_truncate(tiny_model_dir):
    engine = TorchEngine(str(tiny_model_dir))
    prompt = engine.render_prompt([{"role": "user", "content": "Add 1+2"}])
    results, stats = engine.generate([GenerationRequest(prompt, n=6, temperature=1.0, max_tokens=12, seed=1)])
    assert len(results) == 1 and len(results[0]) == 6
    for s in results[0]:
        assert len(s.token_ids) == len(s.logprobs) <= 12
        assert all(lp <= 0 for lp in s.logprobs)
        if s.finish_reason == pb.FINISH_REASON_STOP:
            assert s.token_ids[-1] in engine.eos_ids
        else:
            assert s.finish_reason == pb.FINISH_REASON_LENGTH and len(s.token_ids) == 12
            assert not set(s.token_ids) & engine.eos_ids
    assert stats.sequences == 6 and stats.tokens == sum(len(s.token_ids) for s in results[0])


def test_sampler_logprobs_match_the_learner_computation(tiny_model_dir):
    """The learner recomputes log pi(token) at the same temperature from a plain forward pass."""
    engine = TorchEngine(str(tiny_model_dir))
    prompts = [engine.render_prompt([{"role": "user", "content": c}]) for c in ("Add 1+2", "Add 3+4+5+6")]
    for temperature in (1.0, 0.7):
        results, _ = engine.generate([GenerationRequest(p, n=3, temperature=temperature, max_tokens=20, seed=5) for p in prompts])
        for p, samples in zip(prompts, results):
            for s in samples:
                ids = torch.tensor([p + s.token_ids])
                logp, _ = modeling.token_logprobs(engine.model, ids, torch.ones_like(ids), temperature)
                learner = logp[0, len(p) - 1 :]
                assert torch.allclose(learner, torch.tensor(s.logprobs), atol=1e-4), (learner - torch.tensor(s.logprobs)).abs().max()


def test_low_temperature_concentrates_the_samples(tiny_model_dir):
    engine = TorchEngine(str(tiny_model_dir))
    prompt = engine.render_prompt([{"role": "user", "content": "Add 5+5"}])
    cold, _ = engine.generate([GenerationRequest(prompt, n=8, temperature=1e-4, max_tokens=8, seed=2)])
    hot, _ = engine.generate([GenerationRequest(prompt, n=8, temperature=3.0, max_tokens=8, seed=2)])
    assert len({tuple(s.token_ids) for s in cold[0]}) == 1
    assert len({tuple(s.token_ids) for s in hot[0]}) > 1


def test_batches_mix_prompts_of_different_lengths(tiny_model_dir):
    """Left padding must not change what a prompt's samples look like (greedy-like temperature)."""
    engine = TorchEngine(str(tiny_model_dir))
    short = engine.render_prompt([{"role": "user", "content": "Add 1+1"}])
    long = engine.render_prompt([{"role": "user", "content": "Add 1+2+3+4+5+6+7+8"}])
    alone, _ = engine.generate([GenerationRequest(short, n=1, temperature=1e-4, max_tokens=10)])
    mixed, _ = engine.generate([GenerationRequest(long, n=1, temperature=1e-4, max_tokens=10), GenerationRequest(short, n=1, temperature=1e-4, max_tokens=10)])
    assert mixed[1][0].token_ids == alone[0][0].token_ids


def test_a_group_samples_the_same_whatever_shares_its_batch(tiny_model_dir):
    """Continuous batching: groups join and leave the running batch; a group's samples depend on its seed only."""
    engine = TorchEngine(str(tiny_model_dir), max_batch_sequences=64)
    prompts = [engine.render_prompt([{"role": "user", "content": f"Add {i}+{i + 1}+{i + 2}"}]) for i in range(5)]
    requests = [GenerationRequest(p, n=3, temperature=1.0, max_tokens=6 + 5 * i, seed=100 + i) for i, p in enumerate(prompts)]
    together, _ = engine.generate(requests)
    narrow = TorchEngine(str(tiny_model_dir), max_batch_sequences=4)  # at most one group at a time, joins mid-flight
    one_by_one, _ = narrow.generate(requests)
    alone = [engine.generate([r])[0][0] for r in requests]
    for a, b, c in zip(together, one_by_one, alone):
        assert [s.token_ids for s in a] == [s.token_ids for s in b] == [s.token_ids for s in c]
        for x, y in zip(a, c):
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)


def test_rows_joining_a_running_batch_keep_learner_logprobs(tiny_model_dir):
    """Rows admitted while others are mid-decode (caches left-padded and concatenated) still match the learner."""
    engine = TorchEngine(str(tiny_model_dir), max_batch_sequences=6)
    long = engine.render_prompt([{"role": "user", "content": "Add 1+2+3+4+5+6+7+8"}])
    short = engine.render_prompt([{"role": "user", "content": "Add 1+1"}])
    engine.submit("long", GenerationRequest(long, n=2, temperature=1.0, max_tokens=30, seed=3))
    engine.submit("short", GenerationRequest(short, n=2, temperature=1.0, max_tokens=4, seed=4))
    done = dict(engine.step())
    engine.submit("late", GenerationRequest(short, n=4, temperature=0.8, max_tokens=12, seed=5))  # waits for free slots
    while engine.in_flight():
        done.update(engine.step())
    assert set(done) == {"long", "short", "late"} and engine.free_slots() == 6
    for key, prompt, temperature in (("long", long, 1.0), ("short", short, 1.0), ("late", short, 0.8)):
        for s in done[key]:
            ids = torch.tensor([prompt + s.token_ids])
            logp, _ = modeling.token_logprobs(engine.model, ids, torch.ones_like(ids), temperature)
            assert torch.allclose(logp[0, len(prompt) - 1 :], torch.tensor(s.logprobs), atol=1e-4)


def test_abort_drops_groups_and_frees_their_slots(tiny_model_dir):
    engine = TorchEngine(str(tiny_model_dir), max_batch_sequences=8)
    prompt = engine.render_prompt([{"role": "user", "content": "Add 2+2"}])
    engine.submit("a", GenerationRequest(prompt, n=4, max_tokens=50, seed=1))
    engine.submit("b", GenerationRequest(prompt, n=4, max_tokens=50, seed=2))
    engine.step()
    assert engine.abort(["a"]) == ["a"] and engine.in_flight() == ["b"] and engine.free_slots() == 4
    done = {}
    while engine.in_flight():
        done.update(engine.step())
    assert list(done) == ["b"] and len(done["b"]) == 4


def test_weights_cannot_change_under_groups_in_flight(tiny_model_dir, tmp_path):
    from magic.weights import Checkpoint

    engine = TorchEngine(str(tiny_model_dir))
    engine.submit("a", GenerationRequest(engine.render_prompt([{"role": "user", "content": "Add 1+1"}]), n=1, max_tokens=5))
    with pytest.raises(RuntimeError, match="in flight"):
        engine.load_checkpoint(Checkpoint(1, tmp_path))


def test_invalid_requests_are_refused_with_a_clear_error(tiny_model_dir):
    engine = TorchEngine(str(tiny_model_dir))
    with pytest.raises(ValueError, match="invalid generation request"):
        engine.submit("x", GenerationRequest([1, 2], n=0))
    with pytest.raises(ValueError, match="max_batch_sequences"):
        TorchEngine(str(tiny_model_dir), max_batch_sequences=0)


def test_temperature_zero_is_greedy_decoding(tiny_model_dir):
    """tau = 0 (greedy held-out validation): the argmax token at every position, whatever the seed,
    with its log-probability at tau = 1 — the same tokens as the limit tau -> 0."""
    engine = TorchEngine(str(tiny_model_dir))
    prompt = engine.render_prompt([{"role": "user", "content": "What is 2 + 2?"}])
    greedy, _ = engine.generate([GenerationRequest(prompt, n=1, temperature=0.0, max_tokens=10, seed=s) for s in (1, 2)])
    cold, _ = engine.generate([GenerationRequest(prompt, n=1, temperature=1e-6, max_tokens=10, seed=3)])
    assert greedy[0][0].token_ids == greedy[1][0].token_ids == cold[0][0].token_ids
    assert all(lp <= 0.0 for lp in greedy[0][0].logprobs)
    with pytest.raises(ValueError, match="invalid generation request"):
        engine.generate([GenerationRequest(prompt, n=1, temperature=-0.5, max_tokens=4)])


def test_greedy_validation_takes_one_sample_per_prompt():
    from pydantic import ValidationError

    from magic.config.schema import EvalConfig

    assert EvalConfig(datasets=["held"], samples=1, temperature=0).temperature == 0
    with pytest.raises(ValidationError, match="greedy decoding"):
        EvalConfig(datasets=["held"], samples=4, temperature=0)
