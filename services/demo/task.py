"""The demo task: chained sums of one-digit numbers, worked out one addition per line.

A prompt asks for the sum of n numbers (n from `MIN_TERMS` to `MAX_TERMS`, each 1-9). The
worked solution adds the first two numbers and rewrites the rest, line after line, then boxes
the answer::

    user:       Add 3+5+2+7
    assistant:  8+2+7
                10+7
                17
                \\boxed{17}

Every step is local (one small addition, then a copy), so a model of a few hundred thousand
parameters learns it; the reasoning grows quadratically with n (from about 10 tokens for n=2 to
about 75 for n=8), so a context length T of 72 tokens truncates some of the longest chains
while 96 fits them all — what multi-stage training needs. Answers are checked by the math
verifier like any math answer. Records use the verl / Skywork-OR1 format (`prompt` as chat
messages, `data_source`, `reward_model.ground_truth`, `extra_info`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DATA_SOURCE = "magic/chain-sum"
MIN_TERMS, MAX_TERMS = 2, 8
MAX_TERM_VALUE = 9


def make_problem(rng: random.Random) -> list[int]:
    """Draw one problem: 2-8 numbers, each 1-9."""
    n = rng.randint(MIN_TERMS, MAX_TERMS)
    return [rng.randint(1, MAX_TERM_VALUE) for _ in range(n)]


def prompt_text(terms: list[int]) -> str:
    """The user's message for a problem.

    >>> prompt_text([3, 5, 2])
    'Add 3+5+2'
    """
    return "Add " + "+".join(str(t) for t in terms)


def solution_text(terms: list[int]) -> str:
    """The step-by-step reference solution.

    >>> print(solution_text([3, 5, 2, 7]))
    8+2+7
    10+7
    17
    \\boxed{17}
    """
    lines, rest = [], list(terms)
    while len(rest) > 1:
        rest = [rest[0] + rest[1]] + rest[2:]
        lines.append("+".join(str(t) for t in rest))
    lines.append(f"\\boxed{{{rest[0]}}}")
    return "\n".join(lines)


def record(terms: list[int], split: str, index: int) -> dict:
    """One dataset record in the verl / Skywork-OR1 format."""
    return {
        "prompt": [{"role": "user", "content": prompt_text(terms)}],
        "data_source": DATA_SOURCE,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(sum(terms))},
        "extra_info": {"split": split, "index": index, "terms": len(terms)},
    }


def make_splits(seed: int, n_sft: int, n_train: int, n_eval: int) -> dict[str, list[list[int]]]:
    """Disjoint problem sets for the supervised warm start, RL training and held-out evaluation."""
    rng = random.Random(seed)
    seen: set[tuple[int, ...]] = set()
    out: dict[str, list[list[int]]] = {}
    for name, size in (("eval", n_eval), ("train", n_train), ("sft", n_sft)):
        items: list[list[int]] = []
        while len(items) < size:
            terms = make_problem(rng)
            key = tuple(terms)
            if key in seen:
                continue
            seen.add(key)
            items.append(terms)
        out[name] = items
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
