"""Held-out figures of a policy on this machine: a rollout engine and the reward `Scorer` in-process.

The local counterpart of in-run validation (`magic.controller.validation`, which goes through the
rollout and reward services): the same outcome rule (`PromptOutcome.of`) and the same figures
(`magic.evaluation.summarise`: avg@n, pass@k with a 95% CI, mean length, truncated share). Used
by `magic eval --local` and by `magic local` for its before/after accuracy.

Each prompt is sampled n times at the sampling temperature (the recipe evaluates at tau = 1 with
several samples per prompt; the greedy accuracy would hide what RL changes in the sampled
policy); prompt i is seeded `seed + i`, so two policies are compared on the same draws.
"""

from __future__ import annotations

from pathlib import Path

from magic.controller.datasets import PromptRecord, without_ground_truth
from magic.evaluation import Figures, PromptOutcome, summarise
from magic.protocol.pb import messages_pb2 as pb
from magic.reward.scoring import Sample, Scorer
from magic.reward.settings import RewardSettings
from magic.rollout.engine import GenerationRequest, RolloutEngine

DEFAULT_SEED = 1234
"""The seed of prompt 0 (prompt i: DEFAULT_SEED + i) unless one is given."""


class EvaluationError(ValueError):
    """Input that cannot be evaluated: no prompts, a record without a ground truth, no model."""


def outcomes(
    engine: RolloutEngine, records: list[PromptRecord], samples_per_prompt: int, temperature: float, max_tokens: int, seed: int = DEFAULT_SEED, top_p: float = 1.0
) -> list[PromptOutcome]:
    """Sample every prompt `samples_per_prompt` times (one batch: the engine schedules them) and
    verify every answer; one outcome per prompt, in the records' order."""
    if not records:
        raise EvaluationError("no prompts to evaluate")
    if (blank := without_ground_truth(records)) is not None:
        raise EvaluationError(f"record {blank} has no ground truth (reward_model.ground_truth is empty): it cannot be judged")
    requests = [
        GenerationRequest(
            engine.render_prompt([{"role": r, "content": c} for r, c in rec.messages]),
            n=samples_per_prompt,
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            seed=seed + i,
        )
        for i, rec in enumerate(records)
    ]
    results, _ = engine.generate(requests)
    problem = lambda rec: next((c for r, c in reversed(rec.messages) if r == "user"), "")  # noqa: E731
    with Scorer(RewardSettings()) as scorer:
        scores = scorer.score_many([Sample(rec.data_source, s.text, rec.ground_truth, problem(rec)) for rec, group in zip(records, results) for s in group])
    out, at = [], 0
    for group in results:
        mine = scores[at : at + len(group)]
        out.append(PromptOutcome.of([x.correctness for x in mine], [len(s.token_ids) for s in group], [s.finish_reason == pb.FINISH_REASON_LENGTH for s in group], [x.answer for x in mine]))
        at += len(group)
    return out


def evaluate(
    engine: RolloutEngine,
    records: list[PromptRecord],
    samples_per_prompt: int,
    temperature: float,
    max_tokens: int,
    seed: int = DEFAULT_SEED,
    k: int | None = None,
) -> Figures:
    """The held-out figures of the engine's policy on `records` (pass@k at `k`, default n)."""
    return summarise(outcomes(engine, records, samples_per_prompt, temperature, max_tokens, seed), k)


def context_window(model_dir: str | Path) -> int | None:
    """The model's context window (config.json's max_position_embeddings), None if it has none."""
    import json

    return json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings")


def load_engine(model_dir: str | Path, weights: dict | None = None, max_batch_sequences: int = 1024) -> RolloutEngine:
    """A torch engine on Hugging Face model directory `model_dir` (a learner checkpoint is one),
    with `weights` (a state dict) loaded over it when given."""
    from transformers.utils import logging as hf_logging

    from magic import modeling  # heavy (torch)
    from magic.rollout.engine import TorchEngine

    hf_logging.disable_progress_bar()  # no "Loading weights" bar on every evaluation

    from magic.learner.checkpoints import TRAINER_STATE_FILE, unusable  # safetensors.torch: heavy, as above

    path = Path(model_dir)
    if not path.is_dir():
        raise EvaluationError(f"{model_dir}: no such model directory or checkpoint")
    if (path / TRAINER_STATE_FILE).exists() or path.name.startswith("step-"):  # a learner checkpoint
        if (why := unusable(path)) is not None:
            raise EvaluationError(f"{model_dir}: a checkpoint, but {why}")
    if not (path / "config.json").is_file():
        raise EvaluationError(f"{model_dir}: not a Hugging Face model directory or checkpoint (no config.json)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        raise EvaluationError(
            f"{model_dir}: holds a config but no weights (*.safetensors): a published weights version or a directory being "
            "written; evaluate a checkpoint (data/runs/<run>/checkpoints/step-K) or its `magic export`"
        )
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise EvaluationError(
            f"{model_dir}: has weights but no tokenizer (tokenizer.json / tokenizer_config.json): published weights versions carry "
            "none; evaluate a checkpoint, which carries the run's tokenizer, or its `magic export`"
        )
    try:
        engine = TorchEngine(str(path), max_batch_sequences=max_batch_sequences)
    except (OSError, ValueError, KeyError) as exc:  # weights or tokenizer files transformers cannot read
        raise EvaluationError(f"{model_dir}: the model does not load ({type(exc).__name__}: {str(exc)[:300]})") from None
    if weights is not None:
        modeling.load_state_dict(engine.model, weights)
    return engine
