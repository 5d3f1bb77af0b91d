"""One demo step on CPU with each rollout engine: the torch engine vs vLLM (the CPU build).

    .venv/bin/python benchmarks/rollout_engines.py                 # 64 prompts x 8 samples, T = 72
    .venv/bin/python benchmarks/rollout_engines.py --prompts 16    # quick

The demo model (`.magic/demo/model` when `magic local` has built it, else the same architecture
untrained) generates one on-policy step's rollouts: D_R prompts of the demo task x gs samples at
tau = 1, at most T tokens each. Then one weight push as the learner does it each step: the
`filesystem` sender writes the next version (safetensors, fsync, checksum) and the engine loads it
(torch: load_state_dict; vLLM: pause, reload_weights, refresh_cpu_head, update_weight_version,
resume). Reported: generation tokens/s, push seconds (write + load), and push time as a
fraction of (generation + push). The vLLM server is started from `.venv-vllm` (`make vllm-venv`)
and its start time is reported apart. Figures depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def model_dir(work: Path) -> Path:
    demo = Path(".magic/demo/model")
    if (demo / "config.json").exists():
        return demo.resolve()
    from magic.demo.prepare import build_model

    out = work / "model"
    build_model(out, seed=0)
    return out


def requests(engine, prompts: int, group_size: int, max_tokens: int):
    from magic.demo import task
    from magic.rollout.engine import GenerationRequest

    items = task.make_splits(1, 0, prompts, 0)["train"]
    out = []
    for i, item in enumerate(items):
        ids = engine.render_prompt(task.record(item, "train", i)["prompt"])
        out.append(GenerationRequest(ids, n=group_size, temperature=1.0, top_p=1.0, max_tokens=max_tokens, seed=i))
    return out


def push(engine, store, model, version: int) -> tuple[float, float]:
    """Write `version` like the learner's filesystem sender and load it into `engine`; (write s, load s)."""
    from magic import modeling
    from magic.weights import Checkpoint

    state = {k: v for k, v in modeling.export_state_dict(model).items() if k != "lm_head.weight"}
    t0 = time.perf_counter()
    directory, _, _ = store.write(version, state, model.config.to_json_string())
    t1 = time.perf_counter()
    engine.load_checkpoint(Checkpoint(version, directory))
    return t1 - t0, time.perf_counter() - t1


def measure(name: str, engine, reqs, store, model) -> dict:
    engine.generate(reqs[:2])  # warm-up
    _, stats = engine.generate(reqs)
    write, load = push(engine, store, model, version=len(store.complete_versions()) + 1)
    step = stats.seconds + write + load
    row = {
        "engine": name, "sequences": stats.sequences, "tokens": stats.tokens, "generate_s": round(stats.seconds, 2),
        "tokens_per_s": round(stats.tokens / stats.seconds, 1), "push_write_s": round(write, 3), "push_load_s": round(load, 3),
        "push_fraction_of_step": round((write + load) / step, 3),
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=72)
    p.add_argument("--engines", default="torch,vllm")
    args = p.parse_args()

    import torch

    from magic import modeling
    from magic.rollout.engine import TorchEngine
    from magic.rollout.vllm_engine import VllmEngine
    from magic.rollout.vllm_server import VllmServer, VllmServerConfig
    from magic.weights import FilesystemWeightStore

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = model_dir(work)
        model = modeling.load_model(path)
        print(f"model {path}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters; "
              f"{args.prompts} prompts x {args.group_size} samples, max {args.max_tokens} tokens", flush=True)
        if "torch" in args.engines:
            engine = TorchEngine(str(path), max_batch_sequences=1024)
            measure("torch", engine, requests(engine, args.prompts, args.group_size, args.max_tokens), FilesystemWeightStore(work / "w-torch"), model)
            engine.close()
        if "vllm" in args.engines:
            t0 = time.perf_counter()
            server = VllmServer(VllmServerConfig(model=str(path)), work / "vllm.log").start()
            print(f"vLLM server start: {time.perf_counter() - t0:.1f}s", flush=True)
            engine = VllmEngine(server.url, str(path), max_batch_sequences=1024, server=server)
            try:
                measure("vllm", engine, requests(engine, args.prompts, args.group_size, args.max_tokens), FilesystemWeightStore(work / "w-vllm"), model)
            finally:
                engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
