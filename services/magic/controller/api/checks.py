"""Checks of a run or stage against the model and the data that the schema alone cannot make:
the model must be readable, and T plus the longest prompt must fit the model's context window."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fastapi import HTTPException, status

from magic.config.schema import EvalConfig, StageConfig
from magic.controller.api.deps import Controller, invalid
from magic.controller.datasets import DatasetError, PromptRecord, without_ground_truth
from magic.prompts import load_tokenizer, render_prompt

LONGEST_CHECKED = 16
"""Prompts tokenized to find the longest one (the longest by characters)."""


def model_limits(model: str, records: list[PromptRecord]) -> tuple[int | None, int]:
    """(the model's context window or None if its config has none, tokens of the longest prompt
    rendered with the chat template); a 422 on `model` when the directory is not a model."""
    path = Path(model)
    config = path / "config.json"
    try:
        readable = config.is_file()
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte: the path cannot name a model
        raise invalid(["model"], f"{model[:200]!r} is not a readable path ({type(exc).__name__}: {getattr(exc, 'strerror', None) or exc})", model[:200]) from None
    if not readable:
        raise invalid(["model"], f"{model} is not a Hugging Face model directory the controller can read (no config.json)", model)
    try:
        window = json.loads(config.read_text()).get("max_position_embeddings")
    except (OSError, ValueError) as exc:
        raise invalid(["model"], f"{config}: unreadable ({exc})", model) from None
    try:
        tok = load_tokenizer(path)
    except Exception as exc:  # noqa: BLE001 — transformers raises many kinds for a bad directory
        raise invalid(["model"], f"{model}: cannot load its tokenizer ({type(exc).__name__}: {exc})", model) from None
    longest = sorted(records, key=lambda rec: -sum(len(c) for _, c in rec.messages))[:LONGEST_CHECKED]
    tokens = 0
    try:
        for rec in longest:
            tokens = max(tokens, len(render_prompt(tok, [{"role": r, "content": c} for r, c in rec.messages])))
    except ValueError as exc:  # no chat template: the rollout workers could not render the prompts either
        raise invalid(["model"], f"{model}: {exc}", model) from None
    return (int(window) if isinstance(window, int) else None), tokens


def check_stage(stage: StageConfig, loc: list[str | int], window: int | None, prompt_tokens: int) -> None:
    """422 naming `context_length` when T plus the longest prompt does not fit the model."""
    if window is not None and prompt_tokens + stage.context_length > window:
        raise invalid(
            [*loc, "context_length"],
            f"T = {stage.context_length} plus the longest prompt ({prompt_tokens} tokens) exceeds the model's context window "
            f"(max_position_embeddings = {window}); use T <= {max(0, window - prompt_tokens)} or filter the long prompts out",
            stage.context_length,
        )


def dataset_name_for(path: str) -> str:
    """The registered name of a dataset given by path: its file stem, lowercased and cleaned."""
    stem = re.sub(r"[^a-z0-9_.-]+", "-", Path(path).stem.lower()).strip("-._") or "dataset"
    return stem[:63]


def check_held_out(c: Controller, model: str, cfg: EvalConfig, loc: list[str | int], stage_t: int, window: int | None) -> None:
    """422 naming the field when a held-out dataset (a run's validation block, an eval request)
    is not registered, has a record without a ground truth, or has a prompt that does not fit the
    model with T (the block's own, else `stage_t`: the longest T of the run's stages)."""
    t = cfg.context_length or stage_t
    for i, name in enumerate(cfg.datasets):
        where = [*loc, "datasets", i]
        if c.datasets.get(name) is None:
            raise invalid(where, f"no dataset registered as {name!r} (POST /v1/datasets first)", name)
        try:
            records = c.datasets.load(name)
        except DatasetError as exc:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, f"{'.'.join(map(str, where))}: {exc}") from None
        if (blank := without_ground_truth(records)) is not None:
            raise invalid(where, f"dataset {name!r} cannot be evaluated: record {blank} has no ground truth (reward_model.ground_truth is empty)", name)
        _, prompt_tokens = model_limits(model, records[: cfg.max_prompts] if cfg.max_prompts else records)
        if window is not None and prompt_tokens + t > window:
            raise invalid([*loc, "context_length"], f"T = {t} plus the longest prompt of {name!r} ({prompt_tokens} tokens) exceeds the model's context window {window}", t)
