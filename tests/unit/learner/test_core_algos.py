"""Hand-computed values for every advantage estimator, truncation mask, clip case, k3 and the entropy controller."""

import math

import pytest
import torch

from magic.learner import core_algos
from magic.learner.entropy import EntropyController

E = 1e-6
S3 = math.sqrt(1 / 3)  # unbiased std of {1, 0, 0, 1} and of {1, 0, 1}


def test_grpo_advantages_hand_computed():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv, _ = core_algos.grpo_advantages(rewards, eps=E)
    assert adv[0].tolist() == pytest.approx([0.5 / (S3 + E), -0.5 / (S3 + E), -0.5 / (S3 + E), 0.5 / (S3 + E)])
    # group 1: mean 0.75, unbiased std 0.5
    assert adv[1].tolist() == pytest.approx([0.25 / (0.5 + E)] * 3 + [-0.75 / (0.5 + E)])


def test_drgrpo_advantages_do_not_divide_by_the_std():
    adv, _ = core_algos.drgrpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 1.0, 1.0]]))
    assert adv.tolist() == [[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]]


def test_rloo_advantages_subtract_the_mean_of_the_others():
    adv, _ = core_algos.rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert adv[0].tolist() == pytest.approx([1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3])


def test_batch_advantages_normalise_over_the_whole_batch():
    # mean 0.75; deviations 0.25, -0.75, 0.25, 0.25 -> unbiased var 0.75 / 3 = 0.25, std 0.5
    adv, _ = core_algos.batch_advantages(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), eps=E)
    assert adv.flatten().tolist() == pytest.approx([0.25 / (0.5 + E), -0.75 / (0.5 + E), 0.25 / (0.5 + E), 0.25 / (0.5 + E)])


def test_lite_ppo_advantages_use_the_group_mean_and_the_batch_std():
    # group means 0.5 and 1; batch std of the rewards 0.5
    adv, _ = core_algos.lite_ppo_advantages(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), eps=E)
    assert adv.flatten().tolist() == pytest.approx([0.5 / (0.5 + E), -0.5 / (0.5 + E), 0.0, 0.0])


@pytest.mark.parametrize(
    "strategy, expected",
    [
        # none: truncated sample (index 2) is an ordinary reward-0 sample
        ("none", [0.5 / (S3 + E), -0.5 / (S3 + E), -0.5 / (S3 + E), 0.5 / (S3 + E)]),
        # before: statistics over {1, 0, 1}: mean 2/3, std sqrt(1/3); truncated -> 0
        ("before", [(1 / 3) / (S3 + E), (-2 / 3) / (S3 + E), 0.0, (1 / 3) / (S3 + E)]),
        # after: statistics over all four, then the truncated one -> 0
        ("after", [0.5 / (S3 + E), -0.5 / (S3 + E), 0.0, 0.5 / (S3 + E)]),
    ],
)
def test_truncation_masks_follow_section_3_2_3(strategy, expected):
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    truncated = torch.tensor([[False, False, True, False]])
    adv, _ = core_algos.compute_advantages("grpo", rewards, truncated, mask_strategy=strategy)
    assert adv[0].tolist() == pytest.approx(expected)


def test_mask_before_with_one_untruncated_sample_gives_zero_advantages():
    adv, _ = core_algos.compute_advantages("grpo", torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[False, True, True]]), mask_strategy="before")
    assert adv.tolist() == [[0.0, 0.0, 0.0]]
    assert core_algos.zero_advantage_groups(adv).tolist() == [True]


def test_ragged_groups_ignore_padding():
    rewards = torch.tensor([[1.0, 0.0, 7.0]])
    valid = torch.tensor([[True, True, False]])
    adv, _ = core_algos.compute_advantages("drgrpo", rewards, torch.zeros_like(valid), valid)
    assert adv.tolist() == [[0.5, -0.5, 0.0]]


def test_unknown_mask_and_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="unknown advantage mask"):
        core_algos.truncation_mask("sometimes", torch.zeros(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="groups, group_size"):
        core_algos.grpo_advantages(torch.zeros(4))


def test_zero_advantage_groups_are_detected():
    adv, _ = core_algos.grpo_advantages(torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 1.0]]))
    assert core_algos.zero_advantage_groups(adv).tolist() == [True, True, False]


def test_registry_refuses_duplicates_and_unknown_names():
    with pytest.raises(ValueError, match="already registered"):
        core_algos.register_advantage("grpo")(lambda r: (r, {}))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        core_algos.get_advantage("nope")


def _loss(ratios, adv, dual=None, cl=0.2, ch=0.28):
    old = torch.zeros(1, len(ratios))
    logp = torch.log(torch.tensor([ratios]))
    return core_algos.ppo_clip_loss(logp, old, torch.tensor([adv]), torch.ones(1, len(ratios)), len(ratios), cl, ch, dual)


def test_ppo_clip_loss_clips_each_side():
    # ratios 1.5 (A>0: clipped at 1.28), 0.5 (A<0: clipped at 0.8), 1.1 (A>0: not clipped)
    loss, sums = _loss([1.5, 0.5, 1.1], [2.0, -1.0, 1.0])
    assert loss.item() == pytest.approx(-(1.28 * 2.0 + 0.8 * -1.0 + 1.1 * 1.0) / 3, rel=1e-6)
    assert (sums["pg_clipfrac_high"].item(), sums["pg_clipfrac_low"].item()) == (1, 1)


def test_ppo_clip_does_not_clip_in_the_direction_that_hurts():
    # ratio 1.5 with A<0: min(1.5 * -1, 1.28 * -1) = -1.5 (no clip); ratio 0.5 with A>0: 0.5 (no clip)
    loss, sums = _loss([1.5, 0.5], [-1.0, 1.0])
    assert loss.item() == pytest.approx(-(-1.5 + 0.5) / 2, rel=1e-6)
    assert (sums["pg_clipfrac_high"].item(), sums["pg_clipfrac_low"].item()) == (0, 0)


def test_dual_clip_caps_the_loss_of_negative_advantages():
    # ratio 5, A=-1: PPO loss max(5, 0.8) = 5, capped at 3; ratio 2, A=-1: 2 < 3, kept; ratio 5, A=+1: 1.28 clip, no dual
    loss, sums = _loss([5.0, 2.0, 5.0], [-1.0, -1.0, 1.0], dual=3.0)
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.28) / 3, rel=1e-6)
    assert sums["pg_clipfrac_dual"].item() == 1
    no_dual, _ = _loss([5.0, 2.0, 5.0], [-1.0, -1.0, 1.0])
    assert no_dual.item() == pytest.approx((5.0 + 2.0 - 1.28) / 3, rel=1e-6)


def test_decoupled_loss_weights_each_token_by_the_truncated_proximal_over_behaviour_ratio():
    """AReaL's decoupled PPO objective: the ratio is taken around pi_prox (the learner's version k),
    each token weighted by w = min(pi_prox / pi_behav, C). Hand-computed: four tokens, C = 2."""
    prox = torch.log(torch.tensor([[0.5, 0.9, 0.1, 0.4]], dtype=torch.float64))
    behav = torch.log(torch.tensor([[0.5, 0.3, 0.4, 0.1]], dtype=torch.float64))  # w = 1, 3 -> 2, 0.25, 4 -> 2
    ratios = torch.tensor([[1.5, 1.0, 0.5, 1.1]], dtype=torch.float64)  # pi_theta / pi_prox
    logp = prox + torch.log(ratios)
    adv = torch.tensor([[2.0, 1.0, -1.0, -2.0]], dtype=torch.float64)
    mask = torch.ones(1, 4)
    config = core_algos.LossConfig(clip_low=0.2, clip_high=0.28, rollout_is="truncate", rollout_is_threshold=2.0)
    loss, sums = core_algos.magic_loss(logp, prox, adv, mask, 4, config, behaviour_logp=behav)
    # per token min(rho A, clip(rho) A): 1.28*2 = 2.56; 1*1 = 1; min(-0.5, -0.8) = -0.8; min(-2.2, -2.2) = -2.2
    expected = -(1.0 * 2.56 + 2.0 * 1.0 + 0.25 * -0.8 + 2.0 * -2.2) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert sums["rollout_is_clipfrac"].item() == 2 and sums["rollout_is_weight"].item() == pytest.approx(1 + 2 + 0.25 + 2)
    masked = core_algos.LossConfig(clip_low=0.2, clip_high=0.28, rollout_is="mask", rollout_is_threshold=2.0)
    loss, sums = core_algos.magic_loss(logp, prox, adv, mask, 4, masked, behaviour_logp=behav)
    assert loss.item() == pytest.approx(-(1.0 * 2.56) / 4, rel=1e-12)  # w = 3, 0.25 and 4 are outside [1/2, 2]: those tokens do not train
    assert sums["rollout_is_clipfrac"].item() == 3
    plain = core_algos.LossConfig(clip_low=0.2, clip_high=0.28)
    loss, sums = core_algos.magic_loss(logp, prox, adv, mask, 4, plain, behaviour_logp=behav)
    assert loss.item() == pytest.approx(-(2.56 + 1.0 - 0.8 - 2.2) / 4, rel=1e-12)  # "none": the paper's loss, the share still measured
    assert sums["rollout_is_clipfrac"].item() == 2
    logp.requires_grad_(True)  # the weights carry no gradient: d loss / d logp = w * (d per-token term)
    loss, _ = core_algos.magic_loss(logp, prox, adv, mask, 4, config, behaviour_logp=behav)
    loss.backward()
    # unclipped tokens (2nd: rho = 1, A = 1) have d/dlogp of -w rho A / N = -2 * 1 * 1 / 4
    assert logp.grad[0, 1].item() == pytest.approx(-0.5, rel=1e-12) and logp.grad[0, 0].item() == 0.0  # the 1st is clipped
    with pytest.raises(ValueError, match="sampler's log-probs"):
        core_algos.magic_loss(logp, prox, adv, mask, 4, config)


def test_stale_samples_always_get_the_decoupled_weight_and_fresh_ones_as_rollout_is_says():
    """Bounded staleness: a sample an older version generated (stale) is trained with the decoupled
    objective whatever `rollout_is` says — truncated at C, masked outside [1/C, C] with "mask" —,
    a sample of the step's own version as `rollout_is` says. Hand-computed: two samples of two
    tokens, C = 2, the second sample stale; every ratio pi_theta / pi_prox is 1 but the first token's."""
    prox = torch.log(torch.tensor([[0.9, 0.5], [0.9, 0.1]], dtype=torch.float64))
    behav = torch.log(torch.tensor([[0.3, 0.5], [0.3, 0.4]], dtype=torch.float64))  # w = 3, 1 | 3, 0.25
    ratios = torch.tensor([[1.1, 1.0], [1.0, 1.0]], dtype=torch.float64)
    logp = prox + torch.log(ratios)
    adv = torch.tensor([[1.0], [-2.0]], dtype=torch.float64)
    mask, stale = torch.ones(2, 2), torch.tensor([[False], [True]])

    def loss_of(mode: str, stale_mask=stale):
        config = core_algos.LossConfig(clip_low=0.2, clip_high=0.28, rollout_is=mode, rollout_is_threshold=2.0)
        return core_algos.magic_loss(logp, prox, adv, mask, 4, config, behaviour_logp=behav, stale=stale_mask)

    # "none": the fresh sample unweighted (1.1*1 + 1*1), the stale one min(3, 2) = 2 and 0.25 on -2 each
    loss, sums = loss_of("none")
    assert loss.item() == pytest.approx(-(1.1 + 1.0 + 2.0 * -2.0 + 0.25 * -2.0) / 4, rel=1e-12)
    assert sums["rollout_is_weight"].item() == pytest.approx(1 + 1 + 2 + 0.25) and sums["rollout_is_clipfrac"].item() == 2
    # "truncate": both truncated at 2 (the fresh sample's first token too)
    loss, _ = loss_of("truncate")
    assert loss.item() == pytest.approx(-(2.0 * 1.1 + 1.0 + 2.0 * -2.0 + 0.25 * -2.0) / 4, rel=1e-12)
    # "mask": w = 3 and 0.25 are outside [1/2, 2]: those tokens do not train, fresh or stale
    loss, sums = loss_of("mask")
    assert loss.item() == pytest.approx(-(1.0) / 4, rel=1e-12)
    assert sums["rollout_is_clipfrac"].item() == 3
    # no stale sample: the paper's loss with "none", as before
    loss, _ = loss_of("none", torch.zeros(2, 1, dtype=torch.bool))
    assert loss.item() == pytest.approx(-(1.1 + 1.0 - 2.0 - 2.0) / 4, rel=1e-12)
    with pytest.raises(ValueError, match="stale samples need the sampler's log-probs"):
        core_algos.magic_loss(logp, prox, adv, mask, 4, core_algos.LossConfig(clip_low=0.2, clip_high=0.28), stale=stale)


def test_ppo_clip_loss_is_a_token_sum_over_the_batch_count():
    torch.manual_seed(0)
    logp = torch.randn(4, 5)
    old = logp + 0.1 * torch.randn(4, 5)
    adv = torch.randn(4, 1)
    mask = (torch.rand(4, 5) > 0.3).float()
    n = mask.sum()
    whole, _ = core_algos.ppo_clip_loss(logp, old, adv, mask, n, 0.2, 0.28)
    parts = sum(core_algos.ppo_clip_loss(logp[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], n, 0.2, 0.28)[0] for i in range(4))
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_on_policy_gradient_is_minus_advantage_times_grad_logp():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = core_algos.ppo_clip_loss(logp, logp.detach(), torch.tensor([[3.0]]), torch.ones(1, 2), 2, 0.2, 0.28)
    loss.backward()
    assert loss.item() == pytest.approx(-3.0)
    assert logp.grad[0].tolist() == pytest.approx([-1.5, -1.5])


def test_k3_hand_computed():
    # pi = 0.5, pi_ref = 0.25: ratio 0.5 -> 0.5 - ln 0.5 - 1
    kl = core_algos.k3_kl(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]))
    assert kl.item() == pytest.approx(0.5 + math.log(2) - 1)
    assert core_algos.k3_kl(torch.tensor([-1.3]), torch.tensor([-1.3])).item() == 0.0


def test_magic_loss_adds_entropy_bonus_and_k3_over_the_batch_count():
    logp = torch.tensor([[math.log(0.5), math.log(0.5)]], requires_grad=True)
    ent = torch.tensor([[1.0, 2.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    adv = torch.zeros(1, 1)
    config = core_algos.LossConfig(clip_low=0.2, clip_high=0.28, entropy_coef=0.1, kl_coef=0.01)
    loss, sums = core_algos.magic_loss(logp, logp.detach(), adv, torch.ones(1, 2), 4, config, entropy=ent, ref_logp=ref)
    # -(0.1 * (1 + 2)) / 4 + 0.01 * (0.5 + ln 2 - 1 + 0) / 4
    assert loss.item() == pytest.approx(-0.3 / 4 + 0.01 * (0.5 + math.log(2) - 1) / 4, rel=1e-6)
    assert sums["entropy"].item() == 3.0
    assert sums["kl_ref"].item() == pytest.approx(0.5 + math.log(2) - 1)
    with pytest.raises(ValueError, match="reference"):
        core_algos.magic_loss(logp, logp.detach(), adv, torch.ones(1, 2), 2, core_algos.LossConfig(clip_low=0.2, clip_high=0.2, kl_coef=0.1))


def test_entropy_controller_follows_section_3_2_5():
    c = EntropyController()
    alpha = EntropyController.alpha
    assert c.coef == 0.0  # c_0 = 0
    assert alpha(c.coef, 0.1, 0.2, True, 0.0) == (0.0, True)  # gate on, but c_0 = 0
    assert c.update(0.1, 0.2, 0.005, 0.0, 0.1) == pytest.approx(0.005)  # e < tgt: +Delta
    assert c.update(0.1, 0.2, 0.005, 0.0, 0.1) == pytest.approx(0.010)
    # boundary e = tgt: the bonus is on (e <= tgt) and c stays
    assert alpha(c.coef, 0.2, 0.2, True, 0.0) == (pytest.approx(0.010), True)
    assert c.update(0.2, 0.2, 0.005, 0.0, 0.1) == pytest.approx(0.010)
    # e > tgt: bonus off, c decreases
    assert alpha(c.coef, 0.3, 0.2, True, 0.0) == (0.0, False)
    assert c.update(0.3, 0.2, 0.005, 0.0, 0.1) == pytest.approx(0.005)
    assert c.update(0.3, 0.2, 0.005, 0.0, 0.1) == pytest.approx(0.0)
    assert c.update(0.3, 0.2, 0.005, 0.0, 0.1) == 0.0  # lower bound
    for _ in range(50):
        c.update(0.0, 0.2, 0.005, 0.0, 0.02)
    assert c.coef == pytest.approx(0.02)  # upper bound
    assert c.step == 56
    # not adaptive: a constant coefficient, always applied
    assert alpha(0.0, 0.9, 0.2, False, 0.003) == (0.003, True)
    restored = EntropyController()
    restored.load_state_dict(c.state_dict())
    assert restored == c


def test_entropy_controller_decides_one_steps_gate_and_coefficient():
    """The step's decisions as the trainer uses them: e_k is measured before the update only when
    alpha_k depends on it (adaptive, c_k > 0); otherwise the gate comes from the update pass."""
    from magic.config.schema import EntropyControl

    ent = EntropyControl(target=0.2, delta=0.005, coef_max=0.1)
    c = EntropyController()
    assert not c.gate_needs_entropy_first(ent) and c.alpha_for(ent, None) == (0.0, None)  # c_0 = 0
    assert c.finish_step(ent, 0.1, None) is True and c.coef == pytest.approx(0.005)  # e_k < tgt: gate on, +Delta
    assert c.gate_needs_entropy_first(ent) and c.current(ent) == pytest.approx(0.005)
    alpha, gate = c.alpha_for(ent, 0.3)
    assert (alpha, gate) == (0.0, False)  # e_k > tgt: no bonus this step
    assert c.finish_step(ent, 0.3, gate) is False and c.coef == 0.0
    constant = EntropyControl(adaptive=False, coef=0.003)
    assert not c.gate_needs_entropy_first(constant) and c.alpha_for(constant, None) == (0.003, True)
    assert c.finish_step(constant, 0.9, True) is True and c.coef == 0.0 and c.current(constant) == 0.003


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo", "lite_ppo"])
def test_identical_non_binary_rewards_give_exactly_zero_advantages_and_are_rejected(estimator):
    """Seven penalty-shaped rewards of 0.1: float32 rounding of the group mean must not leave a
    signal (it left |A| ~ 0.0074 under GRPO's 1e-6 epsilon)."""
    rewards = torch.tensor([[0.1] * 7, [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 1.1], [-0.3] * 7], dtype=torch.float32)
    truncated = torch.zeros_like(rewards, dtype=torch.bool)
    adv, _ = core_algos.compute_advantages(estimator, rewards, truncated)
    assert adv[0].abs().max().item() == 0.0 and adv[2].abs().max().item() == 0.0
    assert adv[1].abs().max().item() > 0
    stats, _ = core_algos.truncation_mask("none", truncated)
    assert core_algos.rejected_groups(rewards, stats, adv).tolist() == [True, False, True]


def test_rejection_looks_at_the_rewards_that_count():
    """Adv-Mask-Before leaves truncated rewards out of the statistics: a group whose counted
    rewards are equal is rejected even though a truncated one differs; under `none` it is kept."""
    rewards = torch.tensor([[0.5, 0.5, 0.0]])
    truncated = torch.tensor([[False, False, True]])
    for strategy, rejected in (("before", True), ("none", False), ("after", False)):
        adv, _ = core_algos.compute_advantages("grpo", rewards, truncated, mask_strategy=strategy)
        stats, _ = core_algos.truncation_mask(strategy, truncated)
        assert core_algos.rejected_groups(rewards, stats, adv).tolist() == [rejected], strategy
    # every sample truncated under `after`: the rewards differ, the advantages are all masked to 0
    adv, _ = core_algos.compute_advantages("grpo", torch.tensor([[0.0, -0.5]]), torch.tensor([[True, True]]), mask_strategy="after")
    stats, _ = core_algos.truncation_mask("after", torch.tensor([[True, True]]))
    assert core_algos.rejected_groups(torch.tensor([[0.0, -0.5]]), stats, adv).tolist() == [True]


def test_kl_old_is_k3_of_kl_theta_old_and_ppo_kl_is_verls():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    old = torch.log(torch.tensor([[0.4, 0.3, 0.9]]))
    _, sums = core_algos.ppo_clip_loss(logp, old, torch.ones(1, 1), torch.ones(1, 3), 3, 0.2, 0.28)
    r = (old - logp).exp()  # pi_old / pi_theta
    assert sums["kl_old"].item() == pytest.approx((r - r.log() - 1).sum().item())
    assert sums["ppo_kl"].item() == pytest.approx((old - logp).sum().item())  # verl: mean(log pi_old - log pi_theta)


def test_doctests():
    import doctest

    from magic.config import schema as config
    from magic.learner import batching, trainer

    assert doctest.testmod(core_algos).failed == 0
    assert doctest.testmod(trainer).failed == 0
    assert doctest.testmod(batching).failed == 0
    assert doctest.testmod(config).failed == 0
