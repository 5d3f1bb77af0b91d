"""Held-out accuracy of a policy: sample each prompt k times and verify every answer.

Accuracy is avg@k at the sampling temperature (the recipe evaluates at tau = 1 with several
samples per prompt); the greedy accuracy would hide what RL changes in the sampled policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from magic.controller.datasets import PromptRecord
from magic.common.pb import messages_pb2 as pb
from magic.reward.worker import score_sample
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
    correct = truncated = length = n = 0
    for rec, samples in zip(records, results):
        for s in samples:
            score = score_sample(rec.data_source, s.text, rec.ground_truth, timeout_seconds=5)
            correct += score.correctness
            truncated += s.finish_reason == pb.FINISH_REASON_LENGTH
            length += len(s.token_ids)
            n += 1
    return EvalResult(correct / n, truncated / n, length / n, n)
