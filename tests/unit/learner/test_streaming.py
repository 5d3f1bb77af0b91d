"""Exact streaming: the on-policy update built group by group, in any arrival order, equals the
barrier update (weights after the step, and its figures) for every advantage estimator, the
entropy settings, the reference KL, the rollout correction and rejection."""

from __future__ import annotations

import random

import pytest
import torch
from learner_batches import scored_groups, stage

from magic import modeling
from magic.config.schema import OptimConfig
from magic.learner.backends import TorchBackend
from magic.learner.streaming import StreamingStep, why_not
from magic.learner.trainer import Trainer

OPTIM = OptimConfig(max_grad_norm=1.0)


def make_trainer(model_dir, budget: int = 40) -> Trainer:
    torch.manual_seed(0)
    model = modeling.load_model(model_dir, dtype=torch.float64)
    ref = modeling.load_model(model_dir, dtype=torch.float64).requires_grad_(False)
    return Trainer(TorchBackend(model, OPTIM, torch.device("cpu"), chunk_size=5), OPTIM, pad_id=0, micro_batch_tokens=budget, reference=ref, chunk_size=5)


def on_policy(**overrides):
    base = dict(D_T=None, N_reuse=1, dual_clip=3.0, beta=0.0, entropy={"adaptive": False, "coef": 0.0})
    base.update(overrides)
    return stage(**base)


CASES = {
    "grpo": dict(advantage_estimator="grpo"),
    "drgrpo": dict(advantage_estimator="drgrpo"),
    "rloo": dict(advantage_estimator="rloo"),
    "lite_ppo": dict(advantage_estimator="lite_ppo"),
    "batch": dict(advantage_estimator="batch"),
    "batch-mask-before": dict(advantage_estimator="batch", advantage_mask="before"),
    "grpo-mask-after": dict(advantage_estimator="grpo", advantage_mask="after"),
    "constant-entropy-bonus": dict(entropy={"adaptive": False, "coef": 0.01}),
    "adaptive-gate-on": dict(entropy={"adaptive": True, "target": 10.0, "delta": 0.01}, _c0=0.02),  # c_k > 0, e_k below the target: alpha_k = c_k
    "adaptive-gate-off": dict(entropy={"adaptive": True, "target": 0.1, "delta": 0.01}, _c0=0.02),  # e_k above: alpha_k = 0
    "adaptive-c0-zero": dict(entropy={"adaptive": True, "target": 10.0, "delta": 0.01}),
    "reference-kl": dict(beta=0.05),
    "rollout-is-truncate": dict(rollout_is="truncate", rollout_is_threshold=1.5),
    "lite_ppo-kl-entropy-mask": dict(advantage_estimator="lite_ppo", beta=0.02, entropy={"adaptive": True, "target": 10.0}, advantage_mask="before", _c0=0.01),
}


@pytest.mark.parametrize("case", CASES)
def test_the_streamed_update_equals_the_barrier_update_in_any_arrival_order(tiny_model_dir, case):
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    values = dict(CASES[case])
    c0 = values.pop("_c0", 0.0)  # c_k of the adaptive controller at this step
    st = on_policy(**values)
    groups = scored_groups(0, 6, 4, vocab, seed=13)
    for sc in groups[2].scores:
        sc.reward = 1.0  # a group without reward spread: rejected in both
    groups[4].rollout.samples[1].policy_version = 7  # a sample of another version: dropped in both

    barrier = make_trainer(tiny_model_dir)
    barrier.controller.coef = c0
    expected = barrier.train_step(groups, version=0, stage=st)
    want = {k: v.clone() for k, v in barrier.backend.policy.state_dict().items()}
    assert expected["groups_rejected"] >= 1 and expected["groups_dropped_version"] == 1

    for order_seed in (0, 1):
        order = list(groups)
        random.Random(order_seed).shuffle(order)
        streamer = make_trainer(tiny_model_dir, budget=17)  # another micro-batch split too
        streamer.controller.coef = c0
        step = StreamingStep(streamer, 0, st)
        for g in order:
            step.add(g)
        got = step.finish()
        for k, w in want.items():  # within 1e-5 relative, tensor by tensor (the float64 test model's RMSNorm computes in float32:
            v = streamer.backend.policy.state_dict()[k]  # the gradients agree to ~1e-7, summed in another order)
            assert torch.linalg.norm(v - w) <= 1e-5 * torch.linalg.norm(w), (case, order_seed, k, (torch.linalg.norm(v - w) / torch.linalg.norm(w)).item())
        start = modeling.load_model(tiny_model_dir, dtype=torch.float64).state_dict()
        update = torch.cat([(want[k] - start[k]).flatten() for k in want])
        streamed = torch.cat([(streamer.backend.policy.state_dict()[k] - start[k]).flatten() for k in want])
        assert update.abs().max() > 1e-4, case  # the step moved the policy
        assert torch.linalg.norm(streamed - update) <= 1e-3 * torch.linalg.norm(update), (case, (torch.linalg.norm(streamed - update) / torch.linalg.norm(update)).item())
        for key in ("loss", "pg_loss", "entropy", "grad_norm", "entropy_alpha", "entropy_bonus_active", "entropy_coef_next", "tokens_trained",
                    "groups_trained", "groups_rejected", "advantage_mean", "kl_rollout", "rollout_is_clipfrac"):
            assert got[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), (case, key)
        if st.kl_coef:
            assert got["kl_ref"] == pytest.approx(expected["kl_ref"], rel=1e-6, abs=1e-12)


def test_what_cannot_stream_says_why(tiny_model_dir):
    trainer = make_trainer(tiny_model_dir)
    assert why_not(on_policy(), trainer.backend) is None
    assert "N_SGD" in why_not(stage(), trainer.backend)  # D_T = 2 of D_R = 4, N_reuse 2
    assert "Adv-Mask-After" in why_not(on_policy(advantage_estimator="batch", advantage_mask="after"), trainer.backend)
    with pytest.raises(ValueError, match="cannot stream"):
        StreamingStep(trainer, 0, stage())


def test_a_step_with_nothing_to_learn_keeps_the_policy(tiny_model_dir):
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    groups = scored_groups(0, 3, 4, vocab, seed=2)
    for g in groups:
        for sc in g.scores:
            sc.reward = 0.0
    trainer = make_trainer(tiny_model_dir)
    before = {k: v.clone() for k, v in trainer.backend.policy.state_dict().items()}
    step = StreamingStep(trainer, 0, on_policy())
    for g in groups:
        step.add(g)
    rec = step.finish()
    assert rec["groups_trained"] == 0 and rec["sgd_steps"] == 0
    assert all(torch.equal(v, before[k]) for k, v in trainer.backend.policy.state_dict().items())
