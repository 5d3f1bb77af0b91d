"""The held-out figures' 95% interval covers the truth: a simulation of validation sets drawn from
a population of prompts of known difficulty. The normal interval (the one reported before) is
measured beside it, to show where it fails: few prompts at low accuracy."""

from __future__ import annotations

import math
import random

import pytest

from magic.evaluation import PromptOutcome, mean_ci, pass_at_k, summarise, wilson_ci

SIMULATIONS = 1500


def beta_mean_of_pass(a: float, b: float, k: int) -> float:
    """E[1 - (1 - q)^k] for q ~ Beta(a, b): the population's pass@k (the estimator is unbiased)."""
    log_beta = lambda x, y: math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)  # noqa: E731
    return 1.0 - math.exp(log_beta(a, b + k) - log_beta(a, b))


def coverage(prompts: int, samples: int, a: float, b: float, k: int, interval, seed: int = 0) -> tuple[float, float]:
    """(avg@n coverage, pass@k coverage) of `interval` over SIMULATIONS validation sets."""
    rng = random.Random(seed)
    truth_avg, truth_pass = a / (a + b), beta_mean_of_pass(a, b, k)
    hit_avg = hit_pass = 0
    for _ in range(SIMULATIONS):
        outcomes = []
        for _ in range(prompts):
            q = rng.betavariate(a, b)
            outcomes.append(PromptOutcome(tuple(rng.random() < q for _ in range(samples)), (1,) * samples, (False,) * samples))
        _, lo, hi = interval([sum(o.correct) / samples for o in outcomes])
        hit_avg += lo <= truth_avg <= hi
        _, lo, hi = interval([pass_at_k(samples, sum(o.correct), k) for o in outcomes])
        hit_pass += lo <= truth_pass <= hi
    return hit_avg / SIMULATIONS, hit_pass / SIMULATIONS


@pytest.mark.parametrize(
    "prompts, samples, a, b",
    [
        (10, 4, 0.5, 4.5),  # 10 prompts, mean accuracy 0.1, most prompts never solved
        (10, 4, 2.0, 2.0),  # 10 prompts, mean 0.5
        (30, 32, 0.3, 2.7),  # AIME-sized: 30 prompts x 32 samples, mean 0.1
        (30, 8, 4.0, 1.0),  # mean 0.8, most prompts always solved
    ],
)
def test_the_reported_interval_covers_the_truth_at_least_at_its_level(prompts, samples, a, b):
    avg_cov, pass_cov = coverage(prompts, samples, a, b, k=min(4, samples), interval=wilson_ci)
    assert avg_cov >= 0.93 and pass_cov >= 0.93, (avg_cov, pass_cov)


def test_the_normal_interval_under_covers_where_the_reported_one_does_not():
    _, normal_pass = coverage(10, 4, 2.0, 2.0, k=4, interval=mean_ci)  # pass@4 of 10 prompts at mean 0.5: most near 1
    _, wilson_pass = coverage(10, 4, 2.0, 2.0, k=4, interval=wilson_ci)
    assert normal_pass < 0.85 and wilson_pass >= 0.93, (normal_pass, wilson_pass)


def test_summaries_report_the_wilson_interval():
    outcomes = [PromptOutcome((False,) * 4, (1,) * 4, (False,) * 4) for _ in range(10)]
    f = summarise(outcomes)
    assert f.avg_at_n == 0.0 and f.avg_at_n_ci_low == 0.0 and f.avg_at_n_ci_high == pytest.approx(wilson_ci([0.0] * 10)[2]) and f.avg_at_n_ci_high > 0.2
