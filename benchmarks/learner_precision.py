"""Learner step time and peak memory: fp32 vs bf16 (float32 master weights), with and without
activation checkpointing, on a randomly initialised Qwen2-shaped model.

    .venv/bin/python benchmarks/learner_precision.py --preset small           # what fits a shared CPU box
    .venv/bin/python benchmarks/learner_precision.py --preset qwen2-0.5b --device cuda --seqs 8 --seq-len 4096

Each variant runs in its own process: it builds the model (Qwen2ForCausalLM from a Qwen2Config of
the preset's shape, float32, random weights), wraps it in the torch backend with the variant's
precision and checkpointing, and runs `--steps` on-policy training steps (`Trainer.train_step`,
the full MAGIC loss with the entropy bonus) on a synthetic batch of `--seqs` sequences of
`--seq-len` tokens (a quarter prompt), all in one micro-batch. The first step is a warm-up; the
table shows the mean of the others. Peak memory is the process's resident high-water mark
(getrusage ru_maxrss) on CPU and torch.cuda.max_memory_allocated on CUDA, in total (weights,
gradients, optimizer state and activations) and above the model's float32 weights alone.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from _proc import rss_bytes

PRESETS = {
    # Qwen2 shapes (hidden, layers, heads, kv heads, intermediate, vocab, tied embeddings)
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=1024, vocab_size=151936, tie_word_embeddings=True),
    "qwen2-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "qwen2-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "qwen2-7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}
VARIANTS = [("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)]



def _batch(n_seqs: int, seq_len: int, vocab: int, seed: int):
    """One step's scored groups: groups of 4 samples, rewards 0/1 alternating, the sampler's
    log-probs arbitrary (on-policy training ignores them)."""
    import random

    from magic.protocol.pb import messages_pb2 as pb

    rng = random.Random(seed)
    prompt_len = seq_len // 4
    groups = []
    for g in range(max(1, n_seqs // 4)):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        samples = [pb.Sample(response_ids=[rng.randrange(3, vocab) for _ in range(seq_len - prompt_len)], logprobs=[-1.0] * (seq_len - prompt_len),
                             finish_reason=pb.FINISH_REASON_STOP, policy_version=0) for _ in range(4)]
        scores = [pb.Score(reward=float(j % 2), correctness=float(j % 2)) for j in range(4)]
        groups.append(pb.ScoredGroup(rollout=pb.RolloutGroup(prompt=pb.PromptGroup(step=0, group_id=f"0:{g}"), prompt_ids=prompt, samples=samples), scores=scores))
    return groups


def child(args: argparse.Namespace, precision: str, checkpointing: bool) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from magic.config.schema import OptimConfig, StageConfig
    from magic.learner.backends import TorchBackend
    from magic.learner.trainer import Trainer

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    shape = PRESETS[args.preset]
    model = Qwen2ForCausalLM(Qwen2Config(**shape, use_cache=False)).to(device)
    params = sum(p.numel() for p in model.parameters())
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = rss_bytes()
    optim = OptimConfig()
    backend = TorchBackend(model, optim, device, chunk_size=args.chunk, precision=precision, activation_checkpointing=checkpointing)
    trainer = Trainer(backend, optim, pad_id=0, micro_batch_tokens=args.seqs * args.seq_len, chunk_size=args.chunk)
    stage = StageConfig(steps=1, T=args.seq_len, D_R=max(1, args.seqs // 4), gs=4, lr=1e-6, entropy={"adaptive": False, "coef": 0.001})
    times = []
    for k in range(args.steps):
        batch = _batch(args.seqs, args.seq_len, shape["vocab_size"], seed=k)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        rec = trainer.train_step(batch, version=0, stage=stage)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    timed = times[1:] or times
    return {
        "precision": precision,
        "checkpointing": checkpointing,
        "params": params,
        "step_seconds": sum(timed) / len(timed),
        "peak_gib": peak / 2**30,
        "peak_above_weights_gib": (peak - base) / 2**30,
        "loss": rec["loss"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="small")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seqs", type=int, default=8, help="sequences per step (groups of 4)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per sequence (prompt + response)")
    p.add_argument("--steps", type=int, default=2, help="training steps per variant (the first is a warm-up)")
    p.add_argument("--chunk", type=int, default=1024, help="logprob_chunk_size")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--variants", default="all", help="comma-separated precision:checkpointing, e.g. fp32:0,bf16:1")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        precision, ckpt = args.child.split(":")
        print(json.dumps(child(args, precision, ckpt == "1")))
        return
    variants = VARIANTS if args.variants == "all" else [(v.split(":")[0], v.split(":")[1] == "1") for v in args.variants.split(",")]
    shape = PRESETS[args.preset]
    print(f"model: Qwen2-shaped '{args.preset}' (hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers, "
          f"vocab {shape['vocab_size']}); {args.seqs} x {args.seq_len} tokens per step, device {args.device}", flush=True)
    print(f"{'precision':>9} {'checkpointing':>13} {'params M':>8} {'step s':>8} {'peak GiB':>9} {'above fp32 weights GiB':>23} {'loss':>9}", flush=True)
    for precision, ckpt in variants:  # one process per variant: each peak is its own
        cmd = [sys.executable, __file__, *sys.argv[1:], "--child", f"{precision}:{int(ckpt)}"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"variant {precision} checkpointing={ckpt} failed")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['precision']:>9} {str(r['checkpointing']):>13} {r['params'] / 1e6:8.1f} {r['step_seconds']:8.2f} {r['peak_gib']:9.2f} "
              f"{r['peak_above_weights_gib']:23.2f} {r['loss']:9.4f}", flush=True)

if __name__ == "__main__":
    main()
