"""The learner worker over a real Redis: trains each step once its groups are in, checkpoints, and
a restarted learner resumes from the checkpoint to give the same next step as one that never stopped."""

from __future__ import annotations

import pytest
import torch
from learner_batches import publish_step, scored_groups

from magic import modeling
from magic.config.schema import RunSpec, StageConfig
from magic.learner.settings import LearnerSettings
from magic.learner.worker import LearnerWorker, checkpoint_root
from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.channels import RunChannels
from magic.store.streams import Stream

pytestmark = pytest.mark.integration

STAGE = {"steps": 5, "T": 16, "D_R": 4, "D_T": 2, "N_reuse": 2, "gs": 4, "lr": 5e-3, "entropy": {"adaptive": True, "target": 10.0, "delta": 0.01}}


def start_run(r, run_id: str, model_dir) -> None:
    spec = RunSpec(name=run_id, model=str(model_dir), train_files=["unused.jsonl"], stages=[STAGE])
    r.set(keys.RunKeys(run_id).spec, spec.model_dump_json())


def feed(r, run_id: str, step: int, vocab: int) -> None:
    publish_step(r, run_id, step, StageConfig.model_validate(STAGE), scored_groups(step, 4, 4, vocab, seed=11))


def train(worker: LearnerWorker, r, run_id: str, step: int, vocab: int) -> dict[str, float]:
    feed(r, run_id, step, vocab)
    for _ in range(50):
        worker.poll()
        if worker.step > step:
            break
    assert worker.step == step + 1
    events = [e for _, e in Stream(r, keys.RunKeys(run_id).events_of("learner")).read_after("0", pb.Event) if e.WhichOneof("kind") == "step_completed"]
    return dict(events[-1].step_completed.metrics)


def test_a_restarted_learner_resumes_from_its_checkpoint(r, tmp_path, tiny_model_dir):
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    settings = LearnerSettings(data_dir=tmp_path, worker_name="learner-test", checkpoint_every=1, keep_checkpoints=2, micro_batch_tokens=64)
    for run_id in ("straight", "restarted"):
        start_run(r, run_id, tiny_model_dir)

    straight = LearnerWorker(RunChannels(r, "straight", "learner", settings.worker_name), settings)
    expected = [train(straight, r, "straight", k, vocab) for k in range(3)]
    straight.close()

    first = LearnerWorker(RunChannels(r, "restarted", "learner", settings.worker_name), settings)
    for k in range(2):
        assert train(first, r, "restarted", k, vocab)["loss"] == pytest.approx(expected[k]["loss"], rel=1e-6)
    first.close()  # the process "dies"; a new one attaches to the same run
    assert sorted(p.name for p in checkpoint_root(settings, "restarted").iterdir()) == ["step-00000001", "step-00000002"]  # the policy after 1 and 2 steps

    second = LearnerWorker(RunChannels(r, "restarted", "learner", settings.worker_name), settings)
    assert second.step == 2 and second.trainer.controller.coef == pytest.approx(0.02)
    got = train(second, r, "restarted", 2, vocab)
    second.close()
    assert got["entropy_coef"] == pytest.approx(0.02) and got["entropy_bonus_active"] == 1.0
    for key in ("loss", "pg_loss", "entropy", "kl_old", "grad_norm"):
        assert got[key] == pytest.approx(expected[2][key], rel=1e-5), key
    assert sorted(p.name for p in checkpoint_root(settings, "restarted").iterdir()) == ["step-00000002", "step-00000003"]


def test_checkpoints_the_controller_asks_for_hold_the_version_they_name_and_the_best_is_kept(r, tmp_path, tiny_model_dir):
    """A request in step k's record (a stage ended, a best validation) is the policy after k steps,
    written before step k trains; the best is kept past `keep_checkpoints`; the plan's end is a
    request alone, answered once the checkpoint is on disk."""
    from magic.learner.checkpoints import read_trainer_state
    from magic.store.steps import StepStore

    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    settings = LearnerSettings(data_dir=tmp_path, worker_name="learner-test", checkpoint_every=0, keep_checkpoints=1, micro_batch_tokens=64)
    start_run(r, "asked", tiny_model_dir)
    steps = StepStore(r, "asked")
    worker = LearnerWorker(RunChannels(r, "asked", "learner", settings.worker_name), settings)
    root = checkpoint_root(settings, "asked")
    train(worker, r, "asked", 0, vocab)
    after_one = {k: v.detach().clone() for k, v in worker.trainer.backend.full_state_dict().items()}
    publish_step(r, "asked", 1, StageConfig.model_validate(STAGE), scored_groups(1, 4, 4, vocab, seed=11), checkpoint=True)
    for _ in range(50):
        worker.poll()
        if worker.step > 1:
            break
    worker.trainer.wait_for_checkpoint()  # written in the background while step 1 trained
    assert worker.step == 2 and steps.learner_checkpoint() is None  # only the plan's end is acknowledged
    assert [p.name for p in root.glob("step-*")] == ["step-00000001"] and read_trainer_state(root / "step-00000001")["policy_version"] == 1
    saved = modeling.load_model(root / "step-00000001", dtype=next(iter(after_one.values())).dtype).state_dict()
    assert set(after_one) <= set(saved) and all(torch.equal(saved[k], v) for k, v in after_one.items())  # the weights before step 1, not after

    publish_step(r, "asked", 2, StageConfig.model_validate(STAGE), scored_groups(2, 4, 4, vocab, seed=11), checkpoint=True, keep_version=1)
    for _ in range(50):
        worker.poll()
        if worker.step > 2:
            break
    worker.trainer.wait_for_checkpoint()
    assert sorted(p.name for p in root.glob("step-*")) == ["step-00000001", "step-00000002"]  # keep 1, and the best (v1)

    pipe = r.pipeline(transaction=True)  # the plan ends after 3 steps: a request alone
    steps.request_checkpoint(pipe, 3, keep_version=1)
    pipe.execute()
    assert steps.checkpoint_request(3).version == 3
    worker.poll()
    worker.close()
    assert steps.learner_checkpoint() == 3
    assert sorted(p.name for p in root.glob("step-*")) == ["step-00000001", "step-00000003"]  # v2 went: not the newest, not the best


def test_a_stage_that_does_not_fit_is_refused_before_anything_loads(r, tmp_path, tiny_model_dir, monkeypatch):
    """The memory plan at attach (`LearnerWorker.check_stage`): a stage whose plan exceeds the
    host's memory fails the run with the plan's reason and the knob, and no weight is loaded."""
    from magic import modeling as m
    from magic.learner.worker import MemoryPlanError

    start_run(r, "too-big", tiny_model_dir)
    loaded = []
    monkeypatch.setattr(m, "load_model", lambda *a, **k: loaded.append(a) or pytest.fail("loaded a model"))
    settings = LearnerSettings(data_dir=tmp_path, worker_name="learner-test", micro_batch_tokens=64, host_memory_bytes=50_000_000)
    with pytest.raises(MemoryPlanError, match=r"stage 'stage' \(T = 16\): a learner pod needs .* GiB of host memory, over its 0\.05 GiB limit"):
        LearnerWorker(RunChannels(r, "too-big", "learner", settings.worker_name), settings)
    assert not loaded
    monkeypatch.undo()
    fits = LearnerSettings(data_dir=tmp_path, worker_name="learner-test", micro_batch_tokens=64, host_memory_bytes=8 * 2**30)
    LearnerWorker(RunChannels(r, "too-big", "learner", fits.worker_name), fits).close()  # the same run fits 8 GiB


ON_POLICY = {"steps": 5, "T": 16, "D_R": 4, "gs": 4, "lr": 5e-3, "entropy": {"adaptive": True, "target": 10.0, "delta": 0.01}}


@pytest.mark.parametrize("plan", ["on-policy", "n-sgd-2-slot"])
def test_a_step_trains_each_group_as_it_arrives_and_updates_as_the_barrier_would(r, tmp_path, tiny_model_dir, plan):
    """Half the step's groups arrive, the learner trains them (no update yet), the rest arrive, the
    update is applied: the same step record and the same weights as a learner that waited for the
    whole batch (MAGIC_STREAM=false). With N_SGD = 2 (D_T = 2, rule "slot") the first half is the
    first mini-batch: its backward and the no-grad pass run before the rest arrives."""
    import torch

    from magic.protocol import keys as k
    from magic.store.steps import StepStore

    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    config = ON_POLICY if plan == "on-policy" else {**ON_POLICY, "D_T": 2, "minibatch_rule": "slot"}
    stage = StageConfig.model_validate(config)
    results = {}
    for name, stream in (("barrier", False), ("streamed", True)):
        run_id = f"{plan}-{name}"
        spec = RunSpec(name=run_id, model=str(tiny_model_dir), train_files=["unused.jsonl"], stages=[config])
        r.set(k.RunKeys(run_id).spec, spec.model_dump_json())
        settings = LearnerSettings(data_dir=tmp_path / run_id, worker_name="learner-test", checkpoint_every=0, micro_batch_tokens=64, stream=stream)
        worker = LearnerWorker(RunChannels(r, run_id, "learner", settings.worker_name), settings)
        groups = scored_groups(0, 4, 4, vocab, seed=21)
        for g in groups:
            g.rollout.prompt.run_id = run_id
        pipe = r.pipeline(transaction=True)
        StepStore(r, run_id).publish_step(pipe, 0, 0, stage, [g.rollout.prompt for g in groups])
        pipe.execute()
        before = {n: p.detach().clone() for n, p in worker.trainer.backend.policy.named_parameters()}
        for g in groups[:2]:
            Stream(r, k.RunKeys(run_id).scored).add(g)
        for _ in range(5):
            worker.poll()
        assert worker.step == 0  # half the batch: no update
        if stream:
            assert worker._streamed == {g.rollout.prompt.group_id for g in groups[:2]}  # ...but its groups already trained
            assert worker._stream.sums["tokens"] > 0  # their backward ran (N_SGD = 2: the first mini-batch is slots 0 and 1)
            assert all(torch.equal(p, before[n]) for n, p in worker.trainer.backend.policy.named_parameters())
        for g in groups[2:]:
            Stream(r, k.RunKeys(run_id).scored).add(g)
        for _ in range(50):
            worker.poll()
            if worker.step > 0:
                break
        assert worker.step == 1
        events = [e for _, e in Stream(r, k.RunKeys(run_id).events_of("learner")).read_after("0", pb.Event) if e.WhichOneof("kind") == "step_completed"]
        results[name] = dict(events[-1].step_completed.metrics), {n: p.detach().clone() for n, p in worker.trainer.backend.policy.named_parameters()}
        worker.close()
    (barrier, wb), (streamed, ws) = results["barrier"], results["streamed"]
    assert barrier["streamed"] == 0.0 and streamed["streamed"] == 1.0
    assert streamed["sgd_steps"] == barrier["sgd_steps"] == stage.n_sgd
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "tokens_trained", "groups_trained"):
        assert streamed[key] == pytest.approx(barrier[key], rel=1e-5), key
    flat = lambda weights: torch.cat([w.flatten() for w in weights.values()])  # noqa: E731
    assert torch.linalg.norm(flat(ws) - flat(wb)) <= 1e-5 * torch.linalg.norm(flat(wb))  # the model in float32: the sums' order shows at ~1e-7
