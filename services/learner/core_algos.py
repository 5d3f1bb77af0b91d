"""The algorithm as small pure functions over tensors: advantages and the policy loss.

Each function names the paper equation it implements (Skywork-OR1, arXiv 2505.22312) and the
shapes it takes. Variants are registered by name; registering a name twice is an error.

Token-level mean: the policy loss is a *sum* over response tokens divided by a token count the
caller passes in (`num_tokens`), the count of all response tokens in the whole training batch.
Summing the micro-batch losses computed this way gives exactly the batch mean, however the batch
is split — unlike a per-micro-batch mean.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

AdvantageFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
_ADVANTAGES: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    def wrap(fn: AdvantageFn) -> AdvantageFn:
        if name in _ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        _ADVANTAGES[name] = fn
        return fn

    return wrap


def get_advantage(name: str) -> AdvantageFn:
    try:
        return _ADVANTAGES[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(_ADVANTAGES)}") from None


@register_advantage("grpo")
def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO group-normalised advantages (paper eq. 2.5).

    A_ij = (r_ij - mean_j r_ij) / (std_j r_ij + eps), with the unbiased standard deviation over
    the gs samples of group i (as verl's `compute_grpo_outcome_advantage`).

    rewards: (G, gs) scalar reward per sample. Returns advantages (G, gs), constant over the
    tokens of each response, and metrics.
    """
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=True)
    adv = (rewards - mean) / (std + eps)
    return adv, {"advantage_mean": adv.mean().item(), "advantage_abs_max": adv.abs().max().item()}


def zero_advantage_groups(adv: torch.Tensor, atol: float = 0.0) -> torch.Tensor:
    """Groups whose advantages are all zero (every sample got the same reward): (G,) bool.

    Rejection sampling drops them: they carry no policy-gradient signal.
    """
    return (adv.abs() <= atol).all(dim=1)


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: int | float,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level PPO clipped policy loss with clip-higher (paper eq. 3.1, without entropy/KL terms).

    L = -(1/N) * sum_{tokens} min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A),
    rho = exp(logp - old_logp), N = `num_tokens` (all response tokens of the training batch).

    logp, old_logp: (B, L) log-probabilities of the taken tokens; advantages: (B, L) or (B, 1);
    mask: (B, L) 1 on response tokens. Returns the loss (this micro-batch's share of the batch
    mean) and metric *sums* over the micro-batch (divide by N after accumulating): clipped-token
    counts on each side.
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    loss = (per_token * mask).sum() / num_tokens
    with torch.no_grad():
        high = ((ratio > 1.0 + clip_high) & (advantages > 0)).to(logp.dtype)
        low = ((ratio < 1.0 - clip_low) & (advantages < 0)).to(logp.dtype)
        sums = {
            "pg_clipfrac_high": (high * mask).sum(),
            "pg_clipfrac_low": (low * mask).sum(),
        }
    return loss, sums
