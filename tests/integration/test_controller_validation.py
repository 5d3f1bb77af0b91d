"""The controller's validation over a real Redis: groups published once per version with
deterministic ids, scored groups read from the `estimates` stream and counted once (a replay, a
restarted controller), forged groups dead-lettered, figures equal to the hand-computed ones."""

from __future__ import annotations

import json

import pytest
from held_out import held_file, receive, run_job, score

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
    spec = RunSpec(name="v", model="m", datasets=["held"], stages=[{"steps": 4, "T": 16, "D_R": 2, "gs": 2}], validation={"datasets": ["held"], "every": 2, "samples": 4, "pass_k": 2, "dump_prompts": 2})
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
        run_job(v1.job(spec, 2, 0, 16), lambda: (score(r, "v", stop_after=2), receive(v1), (_ for _ in ()).throw(RuntimeError("died"))))
    assert r.xlen(rk.prompts) == 3
    published, received = runs["v"].evaluation_progress("validation:2")
    assert published == 3 and len(received) == 2
    # a restarted controller: publishes nothing again, rereads the pending entries (replays), counts each group once
    v2 = validation()
    calls: list[int] = []
    figures = run_job(v2.job(spec, 2, 0, 16), lambda: (calls.append(1), score(r, "v", forged="val:2:held:00000" if not calls[1:] else None), receive(v2)))
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
    assert f["maj_at_n"] == pytest.approx((0 + 0 + 1) / 3)  # held:1's right answer is outvoted by a wrong one
    assert runs["v"].validations() == {2: figures}
    # the generations of the first 2 prompts, every sample, in prompt order
    rows = [json.loads(x) for x in (runs["v"].run_dir / "generations" / "step-00000002.jsonl").read_text().splitlines()]
    assert [(x["uid"], x["sample"]) for x in rows] == [(f"held:{p}", i) for p in (1, 2) for i in range(4)]
    assert rows[0] | {"response": None} == {
        "dataset": "held", "uid": "held:1", "data_source": "math", "sample": 0, "prompt": "q1", "ground_truth": "1", "response": None, "answer": "1",
        "verdict": "correct", "correct": True, "tokens": 3, "truncated": False, "policy_version": 2,
    } and rows[0]["response"] == "so the answer is \\boxed{1}"
    assert [x["verdict"] for x in rows[4:]] == ["no_answer", "wrong", "wrong", "no_answer"] and rows[7]["truncated"]
    assert runs["v"].evaluation_progress("validation:2") == (0, {})  # per-group outcomes dropped once summarised
    dead = [d for _, d in Stream(r, rk.dead_of("controller")).read_after("0", pb.DeadLetter)]
    assert len(dead) == 1 and "differs from the one the controller published" in dead[0].reason
    # the same seeds at every version (common random numbers); a finished validation is not run again
    run_job(v2.job(spec, 4, 0, 16), lambda: (score(r, "v"), receive(v2)))
    seeds = {}
    for _, p in Stream(r, rk.prompts).read_after("0", pb.PromptGroup):
        seeds.setdefault(p.prompt_uid, set()).add(p.sampling.seed)
    assert all(len(s) == 1 for s in seeds.values()) and len({s.pop() for s in seeds.values()}) == 3
    assert run_job(v2.job(spec, 2, 0, 16), lambda: pytest.fail("a finished validation ran again")) == figures
    # a controller restarted after both: the series show the newest stored point (version 4), not nothing
    from magic.observability import metrics as m

    m.VALIDATION_VERSION.labels(dataset="held").set(-1)
    validation().restore_series()
    assert m.VALIDATION_VERSION.labels(dataset="held")._value.get() == 4
    assert m.VALIDATION_AVG.labels(dataset="held")._value.get() == pytest.approx(runs["v"].validations()[4]["held"]["avg_at_n"])


def test_dump_prompts_counts_the_prompts_of_each_dataset(r, tmp_path):
    """The generations of the first `dump_prompts` prompts of *each* dataset: group indices run over
    the datasets one after the other."""
    registry = DatasetRegistry(DatasetIndex(r))
    registry.register(DatasetSpec(name="held", path=str(held_file(tmp_path))))
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"prompt": f"p{i}", "reward_model": {"ground_truth": str(i)}}) + "\n" for i in range(5)))
    registry.register(DatasetSpec(name="other", path=str(other)))
    spec = RunSpec(name="d", model="m", datasets=["held"], stages=[{"steps": 4, "T": 16, "D_R": 2, "gs": 2}],
                   validation={"datasets": ["held", "other"], "every": 2, "samples": 2, "dump_prompts": 2})
    runs = Runs(r, tmp_path / "data")
    runs.create(spec)
    channels = runs.channels("d", "controller-0", 5)
    v = Validation(runs["d"], channels.steps, channels.group("estimates", keys.CONTROLLER_GROUP), registry, ControllerSettings(data_dir=tmp_path / "data"))
    assert v._dumped() == {"held": 2, "other": 3 + 2}  # held's prompts are groups 0-2, other's 3-7
    with pytest.raises(ValueError, match="at most 100000"):
        RunSpec(name="d", model="m", datasets=["held"], stages=[{"steps": 4, "T": 16, "D_R": 2, "gs": 2}],
                validation={"datasets": ["held"], "samples": 1024, "dump_prompts": 100})


def test_generations_file_keeps_each_sample_once_in_prompt_order_and_skips_a_cut_line(tmp_path):
    from magic.controller.validation import append_generations, finish_generations, generations_path

    partial, final = generations_path(tmp_path, 4, partial=True), generations_path(tmp_path, 4)
    row = lambda i, s: {"uid": f"held:{i}", "sample": s, "response": f"r{i}{s}"}  # noqa: E731
    append_generations(partial, "val:4:held:00001", "held", [row(1, 0), row(1, 1)])
    append_generations(partial, "val:4:held:00000", "held", [row(0, 0), row(0, 1)])
    append_generations(partial, "val:4:held:00001", "held", [row(1, 0), row(1, 1)])  # a replay
    with partial.open("a") as f:
        f.write('{"group_id": "val:4:held:00002", "dataset": "held", "uid": "hel')  # a crash mid-line
    assert finish_generations(partial, final) == 4 and not partial.exists() and final.name == "step-00000004.jsonl"
    rows = [json.loads(x) for x in final.read_text().splitlines()]
    assert [(x["uid"], x["sample"]) for x in rows] == [("held:0", 0), ("held:0", 1), ("held:1", 0), ("held:1", 1)] and "group_id" not in rows[0]
    assert finish_generations(partial, final) == 4  # a restarted controller: the file is there already


def test_metrics_jsonl_ends_with_the_final_validation_and_mends_a_cut_line(r, tmp_path):
    """metrics.jsonl: one line per recorded step (Redis is authoritative), the final policy's
    validation last — replaced by the steps of a stage appended later —, and a last line a crash
    cut short rewritten from Redis instead of failing the run."""
    spec = RunSpec(name="m", model="m", datasets=["held"], stages=[{"steps": 2, "T": 16, "D_R": 2, "gs": 2}])
    runs = Runs(r, tmp_path / "data")
    runs.create(spec)
    store = runs["m"]
    path = store.run_dir / "metrics.jsonl"
    rk = keys.RunKeys("m")

    def record(k: int) -> None:
        r.rpush(rk.metrics, json.dumps({"step": k, "loss": 0.5}, sort_keys=True))

    record(0), record(1)
    assert store.sync_jsonl() == 2
    store.append_final_validation(2, {"held": {"avg_at_n": 0.5}})
    store.append_final_validation(2, {"held": {"avg_at_n": 0.5}})  # once
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2] and lines[-1] == {"step": 2, "policy_version": 2, "final": True, "validation": {"held": {"avg_at_n": 0.5}}}
    assert store.sync_jsonl() == 0 and len(path.read_text().splitlines()) == 3  # nothing new: the final line stays
    record(2)  # a stage appended: step 2 follows, the final line goes
    assert store.sync_jsonl() == 1 and [json.loads(x).get("final") for x in path.read_text().splitlines()] == [None, None, None]
    with path.open("a") as f:
        f.write('{"step": 3, "lo')  # a crash cut the next append short
    record(3)
    assert store.sync_jsonl() == 1 and [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2, 3]
