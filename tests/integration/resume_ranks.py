"""One rank of tests/integration/test_learner_resume_shapes.py: resume a learner checkpoint as the
learner service does (`worker._attach`: at the checkpoint's shape, or converted through DeepSpeed's
universal format), train the given steps, optionally checkpoint.

    python resume_ranks.py MODEL_DIR CKPT OUT BACKEND ZERO_STAGE STEPS [SAVE_ROOT]   (RANK, WORLD_SIZE, ... set)

STEPS: comma-separated step numbers (the synthetic batches of `learner_batches`); OUT gets the step
records (rank 0) or the error's type and message.
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for learner_batches

from learner_batches import scored_groups, stage  # noqa: E402

from magic import modeling  # noqa: E402
from magic.config.schema import RunSpec  # noqa: E402
from magic.learner import backends, worker  # noqa: E402
from magic.learner.checkpoints import ResumeShapeError  # noqa: E402
from magic.learner.settings import LearnerSettings  # noqa: E402


def main(model_dir: str, ckpt: str, out: str, backend: str, zero_stage: int, steps: str, save_root: str | None = None) -> None:
    torch.set_num_threads(1)
    settings = LearnerSettings(backend=backend, zero_stage=zero_stage, logprob_chunk_size=5, micro_batch_tokens=64, check_memory=False)
    if backend == "deepspeed":
        backends.init_distributed(torch.device("cpu"), 120)
    spec = RunSpec(name="resume", model=model_dir, datasets=["unused"])
    try:
        trainer = worker._attach(settings, spec, ckpt, ckpt)
    except ResumeShapeError as exc:
        Path(out).write_text(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return
    vocab = modeling.load_model_config(model_dir).vocab_size
    records = [trainer.train_step(scored_groups(k, 4, 4, vocab, seed=3), version=k, stage=stage()) for k in map(int, steps.split(","))]
    if save_root:
        trainer.save_checkpoint(Path(save_root), int(steps.split(",")[-1]) + 1, keep=1, background=False)  # the policy after the last step
    if settings.rank == 0:
        Path(out).write_text(json.dumps({"records": records}))
    if backend == "deepspeed":
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5], int(sys.argv[5]), sys.argv[6], *(sys.argv[7:8]))
