"""The trainer: exact token-level mean however the batch is split, checkpoints that resume exactly,
the on-policy shortcut, rejection sampling and the per-step metrics."""

from __future__ import annotations

import math

import pytest
import torch
from learner_batches import scored_groups, stage

from magic import modeling
from magic.config.schema import OptimConfig
from magic.learner.backends import TorchBackend
from magic.learner.batching import build_sequences
from magic.learner.checkpoints import latest_checkpoint
from magic.learner.trainer import Trainer

OPTIM = OptimConfig(max_grad_norm=1.0)


def make_trainer(model_dir, budget: int, with_reference: bool = True) -> Trainer:
    torch.manual_seed(0)
    model = modeling.load_model(model_dir, dtype=torch.float64)  # float64: equalities hold to 1e-9
    ref = modeling.load_model(model_dir, dtype=torch.float64).requires_grad_(False) if with_reference else None
    return Trainer(TorchBackend(model, OPTIM, torch.device("cpu"), chunk_size=5), OPTIM, pad_id=0, micro_batch_tokens=budget, reference=ref, chunk_size=5)


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.backend.policy.state_dict().items()}


def test_loss_and_updates_do_not_depend_on_the_micro_batch_split(tiny_model_dir):
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    st = stage()
    results = []
    for budget in (1, 28, 10**6):  # one sequence per micro-batch, about two, the whole mini-batch
        trainer = make_trainer(tiny_model_dir, budget)
        recs = [trainer.train_step(scored_groups(k, 4, 4, vocab, seed=3), version=k, stage=st) for k in range(2)]
        results.append((recs, weights(trainer)))
    (base_recs, base_w) = results[0]
    assert base_recs[0]["sgd_steps"] == 4 and base_recs[0]["n_sgd"] == 4
    assert base_recs[1]["kl_old"] > 0 and base_recs[1]["kl_ref"] > 0  # the updates moved the policy
    for recs, w in results[1:]:
        for a, b in zip(base_recs, recs):
            for key in ("loss", "pg_loss", "entropy", "kl_old", "kl_ref", "grad_norm", "pg_clipfrac_high", "pg_clipfrac_low"):
                assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), key
        for k in base_w:
            assert torch.allclose(w[k], base_w[k], rtol=0, atol=1e-9), k
    moved = max((base_w[k] - modeling.load_model(tiny_model_dir).state_dict()[k]).abs().max().item() for k in base_w)
    assert moved > 1e-3


def test_resuming_from_a_checkpoint_gives_the_same_next_step(tiny_model_dir, tmp_path):
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    st = stage(entropy={"adaptive": True, "target": 10.0, "delta": 0.01})  # entropy below target: c_k grows, the bonus is on
    batches = [scored_groups(k, 4, 4, vocab, seed=5) for k in range(3)]
    straight = make_trainer(tiny_model_dir, 64)
    recs = [straight.train_step(b, version=k, stage=st) for k, b in enumerate(batches)]

    first = make_trainer(tiny_model_dir, 64)
    for k in range(2):
        first.train_step(batches[k], version=k, stage=st)
        first.save_checkpoint(tmp_path, k + 1, keep=1)  # version k + 1, written in the background while step k + 1 trains
    first.wait_for_checkpoint()
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000002"]  # older ones deleted
    ckpt = latest_checkpoint(tmp_path, version=2)
    assert (ckpt / "model.safetensors").exists() and (ckpt / "config.json").exists() and (ckpt / "optimizer.pt").exists()

    # a new process: the policy from the HF-format checkpoint, then optimizer and controller state
    model = modeling.load_model(ckpt, dtype=torch.float64)
    ref = modeling.load_model(tiny_model_dir, dtype=torch.float64)
    resumed = Trainer(TorchBackend(model, OPTIM, torch.device("cpu"), chunk_size=5), OPTIM, 0, 64, reference=ref, chunk_size=5)
    assert resumed.load_checkpoint(ckpt) == 2  # the policy version it holds
    assert resumed.controller.coef == pytest.approx(0.02) and recs[2]["entropy_coef"] == pytest.approx(0.02)
    again = resumed.train_step(batches[2], version=2, stage=st)
    for key in ("loss", "pg_loss", "entropy", "kl_old", "grad_norm", "entropy_alpha"):
        assert again[key] == pytest.approx(recs[2][key], rel=1e-9, abs=1e-12), key
    w1, w2 = weights(straight), weights(resumed)
    for k in w1:
        assert torch.allclose(w1[k], w2[k], rtol=0, atol=1e-9), k

    fresh = make_trainer(tiny_model_dir, 64)  # without the optimizer state the step differs
    fresh.backend.policy.load_state_dict(modeling.load_model(ckpt, dtype=torch.float64).state_dict())
    assert fresh.train_step(batches[2], version=2, stage=st)["loss"] != pytest.approx(recs[2]["loss"], rel=1e-5)


def test_on_policy_step_has_ratio_one_and_reports_every_metric(tiny_model_dir):
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    st = stage(D_T=None, N_reuse=1, beta=0.0, dual_clip=None, entropy={"adaptive": True, "target": 0.2})
    trainer = make_trainer(tiny_model_dir, 64, with_reference=False)
    groups = scored_groups(0, 4, 4, vocab, seed=7)
    groups[1].scores[0].reward = 0.0  # group 1 now has all-zero rewards except...
    for sc in groups[1].scores:
        sc.reward = 1.0  # ...all equal: zero advantages, rejected
    rec = trainer.train_step(groups, version=0, stage=st)
    assert rec["sgd_steps"] == 1 and rec["kl_old"] == 0.0
    assert rec["pg_clipfrac_high"] == 0.0 and rec["pg_clipfrac_low"] == 0.0
    assert rec["zero_adv_group_ratio"] == 0.25 and rec["groups_rejected"] == 1 and rec["groups_trained"] == 3
    # untrained model: entropy near log(vocab), far above the target; c_0 = 0, gate off
    assert rec["entropy"] > 3.0 and rec["entropy_bonus_active"] == 0.0 and rec["entropy_coef"] == 0.0 and rec["entropy_alpha"] == 0.0
    for key in (
        "entropy", "entropy_target", "entropy_coef", "entropy_bonus_active", "pg_clipfrac_high", "pg_clipfrac_low", "kl_old", "grad_norm",
        "advantage_mean", "advantage_std", "advantage_abs_max", "zero_adv_group_ratio", "response_clip_ratio", "accuracy_all",
        "accuracy_nontruncated", "reward_mean", "kl_rollout", "loss", "pg_loss",
    ):
        assert key in rec, key
    # the on-policy loss at ratio 1 is minus the token-weighted mean advantage
    seqs, _ = build_sequences(groups, 0, st)
    flat = [s for g in seqs for s in g]
    expected = -sum(s.advantage * s.response_len for s in flat) / sum(s.response_len for s in flat)
    assert rec["pg_loss"] == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_rollout_correction_weights_the_update_by_the_sampler_mismatch(tiny_model_dir):
    """With the sampler's log-probs equal to the learner's the correction changes nothing; with a
    sampler that put a quarter of the learner's probability on every token, "truncate" weighs
    each token by C and "mask" drops them all, and the clipped share says so in every mode."""
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    groups = scored_groups(0, 4, 4, vocab, seed=11)
    probe = make_trainer(tiny_model_dir, 64, with_reference=False)
    learner_logp = {}  # the learner's own log-probs of every sampled token (policy version 0)
    st = stage(D_T=None, N_reuse=1, beta=0.0, dual_clip=None, entropy={"adaptive": False, "coef": 0.0})
    for i, g in enumerate(groups):
        for j, smp in enumerate(g.rollout.samples):
            ids = torch.tensor([list(g.rollout.prompt_ids) + list(smp.response_ids)])
            logp, _ = probe.backend.forward(ids, torch.ones_like(ids), st.temperature)
            n = len(smp.response_ids)
            learner_logp[i, j] = logp[0, -n:].tolist()

    def run(mode: str, shift: float):
        for i, g in enumerate(groups):
            for j, smp in enumerate(g.rollout.samples):
                del smp.logprobs[:]
                smp.logprobs.extend(x + shift for x in learner_logp[i, j])
        trainer = make_trainer(tiny_model_dir, 64, with_reference=False)
        rec = trainer.train_step(groups, version=0, stage=stage(D_T=None, N_reuse=1, beta=0.0, dual_clip=None, entropy={"adaptive": False, "coef": 0.0},
                                                               rollout_is=mode, rollout_is_threshold=2.0))
        return rec, weights(trainer)

    base, base_w = run("none", 0.0)
    same, same_w = run("truncate", 0.0)
    assert same["rollout_is_clipfrac"] == 0.0 and same["rollout_is_weight"] == pytest.approx(1.0, abs=1e-6)
    assert all(torch.allclose(same_w[k], base_w[k], atol=1e-6) for k in base_w)  # the sampler's log-probs travel as float32: w = 1 +- 1e-7
    far, _ = run("none", -math.log(4.0))  # w = 4 on every token, beyond C = 2
    assert far["rollout_is_clipfrac"] == pytest.approx(1.0) and far["kl_rollout"] > 0.5
    truncated, _ = run("truncate", -math.log(4.0))
    assert truncated["pg_loss"] == pytest.approx(2.0 * far["pg_loss"], rel=1e-6)  # every token weighted by C
    masked, masked_w = run("mask", -math.log(4.0))
    assert masked["pg_loss"] == 0.0 and masked["rollout_is_weight"] == 0.0


def test_versions_other_than_the_step_are_not_trained(tiny_model_dir):
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    trainer = make_trainer(tiny_model_dir, 64, with_reference=False)
    groups = scored_groups(3, 2, 4, vocab, seed=1)
    rec = trainer.train_step(groups, version=4, stage=stage(beta=0.0))
    assert rec["version_mismatch"] == 8 and rec["groups_dropped_version"] == 2 and rec["tokens_trained"] == 0.0


def test_a_stage_with_beta_needs_a_reference(tiny_model_dir):
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    trainer = make_trainer(tiny_model_dir, 64, with_reference=False)
    with pytest.raises(RuntimeError, match="reference"):
        trainer.train_step(scored_groups(0, 2, 4, vocab, seed=1), version=0, stage=stage())


def test_the_reference_is_loaded_at_the_first_step_with_beta(tiny_model_dir):
    """A stage with beta > 0 appended after the learner attached: the reference policy is loaded
    at its first step, once, and the step reports the KL to it."""
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    trainer = make_trainer(tiny_model_dir, 64, with_reference=False)
    loads = []
    trainer.load_reference = lambda: loads.append(1) or modeling.load_model(tiny_model_dir, dtype=torch.float64).requires_grad_(False)
    trainer.train_step(scored_groups(0, 2, 4, vocab, seed=1), version=0, stage=stage(beta=0.0))
    assert trainer.reference is None and loads == []
    for k in (1, 2):
        rec = trainer.train_step(scored_groups(k, 2, 4, vocab, seed=1), version=k, stage=stage())
        assert "kl_ref" in rec
    assert loads == [1] and trainer.reference is not None


def _flat_groups(groups, which):
    for i in which:
        for sc in groups[i].scores:
            sc.reward = 0.1  # penalty-shaped, identical: no relative signal
    return groups


@pytest.mark.parametrize("d_t, rejected, expected", [(2, 0, 8), (2, 3, 8), (2, 7, 8), (1, 7, 8)])
def test_n_sgd_is_d_r_over_d_t_times_n_reuse_after_rejection(tiny_model_dir, d_t, rejected, expected):
    """D_R 8, N_reuse 2: D_T 2 gives 8 optimizer steps whatever rejection drops (rule "count"),
    down to one sample per mini-batch; D_T 1 with one group of 4 samples left can only make 4
    mini-batches (8 steps instead of 16)."""
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    st = stage(D_R=8, D_T=d_t, N_reuse=2, beta=0.0)
    groups = _flat_groups(scored_groups(0, 8, 4, vocab, seed=2), range(rejected))
    trainer = make_trainer(tiny_model_dir, 64, with_reference=False)
    rec = trainer.train_step(groups, version=0, stage=st)
    assert rec["groups_rejected"] == rejected and rec["n_sgd"] == 8 // d_t * 2
    assert rec["sgd_steps"] == expected


def test_minibatch_rule_size_takes_fewer_steps_after_rejection(tiny_model_dir):
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    st = stage(D_R=8, D_T=2, N_reuse=2, beta=0.0, minibatch_rule="size")
    groups = _flat_groups(scored_groups(0, 8, 4, vocab, seed=2), range(3))
    rec = make_trainer(tiny_model_dir, 64, with_reference=False).train_step(groups, version=0, stage=st)
    assert rec["sgd_steps"] == 6  # 5 kept groups in mini-batches of 2, 2, 1; two passes


def test_split_minibatches_counts():
    from magic.learner.batching import Sequence, split_minibatches

    groups = [[Sequence([1, 2, 3], 1, [0.0, 0.0], 1.0) for _ in range(4)] for _ in range(5)]
    assert [len(m) for m in split_minibatches(groups, 4)] == [8, 4, 4, 4]
    assert [len(m) for m in split_minibatches(groups[:1], 3)] == [2, 1, 1]
    assert [len(m) for m in split_minibatches(groups, 4, "size", 2)] == [8, 8, 4]
    assert split_minibatches([], 4) == []
    with pytest.raises(ValueError, match="mini-batch rule"):
        split_minibatches(groups, 2, "often")


def test_ema_reference_follows_the_policy(tiny_model_dir, tmp_path):
    """kl_reference "ema": pi_ref starts at the policy of its first step and moves towards the
    policy by (1 - d) after every step; it is checkpointed and restored."""
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    st = stage(kl_reference="ema", kl_ema_decay=0.9)
    trainer = make_trainer(tiny_model_dir, 64, with_reference=False)
    trainer.load_reference = lambda: modeling.load_model(tiny_model_dir, dtype=torch.float64).requires_grad_(False)
    name = "model.layers.0.mlp.up_proj.weight"
    theta0 = weights(trainer)[name]
    rec0 = trainer.train_step(scored_groups(0, 4, 4, vocab, seed=3), version=0, stage=st)
    assert rec0["kl_ref"] > 0  # pi_ref = theta_0 while the 4 SGD steps move the policy away
    theta1 = weights(trainer)[name]
    ref = dict(trainer.ema_reference.named_parameters())[name]
    assert torch.allclose(ref, 0.9 * theta0 + 0.1 * theta1, atol=1e-12)
    assert trainer.reference is None  # the initial model is never loaded as a reference
    rec1 = trainer.train_step(scored_groups(1, 4, 4, vocab, seed=3), version=1, stage=st)
    theta2 = weights(trainer)[name]
    assert torch.allclose(dict(trainer.ema_reference.named_parameters())[name], 0.9 * (0.9 * theta0 + 0.1 * theta1) + 0.1 * theta2, atol=1e-12)
    assert rec1["kl_ref"] > 0

    trainer.save_checkpoint(tmp_path, 2, keep=1, background=False)
    ckpt = latest_checkpoint(tmp_path, version=2)
    resumed = Trainer(TorchBackend(modeling.load_model(ckpt, dtype=torch.float64), OPTIM, torch.device("cpu"), chunk_size=5), OPTIM, 0, 64, chunk_size=5,
                      load_reference=trainer.load_reference)
    resumed.load_checkpoint(ckpt)
    for k, v in trainer.ema_reference.state_dict().items():
        assert torch.equal(resumed.ema_reference.state_dict()[k], v), k
