import re

import pytest
from pydantic import ValidationError

from magic.config.schema import RunSpec, StageConfig
from magic.config.settings import ServiceSettings


def stage(**kw):
    base = {"steps": 3, "T": 64, "D_R": 8, "gs": 4}
    return StageConfig.model_validate({**base, **kw})


def test_paper_symbols_are_accepted_as_aliases():
    s = StageConfig.model_validate({"steps": 2, "T": 128, "D_R": 16, "gs": 8, "tau": 0.9})
    assert (s.context_length, s.rollout_batch_size, s.group_size, s.temperature) == (128, 16, 8, 0.9)
    s2 = StageConfig.model_validate({"steps": 2, "context_length": 128, "rollout_batch_size": 16, "group_size": 8})
    assert s2.context_length == 128


@pytest.mark.parametrize("bad", [{"gs": 1}, {"T": 0}, {"tau": 0}, {"clip_low": 1.0}, {"steps": 0}, {"unknown": 1}])
def test_invalid_stage_fields_are_rejected(bad):
    with pytest.raises(ValidationError):
        stage(**bad)


def test_run_spec_walks_the_stage_plan():
    spec = RunSpec(name="r1", model="m", train_files=["x.jsonl"], stages=[stage(name="a", steps=2), stage(name="b", steps=3, T=128)])
    assert spec.total_steps == 5
    assert [spec.stage_at(k)[0] for k in range(5)] == [0, 0, 1, 1, 1]
    assert spec.stage_at(4)[1].context_length == 128
    with pytest.raises(ValueError):
        spec.stage_at(5)


def test_run_names_and_stage_names_are_checked():
    with pytest.raises(ValidationError):
        RunSpec(name="Bad Name", model="m", train_files=["x"], stages=[stage()])
    with pytest.raises(ValidationError, match="unique"):
        RunSpec(name="ok", model="m", train_files=["x"], stages=[stage(name="a"), stage(name="a")])


def test_settings_come_from_magic_env(monkeypatch):
    monkeypatch.setenv("MAGIC_REDIS_URL", "redis://example:1/2")
    monkeypatch.setenv("MAGIC_MAX_DELIVERIES", "7")
    s = ServiceSettings()
    assert s.redis_url == "redis://example:1/2" and s.max_deliveries == 7


def test_validation_block_defaults_aliases_and_bad_input():
    from magic.config.schema import ValidationConfig

    v = ValidationConfig.model_validate({"datasets": ["aime"], "n": 8, "T": 32})
    assert (v.samples, v.k, v.temperature, v.context_length, v.every, v.max_prompts) == (8, 8, 1.0, 32, 10, None)
    assert ValidationConfig(datasets=["aime"], samples=8, pass_k=2).k == 2
    assert ValidationConfig(datasets=["aime"]).context_length is None  # the stage's T
    for bad, why in [
        ({"samples": 0}, "greater than or equal to 1"),
        ({"k": 8}, re.escape("`k` is ambiguous here: the samples per prompt are `samples` (or `n`), pass@k's k is `pass_k`")),
        ({"best_by": "accuracy"}, "should match pattern"),
        ({"best_by": "math:avg_at_n"}, "best_by 'math:avg_at_n' names a dataset this validation does not evaluate"),
        ({"samples": 2, "pass_k": 3}, "pass@k needs k <= n"),
        ({"every": 0}, "greater than or equal to 1"),
        ({"datasets": []}, "at least 1"),
        ({"datasets": ["a", "a"]}, "twice"),
        ({"datasets": ["Not A Name"]}, "pattern"),
    ]:
        with pytest.raises(ValidationError, match=why):
            ValidationConfig.model_validate({"datasets": ["aime"], **bad})
    spec = RunSpec(name="r", model="m", datasets=["x"], stages=[stage(steps=3), stage(name="b", steps=2)], validation={"datasets": ["aime"], "every": 5})
    assert spec.validation.every == 5
    with pytest.raises(ValidationError, match=r"validation.every = 6 is longer than the plan \(5 steps\)"):
        RunSpec(name="r", model="m", datasets=["x"], stages=[stage(steps=3), stage(name="b", steps=2)], validation={"datasets": ["aime"], "every": 6})
    # a run that waits for its stages has no plan length to check against yet
    assert RunSpec(name="r", model="m", datasets=["x"], validation={"datasets": ["aime"], "every": 50}).validation.every == 50
