"""The run specs in examples/ are valid and each of their stages trains (scaled down to the tiny
model: D_R 4 with the spec's D_R / D_T ratio, gs 4, T 16)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from learner_batches import scored_groups

from magic import modeling
from magic.config.files import load_file
from magic.config.schema import RunSpec, StageConfig
from magic.learner.backends import TorchBackend
from magic.learner.trainer import Trainer
from magic.reward.penalties import PenaltyInput, compute_penalties

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
RECIPES = {"magic.json": "grpo", "rloo_entropy_penalties.json": "rloo", "lite_ppo.json": "lite_ppo", "drgrpo.json": "drgrpo"}


def test_every_recipe_of_the_family_ships():
    assert sorted(p.name for p in EXAMPLES.glob("*.json")) == sorted(RECIPES)


def scaled(st: StageConfig) -> StageConfig:
    """The stage at the tiny model's size: T = 16, the overlong buffer scaled with it (it must stay below T)."""
    ratio = st.rollout_batch_size // (st.train_batch_size or st.rollout_batch_size)
    data = st.model_dump() | {"rollout_batch_size": 4, "train_batch_size": 4 // ratio, "group_size": 4, "context_length": 16, "lr": 1e-3}
    if data["penalties"]:
        data["penalties"]["overlong_buffer_tokens"] = data["penalties"]["overlong_buffer_tokens"] * 16 // st.context_length
    return StageConfig.model_validate(data)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_example_spec_validates_and_each_stage_trains(name, tiny_model_dir):
    spec = RunSpec.model_validate(load_file(str(EXAMPLES / name)))
    assert {s.advantage_estimator.value for s in spec.stages} == {RECIPES[name]}
    if spec.estimation is not None:  # the paper: 16 samples per math prompt, 8 per code prompt
        assert (spec.estimation.samples_for("math"), spec.estimation.samples_for("livecodebench-code")) == (16, 8)
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    torch.manual_seed(0)
    optim = spec.optim.model_copy(update={"max_grad_norm": 1.0})
    trainer = Trainer(TorchBackend(modeling.load_model(tiny_model_dir), optim, torch.device("cpu"), chunk_size=8), optim, 0, 256,
                      load_reference=lambda: modeling.load_model(tiny_model_dir).requires_grad_(False), chunk_size=8)
    for k, st in enumerate(spec.stages):
        small = scaled(st)
        rec = trainer.train_step(scored_groups(k, 4, 4, vocab, seed=11), version=k, stage=small)
        assert rec["sgd_steps"] == small.n_sgd and rec["loss"] == rec["loss"], (name, st.name)
        assert ("kl_ref" in rec) == (st.kl_coef > 0)
        if st.kl_reference == "ema" and st.kl_coef > 0:
            assert trainer.ema_reference is not None and trainer.reference is None
        if st.penalties is not None:  # what the reward service will apply to this stage's groups
            loop = " ".join(["the same twenty words again"] * 40)
            assert compute_penalties(PenaltyInput(loop, 100, st.context_length), st.penalties)["repetition"] == -st.penalties.repetition_max
