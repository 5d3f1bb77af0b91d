"""The learner's part of the stage schema: N_SGD (eq. 4.1) and the entropy-control bounds."""

import pytest
from pydantic import ValidationError

from magic.config.schema import StageConfig
from magic.learner.settings import LearnerSettings

BASE = {"steps": 1, "T": 8, "D_R": 8, "gs": 2}


def test_n_sgd_is_d_r_over_d_t_times_n_reuse():
    assert StageConfig.model_validate(BASE).n_sgd == 1
    assert StageConfig.model_validate({**BASE, "D_T": 2, "N_reuse": 3}).n_sgd == 12
    assert StageConfig.model_validate({**BASE, "D_T": 8, "N_reuse": 2}).n_minibatches == 1


def test_entropy_bounds_must_be_ordered():
    with pytest.raises(ValidationError, match="coef_min"):
        StageConfig.model_validate({**BASE, "entropy": {"coef_min": 0.2, "coef_max": 0.1}})
    ok = StageConfig.model_validate({**BASE, "entropy": {"tgt_ent": 0.3, "Delta": 0.01}})
    assert (ok.entropy.target, ok.entropy.delta, ok.entropy.adaptive) == (0.3, 0.01, True)


def test_learner_backend_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("MAGIC_BACKEND", "deepspeed")
    monkeypatch.setenv("MAGIC_ZERO_STAGE", "3")
    s = LearnerSettings()
    assert (s.backend, s.zero_stage, s.checkpoint_every) == ("deepspeed", 3, 20)
    monkeypatch.setenv("MAGIC_BACKEND", "megatron")
    with pytest.raises(ValidationError):
        LearnerSettings()
