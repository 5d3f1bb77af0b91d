"""The stage schema's cross-field rules and the stage end conditions."""

import pytest
from pydantic import ValidationError

from magic.config.schema import RunSpec, StageConfig
from magic.controller.plan import stage_end_reason


def stage(**kw):
    return StageConfig.model_validate({"steps": 10, "T": 64, "D_R": 8, "gs": 4, **kw})


def test_d_t_must_divide_d_r_and_not_exceed_it():
    assert stage(D_T=4, N_reuse=2).n_sgd == 4  # N_SGD = D_R / D_T * N_reuse
    assert stage().n_sgd == 1
    with pytest.raises(ValidationError, match="not divisible by D_T = 3") as exc:
        stage(D_T=3)
    assert exc.value.errors()[0]["loc"] == ("D_T",)
    with pytest.raises(ValidationError, match="larger than D_R"):
        stage(D_T=16)


def test_paper_entropy_symbols_may_be_flat():
    s = stage(tgt_ent=0.5, Delta=0.01)
    assert (s.entropy.target, s.entropy.delta) == (0.5, 0.01)
    with pytest.raises(ValidationError, match="given twice"):
        stage(tgt_ent=0.5, entropy={"target": 0.4})
    with pytest.raises(ValidationError, match="coef_min"):
        stage(entropy={"coef_min": 0.5, "coef_max": 0.1})


def test_plateau_needs_two_windows():
    with pytest.raises(ValidationError, match="2 \\* window"):
        stage(steps=5, plateau={"window": 3})
    assert stage(steps=6, plateau={"window": 3}).plateau.window == 3


def test_run_defaults_what_happens_after_the_plan():
    base = {"name": "r", "model": "m", "datasets": ["d"]}
    assert RunSpec.model_validate(base).on_plan_end == "wait"
    assert RunSpec.model_validate({**base, "stages": [{"steps": 1, "T": 8, "D_R": 2, "gs": 2}]}).on_plan_end == "finish"
    assert RunSpec.model_validate({"name": "r", "model": "m", "train_files": ["x.jsonl"]}).datasets == ["x.jsonl"]  # the old name


def rec(acc):
    return {"accuracy_all": acc}


def test_stage_ends_after_its_steps():
    s = stage(steps=3)
    assert stage_end_reason(s, [rec(0.1)] * 2) is None
    assert stage_end_reason(s, [rec(0.1)] * 3) == "steps"


def test_stage_ends_on_a_plateau_only_after_two_windows_and_min_steps():
    s = stage(steps=100, plateau={"window": 2, "min_delta": 0.05, "min_steps": 6})
    rising = [rec(x) for x in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)]
    assert stage_end_reason(s, rising) is None
    flat = [rec(x) for x in (0.1, 0.2, 0.5, 0.5, 0.51, 0.52)]
    assert stage_end_reason(s, flat[:5]) is None  # before min_steps
    assert stage_end_reason(s, flat) == "plateau"  # (0.51 + 0.52) / 2 - (0.5 + 0.5) / 2 = 0.015 < 0.05
    assert stage_end_reason(s, [rec(x) for x in (0.1, 0.2, 0.3, 0.5, 0.51, 0.52)]) is None  # rose by 0.115
    missing = flat[:-1] + [{"accuracy_all": None}]
    assert stage_end_reason(s, missing) is None  # a step without the figure never ends the stage


def test_validation_before_training_is_a_switch():
    """verl's val_before_train: the initial model's point of the curve, on by default."""
    from magic.config.schema import RunSpec
    from magic.controller.validation import Validation

    def spec(**validation):
        return RunSpec.model_validate({"name": "v", "model": "m", "datasets": ["d"], "validation": {"datasets": ["held"], "every": 5, **validation}})

    due = lambda s, v: Validation.due(None, s, v)  # noqa: E731 — reads only the spec
    assert [v for v in range(12) if due(spec(), v)] == [0, 5, 10]
    assert [v for v in range(12) if due(spec(before_training=False), v)] == [5, 10]
