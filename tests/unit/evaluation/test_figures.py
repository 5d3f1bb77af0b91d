"""pass@k, avg@n, the confidence interval and the dataset summary against hand-computed values."""

from __future__ import annotations

import math

import pytest

from magic.evaluation import PromptOutcome, avg_at_n, mean_ci, pass_at_k, summarise


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 2, 1 - 3 / 6),  # C(3,2)/C(4,2)
        (5, 2, 3, 1 - 1 / 10),  # C(3,3)/C(5,3)
        (10, 2, 5, 1 - 56 / 252),  # k larger than the correct count: C(8,5)/C(10,5)
        (10, 3, 1, 0.3),  # pass@1 is the fraction correct
        (5, 3, 3, 1.0),  # n - c < k: every 3 of 5 samples hold a correct one
        (8, 0, 8, 0.0),  # k = n, nothing correct
        (8, 1, 8, 1.0),  # k = n, one correct
        (8, 8, 3, 1.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomials_and_is_stable_for_large_n():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
    # C(1024, 512) overflows a float; the product form does not
    assert pass_at_k(1024, 1, 512) == pytest.approx(0.5)
    assert 0.0 < pass_at_k(1024, 3, 16) < 1.0


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 5), (4, 5, 2), (4, 1, 0), (0, 0, 1)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_avg_and_ci():
    assert avg_at_n([True, False, False, True]) == 0.5
    mean, lo, hi = mean_ci([0.0, 1.0, 0.5, 0.5])
    # s^2 = (0.25 + 0.25 + 0 + 0) / 3 = 1/6; half width 1.96 * sqrt(1/24)
    half = 1.959963984540054 * math.sqrt(1 / 24)
    assert (mean, lo, hi) == pytest.approx((0.5, 0.5 - half, 0.5 + half))
    assert mean_ci([1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)
    assert mean_ci([0.3]) == (0.3, 0.0, 1.0)
    assert mean_ci([0.0, 1.0]) == (0.5, 0.0, 1.0)  # clipped to [0, 1]


def test_summarise_dataset():
    outcomes = [
        PromptOutcome((True, False, False, False), (10, 20, 30, 40), (False, False, False, True)),
        PromptOutcome((False, False, False, False), (5, 5, 5, 5), (False,) * 4),
        PromptOutcome((True, True, True, True), (1, 2, 3, 4), (False,) * 4),
    ]
    f = summarise(outcomes, k=2)
    assert (f.prompts, f.samples, f.k) == (3, 4, 2)
    assert f.avg_at_n == pytest.approx((0.25 + 0 + 1) / 3)
    assert f.pass_at_k == pytest.approx((0.5 + 0 + 1) / 3)
    assert f.pass_at_k_ci_low < f.pass_at_k < f.pass_at_k_ci_high
    assert f.response_length_mean == pytest.approx((100 + 20 + 10) / 12)
    assert f.truncated_ratio == pytest.approx(1 / 12)
    assert summarise(outcomes).pass_at_k == pytest.approx(2 / 3)  # k = n: any correct
    with pytest.raises(ValueError, match="same number of samples"):
        summarise([outcomes[0], PromptOutcome((True,), (1,), (False,))])


@pytest.mark.parametrize(
    ("correct", "answers", "expected"),
    [
        ((False, True, True, False), ("3", "4", "4", "5"), 1.0),  # 4 wins, and is right
        ((True, False, False, False), ("4", "5", "5", "6"), 0.0),  # the right answer is outvoted
        ((True, False, True, False), ("4", "5", "4", "5"), 0.5),  # a tie of two: one of them right
        ((True, False, False), ("4", "5", "6"), 1 / 3),  # three singletons tie
        ((False, False, True), ("", "", "4"), 1.0),  # samples without an answer do not vote
        ((False, False), ("", ""), 0.0),  # nobody answers
        ((False, False, False), (" 1/3 ", "$1/3$.", "2/4"), 0.0),  # spacing, dollars and a full stop are one answer: 1/3 wins
        ((True, True, False, False, False), ("1/2", "0.5", "3", "3", "4"), 0.5),  # the gold in two forms is one answer: ties with 3
    ],
)
def test_maj_at_n_hand_computed(correct, answers, expected):
    from magic.evaluation import maj_at_n

    assert maj_at_n(correct, answers) == pytest.approx(expected)


def test_summarise_reports_maj_at_n_only_when_every_prompt_has_its_answers():
    with_answers = [PromptOutcome.of([1, 0, 0], [3, 3, 3], [False] * 3, ["4", "5", "5"]), PromptOutcome.of([1, 1, 0], [3, 3, 3], [False] * 3, ["7", "7", "8"])]
    f = summarise(with_answers)
    assert f.maj_at_n == pytest.approx(0.5) and f.avg_at_n == pytest.approx(0.5) and f.as_dict()["maj_at_n"] == f.maj_at_n
    assert summarise([*with_answers, PromptOutcome.of([1, 0, 0], [3, 3, 3], [False] * 3)]).maj_at_n is None  # stored before answers were kept
    assert summarise([PromptOutcome.of([1, 0], [3, 3], [False] * 2, ["", ""])]).maj_at_n is None  # correct, yet no answer: code, or none reported
    assert summarise([PromptOutcome.of([0, 0], [3, 3], [False] * 2, ["", ""])]).maj_at_n == 0.0  # nothing answered, nothing right
    with pytest.raises(ValueError, match="one answer per sample"):
        summarise([PromptOutcome.of([1, 0], [3, 3], [False] * 2, ["4"])])
