"""A learner checkpoint resumes at another shape (`worker._attach`, `checkpoints.resume_mode`): written
at 2 DeepSpeed ranks (ZeRO-2), resumed at 1 rank, which trains a step and checkpoints; that resumed
at 4 ranks under ZeRO-3, which trains a step and checkpoints; that resumed at 2 ranks under ZeRO-2
again — each through DeepSpeed's universal checkpoint format — and every next-step record equals
the one of a learner that stayed at 2 ranks. A change of backend is refused, saying
what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import learner_batches
from ranks import run_ranks

HERE = Path(__file__).parent
KEYS = learner_batches.RECORD_KEYS


@pytest.fixture(scope="module")
def two_rank_checkpoint(tiny_model_dir, tmp_path_factory) -> Path:
    """Steps 0 and 1 trained on 2 ranks (ZeRO-2), the checkpoint of the policy after them (version 2)."""
    out = tmp_path_factory.mktemp("resume") / "first.pt"
    run_ranks(HERE / "learner_ranks.py", 2, str(tiny_model_dir), str(out), "2")
    return out.parent / "ckpt-2-2-fp32" / "step-00000002"


def records(path: Path) -> list[dict]:
    return json.loads(path.read_text())["records"]


def test_resume_2_to_1_to_4_ranks_gives_the_same_next_steps(tiny_model_dir, two_rank_checkpoint, tmp_path):
    model = str(tiny_model_dir)
    run_ranks(HERE / "resume_ranks.py", 2, model, str(two_rank_checkpoint), str(tmp_path / "stay.json"), "deepspeed", "2", "2,3,4")
    stay = records(tmp_path / "stay.json")

    run_ranks(HERE / "resume_ranks.py", 1, model, str(two_rank_checkpoint), str(tmp_path / "one.json"), "deepspeed", "2", "2", str(tmp_path / "one-ckpts"))
    one_ckpt = tmp_path / "one-ckpts" / "step-00000003"
    assert json.loads((one_ckpt / "trainer_state.json").read_text())["shape"] == {"backend": "deepspeed", "world_size": 1, "zero_stage": 2, "precision": "fp32"}
    assert (two_rank_checkpoint.parent.parent / "universal" / two_rank_checkpoint.name / "UNIVERSAL_COMPLETE").is_file()
    run_ranks(HERE / "resume_ranks.py", 4, model, str(one_ckpt), str(tmp_path / "four.json"), "deepspeed", "3", "3", str(tmp_path / "four-ckpts"))
    four_ckpt = tmp_path / "four-ckpts" / "step-00000004"
    run_ranks(HERE / "resume_ranks.py", 2, model, str(four_ckpt), str(tmp_path / "back.json"), "deepspeed", "2", "4")
    chain = records(tmp_path / "one.json") + records(tmp_path / "four.json") + records(tmp_path / "back.json")
    assert len(chain) == 3

    for a, b in zip(stay, chain, strict=True):
        for key in KEYS:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_a_change_of_backend_is_refused_with_what_to_do(tiny_model_dir, two_rank_checkpoint, tmp_path):
    out = tmp_path / "torch.json"
    run_ranks(HERE / "resume_ranks.py", 1, str(tiny_model_dir), str(two_rank_checkpoint), str(out), "torch", "2", "2")
    got = json.loads(out.read_text())
    assert got["error"] == "ResumeShapeError"
    assert "written by the deepspeed backend (2 rank(s))" in got["message"] and "MAGIC_BACKEND=deepspeed" in got["message"]
