import math

import pytest
import torch

from magic.learner import core_algos


def test_grpo_advantages_hand_computed():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv, _ = core_algos.grpo_advantages(rewards, eps=1e-6)
    # group 0: mean 0.5, unbiased std sqrt(1/3)
    s0 = math.sqrt(1 / 3)
    assert adv[0].tolist() == pytest.approx([0.5 / (s0 + 1e-6), -0.5 / (s0 + 1e-6), -0.5 / (s0 + 1e-6), 0.5 / (s0 + 1e-6)])
    # group 1: mean 0.75, unbiased std 0.5
    assert adv[1].tolist() == pytest.approx([0.25 / 0.500001, 0.25 / 0.500001, 0.25 / 0.500001, -0.75 / 0.500001])


def test_zero_advantage_groups_are_detected():
    adv, _ = core_algos.grpo_advantages(torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 1.0]]))
    assert core_algos.zero_advantage_groups(adv).tolist() == [True, True, False]


def test_registry_refuses_duplicates_and_unknown_names():
    with pytest.raises(ValueError, match="already registered"):
        core_algos.register_advantage("grpo")(lambda r: (r, {}))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        core_algos.get_advantage("nope")


def test_ppo_clip_loss_clips_each_side():
    # ratios 1.5 (A>0: clipped at 1.28), 0.5 (A<0: clipped at 0.8), 1.1 (A>0: not clipped)
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    adv = torch.tensor([[2.0, -1.0, 1.0]])
    mask = torch.ones(1, 3)
    loss, sums = core_algos.ppo_clip_loss(logp, old, adv, mask, num_tokens=3, clip_low=0.2, clip_high=0.28)
    expected = -(1.28 * 2.0 + 0.8 * -1.0 + 1.1 * 1.0) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert sums["pg_clipfrac_high"].item() == 1
    assert sums["pg_clipfrac_low"].item() == 1


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
    adv = torch.tensor([[3.0]])
    loss, _ = core_algos.ppo_clip_loss(logp, logp.detach(), adv, torch.ones(1, 2), 2, 0.2, 0.28)
    loss.backward()
    assert loss.item() == pytest.approx(-3.0)
    assert logp.grad[0].tolist() == pytest.approx([-1.5, -1.5])
