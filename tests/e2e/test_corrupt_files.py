"""Files cut by a crash or a power cut: the newest checkpoint half-written (its COMPLETE marker
present), a garbage trainer state, tensor data zeroed with sizes and header kept (only the
manifest's SHA-256 tells), a half-written published weights file. A learner restarted on a
checkpoint it cannot read falls back (to the weights it published for the same step, logged) and
the run finishes exactly once; weights no rollout worker can load fail the run at once, naming the
file, instead of stalling it.

The four services run as processes over a real Redis; the files are damaged between a SIGKILL and
a restart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from waiting import wait_for
from world import World, assert_exactly_once, drive, running_world

from magic.protocol import keys

pytestmark = pytest.mark.e2e


@pytest.fixture
def world(tmp_path, tiny_model_dir):
    with running_world(tmp_path, tiny_model_dir, MAGIC_CHECKPOINT_EVERY="1") as w:
        yield w


def recorded(w: World, run: str) -> int:
    return int(w.r.llen(keys.RunKeys(run).metrics))


def learner_stopped_at(w: World, run: str) -> Path:
    """Pause the run after step 1 (the learner has committed its last step and writes that step's
    checkpoint), SIGKILL the learner: the checkpoint of its last committed step, complete."""
    wait_for(lambda: recorded(w, run) >= 2, 120, "step 1 recorded")
    assert w.api.post(f"/v1/runs/{run}/pause").status_code == 200
    wait_for(lambda: w.status(run)["status"] == "paused", 60, "the run to pause")
    last = int(w.r.hget(keys.RunKeys(run).learner_state, "last_step"))
    ckpt = Path(w.sup.base_env["MAGIC_DATA_DIR"]) / "runs" / run / "checkpoints" / f"step-{last + 1:08d}"  # the policy after its last step
    wait_for(lambda: (ckpt / "COMPLETE").exists(), 30, f"checkpoint {ckpt.name}")
    w.sup.kill("learner")
    return ckpt


@pytest.mark.parametrize("damage", ["half-written weights", "garbage trainer state", "zeroed tensor data"])
def test_a_learner_restarted_on_an_unreadable_checkpoint_falls_back_and_the_run_finishes(world, damage):
    run = "ckpt-" + damage.split()[0]
    world.submit(run, steps=4)
    ckpt = learner_stopped_at(world, run)
    if damage == "half-written weights":
        weights = ckpt / "model.safetensors"
        with weights.open("r+b") as f:
            f.truncate(weights.stat().st_size // 2)
    elif damage == "zeroed tensor data":  # size and header kept: only the digest tells
        weights = ckpt / "model.safetensors"
        header, size = 8 + int.from_bytes(weights.read_bytes()[:8], "little"), weights.stat().st_size
        with weights.open("r+b") as f:
            f.seek(header)
            f.write(b"\0" * (size - header))
    else:
        (ckpt / "trainer_state.json").write_text("{not json")
    world.start("learner")
    assert world.api.post(f"/v1/runs/{run}/resume").status_code == 200
    status, _ = drive(world, run, {}, timeout=150)
    assert_exactly_once(world, run, 4, status)
    log = world.sup.get("learner").log_tail(400)
    assert f"checkpoint {ckpt} is unreadable" in log and "without a (readable) checkpoint" in log
    # the reset of the optimizer state is recorded, not silent: in the step record, the run's status
    resumed = int(ckpt.name.split("-")[1])  # the policy after K steps resumes at step K
    records = world.api.get(f"/v1/runs/{run}/metrics").json()
    assert [r["step"] for r in records if r.get("optimizer_reset")] == [resumed]
    view = world.api.get(f"/v1/runs/{run}").json()
    assert view["optimizer_resets"] == 1 and view["last_optimizer_reset_step"] == resumed
    if damage == "zeroed tensor data":
        assert "model.safetensors does not match its SHA-256" in log
        from safetensors.torch import load_file

        published = sorted((Path(world.sup.base_env["MAGIC_DATA_DIR"]) / "runs" / run / "weights").glob("v*/model.safetensors"))
        norm = lambda path: sum(float(t.float().norm()) ** 2 for t in load_file(str(path)).values()) ** 0.5  # noqa: E731
        assert norm(published[-1]) > 0.5 * norm(published[0]), "the run trained on from the zeroed weights"


def test_published_weights_no_worker_can_load_fail_the_run_at_once(world):
    run = "cut-weights"
    world.submit(run, steps=6)
    wait_for(lambda: recorded(world, run) >= 2, 120, "step 1 recorded")
    world.sup.kill("rollout-0")
    weights = Path(world.sup.base_env["MAGIC_DATA_DIR"]) / "runs" / run / "weights"
    newest = max((d for d in weights.iterdir() if (d / "COMPLETE").exists()), key=lambda d: d.name)
    with (newest / "model.safetensors").open("r+b") as f:
        f.truncate(1000)
    world.start("rollout-0")
    deadline = time.monotonic() + 60
    status: dict = {}
    while time.monotonic() < deadline and status.get("status") != "failed":
        time.sleep(0.5)
        status = world.api.get(f"/v1/runs/{run}").json()
    assert status.get("status") == "failed", status
    assert "cannot be loaded" in status["error"] and newest.name in status["error"], status["error"]
