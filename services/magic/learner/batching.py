"""The rollout batch laid out for training: advantages and rejection per group, SGD mini-batches
(eq. 4.1), each rank's share, token-budgeted micro-batches, and padded tensors.

    build_sequences     advantages of the rollout batch (estimator + truncation mask), groups
                        without reward spread rejected                        (eq. 2.5, §3.2.3)
    split_minibatches   the kept groups as D_R / D_T SGD mini-batches          (eq. 4.1)
    shard               this rank's share of a mini-batch (balanced tokens)
    micro_batches       sequences packed under a token budget
    collate             right-padded tensors of one micro-batch
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from magic.config.schema import StageConfig
from magic.learner import core_algos
from magic.protocol.pb import messages_pb2 as pb


@dataclass
class Sequence:
    """One sample laid out for training."""

    token_ids: list[int]  # prompt + response
    prompt_len: int
    rollout_logprobs: list[float]  # one per response token
    advantage: float
    old_logp: torch.Tensor | None = None  # (response_len,) log pi_k, filled by the no-grad pass
    ref_logp: torch.Tensor | None = None  # (response_len,) log pi_ref, filled when beta > 0

    @property
    def response_len(self) -> int:
        return len(self.token_ids) - self.prompt_len


@dataclass
class RolloutBatchStats:
    """Figures about the rollout batch itself (before rejection)."""

    samples: int
    version_mismatch: int
    reward_mean: float
    accuracy_all: float
    accuracy_nontruncated: float
    response_clip_ratio: float
    response_length_mean: float

    def metrics(self) -> dict[str, float]:
        return {name: float(value) for name, value in dataclasses.asdict(self).items()}


def batch_stats(groups: list[pb.ScoredGroup], version: int) -> RolloutBatchStats:
    rewards, correct, truncated, lengths, mismatch = [], [], [], [], 0
    for g in groups:
        for s, sc in zip(g.rollout.samples, g.scores):
            if s.policy_version != version:
                mismatch += 1
            rewards.append(sc.reward)
            correct.append(sc.correctness)
            truncated.append(s.finish_reason == pb.FINISH_REASON_LENGTH)
            lengths.append(len(s.response_ids))
    n = max(1, len(rewards))
    nontrunc = [c for c, t in zip(correct, truncated) if not t]
    return RolloutBatchStats(
        samples=len(rewards),
        version_mismatch=mismatch,
        reward_mean=sum(rewards) / n,
        accuracy_all=sum(correct) / n,
        accuracy_nontruncated=sum(nontrunc) / len(nontrunc) if nontrunc else 0.0,
        response_clip_ratio=sum(truncated) / n,
        response_length_mean=sum(lengths) / n,
    )


def build_sequences(groups: list[pb.ScoredGroup], version: int, stage: StageConfig) -> tuple[list[list[Sequence]], dict[str, float]]:
    """Advantages over the rollout batch, rejection of groups without reward spread
    (`core_algos.rejected_groups`); returns the kept groups' training sequences (one list per
    group) and metrics."""
    kept_groups, dropped = [], 0
    for g in groups:
        ok = [s.policy_version == version and s.finish_reason != pb.FINISH_REASON_ABORT for s in g.rollout.samples]
        if all(ok) and len(g.rollout.samples) >= 2:
            kept_groups.append(g)
        else:
            dropped += 1
    metrics: dict[str, float] = {"groups": float(len(groups)), "groups_dropped_version": float(dropped)}
    if not kept_groups:
        metrics.update(zero_adv_group_ratio=1.0 if groups else 0.0, groups_trained=0.0, groups_rejected=0.0)
        return [], metrics
    width = max(len(g.rollout.samples) for g in kept_groups)  # ragged only if an engine returned fewer samples
    rewards = torch.zeros(len(kept_groups), width, dtype=torch.float64)  # float64: the streamed step computes the same figures group by group
    valid = torch.zeros(len(kept_groups), width, dtype=torch.bool)
    truncated = torch.zeros(len(kept_groups), width, dtype=torch.bool)
    for i, g in enumerate(kept_groups):
        for j, (s, sc) in enumerate(zip(g.rollout.samples, g.scores)):
            rewards[i, j] = sc.reward
            valid[i, j] = True
            truncated[i, j] = s.finish_reason == pb.FINISH_REASON_LENGTH
    adv, _ = core_algos.compute_advantages(stage.advantage_estimator.value, rewards, truncated, valid, stage.advantage_mask.value)
    stats_mask, _ = core_algos.truncation_mask(stage.advantage_mask.value, truncated, valid)
    zero = core_algos.rejected_groups(rewards, stats_mask, adv)
    out: list[list[Sequence]] = []
    trained_adv: list[float] = []
    for i, g in enumerate(kept_groups):
        if bool(zero[i]):
            continue
        prompt = list(g.rollout.prompt_ids)
        seqs = [Sequence(prompt + list(s.response_ids), len(prompt), list(s.logprobs), float(a)) for s, a in zip(g.rollout.samples, adv[i].tolist())]
        out.append(seqs)
        trained_adv.extend(adv[i, : len(seqs)].tolist())
    a = torch.tensor(trained_adv) if trained_adv else torch.zeros(1)
    metrics.update(
        zero_adv_group_ratio=float(zero.sum()) / len(kept_groups),
        groups_rejected=float(zero.sum()),
        groups_trained=float(len(out)),
        advantage_mean=a.mean().item(),
        advantage_std=a.std().item() if a.numel() > 1 else 0.0,
        advantage_abs_max=a.abs().max().item(),
    )
    return out, metrics


def _even_chunks(items: list, n: int) -> list[list]:
    """`items` in order as n chunks whose sizes differ by at most one (the first ones larger).

    >>> [len(c) for c in _even_chunks(list(range(5)), 4)]
    [2, 1, 1, 1]
    """
    q, r = divmod(len(items), n)
    bounds = [i * q + min(i, r) for i in range(n + 1)]
    return [items[bounds[i] : bounds[i + 1]] for i in range(n)]


def split_minibatches(groups: list[list[Sequence]], n: int, rule: str = "count", group_size: int | None = None) -> list[list[Sequence]]:
    """The kept groups as SGD mini-batches (eq. 4.1), in order, none empty.

    rule "count": exactly n = D_R / D_T mini-batches — whole groups, as evenly as possible, while
    at least n groups are kept; else the kept samples split evenly (at most one per mini-batch
    when fewer than n samples are left). N_SGD = D_R / D_T * N_reuse whatever rejection dropped.
    rule "size": mini-batches of `group_size` = D_T groups (ceil(len / n) when unset), so fewer
    mini-batches after rejection.
    """
    if not groups:
        return []
    if rule == "size":
        size = group_size or -(-len(groups) // n)
        return [[s for g in groups[i : i + size] for s in g] for i in range(0, len(groups), size)]
    if rule != "count":
        raise ValueError(f"unknown mini-batch rule {rule!r}; known: count, size")
    if len(groups) >= n:
        return [[s for g in chunk for s in g] for chunk in _even_chunks(groups, n)]
    seqs = [s for g in groups for s in g]
    return _even_chunks(seqs, min(n, len(seqs)))


def shard(seqs: list[Sequence], rank: int, world: int) -> list[Sequence]:
    """This rank's share: sequences sorted by length, dealt round-robin (balanced tokens)."""
    order = sorted(seqs, key=lambda s: len(s.token_ids))
    return order[rank::world]


def micro_batches(seqs: list[Sequence], token_budget: int) -> list[list[Sequence]]:
    """Pack sequences (sorted by length) into micro-batches whose padded size fits `token_budget`."""
    order = sorted(seqs, key=lambda s: len(s.token_ids))
    out: list[list[Sequence]] = []
    current: list[Sequence] = []
    for s in order:
        width = len(s.token_ids)
        if current and width * (len(current) + 1) > token_budget:
            out.append(current)
            current = []
        current.append(s)
    if current:
        out.append(current)
    return out


def collate(seqs: list[Sequence], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded tensors for a micro-batch; targets are aligned to logp[:, t] (token t+1).
    An empty list gives one dummy row with no response token (ranks keep equal micro-batch counts)."""
    if not seqs:
        seqs = [Sequence([pad_id, pad_id], 1, [], 0.0)]
        dummy = True
    else:
        dummy = False
    width = max(len(s.token_ids) for s in seqs)
    b = len(seqs)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    resp = torch.zeros((b, width - 1), dtype=torch.float32)
    rollout = torch.zeros((b, width - 1), dtype=torch.float32)
    old = torch.zeros((b, width - 1), dtype=torch.float64)  # as computed (float32, or float64 for a float64 model)
    ref = torch.zeros((b, width - 1), dtype=torch.float64)
    adv = torch.zeros((b, 1), dtype=torch.float32)
    for i, s in enumerate(seqs):
        n = len(s.token_ids)
        ids[i, :n] = torch.tensor(s.token_ids)
        attn[i, :n] = 1
        r0, r1 = s.prompt_len - 1, n - 1  # logp index of the first / past-the-last response token
        if not dummy:
            resp[i, r0:r1] = 1.0
            rollout[i, r0:r1] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
        if s.old_logp is not None:
            old[i, r0:r1] = s.old_logp
        if s.ref_logp is not None:
            ref[i, r0:r1] = s.ref_logp
        adv[i, 0] = s.advantage
    t = dict(input_ids=ids, attention_mask=attn, response_mask=resp, rollout_logp=rollout, old_logp=old, ref_logp=ref, advantages=adv)
    return {k: v.to(device) for k, v in t.items()}


def scatter_response(seqs: list[Sequence], values: torch.Tensor, attr: str) -> None:
    for i, s in enumerate(seqs):
        setattr(s, attr, values[i, s.prompt_len - 1 : len(s.token_ids) - 1].detach().cpu())

