"""A learner checkpoint resumes at another shape (`worker._attach`, `checkpoints.resume_mode`): written
at 2 DeepSpeed ranks (ZeRO-2), resumed at 1 rank, which trains a step and checkpoints; that resumed
at 4 ranks under ZeRO-3, which trains a step and checkpoints; that resumed at 2 ranks under ZeRO-2
again — each through DeepSpeed's universal checkpoint format — and every next-step record equals
the one of a learner that stayed at 2 ranks. A change of backend is refused, saying
what to do."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import learner_batches

HERE = Path(__file__).parent
KEYS = learner_batches.RECORD_KEYS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: str, world: int, *args: str) -> None:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(HERE / script), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    assert all(p.returncode == 0 for p in procs), "\n".join(x[-4000:] for x in logs)


@pytest.fixture(scope="module")
def two_rank_checkpoint(tiny_model_dir, tmp_path_factory) -> Path:
    """Steps 0 and 1 trained on 2 ranks (ZeRO-2), checkpoint of step 1."""
    out = tmp_path_factory.mktemp("resume") / "first.pt"
    run_ranks("learner_ranks.py", 2, str(tiny_model_dir), str(out), "2")
    return out.parent / "ckpt-2-2-fp32" / "step-00000001"


def records(path: Path) -> list[dict]:
    return json.loads(path.read_text())["records"]


def test_resume_2_to_1_to_4_ranks_gives_the_same_next_steps(tiny_model_dir, two_rank_checkpoint, tmp_path):
    model = str(tiny_model_dir)
    run_ranks("resume_ranks.py", 2, model, str(two_rank_checkpoint), str(tmp_path / "stay.json"), "deepspeed", "2", "2,3,4")
    stay = records(tmp_path / "stay.json")

    run_ranks("resume_ranks.py", 1, model, str(two_rank_checkpoint), str(tmp_path / "one.json"), "deepspeed", "2", "2", str(tmp_path / "one-ckpts"))
    one_ckpt = tmp_path / "one-ckpts" / "step-00000002"
    assert json.loads((one_ckpt / "trainer_state.json").read_text())["shape"] == {"backend": "deepspeed", "world_size": 1, "zero_stage": 2, "precision": "fp32"}
    assert (two_rank_checkpoint.parent.parent / "universal" / two_rank_checkpoint.name / "UNIVERSAL_COMPLETE").is_file()
    run_ranks("resume_ranks.py", 4, model, str(one_ckpt), str(tmp_path / "four.json"), "deepspeed", "3", "3", str(tmp_path / "four-ckpts"))
    four_ckpt = tmp_path / "four-ckpts" / "step-00000003"
    run_ranks("resume_ranks.py", 2, model, str(four_ckpt), str(tmp_path / "back.json"), "deepspeed", "2", "4")
    chain = records(tmp_path / "one.json") + records(tmp_path / "four.json") + records(tmp_path / "back.json")
    assert len(chain) == 3

    for a, b in zip(stay, chain, strict=True):
        for key in KEYS:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_a_change_of_backend_is_refused_with_what_to_do(tiny_model_dir, two_rank_checkpoint, tmp_path):
    out = tmp_path / "torch.json"
    env_free = ["resume_ranks.py", 1, str(tiny_model_dir), str(two_rank_checkpoint), str(out), "torch", "2", "2"]
    run_ranks(*env_free)
    got = json.loads(out.read_text())
    assert got["error"] == "ResumeShapeError"
    assert "written by the deepspeed backend (2 rank(s))" in got["message"] and "MAGIC_BACKEND=deepspeed" in got["message"]
