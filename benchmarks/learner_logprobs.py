"""Peak memory of per-token log-probs + full-vocabulary entropy, forward and backward:
the chunked computation (`magic.modeling.ChunkedLogpEntropy`) against the naive one
(all tokens x vocab logits at once, autograd through log_softmax).

    .venv/bin/python benchmarks/learner_logprobs.py                      # 8k tokens x 152k vocab
    .venv/bin/python benchmarks/learner_logprobs.py --tokens 2048 --naive-tokens 2048

Each variant runs in its own process; its peak is the process's resident-memory high-water
mark (getrusage ru_maxrss, which sees torch's CPU allocations, unlike tracemalloc) minus the
resident memory just before the computation (inputs: hidden states and the output layer's
weight, both requiring gradients). On CUDA (--device cuda) torch.cuda.max_memory_allocated is used.

The naive variant needs about 5 x tokens x vocab float32 at its peak (~25 GB at 8k x 152k); when
the machine has less memory available than that (plus a margin), it runs at the largest power-of-2
fraction of the tokens that fits and the table says so, with the linear extrapolation (its peak
is proportional to the token count; the measured points show it).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from _proc import rss_bytes


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def child(variant: str, tokens: int, vocab: int, hidden: int, chunk: int, device: str) -> dict:
    import torch

    from magic import modeling

    torch.manual_seed(0)
    h = (torch.randn(tokens, hidden, device=device) * 0.02).requires_grad_()
    head = torch.nn.Linear(hidden, vocab, bias=False).to(device)
    targets = torch.randint(0, vocab, (tokens,), device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = rss_bytes()
    t0 = time.perf_counter()
    if variant == "chunked":
        logp, ent = modeling.logp_entropy_from_hidden(head, h, targets, temperature=1.0, chunk_size=chunk)
    else:
        logp, ent = modeling.naive_logp_entropy(h, head.weight, targets, 1.0)
    (logp.sum() + ent.sum()).backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"variant": variant, "tokens": tokens, "vocab": vocab, "hidden": hidden, "chunk": chunk, "device": device,
            "peak_extra_bytes": peak - base, "seconds": time.perf_counter() - t0}


def run_child(variant: str, tokens: int, args) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, "--tokens", str(tokens), "--vocab", str(args.vocab), "--hidden", str(args.hidden),
           "--chunk", str(args.chunk), "--device", args.device]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--device", default="cpu")
    p.add_argument("--naive-tokens", type=int, default=None, help="token count for the naive variant (default: --tokens if it fits in memory)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.tokens, args.vocab, args.hidden, args.chunk, args.device)))
        return

    gib = 2**30
    rows = [run_child("chunked", args.tokens, args)]
    naive_tokens = args.naive_tokens or args.tokens
    if args.naive_tokens is None and args.device == "cpu":
        need = lambda n: 5.5 * n * args.vocab * 4 + 2 * args.vocab * args.hidden * 4  # noqa: E731
        while naive_tokens > 256 and need(naive_tokens) > 0.8 * _available_bytes():
            naive_tokens //= 2
    naive = [run_child("naive", n, args) for n in sorted({max(256, naive_tokens // 2), naive_tokens})]
    rows += naive
    print(f"{'variant':<8} {'tokens':>7} {'vocab':>7} {'peak extra (GiB)':>17} {'seconds':>8}")
    for r in rows:
        print(f"{r['variant']:<8} {r['tokens']:>7} {r['vocab']:>7} {r['peak_extra_bytes'] / gib:>17.2f} {r['seconds']:>8.1f}")
    full = naive[-1]["peak_extra_bytes"] * args.tokens / naive[-1]["tokens"]
    note = "measured" if naive[-1]["tokens"] == args.tokens else f"extrapolated linearly from {naive[-1]['tokens']} tokens"
    print(f"naive at {args.tokens} tokens: {full / gib:.2f} GiB ({note}); chunked: {rows[0]['peak_extra_bytes'] / gib:.2f} GiB; "
          f"ratio chunked/naive = {rows[0]['peak_extra_bytes'] / full:.3f}")


if __name__ == "__main__":
    main()
