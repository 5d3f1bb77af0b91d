"""Held-out accuracy from scored samples: avg@k, pass@k with a confidence interval, length, truncation.

Pure functions, shared by in-run validation (`magic.controller.validation`), `magic eval` and
`magic local`: each prompt of a validation dataset is sampled n times, every sample is judged
correct or not, and the figures below summarise one dataset at one policy version.

- avg@n (Skywork-OR1's curves, e.g. AIME24 avg@32): the mean correctness over the n samples of
  a prompt, averaged over prompts — the estimate of pass@1.
- pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1 and its
  numerically stable form): per prompt with c correct of n samples,
  pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i),
  the unbiased estimate of the chance that at least one of k samples is correct; averaged over
  prompts.
- maj@n (self-consistency, Wang et al. 2023; the papers' maj@k with k samples): per prompt, the
  answer most of its n samples give (the verifier's extracted answer, whitespace and `$` aside;
  every correct answer is the gold in some form, so they all count as one) is taken as the
  prompt's answer; correct if that answer is. Ties are broken uniformly at random, in expectation;
  samples without an answer do not vote, and a prompt none of whose samples answers scores 0.
  Averaged over prompts. Math only: the reward service reports no answer for code, and a dataset
  with correct samples but no answer at all has no maj@n (None).
- The confidence interval of pass@k (and avg@n) is a Wilson score interval over the m prompts
  (`wilson_ci`): how much the figure would move with another draw of prompts from the same
  distribution — the uncertainty that dominates with small held-out sets like AIME's 30 problems.
  Each prompt's estimate lies in [0, 1], so its variance is at most p(1 - p) for a mean p: the
  interval Wilson derived for m successes out of m trials, taken at the observed mean, covers at
  least its level wherever the normal interval (mean +- z s / sqrt(m), `mean_ci`) fails — at few
  prompts and accuracies near 0 or 1, where s is small or 0 and the normal interval shrinks to a
  point. Simulated coverage of the 95% intervals (`tests/unit/evaluation/test_interval_coverage.py`,
  1500 validation sets drawn from Beta-distributed prompt difficulties; avg@n / pass@4):
  10 prompts x 4 samples at mean accuracy 0.1: normal 0.87 / 0.96, Wilson 0.99 / 0.94; at 0.5:
  normal 0.91 / 0.77, Wilson 1.00 / 0.95; 30 x 8 at 0.8: normal 0.94 / 0.65, Wilson 1.00 / 0.99;
  30 x 32 at 0.1 (AIME-sized): normal 0.90 / 0.93, Wilson 1.00 / 0.99. Wilson is conservative for
  avg@n (a prompt's n samples vary less than one Bernoulli draw); it never under-covers much.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

Z95 = 1.959963984540054
"""The 97.5% quantile of the standard normal: a two-sided 95% interval."""


@dataclass(frozen=True)
class PromptOutcome:
    """The n scored samples of one validation prompt."""

    correct: tuple[bool, ...]  # one per sample
    lengths: tuple[int, ...]  # response tokens, one per sample
    truncated: tuple[bool, ...]  # finish reason `length` (cut at T), one per sample
    answers: tuple[str, ...] = ()  # the verifier's extracted answer per sample ("" none); () unknown: no maj@n

    @classmethod
    def of(cls, correctness: Sequence[float], lengths: Sequence[int], truncated: Sequence[bool], answers: Sequence[str] = ()) -> "PromptOutcome":
        """From the verifier's correctness per sample (`pb.Score.correctness`, 1.0 when the answer
        is right): the one rule, shared by in-run validation and local evaluation, of what counts
        as a correct sample."""
        return cls(tuple(c >= 1.0 for c in correctness), tuple(int(n) for n in lengths), tuple(bool(t) for t in truncated), tuple(str(a) for a in answers))


RIGHT = "\x00right"
"""The vote of every correct sample (no extracted answer has a NUL byte)."""


def vote_key(answer: str) -> str:
    """The form answers are counted in for maj@n: whitespace and `$` removed, a final full stop dropped.

    >>> vote_key(" $1/2$. "), vote_key("x = 3")
    ('1/2', 'x=3')
    """
    return "".join(answer.split()).replace("$", "").rstrip(".")


def maj_at_n(correct: Sequence[bool], answers: Sequence[str]) -> float:
    """maj@n of one prompt: whether its majority answer is correct (in expectation over ties).

    >>> maj_at_n([True, False, False, True, False], ["4", "5", "5", "4", "6"])  # 4 and 5 tie: one of two is right
    0.5
    >>> maj_at_n([False, True, True], ["3", "4", "4"]), maj_at_n([False, False], ["", ""])
    (1.0, 0.0)
    """
    if len(answers) != len(correct):
        raise ValueError(f"maj@n needs one answer per sample (got {len(answers)} answers for {len(correct)} samples)")
    votes: dict[str, int] = {}
    for ok, answer in zip(correct, answers):
        if key := (RIGHT if ok else vote_key(answer)):  # the gold in any form is one answer
            votes[key] = votes.get(key, 0) + 1
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [key for key, count in votes.items() if count == top]
    return tied.count(RIGHT) / len(tied)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021) unbiased pass@k of one prompt with `c` correct of `n` samples:
    1 - C(n - c, k) / C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i) (no huge binomials).

    >>> pass_at_k(10, 0, 5), pass_at_k(10, 10, 1), round(pass_at_k(4, 1, 2), 6)
    (0.0, 1.0, 0.5)
    """
    if not (n >= 1 and 0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n (got n={n}, c={c}, k={k})")
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def avg_at_n(correct: Sequence[bool]) -> float:
    """avg@n of one prompt: the fraction of its n samples that are correct (an estimate of pass@1)."""
    if not correct:
        raise ValueError("avg@n of a prompt with no samples")
    return sum(1 for x in correct if x) / len(correct)


def mean_ci(values: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """(mean, low, high): the normal confidence interval of the mean of per-prompt figures in
    [0, 1], mean +- z * s / sqrt(m), clipped to [0, 1]; [0, 1] with a single value. Kept for
    comparison: it under-covers at few prompts and extreme accuracies (`wilson_ci` is reported)."""
    m = len(values)
    if m == 0:
        raise ValueError("a confidence interval over no prompts")
    mean = sum(values) / m
    if m == 1:
        return mean, 0.0, 1.0
    var = sum((v - mean) ** 2 for v in values) / (m - 1)
    half = z * math.sqrt(var / m)
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def wilson_ci(values: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """(mean, low, high): the Wilson score interval of the mean of m per-prompt figures in [0, 1],
    at the observed mean p: (p + z^2/2m +- z sqrt(p(1-p)/m + z^2/4m^2)) / (1 + z^2/m).

    >>> [round(x, 4) for x in wilson_ci([0.0] * 10)]  # no prompt solved: not the point [0, 0]
    [0.0, 0.0, 0.2775]
    >>> [round(x, 4) for x in wilson_ci([0.0, 1.0, 0.5, 0.5])]
    [0.5, 0.15, 0.85]
    """
    m = len(values)
    if m == 0:
        raise ValueError("a confidence interval over no prompts")
    mean = sum(values) / m
    p = min(1.0, max(0.0, mean))
    z2 = z * z
    centre = (p + z2 / (2 * m)) / (1 + z2 / m)
    half = z * math.sqrt(p * (1 - p) / m + z2 / (4 * m * m)) / (1 + z2 / m)
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    return mean, min(low, mean), max(high, mean)  # it holds the mean: exactly, not within rounding (0 solved: low is 0)


@dataclass(frozen=True)
class Figures:
    """One dataset's held-out figures at one policy version (the keys of the step record's
    `validation.<dataset>` object, of `magic eval`'s JSON and of the magic_validation_* series)."""

    prompts: int  # m: prompts evaluated
    samples: int  # n: samples per prompt
    k: int  # the k of pass@k
    avg_at_n: float  # mean correctness over all samples (avg@n)
    avg_at_n_ci_low: float
    avg_at_n_ci_high: float
    pass_at_k: float  # Chen et al. unbiased pass@k, mean over prompts
    pass_at_k_ci_low: float
    pass_at_k_ci_high: float
    response_length_mean: float  # tokens, over all samples
    truncated_ratio: float  # share of samples cut at T
    maj_at_n: float | None = None  # majority vote over the n samples, mean over prompts (None: answers unknown)

    def as_dict(self) -> dict:
        return asdict(self)


def _answers_known(outcomes: Sequence[PromptOutcome]) -> bool:
    """Whether the verifier's answers came with the outcomes: every prompt has them, and a dataset
    with a correct sample has an answer somewhere (no answer at all: code, or a reward service
    that reports none)."""
    if not all(o.answers for o in outcomes):
        return False
    return any(a for o in outcomes for a in o.answers) or not any(any(o.correct) for o in outcomes)


def summarise(outcomes: Sequence[PromptOutcome], k: int | None = None, z: float = Z95) -> Figures:
    """The figures of one dataset from its prompts' outcomes; every prompt has the same n samples,
    and pass@k is reported at `k` (default n)."""
    if not outcomes:
        raise ValueError("no prompts to summarise")
    ns = {len(o.correct) for o in outcomes}
    if len(ns) != 1 or any(len(o.lengths) != len(o.correct) or len(o.truncated) != len(o.correct) for o in outcomes):
        raise ValueError(f"every prompt needs the same number of samples with a length and a finish reason each (got n in {sorted(ns)})")
    n = ns.pop()
    k = n if k is None else k
    _, avg_lo, avg_hi = wilson_ci([avg_at_n(o.correct) for o in outcomes], z)
    pk, pk_lo, pk_hi = wilson_ci([pass_at_k(n, sum(o.correct), k) for o in outcomes], z)
    total = n * len(outcomes)
    # the mean of the per-prompt avg@n, as one division (all prompts have n samples): the same
    # float as correct samples / samples, the accuracy `magic local` has always reported
    avg = sum(sum(o.correct) for o in outcomes) / total
    return Figures(
        prompts=len(outcomes),
        samples=n,
        k=k,
        avg_at_n=avg,
        avg_at_n_ci_low=avg_lo,
        avg_at_n_ci_high=avg_hi,
        pass_at_k=pk,
        pass_at_k_ci_low=pk_lo,
        pass_at_k_ci_high=pk_hi,
        response_length_mean=sum(sum(o.lengths) for o in outcomes) / total,
        truncated_ratio=sum(sum(o.truncated) for o in outcomes) / total,
        maj_at_n=sum(maj_at_n(o.correct, o.answers) for o in outcomes) / len(outcomes) if _answers_known(outcomes) else None,
    )
