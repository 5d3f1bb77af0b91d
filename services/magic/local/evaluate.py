"""Held-out accuracy of a policy: sample each prompt k times and verify every answer.

Accuracy is avg@k at the sampling temperature (the recipe evaluates at tau = 1 with several
samples per prompt); the greedy accuracy would hide what RL changes in the sampled policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from magic.controller.datasets import PromptRecord
from magic.protocol.pb import messages_pb2 as pb
from magic.reward.scoring import Sample, Scorer
from magic.reward.settings import RewardSettings
from magic.rollout.engine import GenerationRequest, RolloutEngine


@dataclass
class EvalResult:
    accuracy: float
    truncated: float
    response_length: float
    samples: int


def evaluate(
    engine: RolloutEngine,
    records: list[PromptRecord],
    samples_per_prompt: int,
    temperature: float,
    max_tokens: int,
    seed: int = 1234,
) -> EvalResult:
    requests = [
        GenerationRequest(
            engine.render_prompt([{"role": r, "content": c} for r, c in rec.messages]),
            n=samples_per_prompt,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed + i,
        )
        for i, rec in enumerate(records)
    ]
    results, _ = engine.generate(requests)
    generated = [(rec, s) for rec, samples in zip(records, results) for s in samples]
    problem = lambda rec: next((c for r, c in reversed(rec.messages) if r == "user"), "")  # noqa: E731
    with Scorer(RewardSettings()) as scorer:
        scores = scorer.score_many([Sample(rec.data_source, s.text, rec.ground_truth, problem(rec)) for rec, s in generated])
    n = len(generated)
    correct = sum(score.correctness for score in scores)
    truncated = sum(s.finish_reason == pb.FINISH_REASON_LENGTH for _, s in generated)
    length = sum(len(s.token_ids) for _, s in generated)
    return EvalResult(correct / n, truncated / n, length / n, n)
