"""Command-line options of `magic local` (kept apart so `magic --help` stays cheap)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=".magic/local", help="where logs, metrics, the plot and weights go (default: .magic/local)")
    p.add_argument("--demo-dir", default=".magic/demo", help="cache of the tiny model and data (default: .magic/demo)")
    p.add_argument("--sft-steps", type=int, default=None, help="steps of the supervised warm start (default: 700; changing it rebuilds the cache)")
    p.add_argument("--run-name", default="local", help="run id (default: local)")
    p.add_argument("--stage1-steps", type=int, default=16, help="on-policy steps of stage 1 (default: 16)")
    p.add_argument("--stage2-steps", type=int, default=24, help="on-policy steps of stage 2 (default: 24)")
    p.add_argument("--T1", type=int, default=72, help="context length T of stage 1, tokens (default: 72)")
    p.add_argument("--T2", type=int, default=96, help="context length T of stage 2, tokens (default: 96)")
    p.add_argument("--rollout-batch-size", type=int, default=64, help="D_R: prompts per step (default: 64)")
    p.add_argument("--group-size", type=int, default=8, help="gs: samples per prompt (default: 8)")
    p.add_argument("--temperature", type=float, default=1.0, help="tau: sampling temperature (default: 1.0)")
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate (default: 1e-4)")
    p.add_argument(
        "--tgt-ent", type=float, default=0.1,
        help="tgt_ent: target entropy of adaptive entropy control (default: 0.1; the tiny model's per-token entropy is about 0.15, "
        "below the paper's 0.2 for 7B-32B models, which would keep the bonus on at every step)",
    )
    p.add_argument("--eval-samples", type=int, default=4, help="samples per held-out prompt for accuracy (default: 4)")
    p.add_argument("--eval-prompts", type=int, default=500, help="held-out prompts to evaluate (default: 500)")
    p.add_argument("--rollout-workers", type=int, default=1, help="rollout processes (default: 1)")
    p.add_argument("--reward-workers", type=int, default=1, help="reward processes (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation before and after")
    p.add_argument("--timeout", type=float, default=3600, help="give up after this many seconds (default: 3600)")
