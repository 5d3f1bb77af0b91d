"""The controller's validation over a real Redis: groups published once per version with
deterministic ids, scored groups read from the `estimates` stream and counted once (a replay, a
restarted controller), forged groups dead-lettered, figures equal to the hand-computed ones."""

from __future__ import annotations


import pytest
from held_out import held_file, receive, score

from magic.config.schema import DatasetSpec, RunSpec
from magic.controller.datasets import DatasetRegistry
from magic.controller.settings import ControllerSettings
from magic.controller.validation import Validation
from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.datasets import DatasetIndex
from magic.store.runs import Runs
from magic.store.streams import Stream

pytestmark = pytest.mark.integration

@pytest.fixture
def world(r, tmp_path):
    registry = DatasetRegistry(DatasetIndex(r))
    registry.register(DatasetSpec(name="held", path=str(held_file(tmp_path))))
    spec = RunSpec(name="v", model="m", datasets=["held"], stages=[{"steps": 4, "T": 16, "D_R": 2, "gs": 2}], validation={"datasets": ["held"], "every": 2, "samples": 4, "pass_k": 2})
    runs = Runs(r, tmp_path / "data")
    runs.create(spec)

    def validation() -> Validation:  # a (re)started controller's
        channels = runs.channels("v", "controller-0", 5)
        return Validation(runs["v"], channels.steps, channels.group("estimates", keys.CONTROLLER_GROUP), registry, ControllerSettings(data_dir=tmp_path / "data", step_timeout_seconds=20))

    return r, runs, spec, validation


def test_validation_is_published_once_counted_once_and_figures_are_exact(world):
    r, runs, spec, validation = world
    rk = keys.RunKeys("v")
    v1 = validation()
    # the first controller publishes version 2's groups, two are scored, then it "dies"
    with pytest.raises(RuntimeError, match="died"):
        v1.run(spec, 2, 0, 16, tick=lambda: (score(r, "v", stop_after=2), receive(v1), (_ for _ in ()).throw(RuntimeError("died"))))
    assert r.xlen(rk.prompts) == 3
    published, received = runs["v"].evaluation_progress("validation:2")
    assert published == 3 and len(received) == 2
    # a restarted controller: publishes nothing again, rereads the pending entries (replays), counts each group once
    v2 = validation()
    calls: list[int] = []
    figures = v2.run(spec, 2, 0, 16, tick=lambda: (calls.append(1), score(r, "v", forged="val:2:held:00000" if not calls[1:] else None), receive(v2)))
    assert r.xlen(rk.prompts) == 3
    prompts = [p for _, p in Stream(r, rk.prompts).read_after("0", pb.PromptGroup)]
    assert [p.group_id for p in prompts] == ["val:2:held:00000", "val:2:held:00001", "val:2:held:00002"]
    assert all(p.kind == pb.GROUP_KIND_VALIDATE and p.policy_version == 2 and p.sampling.n == 4 and p.sampling.temperature == 1.0 and p.sampling.max_tokens == 16 for p in prompts)
    f = figures["held"]
    assert (f["prompts"], f["samples"], f["k"]) == (3, 4, 2)
    assert f["avg_at_n"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert f["pass_at_k"] == pytest.approx((0.5 + 0 + 1) / 3)  # 1 - C(3,2)/C(4,2) = 0.5 for 1 of 4
    assert f["response_length_mean"] == pytest.approx(4.5)
    assert f["truncated_ratio"] == pytest.approx(0.25)
    assert runs["v"].validations() == {2: figures}
    assert runs["v"].evaluation_progress("validation:2") == (0, {})  # per-group outcomes dropped once summarised
    dead = [d for _, d in Stream(r, rk.dead_of("controller")).read_after("0", pb.DeadLetter)]
    assert len(dead) == 1 and "differs from the one the controller published" in dead[0].reason
    # the same seeds at every version (common random numbers); a finished validation is not run again
    v2.run(spec, 4, 0, 16, tick=lambda: (score(r, "v"), receive(v2)))
    seeds = {}
    for _, p in Stream(r, rk.prompts).read_after("0", pb.PromptGroup):
        seeds.setdefault(p.prompt_uid, set()).add(p.sampling.seed)
    assert all(len(s) == 1 for s in seeds.values()) and len({s.pop() for s in seeds.values()}) == 3
    assert v2.run(spec, 2, 0, 16, tick=lambda: pytest.fail("a finished validation ran again")) == figures
    # a controller restarted after both: the series show the newest stored point (version 4), not nothing
    from magic.observability import metrics as m

    m.VALIDATION_VERSION.labels(dataset="held").set(-1)
    validation().restore_series()
    assert m.VALIDATION_VERSION.labels(dataset="held")._value.get() == 4
    assert m.VALIDATION_AVG.labels(dataset="held")._value.get() == pytest.approx(runs["v"].validations()[4]["held"]["avg_at_n"])
