import torch

from magic.common import modeling
from magic.common.pb import messages_pb2 as pb
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
