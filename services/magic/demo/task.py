"""The demo task: chained sums of one-digit numbers, worked out one addition per line.

A prompt asks for the sum of n numbers (n from `MIN_TERMS` to `MAX_TERMS`, each from 1 to
`MAX_TERM_VALUE`). The worked solution adds the first two numbers and rewrites the rest, line
after line, then boxes the answer::

    user:       Add 3+5+2+4
    assistant:  8+2+4
                10+4
                14
                \\boxed{14}

Every step is local (one small addition, then a copy), so a model of a few hundred thousand
parameters learns it; numbers up to 5 keep the addition table it must learn small (partial sums
up to 40: after 300 warm-start steps the loss was 0.14 against 0.20 with numbers up to 9). The
reasoning grows quadratically with n (from about 10 tokens for n=2 to about 70 for n=8), so a
context length T of 72 tokens truncates some of the longest chains while 96 fits them all — what
multi-stage training needs. Answers are checked by the math verifier like any math answer.
Records use the verl / Skywork-OR1 format (`prompt` as chat messages, `data_source`,
`reward_model.ground_truth`, `extra_info`).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

DATA_SOURCE = "magic/chain-sum"
MIN_TERMS, MAX_TERMS = 2, 8
MAX_TERM_VALUE = 5
SPLIT_SHARES = (("eval", 0.1), ("train", 0.2), ("sft", 0.7))
"""Each problem belongs to one split, by a hash of its terms: every split gets its share of the
problems of every length (there are only 25 two-term problems, which a split drawn first would
otherwise take nearly all of)."""


def make_problem(rng: random.Random) -> list[int]:
    """Draw one problem: `MIN_TERMS` to `MAX_TERMS` numbers, each 1 to `MAX_TERM_VALUE`."""
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


def split_of(terms: list[int]) -> str:
    """The split a problem belongs to (`SPLIT_SHARES`), fixed by a hash of its terms."""
    digest = hashlib.sha256("+".join(map(str, terms)).encode()).digest()
    u, edge = int.from_bytes(digest[:8], "big") / 2**64, 0.0
    for name, share in SPLIT_SHARES:
        edge += share
        if u < edge:
            return name
    return SPLIT_SHARES[-1][0]


def make_splits(seed: int, n_sft: int, n_train: int, n_eval: int) -> dict[str, list[list[int]]]:
    """Problems for the supervised warm start, RL training and held-out evaluation, from disjoint
    parts of the problem space (`split_of`): held-out problems are never trained on.

    Each draw picks a length uniformly, then the numbers. The RL and held-out sets hold distinct
    problems (a length whose part is used up is drawn no more, so short problems are rarer there);
    the warm-start list may repeat a problem, so it covers every length evenly."""
    rng = random.Random(seed)
    out: dict[str, list[list[int]]] = {}
    for name, size, distinct in (("eval", n_eval, True), ("train", n_train, True), ("sft", n_sft, False)):
        items: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for _ in range(1000 * size + 100_000):
            if len(items) == size:
                break
            terms = make_problem(rng)
            if split_of(terms) != name or (distinct and tuple(terms) in seen):
                continue
            if distinct:
                seen.add(tuple(terms))
            items.append(terms)
        if len(items) < size:
            raise ValueError(f"the {name} split holds too few distinct problems for {size} (found {len(items)}); ask for fewer")
        out[name] = items
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
