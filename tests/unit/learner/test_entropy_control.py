"""Adaptive entropy control (§3.2.5) keeps a toy policy's entropy near the target where the
uncontrolled run collapses. The toy: one prompt token, one-token responses from V choices,
reward 1 for choice 0 only; GRPO, on-policy, through the real Trainer."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from magic.config.schema import OptimConfig, StageConfig
from magic.learner.backends import TorchBackend
from magic.learner.trainer import Trainer
from magic.protocol.pb import messages_pb2 as pb

V, PROMPT = 16, 1


class _Body(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, 8)

    def forward(self, input_ids, **_):
        return SimpleNamespace(last_hidden_state=self.emb(input_ids))


class ToyLM(torch.nn.Module):
    """Next token depends on the current token only: enough for a one-token bandit."""

    def __init__(self):
        super().__init__()
        self.model = _Body()
        self.lm_head = torch.nn.Linear(8, V, bias=False)


def rollout(policy: ToyLM, step: int, gen: torch.Generator, groups: int = 4, gs: int = 8) -> list[pb.ScoredGroup]:
    with torch.no_grad():
        logp = torch.log_softmax(policy.lm_head(policy.model.emb(torch.tensor([PROMPT]))), -1)[0]
    out = []
    for i in range(groups):
        actions = torch.multinomial(logp.exp(), gs, replacement=True, generator=gen).tolist()
        samples = [pb.Sample(response_ids=[a], logprobs=[logp[a].item()], finish_reason=pb.FINISH_REASON_STOP, policy_version=step) for a in actions]
        scores = [pb.Score(reward=float(a == 0), correctness=float(a == 0)) for a in actions]
        out.append(pb.ScoredGroup(rollout=pb.RolloutGroup(prompt=pb.PromptGroup(step=step, group_id=f"{step}:{i}"), prompt_ids=[PROMPT], samples=samples), scores=scores))
    return out


def run(entropy: dict, steps: int = 120, lr: float = 0.01) -> list[float]:
    torch.manual_seed(0)
    policy = ToyLM()
    optim = OptimConfig(max_grad_norm=10.0)
    trainer = Trainer(TorchBackend(policy, optim, torch.device("cpu")), optim, pad_id=0, micro_batch_tokens=1024)
    stage = StageConfig(steps=steps, T=1, D_R=4, gs=8, lr=lr, entropy=entropy)
    gen = torch.Generator().manual_seed(1)
    history = []
    for k in range(steps):
        rec = trainer.train_step(rollout(policy, k, gen), version=k, stage=stage)
        if "entropy" in rec:
            history.append(rec["entropy"])
    return history


def test_adaptive_entropy_control_holds_entropy_near_the_target():
    target = 1.0
    free = run({"adaptive": False, "coef": 0.0})
    held = run({"adaptive": True, "target": target, "delta": 0.2, "coef_max": 10.0})
    assert free[0] > 2.5 and held[0] > 2.5  # both start near log(16) = 2.77
    # uncontrolled: entropy collapses (then every group is all-correct and is rejected)
    assert max(free[-5:]) < 0.1 * target, free
    # controlled: once below the target the bonus switches on and entropy comes back; it then
    # oscillates around the target, and every step keeps a learning signal
    assert len(held) >= 110
    tail = held[-60:]
    assert 0.8 * target <= sum(tail) / len(tail) <= 1.4 * target, tail
    assert min(tail) > 0.5 * target, tail
