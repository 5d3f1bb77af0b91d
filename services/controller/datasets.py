"""Training prompts in the verl / Skywork-OR1 record format, and the order they are served in.

A record is one JSON object per line::

    {"prompt": [{"role": "user", "content": "..."}], "data_source": "math",
     "reward_model": {"ground_truth": "42"}, "extra_info": {...}}

`prompt` may also be a plain string (taken as one user message).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path


class DatasetError(ValueError):
    """A dataset file is missing or has a malformed record; the message says which line."""


@dataclass(frozen=True)
class PromptRecord:
    uid: str  # "<file stem>:<line number>"
    messages: tuple[tuple[str, str], ...]
    data_source: str
    ground_truth: str
    extra_info: dict = field(default_factory=dict, hash=False, compare=False)


def parse_record(obj: object, uid: str) -> PromptRecord:
    if not isinstance(obj, dict):
        raise DatasetError(f"{uid}: a record must be a JSON object")
    prompt = obj.get("prompt")
    if isinstance(prompt, str):
        messages = (("user", prompt),)
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt):
        messages = tuple((str(m.get("role", "user")), m["content"]) for m in prompt)
    else:
        raise DatasetError(f"{uid}: 'prompt' must be a string or a non-empty list of {{role, content}} messages")
    rm = obj.get("reward_model")
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        raise DatasetError(f"{uid}: 'reward_model.ground_truth' is required")
    gt = rm["ground_truth"]
    ground_truth = gt if isinstance(gt, str) else json.dumps(gt)
    data_source = obj.get("data_source", "math")
    if not isinstance(data_source, str):
        raise DatasetError(f"{uid}: 'data_source' must be a string")
    extra = obj.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DatasetError(f"{uid}: 'extra_info' must be an object")
    return PromptRecord(uid, messages, data_source, ground_truth, extra)


def load_jsonl(path: str | Path) -> list[PromptRecord]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    records = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            uid = f"{path.stem}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{uid}: invalid JSON ({exc.msg})") from None
            records.append(parse_record(obj, uid))
    if not records:
        raise DatasetError(f"{path}: no records")
    return records


class PromptSource:
    """Serves prompts in a seeded shuffled order, epoch after epoch; position p is deterministic."""

    def __init__(self, records: list[PromptRecord], seed: int):
        self.records = records
        self.seed = seed
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            idx = list(range(len(self.records)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(idx)
            self._orders = {epoch: idx}  # keep one epoch in memory
        return self._orders[epoch]

    def take(self, position: int, count: int) -> list[PromptRecord]:
        """`count` records starting at absolute position `position` of the endless shuffled stream."""
        n = len(self.records)
        out = []
        for p in range(position, position + count):
            out.append(self.records[self._order(p // n)[p % n]])
        return out
