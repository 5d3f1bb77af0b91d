"""Exact streaming of an on-policy step: train each scored group of step k as it arrives.

The barrier step waits for the whole rollout batch, then runs one forward and backward over it.
On-policy (N_SGD = 1) the same update can be built group by group while the fleet is still
generating, and equal the barrier's to float tolerance, because at theta_k the ratio is exactly 1
(no clip is active) and every term of the loss is a token *sum*:

    grad L = (1/N) [ - s * sum_i c_i sum_t w_t grad log pi(t)        the policy gradient (eq. 3.1 at rho = 1)
                     + s * mu * sum_i m_i sum_t w_t grad log pi(t)    (batch estimator only)
                     - alpha_k * sum_t grad H_t                       the entropy bonus (§3.2.5)
                     + beta * sum_t grad k3_t ]                       the reference KL (§3.2.6)

    add(group):  per group, as it arrives — rejection (no reward spread), the group's own part of
                 its advantages c_i (GRPO, Dr.GRPO, RLOO: the whole advantage; LitePPO: r - mean of
                 the group; batch: r), one forward and backward per micro-batch, each term's
                 gradient into its own buffer (nothing divided yet)
    finish():    the batch's scalars, once the last group is in — N (all response tokens), the
                 batch std s = 1 / (std + eps) and mean mu (LitePPO, batch), e_k and the gate
                 alpha_k = c_k * 1{e_k <= tgt_ent} — combine the buffers, clip the gradient, one
                 optimizer step; c_{k+1} from e_k

The entropy term is kept apart until the end (its coefficient depends on the whole batch's
entropy when the gate is adaptive) rather than re-running the forward pass: one gradient buffer
more (the policy's size in the gradient's precision) instead of a second pass over the batch.

N_SGD > 1 (eq. 4.1). The barrier runs one no-grad pass at theta_k over the batch (old and
reference log-probs, e_k), then the SGD steps. Streamed, that pass runs per group as it arrives
(exact: it is per sequence), and so does the first mini-batch's forward and backward when its
groups are known on arrival — mini-batch rule "slot", where mini-batch j holds the kept groups
among prompts j * D_T ... (j + 1) * D_T - 1 — since at theta_k its ratio is 1 and its loss a
token sum like the on-policy one. Once the last group is in: the batch's scalars, the first
mini-batch's update, then the other mini-batches and the N_reuse passes as the barrier runs
them. Under the rules "count" and "size" a group's mini-batch depends on how many groups are
kept before it, known only at the end: the no-grad pass streams, the SGD steps wait.

What cannot stream falls back to the barrier step (`why_not`): a backend over several ranks
(DeepSpeed partitions and reduces gradients itself), the batch estimator with Adv-Mask-After
(its rejection depends on the batch mean).
"""

from __future__ import annotations

import time

import torch

from magic.config.schema import StageConfig
from magic.learner import core_algos
from magic.learner.backends import TorchBackend
from magic.learner.batching import Sequence, batch_stats, build_sequences, collate, group_slot, of_version, split_minibatches
from magic.learner.core_algos import LossConfig
from magic.learner.trainer import step_averages
from magic.protocol.pb import messages_pb2 as pb

GROUP_PART = {"grpo": "grpo", "drgrpo": "drgrpo", "rloo": "rloo", "lite_ppo": "drgrpo"}
"""The estimator whose per-group advantages are the group's own part: all of it for the group
estimators, r - mean_group (Dr.GRPO's) for LitePPO, which divides by the batch std at the end."""


def why_not(stage: StageConfig, backend) -> str | None:
    """Why step k of `stage` cannot stream on `backend` (None when it can)."""
    if not isinstance(backend, TorchBackend) or backend.world_size != 1:
        return "the backend spans several ranks (or is DeepSpeed): it reduces and steps its gradients itself"
    if stage.advantage_estimator.value == "batch" and stage.advantage_mask.value == "after":
        return "the batch estimator with Adv-Mask-After rejects groups by the batch mean"
    return None


class StreamingStep:
    """One step built group by group (see the module docstring); `trainer` is the
    `magic.learner.trainer.Trainer` whose policy, reference and entropy controller it uses."""

    def __init__(self, trainer, version: int, stage: StageConfig):
        reason = why_not(stage, trainer.backend)
        if reason is not None:
            raise ValueError(f"this step cannot stream: {reason}")
        self.trainer, self.version, self.stage = trainer, version, stage
        self.estimator = stage.advantage_estimator.value
        self.groups: list[pb.ScoredGroup] = []
        self.params = [p for p in trainer.backend.policy.parameters() if p.requires_grad]
        self.buffers: dict[str, list[torch.Tensor]] = {}
        self.sums = dict.fromkeys(("tokens", "entropy", "kl_ref", "lin", "one", "kl_rollout", "rollout_is_weight", "rollout_is_clipfrac"), 0.0)
        self.diff_max = 0.0
        self.ref = trainer._reference_for(stage) if stage.kl_coef > 0 else None
        self.kept_groups = 0
        self.train_seconds = 0.0
        # N_SGD > 1: the no-grad pass per group, the first mini-batch's backward when its groups are known on arrival
        self.multi = stage.n_sgd > 1
        self.d_t = stage.train_batch_size or stage.rollout_batch_size
        self.first_streams = self.multi and stage.minibatch_rule == "slot"
        self.kept: dict[str, list[Sequence]] = {}  # N_SGD > 1: the kept groups' sequences by group id, c_i as their advantage until finish()
        self.measured = dict.fromkeys(("tokens", "entropy", "kl_rollout"), 0.0)

    # -- as groups arrive ------------------------------------------------------------------------

    def add(self, *groups: pb.ScoredGroup) -> None:
        """Train on scored groups of the step that arrived together (forward and backward now,
        nothing applied): their samples packed into micro-batches as the barrier packs a batch,
        so groups that come at once cost what the barrier's passes over them would. With
        N_SGD > 1: the no-grad pass over them, and the backward of those of the first mini-batch
        (rule "slot")."""
        t0 = time.perf_counter()
        seqs, first = [], []
        for group in groups:
            self.groups.append(group)
            parts = self._coefficients(group)
            if parts is None:
                continue
            self.kept_groups += 1
            prompt, slot = list(group.rollout.prompt_ids), group_slot(group)
            mine = []
            for s, c, counted in zip(group.rollout.samples, *parts):
                seq = Sequence(prompt + list(s.response_ids), len(prompt), list(s.logprobs), c, stale=s.policy_version != self.version, slot=slot)
                seq.counted = counted  # the batch estimator's m_i: the sample carries -mu
                mine.append(seq)
            seqs.extend(mine)
            if self.multi:
                self.kept[group.rollout.prompt.group_id] = mine
                if self.first_streams and slot < self.d_t:
                    first.extend(mine)
        if self.multi:
            if seqs:
                self._measure(seqs)
            for mb in self.trainer._local_micro_batches(first) if first else []:
                self._backward(mb)
        elif seqs:
            for mb in self.trainer._local_micro_batches(seqs):
                self._backward(mb)
        self.train_seconds += time.perf_counter() - t0

    def _measure(self, seqs: list[Sequence]) -> None:
        """The barrier's no-grad pass at theta_k (`Trainer._measure`) over these sequences: their
        old and reference log-probs, and the sums of e_k and of the rollout-vs-learner figures."""
        entropy, figures = self.trainer._measure([seqs], self.stage, old=True, ref=self.ref)
        self.measured["tokens"] += sum(s.response_len for s in seqs)
        self.measured["entropy"] += entropy
        self.measured["kl_rollout"] += figures["kl_rollout"]
        self.diff_max = max(self.diff_max, figures["rollout_logprob_diff_max"])

    def _coefficients(self, group: pb.ScoredGroup) -> tuple[list[float], list[float]] | None:
        """The group's own part of its advantages c_i and, for the batch estimator, which samples
        count (m_i); None: the group is not trained — another version, aborted, or rejected for
        want of reward spread."""
        if not of_version(group, self.version, self.stage.max_staleness):
            return None
        rewards, truncated, stats_mask, keep = self._row(group)
        counted = (stats_mask & keep).to(torch.float64)
        if self.estimator == "batch":
            part = rewards * counted
            few = stats_mask.sum(dim=1) < 2
            zero = (core_algos.reward_spread(rewards, stats_mask) == 0) | few | ~(counted > 0).any(dim=1)
        else:
            part, _ = core_algos.compute_advantages(GROUP_PART[self.estimator], rewards, truncated, torch.ones_like(truncated), self.stage.advantage_mask.value)
            zero = core_algos.rejected_groups(rewards, stats_mask, part)
        if bool(zero[0]):
            return None
        return part[0].tolist(), counted[0].tolist()

    def _row(self, group: pb.ScoredGroup) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rewards, truncated, stats_mask, keep), each (1, gs), of one group, as the barrier lays them out."""
        rewards = torch.tensor([[sc.reward for sc in group.scores]], dtype=torch.float64)
        truncated = torch.tensor([[s.finish_reason == pb.FINISH_REASON_LENGTH for s in group.rollout.samples]])
        stats_mask, keep = core_algos.truncation_mask(self.stage.advantage_mask.value, truncated, torch.ones_like(truncated))
        return rewards, truncated, stats_mask, keep

    def _backward(self, mb: list[Sequence]) -> None:
        trainer, stage = self.trainer, self.stage
        t = collate(mb, trainer.pad_id, trainer.device)
        trainer.backend.train(True)
        logp, entropy = trainer.backend.forward(t["input_ids"], t["attention_mask"], stage.temperature)
        mask = t["response_mask"].to(logp.dtype)
        ratio = torch.exp(logp - logp.detach())  # 1, with the gradient of log pi
        # pi_prox: this forward pass at theta_k (N_SGD = 1), or the no-grad pass's, as the barrier's SGD steps weight it
        prox = t["old_logp"].to(logp.dtype) if self.multi else logp
        weights, is_sums = core_algos.behaviour_weights(prox, t["rollout_logp"], t["response_mask"], t["stale"], stage.rollout_is, stage.rollout_is_threshold)
        w = weights if weights is not None else torch.ones_like(logp)
        coef = t["advantages"].to(logp.dtype)  # (B, 1): each sample's coefficient c_i
        terms = {"lin": (coef * w * ratio * mask).sum()}
        if self.estimator == "batch":
            counted = torch.tensor([[s.counted] for s in mb], dtype=logp.dtype, device=logp.device)
            terms["one"] = (counted * w * ratio * mask).sum()
        ent = (entropy * mask).sum()
        if self._entropy_may_count():
            terms["entropy"] = ent
        if self.ref is not None:
            ref_logp = trainer.backend.reference_forward(self.ref, t["input_ids"], t["attention_mask"], stage.temperature)
            terms["kl_ref"] = (core_algos.k3_kl(logp, ref_logp) * mask).sum()
        names = list(terms)
        for i, name in enumerate(names):
            grads = torch.autograd.grad(terms[name], self.params, retain_graph=i < len(names) - 1, allow_unused=True)
            buffer = self.buffers.setdefault(name, [torch.zeros_like(p, dtype=torch.float64 if p.dtype == torch.float64 else torch.float32) for p in self.params])
            for b, g in zip(buffer, grads):
                if g is not None:
                    b.add_(g.to(b.dtype))
        with torch.no_grad():
            self.sums["tokens"] += float(mask.sum())
            self.sums["entropy"] += float(ent)
            self.sums["lin"] += float(terms["lin"].detach())
            if "one" in terms:
                self.sums["one"] += float(terms["one"].detach())
            if "kl_ref" in terms:
                self.sums["kl_ref"] += float(terms["kl_ref"].detach())
            if not self.multi:  # N_SGD > 1: the no-grad pass measured them over the whole batch
                self.sums["kl_rollout"] += float((core_algos.k3_kl(logp.detach(), t["rollout_logp"]) * mask).sum())
                self.diff_max = max(self.diff_max, float(((t["rollout_logp"] - logp.detach()) * mask).abs().max()))
            for k, v in is_sums.items():
                self.sums[k] += float(v)

    def _entropy_may_count(self) -> bool:
        ent = self.stage.entropy
        return bool(ent.adaptive or ent.coef)

    # -- when the last group is in --------------------------------------------------------------

    def finish(self) -> dict[str, float]:
        """Apply the step: the batch's scalars, the combined gradient, one optimizer step (N_SGD > 1:
        then the other SGD steps); the step's metrics, the same keys as `Trainer.train_step`'s."""
        trainer, stage, ent_cfg = self.trainer, self.stage, self.stage.entropy
        t0 = time.perf_counter()
        control = trainer.controller
        kept, metrics = build_sequences(self.groups, self.version, stage, layout=False)  # the barrier's own bookkeeping: rejections, advantage figures
        metrics.update(batch_stats(self.groups, self.version, stage.max_staleness).metrics(), entropy_target=ent_cfg.target, entropy_coef=control.current(ent_cfg), n_sgd=float(stage.n_sgd))
        if len(kept) != self.kept_groups:
            raise RuntimeError(f"streamed {self.kept_groups} groups, the batch keeps {len(kept)}")
        if not kept:
            metrics.update(loss=0.0, pg_loss=0.0, grad_norm=0.0, tokens_trained=0.0, sgd_steps=0.0, entropy_bonus_active=0.0, entropy_alpha=0.0)
            trainer._update_ema(stage)
            return metrics
        scale, mean = self._batch_scalars()
        if self.multi:
            metrics.update(self._finish_sgd(scale, mean))
        else:
            n = self.sums["tokens"]
            entropy_k = self.sums["entropy"] / n
            alpha, gate = control.alpha_for(ent_cfg, entropy_k if control.gate_needs_entropy_first(ent_cfg) else None)
            grad_norm = self._step(n, scale, mean, alpha)
            gate = control.finish_step(ent_cfg, entropy_k, gate)
            metrics.update(
                step_averages([(self._streamed_sums(scale, mean, alpha), grad_norm, n)], with_ref=self.ref is not None),
                kl_rollout=self.sums["kl_rollout"] / n, rollout_logprob_diff_max=self.diff_max,
                entropy=entropy_k, entropy_bonus_active=float(gate), entropy_alpha=alpha, entropy_coef_next=control.current(ent_cfg),
                tokens_trained=n, lr=stage.lr, measure_seconds=0.0,
            )
        metrics.update(streamed_train_seconds=self.train_seconds, finish_seconds=time.perf_counter() - t0)
        self.buffers.clear()
        trainer._update_ema(stage)
        return metrics

    def _step(self, n: float, scale: float, mean: float, alpha: float) -> float:
        """One optimizer step on the streamed gradient: the buffers combined with the batch's
        scalars over `n` tokens (the mini-batch's). Returns the grad norm."""
        coefficient = {"lin": -scale, "one": scale * mean, "entropy": -alpha, "kl_ref": self.stage.kl_coef}
        for i, p in enumerate(self.params):
            g = None
            for name, buffer in self.buffers.items():
                if coefficient[name]:
                    term = buffer[i] * (coefficient[name] / n)
                    g = term if g is None else g + term
            p.grad = None if g is None else g.to(p.dtype)
        return self.trainer.backend.step(self.stage.lr, self.trainer.optim.max_grad_norm)

    def _streamed_sums(self, scale: float, mean: float, alpha: float) -> dict[str, float]:
        """The streamed update's token sums of `trainer.SUM_KEYS` (its ratio is 1: nothing clipped)."""
        pg = -scale * self.sums["lin"] + scale * mean * self.sums["one"]
        return {
            "loss": pg - alpha * self.sums["entropy"] + self.stage.kl_coef * self.sums["kl_ref"], "pg_loss": pg, "entropy": self.sums["entropy"],
            "pg_clipfrac_high": 0.0, "pg_clipfrac_low": 0.0, "pg_clipfrac_dual": 0.0, "kl_old": 0.0, "ppo_kl": 0.0, "kl_ref": self.sums["kl_ref"],
            "rollout_is_weight": self.sums["rollout_is_weight"], "rollout_is_clipfrac": self.sums["rollout_is_clipfrac"],
        }

    def _finish_sgd(self, scale: float, mean: float) -> dict[str, float]:
        """N_SGD > 1 once the last group is in: e_k and alpha_k from the streamed no-grad pass, the
        advantages A_i = s (c_i - mu m_i), the first mini-batch's update from its streamed gradient
        (rule "slot"), then the other SGD steps as `Trainer.train_step` runs them."""
        trainer, stage, ent_cfg, control = self.trainer, self.stage, self.stage.entropy, self.trainer.controller
        total = self.measured["tokens"]
        entropy_k = self.measured["entropy"] / total
        alpha, gate = control.alpha_for(ent_cfg, entropy_k)
        mu = mean if self.estimator == "batch" else 0.0  # LitePPO: r - mean_group is c_i already
        kept = [self.kept[group_id] for group_id in sorted(self.kept)]  # group-id order, as the learner hands the barrier its batch
        for group in kept:
            for seq in group:
                seq.advantage = scale * (seq.advantage - mu * seq.counted)
        minibatches = split_minibatches(kept, stage.n_minibatches, stage.minibatch_rule, self.d_t)

        def streamed(mb: list[Sequence]) -> tuple[dict[str, float], float, int]:
            """The first mini-batch's step from the gradient its groups left in the buffers."""
            n_tok = sum(s.response_len for s in mb)
            if n_tok != self.sums["tokens"]:
                raise RuntimeError(f"streamed {self.sums['tokens']:.0f} tokens of the first mini-batch, it holds {n_tok}")
            grad_norm = self._step(n_tok, scale, mean, alpha)
            self.buffers.clear()  # not held through the other SGD steps
            return self._streamed_sums(scale, mean, alpha), grad_norm, n_tok

        first = streamed if self.first_streams and minibatches[0][0].slot < self.d_t else None  # chunk 0 kept: its gradient is in the buffers
        steps = trainer.sgd_passes(minibatches, stage, LossConfig.for_stage(stage, alpha), on_policy=False, first=first)
        gate = control.finish_step(ent_cfg, entropy_k, gate)
        return {
            **step_averages(steps, with_ref=self.ref is not None),
            "kl_rollout": self.measured["kl_rollout"] / total, "rollout_logprob_diff_max": self.diff_max,
            "entropy": entropy_k, "entropy_bonus_active": float(gate), "entropy_alpha": alpha, "entropy_coef_next": control.current(ent_cfg),
            "tokens_trained": total, "lr": stage.lr, "measure_seconds": 0.0,
        }

    def _batch_scalars(self) -> tuple[float, float]:
        """(s, mu): the batch estimator's 1 / (std + eps) and mean, LitePPO's 1 / (std + eps) (mu
        unused), 1 and 0 for the group estimators — over the counted rewards of every group of the
        right version, as the barrier computes them."""
        if self.estimator not in ("batch", "lite_ppo"):
            return 1.0, 0.0
        rows, masks = [], []
        for g in self.groups:
            if not of_version(g, self.version, self.stage.max_staleness):
                continue
            rewards, _, stats_mask, _ = self._row(g)
            rows.append(rewards[0])
            masks.append(stats_mask[0])
        width = max(len(r) for r in rows)
        rewards = torch.zeros(len(rows), width, dtype=torch.float64)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, (r, m) in enumerate(zip(rows, masks)):
            rewards[i, : len(r)], mask[i, : len(m)] = r, m
        mean, _ = core_algos._masked_mean(rewards, mask, dim=None)
        std, _ = core_algos._masked_std(rewards, mask, dim=None)
        return 1.0 / float(std + core_algos.EPS), float(mean)
