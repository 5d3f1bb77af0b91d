"""One rank of tests/integration/test_learner_sharded_load.py.

    python sharded_load_rank.py MODEL_DIR OUT ZERO_STAGE PRECISION   (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)

Loads the policy as the learner does (`DeepSpeedBackend.load_policy`) and reports the rank's peak
resident memory over the load (VmHWM, reset just before) above its resident memory before it; then
gathers the loaded weights bucket by bucket (`state_dict_buckets`) and, on rank 0, saves them to OUT
for the test to compare with the files.
"""

import json
import sys
import threading
import time
from pathlib import Path

import torch

from magic.learner import backends


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def main(model_dir: str, out: str, zero_stage: int, precision: str) -> None:
    torch.set_num_threads(1)
    rank, world = backends.init_distributed(torch.device("cpu"), 120)
    import transformers  # noqa: F401  (imported before the baseline: the load's own cost is what is measured)
    from transformers.models.qwen2 import modeling_qwen2  # noqa: F401

    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM
    peak_anon = [status("RssAnon")]
    done = threading.Event()

    def sample() -> None:  # the anonymous memory's peak (VmHWM counts file pages too)
        while not done.is_set():
            peak_anon[0] = max(peak_anon[0], status("RssAnon"))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    anon_before = peak_anon[0]
    sampler.start()
    model = backends.DeepSpeedBackend.load_policy(model_dir, torch.device("cpu"), zero_stage, precision)
    done.set()
    sampler.join()
    peak = status("VmHWM") - before
    held = sum((getattr(p, "ds_tensor", None) if zero_stage == 3 else p).numel() * p.element_size() for p in model.parameters())
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    backend = backends.DeepSpeedBackend(model, __import__("magic.config.schema", fromlist=["OptimConfig"]).OptimConfig(), torch.device("cpu"),
                                        zero_stage, chunk_size=5, precision=precision, model_dir=model_dir)
    state = {}
    for bucket in backend.state_dict_buckets(1 << 16, None):
        if bucket is not None:
            state.update(bucket)
    Path(f"{out}.{rank}.json").write_text(json.dumps({"peak": peak, "peak_anon": peak_anon[0] - anon_before, "held": held, "dtypes": dtypes}))
    if rank == 0:
        torch.save(state, out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
