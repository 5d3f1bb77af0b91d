"""The algorithm as small pure functions over tensors: advantages, masks, rejection, the MAGIC loss.

Each function names the paper equation it implements (Skywork-OR1, arXiv 2505.22312) and the
shapes it takes. Advantage estimators are registered by name; registering a name twice is an
error. verl's `trainer/ppo/core_algos.py` is the numerical reference where it agrees with the
paper; where it does not, the paper wins and the docstring says so.

Token-level mean over the whole training batch: every loss here is a *sum* over response tokens
divided by a token count the caller passes in (`num_tokens` = T_k of eq. 3.1, the count of all
response tokens of the SGD mini-batch across micro-batches and data-parallel ranks). Summing the
micro-batch losses computed this way gives exactly the batch mean, however the batch is split —
unlike the per-micro-batch mean of verl's and Skywork-OR1's released code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from magic.config.registry import Registry
from magic.config.schema import StageConfig

AdvantageFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
_ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")

EPS = 1e-6
"""Added to a standard deviation before dividing by it (verl's `epsilon`)."""


register_advantage = _ADVANTAGES.register
"""Decorator registering an advantage estimator by name (twice is an error)."""


def get_advantage(name: str) -> AdvantageFn:
    """The estimator registered under `name` (ValueError listing the known ones otherwise)."""
    return _ADVANTAGES.lookup(name)


# -- statistics over masked groups ------------------------------------------------------------


def _check(rewards: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (groups, group_size), got shape {tuple(rewards.shape)}")
    if mask is None:
        return torch.ones_like(rewards, dtype=torch.bool)
    if mask.shape != rewards.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} differs from rewards shape {tuple(rewards.shape)}")
    return mask.bool()


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    m = mask.to(x.dtype)
    n = m.sum() if dim is None else m.sum(dim=dim, keepdim=True)
    s = (x * m).sum() if dim is None else (x * m).sum(dim=dim, keepdim=True)
    return s / n.clamp(min=1), n


def _masked_std(x: torch.Tensor, mask: torch.Tensor, dim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Unbiased (n - 1) standard deviation over the masked entries (torch.std's default, as verl)."""
    mean, n = _masked_mean(x, mask, dim)
    sq = ((x - mean) ** 2) * mask.to(x.dtype)
    ss = sq.sum() if dim is None else sq.sum(dim=dim, keepdim=True)
    return (ss / (n - 1).clamp(min=1)).sqrt(), n


def reward_spread(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """max - min of each group's counted rewards: (G, gs) -> (G,); 0 for a group with no counted sample.

    >>> reward_spread(torch.tensor([[0.1] * 7, [0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5]]), torch.ones(2, 7, dtype=torch.bool))
    tensor([0., 1.])
    """
    big = torch.finfo(rewards.dtype).max
    hi = torch.where(mask, rewards, torch.full_like(rewards, -big)).max(dim=1).values
    lo = torch.where(mask, rewards, torch.full_like(rewards, big)).min(dim=1).values
    return torch.where(mask.any(dim=1), hi - lo, torch.zeros_like(hi))


def _centered(rewards: torch.Tensor, mean: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """r - mean_group, exactly 0 in a group whose counted rewards are all equal: float rounding of
    the mean (seven rewards of 0.1 in float32) must not turn a flat group into a signal."""
    flat = (reward_spread(rewards, mask) == 0)[:, None]
    return torch.where(flat, torch.zeros_like(rewards), rewards - mean)


def _finish(adv: torch.Tensor, mask: torch.Tensor, enough: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Zero the advantages of samples outside the statistics and of groups with fewer than 2 counted samples."""
    adv = torch.where(mask & enough, adv, torch.zeros_like(adv))
    counted = adv[mask] if bool(mask.any()) else adv.new_zeros(1)
    return adv, {
        "advantage_mean": counted.mean().item(),
        "advantage_std": counted.std().item() if counted.numel() > 1 else 0.0,
        "advantage_abs_max": counted.abs().max().item(),
    }


@register_advantage("grpo")
def grpo_advantages(rewards: torch.Tensor, mask: torch.Tensor | None = None, eps: float = EPS) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO group normalisation (paper eq. 2.5): A_ij = (r_ij - mean_j r_ij) / (std_j r_ij + eps).

    The std is the unbiased one over the group's samples, eps = 1e-6 (verl's
    `compute_grpo_outcome_advantage`). rewards: (G, gs); mask: (G, gs) bool, the samples that
    enter the group statistics (the others get advantage 0; see `truncation_mask`). A group with
    fewer than 2 counted samples has no relative signal and gets 0 (verl would use mean 0, std 1
    for a group of one). Returns advantages (G, gs), constant over each response's tokens.
    """
    mask = _check(rewards, mask)
    mean, n = _masked_mean(rewards, mask, dim=1)
    std, _ = _masked_std(rewards, mask, dim=1)
    return _finish(_centered(rewards, mean, mask) / (std + eps), mask, n >= 2)


@register_advantage("drgrpo")
def drgrpo_advantages(rewards: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Dr.GRPO (Liu et al. 2025): A_ij = r_ij - mean_j r_ij, no division by the group std
    (verl's GRPO with `norm_adv_by_std_in_grpo=False`). Shapes as `grpo_advantages`."""
    mask = _check(rewards, mask)
    mean, n = _masked_mean(rewards, mask, dim=1)
    return _finish(_centered(rewards, mean, mask), mask, n >= 2)


@register_advantage("rloo")
def rloo_advantages(rewards: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """RLOO (Ahmadian et al. 2024): A_ij = r_ij - mean of the group's *other* samples
    = n/(n-1) * (r_ij - mean_j r_ij) (verl's `compute_rloo_outcome_advantage`). Shapes as `grpo_advantages`."""
    mask = _check(rewards, mask)
    mean, n = _masked_mean(rewards, mask, dim=1)
    return _finish(_centered(rewards, mean, mask) * n / (n - 1).clamp(min=1), mask, n >= 2)


@register_advantage("batch")
def batch_advantages(rewards: torch.Tensor, mask: torch.Tensor | None = None, eps: float = EPS) -> tuple[torch.Tensor, dict[str, float]]:
    """Batch-level normalisation (REINFORCE++-style): A_ij = (r_ij - mean(r)) / (std(r) + eps), mean and
    unbiased std over every counted sample of the rollout batch. Shapes as `grpo_advantages`."""
    mask = _check(rewards, mask)
    mean, n = _masked_mean(rewards, mask, dim=None)
    std, _ = _masked_std(rewards, mask, dim=None)
    enough = torch.full_like(mask, bool(n >= 2))
    return _finish((rewards - mean) / (std + eps), mask, enough)


@register_advantage("lite_ppo")
def lite_ppo_advantages(rewards: torch.Tensor, mask: torch.Tensor | None = None, eps: float = EPS) -> tuple[torch.Tensor, dict[str, float]]:
    """LitePPO (Liu et al. 2025, "Tricks or Traps"): group mean, batch std —
    A_ij = (r_ij - mean_j r_ij) / (std(r) + eps), the unbiased std of the rewards over every counted
    sample of the rollout batch. Shapes as `grpo_advantages`."""
    mask = _check(rewards, mask)
    mean, n = _masked_mean(rewards, mask, dim=1)
    std, _ = _masked_std(rewards, mask, dim=None)
    return _finish(_centered(rewards, mean, mask) / (std + eps), mask, n >= 2)


def truncation_mask(strategy: str, truncated: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantage mask for truncated responses (paper §3.2.3).

    truncated: (G, gs) bool, responses cut at the context length T; valid: (G, gs) bool, real
    samples (False on padding of ragged groups). Returns (stats_mask, keep):
      - `none`:   truncated responses are ordinary samples (reward 0, so usually a negative advantage);
      - `before`: Adv-Mask-Before — truncated responses are left out of the group statistics and
                  get advantage 0 (mean/std over the group's non-truncated rewards R̂_i);
      - `after`:  Adv-Mask-After — truncated responses count in the statistics (mean/std over R_i),
                  then get advantage 0.
    Compute advantages with `stats_mask`, then multiply by `keep`.
    """
    valid = torch.ones_like(truncated, dtype=torch.bool) if valid is None else valid.bool()
    truncated = truncated.bool() & valid
    if strategy == "none":
        return valid, valid
    if strategy == "before":
        return valid & ~truncated, valid & ~truncated
    if strategy == "after":
        return valid, valid & ~truncated
    raise ValueError(f"unknown advantage mask {strategy!r}; known: none, before, after")


def compute_advantages(
    estimator: str, rewards: torch.Tensor, truncated: torch.Tensor, valid: torch.Tensor | None = None, mask_strategy: str = "none"
) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages (G, gs) of a rollout batch: the estimator over the statistics mask, then the truncation mask."""
    stats_mask, keep = truncation_mask(mask_strategy, truncated, valid)
    adv, metrics = get_advantage(estimator)(rewards, stats_mask)
    return adv * keep.to(adv.dtype), metrics


def zero_advantage_groups(adv: torch.Tensor, atol: float = 0.0) -> torch.Tensor:
    """Groups whose advantages are all zero: (G,) bool."""
    return (adv.abs() <= atol).all(dim=1)


def rejected_groups(rewards: torch.Tensor, stats_mask: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """Rejection sampling (paper §3.1, below eq. 2.5): the groups with no relative signal, (G,) bool.

    A group is rejected when the rewards that count in its statistics (`stats_mask`) are all
    equal — max - min = 0, decided on the rewards themselves, not on float advantages, so seven
    penalty-shaped rewards of 0.1 are rejected like seven 0s — or when fewer than two count, or
    when every advantage is exactly 0 after the truncation mask (e.g. a group all truncated under
    Adv-Mask-After). They carry no policy-gradient signal but would still weigh in the entropy
    and KL terms. rewards, stats_mask, adv: (G, gs).

    >>> r = torch.tensor([[0.1] * 4, [0.0, 1.0, 0.0, 0.0]]); m = torch.ones(2, 4, dtype=torch.bool)
    >>> rejected_groups(r, m, torch.tensor([[7e-3] * 4, [-0.5, 1.5, -0.5, -0.5]]))
    tensor([ True, False])
    """
    few = stats_mask.sum(dim=1) < 2
    return (reward_spread(rewards, stats_mask) == 0) | few | zero_advantage_groups(adv)


# -- the loss (eq. 3.1 with §3.2.6's k3 term) -------------------------------------------------


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Token-level k3 estimator of KL(pi_theta || pi_ref) (paper §3.2.6, Schulman's k3):
    pi_ref/pi_theta - log(pi_ref/pi_theta) - 1 >= 0, elementwise on (B, L). verl's `low_var_kl`
    also clamps it to [-10, 10]; the paper does not, nor do we."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


ROLLOUT_IS_MODES = ("none", "truncate", "mask")


def rollout_is_weights(
    prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, mode: str, threshold: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Importance weights of the policy the loss is taken around over the policy that sampled:
    w = pi_prox / pi_behav = exp(prox_logp - behav_logp) per token (no gradient). pi_prox is the
    learner's policy version k (its own log-probs); pi_behav the sampler's (vLLM's, in bf16: the
    rollout/learner mismatch; or an older version with bounded staleness — the decoupled PPO
    objective of AReaL, Fu et al. 2025, takes its clipped ratio around pi_prox and this weight).

    - "truncate" (truncated IS, Yao et al. 2025's TIS; verl's rollout_is): min(w, C);
    - "mask" (masked IS): w where 1/C <= w <= C, else 0 (the token does not train);
    - "none": 1 (the paper's recipe), the metrics still measured.

    Returns (B, L) weights and sums over the masked tokens: `rollout_is_weight` (of the weights
    applied) and `rollout_is_clipfrac` (tokens whose w is beyond C, or outside [1/C, C] with "mask").

    >>> w, s = rollout_is_weights(torch.log(torch.tensor([[0.5, 0.9, 0.1]])), torch.log(torch.tensor([[0.5, 0.3, 0.4]])), torch.ones(1, 3), "truncate", 2.0)
    >>> [round(x, 4) for x in w[0].tolist()], s["rollout_is_clipfrac"].item()
    ([1.0, 2.0, 0.25], 1.0)
    >>> w, s = rollout_is_weights(torch.log(torch.tensor([[0.5, 0.9, 0.1]])), torch.log(torch.tensor([[0.5, 0.3, 0.4]])), torch.ones(1, 3), "mask", 2.0)
    >>> [round(x, 4) for x in w[0].tolist()], s["rollout_is_clipfrac"].item()
    ([1.0, 0.0, 0.0], 2.0)
    """
    if mode not in ROLLOUT_IS_MODES:
        raise ValueError(f"rollout_is must be one of {ROLLOUT_IS_MODES}, got {mode!r}")
    m = mask.to(torch.float64)
    with torch.no_grad():
        log_w = (prox_logp.detach().double() - behav_logp.double()) * m  # 0 off the response: w = 1 there
        w = torch.exp(torch.clamp(log_w, max=80.0))
        if mode == "mask":
            beyond = (w > threshold) | (w < 1.0 / threshold)
            applied = torch.where(beyond, torch.zeros_like(w), w)
        else:
            beyond = w > threshold
            applied = torch.clamp(w, max=threshold) if mode == "truncate" else torch.ones_like(w)
        sums = {"rollout_is_weight": (applied * m).sum(), "rollout_is_clipfrac": (beyond.to(torch.float64) * m).sum()}
    return applied.to(prox_logp.dtype), sums


def behaviour_weights(
    prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, stale: torch.Tensor | None, mode: str, threshold: float
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """The per-token weights of the policy-gradient term, pi_prox / pi_behav (`rollout_is_weights`),
    for a batch whose samples come from the step's own version (fresh) or, with bounded staleness,
    from an older one (`stale`, (B, 1) bool): the decoupled PPO objective (AReaL, Fu et al. 2025)
    always weights a stale sample's tokens — truncated at C, or masked outside [1/C, C] when `mode`
    is "mask" — and fresh tokens as `mode` says ("none": unweighted, the paper's recipe).

    Returns the weights to apply (None: no token is weighted) and the sums of `rollout_is_weights`
    over every response token (fresh and stale).

    >>> prox = torch.log(torch.tensor([[0.9, 0.9], [0.9, 0.1]])); behav = torch.log(torch.tensor([[0.3, 0.3], [0.3, 0.4]]))
    >>> w, s = behaviour_weights(prox, behav, torch.ones(2, 2), torch.tensor([[False], [True]]), "none", 2.0)
    >>> [[round(x, 4) for x in row] for row in w.tolist()], s["rollout_is_clipfrac"].item()
    ([[1.0, 1.0], [2.0, 0.25]], 3.0)
    """
    stale_mode = "mask" if mode == "mask" else "truncate"
    if stale is None or mode == stale_mode or not bool(stale.any()):  # every token weighted alike
        weights, sums = rollout_is_weights(prox_logp, behav_logp, mask, mode, threshold)
        return (weights if mode != "none" else None), sums
    m = mask.to(torch.float64)
    s = stale.expand_as(mask).to(torch.float64)
    w_fresh, fresh = rollout_is_weights(prox_logp, behav_logp, m * (1 - s), mode, threshold)
    w_stale, old = rollout_is_weights(prox_logp, behav_logp, m * s, stale_mode, threshold)
    weights = torch.where(stale.expand_as(w_fresh), w_stale, w_fresh)
    return weights, {k: fresh[k] + old[k] for k in fresh}


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: int | float,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level PPO clipped policy loss with clip-higher (the first term of paper eq. 3.1).

    L = -(1/N) * sum_tokens min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A),
    rho = exp(logp - old_logp), N = `num_tokens` (all response tokens of the SGD mini-batch).
    Dual clip (Ye et al. 2020, verl's `clip_ratio_c`): for A < 0 the per-token loss is capped at
    -dual_clip * A. `is_weights` (B, L), when given, multiplies each token's term (no gradient
    through them): the decoupled objective, w_t * min(rho_t A, clip(rho_t) A), with rho taken
    around old_logp = pi_prox and w = pi_prox / pi_behav (`rollout_is_weights`).

    logp, old_logp: (B, L) log-probabilities of the taken tokens; advantages: (B, L) or (B, 1);
    mask: (B, L) 1 on response tokens. Returns the loss (this micro-batch's share of the batch
    mean) and metric *sums* over the micro-batch's tokens (divide by N after accumulating):
    tokens clipped on the high side (rho > 1 + clip_high, A > 0), the low side (rho < 1 - clip_low,
    A < 0), by the dual clip, and two divergences between pi_old and pi_theta on the sampled tokens:

    - `kl_old`: k3 of KL(pi_theta || pi_old), pi_old/pi_theta - log(pi_old/pi_theta) - 1 >= 0 per
      token (the same form as the reference term `k3_kl`, which estimates KL(pi_theta || pi_ref));
    - `ppo_kl`: verl's `ppo_kl`, log pi_old - log pi_theta per token (k1; its mean estimates
      KL(pi_old || pi_theta) over tokens sampled from pi_old, and may be negative on a batch).
    """
    mask = mask.to(logp.dtype)
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(per_token, dtype=torch.bool)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (per_token > cap)
        per_token = torch.where(advantages < 0, torch.minimum(per_token, cap), per_token)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = (per_token * mask).sum() / num_tokens
    with torch.no_grad():
        adv = advantages.expand_as(ratio)
        sums = {
            "pg_clipfrac_high": (((ratio > 1.0 + clip_high) & (adv > 0)).to(logp.dtype) * mask).sum(),
            "pg_clipfrac_low": (((ratio < 1.0 - clip_low) & (adv < 0)).to(logp.dtype) * mask).sum(),
            "pg_clipfrac_dual": (dual.to(logp.dtype) * mask).sum(),
            "kl_old": (k3_kl(logp.detach(), old_logp) * mask).sum(),
            "ppo_kl": ((old_logp - logp.detach()) * mask).sum(),
        }
    return loss, sums


@dataclass(frozen=True)
class LossConfig:
    """The coefficients of one SGD step's loss, built once from the stage (`for_stage`) and passed whole."""

    clip_low: float
    """eps_low: the ratio is clipped below at 1 - clip_low."""
    clip_high: float
    """eps_high: the ratio is clipped above at 1 + clip_high (clip-higher)."""
    dual_clip: float | None = None
    """c of dual-clip PPO (None: off)."""
    entropy_coef: float = 0.0
    """alpha_k, the entropy bonus's coefficient this step (§3.2.5)."""
    kl_coef: float = 0.0
    """beta, the weight of the k3 KL to the reference policy (§3.2.6)."""
    rollout_is: str = "none"
    """The sampler/learner correction (`rollout_is_weights`): "none", "truncate" or "mask"."""
    rollout_is_threshold: float = 2.0
    """C of `rollout_is`."""

    @classmethod
    def for_stage(cls, stage: StageConfig, entropy_coef: float) -> "LossConfig":
        """The stage's clip range, dual clip, beta and rollout correction, with this step's alpha_k."""
        return cls(stage.clip_low, stage.clip_high, stage.dual_clip, entropy_coef, stage.kl_coef, stage.rollout_is, stage.rollout_is_threshold)


def magic_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: int | float,
    config: LossConfig,
    *,
    entropy: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    behaviour_logp: torch.Tensor | None = None,
    stale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The MAGIC objective (paper eq. 3.1 plus the k3 term of §3.2.6), token-level over the batch:

        L = -(1/T_k) sum_tokens [ min(rho A, clip(rho) A) + alpha_k H ] + (beta/T_k) sum_tokens k3(pi_theta, pi_ref)

    with alpha_k = `config.entropy_coef` and beta = `config.kl_coef`. entropy: (B, L)
    full-vocabulary entropy of pi_theta at each position (needed when alpha_k > 0); ref_logp:
    (B, L) reference log-probs (needed when beta > 0); behaviour_logp: (B, L) the sampler's
    log-probs of the sampled tokens: with `config.rollout_is` the policy-gradient term of each
    token is weighted by `rollout_is_weights(old_logp, behaviour_logp)` (old_logp is pi_prox, the
    learner's policy version k), and its sums are reported in every mode; stale: (B, 1) bool,
    samples an older version generated (bounded staleness), whose tokens are always weighted
    (the decoupled objective, `behaviour_weights`). Returns this
    micro-batch's share of the loss and metric sums over its tokens (see `ppo_clip_loss`, plus
    `loss`, `pg_loss`, `entropy`, `kl_ref`, `rollout_is_weight`, `rollout_is_clipfrac`).
    """
    entropy_coef, kl_coef = config.entropy_coef, config.kl_coef
    weights, is_sums = None, {}
    if behaviour_logp is not None:
        weights, is_sums = behaviour_weights(old_logp, behaviour_logp, mask, stale, config.rollout_is, config.rollout_is_threshold)
    elif config.rollout_is != "none" or (stale is not None and bool(stale.any())):
        raise ValueError("rollout_is and stale samples need the sampler's log-probs")
    loss, sums = ppo_clip_loss(logp, old_logp, advantages, mask, num_tokens, config.clip_low, config.clip_high, config.dual_clip, is_weights=weights)
    sums.update(is_sums)
    m = mask.to(logp.dtype)
    sums["pg_loss"] = loss.detach() * num_tokens
    if entropy is not None:
        ent_sum = (entropy * m).sum()
        sums["entropy"] = ent_sum.detach()
        if entropy_coef:
            loss = loss - entropy_coef * ent_sum / num_tokens
    elif entropy_coef:
        raise ValueError("an entropy coefficient needs the entropy")
    if kl_coef:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs the reference log-probs")
        kl_sum = (k3_kl(logp, ref_logp) * m).sum()
        sums["kl_ref"] = kl_sum.detach()
        loss = loss + kl_coef * kl_sum / num_tokens
    elif ref_logp is not None:
        sums["kl_ref"] = (k3_kl(logp.detach(), ref_logp) * m).sum()
    sums["loss"] = loss.detach() * num_tokens
    return loss, sums
