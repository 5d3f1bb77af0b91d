"""One rank of a multi-process learner run for tests/integration/test_learner_deepspeed.py.

    python learner_ranks.py MODEL_DIR OUT ZERO_STAGE [PRECISION [CHECKPOINTING]]   (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)

Trains two steps of the synthetic batches of `learner_batches` with the DeepSpeed backend,
checkpoints (collective), gathers the full weights, and on rank 0 saves the step records and the
weights to OUT.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for learner_batches

from learner_batches import scored_groups, stage  # noqa: E402

from magic import modeling  # noqa: E402
from magic.config.schema import OptimConfig  # noqa: E402
from magic.learner import backends  # noqa: E402
from magic.learner.trainer import Trainer  # noqa: E402


def main(model_dir: str, out: str, zero_stage: int, precision: str = "fp32", checkpointing: bool = False) -> None:
    torch.set_num_threads(1)
    rank, world = backends.init_distributed(torch.device("cpu"), 120)
    optim = OptimConfig(max_grad_norm=1.0)
    model = backends.DeepSpeedBackend.load_policy(model_dir, torch.device("cpu"), zero_stage, precision)  # as the learner loads it
    backend = backends.DeepSpeedBackend(
        model, optim, torch.device("cpu"), zero_stage, chunk_size=5, precision=precision, activation_checkpointing=checkpointing, model_dir=model_dir
    )
    # pi_ref loaded by the backend as the learner does: partitioned under ZeRO-3, a replica otherwise
    trainer = Trainer(backend, optim, 0, 28, load_reference=lambda: modeling.load_model(model_dir).requires_grad_(False), chunk_size=5)
    vocab = modeling.load_model_config(model_dir).vocab_size
    records = [trainer.train_step(scored_groups(k, 4, 4, vocab, seed=3), version=k, stage=stage()) for k in range(2)]
    ckpt = trainer.save_checkpoint(Path(out).parent / f"ckpt-{world}-{zero_stage}-{precision}", 2, keep=1)  # the policy after steps 0 and 1
    state = backend.full_state_dict()
    if rank == 0:
        dtypes = sorted({str(p.dtype) for p in backend.policy.parameters()})
        torch.save({"records": records, "state": state, "ckpt": str(ckpt), "dtypes": dtypes}, out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *(sys.argv[4:5]), *([sys.argv[5] == "1"] if len(sys.argv) > 5 else []))
