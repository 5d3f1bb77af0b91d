"""The supervised warm start: a short pass of next-token cross-entropy on demonstrations.

The demonstrations mix two styles, like the uneven data a real model is warm-started on:
worked solutions (one line per partial sum, always right) and answer-only replies (the sum
guessed at a glance, often off by a little for three or more terms). The warm-started policy
therefore answers directly some of the time and works the sum out the rest; RL has to discover
that working it out pays, which lengthens the responses as it learns (and the context length T
of the first stage truncates the longest worked solutions).
"""

from __future__ import annotations

import logging
import math
import random
import sys
import time
from dataclasses import dataclass

import torch

from magic import modeling
from magic.prompts import render_prompt
from magic.demo import task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTConfig:
    steps: int = 350
    batch_size: int = 64
    micro_batches: int = 4  # each batch is sorted by length and split, to pad less
    lr: float = 3e-3
    warmup_steps: int = 30
    decay_fraction: float = 0.25  # warmup, constant, then linear decay over the last quarter
    answer_only_fraction: float = 0.5
    """Share of demonstrations that reply with a guessed answer instead of a worked solution."""
    guess_error_rate: float = 0.85
    """For three or more terms, how often an answer-only guess is off (by 1 to 4)."""
    seed: int = 0


def demonstration(terms: list[int], rng: random.Random, cfg: SFTConfig) -> str:
    """One demonstration reply for `terms`: worked, or (sometimes) a guess."""
    if rng.random() >= cfg.answer_only_fraction:
        return task.solution_text(terms)
    guess = sum(terms)
    if len(terms) > 2 and rng.random() < cfg.guess_error_rate:
        guess += rng.choice([-4, -3, -2, -1, 1, 2, 3, 4])
    return f"\\boxed{{{max(guess, 0)}}}"


def train(model, tokenizer, problems: list[list[int]], cfg: SFTConfig, progress: bool = False) -> dict[str, float]:
    """Fine-tune `model` in place on demonstrations for `problems`; returns summary figures.
    `progress` shows a progress bar with the loss and an ETA on stdout."""
    from tqdm import tqdm

    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    prompts: dict[tuple[int, ...], list[int]] = {}  # each problem's chat-formatted prompt, rendered once
    replies: dict[str, list[int]] = {}

    def example(terms: list[int]) -> tuple[list[int], int]:
        key = tuple(terms)
        if key not in prompts:
            prompts[key] = render_prompt(tokenizer, [{"role": "user", "content": task.prompt_text(terms)}])
        text = demonstration(terms, rng, cfg)
        if text not in replies:
            replies[text] = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        return prompts[key] + replies[text], len(prompts[key])

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def lr_at(step: int) -> float:
        warm = min(1.0, (step + 1) / cfg.warmup_steps)
        decay = min(1.0, (cfg.steps - step) / (cfg.decay_fraction * cfg.steps))
        return cfg.lr * warm * decay

    model.train()
    t0 = time.perf_counter()
    loss_value = float("nan")
    bar = tqdm(total=cfg.steps, desc="warm start", unit="step", disable=not progress, file=sys.stdout, dynamic_ncols=True, mininterval=1.0)
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        batch = sorted((example(t) for t in rng.sample(problems, cfg.batch_size)), key=lambda x: len(x[0]))
        n_tokens = sum(len(ids) - p for ids, p in batch)
        size = math.ceil(len(batch) / cfg.micro_batches)
        total = 0.0
        for i in range(0, len(batch), size):
            part = batch[i : i + size]
            width = max(len(ids) for ids, _ in part)
            ids = torch.full((len(part), width), pad, dtype=torch.long)
            attn = torch.zeros_like(ids)
            mask = torch.zeros((len(part), width - 1))
            for j, (seq, p) in enumerate(part):
                ids[j, : len(seq)] = torch.tensor(seq)
                attn[j, : len(seq)] = 1
                mask[j, p - 1 : len(seq) - 1] = 1
            logp, _ = modeling.token_logprobs(model, ids, attn, temperature=1.0, with_entropy=False)
            loss = -(logp * mask).sum() / n_tokens
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = total
        bar.update(1)
        if (step + 1) % 10 == 0:
            bar.set_postfix(loss=f"{loss_value:.3f}", refresh=False)
        if not progress and ((step + 1) % 100 == 0 or step + 1 == cfg.steps):
            log.info("warm start step %d/%d loss %.4f (%.0fs)", step + 1, cfg.steps, loss_value, time.perf_counter() - t0)
    bar.close()
    model.eval()
    return {"sft_seconds": time.perf_counter() - t0, "sft_final_loss": loss_value}
