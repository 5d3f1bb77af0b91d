"""Precision first: the adversarial corpus (tests/data/reward/math_adversarial.jsonl, built by
build_math_adversarial.py) holds wrong answers written to be accepted — hedges, several candidates,
negations, comparisons, words that change the value, functions of the unknown and question-dependent
names read as labels, near-miss forms — each bare, as a final-answer statement and boxed. The
verifier accepts none; every recall rule it has (`RECALL_RULES`) has such twins, so no rule can land
without them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from magic.reward.math.verifier import RECALL_RULES, verify_magic

CORPUS = Path(__file__).parents[2] / "data" / "reward" / "math_adversarial.jsonl"
OPTIONS = "Which is it? A) 1 B) 2 C) 3 D) 4"


def rows() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def test_the_adversarial_corpus_is_large_and_every_recall_rule_has_twins():
    cases = rows()
    assert len(cases) >= 150
    per_rule = Counter(r["rule"] for r in cases)
    assert set(per_rule) <= set(RECALL_RULES), set(per_rule) - set(RECALL_RULES)
    assert all(per_rule[rule] >= 3 for rule in RECALL_RULES), {rule: per_rule[rule] for rule in RECALL_RULES}
    assert {r["form"] for r in cases} == {"bare", "statement", "box"}


def test_no_adversarial_answer_is_accepted():
    accepted = [
        (r["id"], r["class"], r["response"][-60:], r["gold"])
        for r in rows()
        if verify_magic(r["response"], r["gold"], OPTIONS if r["rule"] == "choices" else r.get("problem", "")).correct
    ]
    assert not accepted, accepted


RECALL_TWINS = [  # clean answers next to the attacks: each still correct
    (r"\boxed{5 \text{ apples}}", "5"), (r"\boxed{5 \text{ square meters}}", "5"), (r"\boxed{5 \text{ ways}}", "5"),
    (r"\boxed{12\pi \text{ cm}^2}", r"12\pi"), (r"\boxed{x_1 = 3}", "3"), (r"\boxed{x_{\max} = 5}", "5"), (r"\boxed{\Delta x = 5}", "5"),
    (r"\boxed{\bar{x} = 5}", "5"), (r"\boxed{\alpha = 30^\circ}", r"30^\circ"), (r"\boxed{V_{\text{cone}} = 12\pi}", r"12\pi"),
    (r"\boxed{AB = 5\sqrt{2}}", r"5\sqrt{2}"), (r"\boxed{(p, q) = (3, 2)}", "(3, 2)"), ("The answer is 42 dollars", "42"),
    ("So x = 5.", "5"), ("Hence 42.", "42"), ("Total: 42", "42"), ("She has 42 apples.", "42"), ("The most likely outcome is 7.", "7"),
    ("It is 6.", "6"), ("The volume is $120$.", "120"), ("Answer $ 9 $", "9"), ("28 percent", "28"),
    # the recall classes of HardVerify-Math's kind (docs/reward.md), each next to its attacks above
    (r"\boxed{12^{\mathrm{th}}}", "12"), (r"\boxed{15\text{th}}", "15"), (r"\boxed{T(10)=2, T(11)=4, T(12)=3}", "2, 4, 3"),
    (r"\boxed{\text{Maximum} = 2, \text{Minimum} = 1}", "1, 2"), (r"\boxed{x = 2 + 3 = 5}", "5"), (r"\boxed{\frac{\sqrt2}{2}}", r"x = y = z = \frac{\sqrt{2}}{2}"),
    (r"\boxed{\frac{6}{x}}", "xy = 6"), (r"\boxed{-4x^2 + 4x - 2}", "y + 1 = -(2x - 1)^2"), (r"\boxed{b < c}", "c > b"),
    (r"\boxed{\tan \frac{7}{5}\pi > \sin \frac{2}{5}\pi}", r"\tan \frac{7\pi}{5} > \sin \frac{2\pi}{5}"),
    (r"\boxed{(4, 8] \cup [10, 12)}", r"4 < m \leq 8 \text{ or } 10 \leq m < 12"), (r"\boxed{(-\infty, -2] \cup \{1\}}", r"a \leqslant -2 \text{ or } a = 1"),
    (r"\boxed{(1, 3)}", r"x > 1 \text{ and } x < 3"),
    (r"\boxed{f(x) = 1 \text{ for all } x \in \mathbb{Q}_{>0}}", "f(x)=1", r"Find all $f: \mathbb{Q}_{>0} \to \mathbb{Q}_{>0}$ with ..."),
    (r"\boxed{f(n) = n \text{ for all positive integers } n}", "f(n)=n", "Find every function f from the positive integers to the positive integers with ..."),
    (r"\boxed{\text{Minimum} = 1, \text{Maximum} = 3}", "1, 3"), (r"\boxed{f(y) = y^2}", "x^2"), (r"\boxed{\frac{\pi}{6} + n\pi}", r"x = \frac{\pi}{6} + k\pi"),
    (r"\boxed{(-32 + 3t, 64 - 5t) \text{ for some integer } t}", "(-32 + 3x, 64 - 5x)"), (r"\boxed{(\pm 1, 0, \pm 2)}", "(1,0,2), (1,0,-2), (-1,0,2), (-1,0,-2)"),
    (r"\boxed{(x, y, z) = (1, 2, 3)}", "1, 2, 3"), (r"\boxed{\text{line segment and circle}}", "line segment, circle"), (r"\boxed{\infty}", r"\text{infinitely many}"),
    (r"\boxed{(-\infty, -6) \cup (-6, \frac{3}{2})}", r"\{x | x < \frac{3}{2}\} - \{-6\}"), (r"\boxed{e^{-t} + t}", "x(t) = e^{-t} + t"),
    (r"\boxed{\frac{1}{15}}", r"6.67\%"), (r"\boxed{\frac{a+b+1}{c}}", r"\frac{1+a+b}c"), (r"\boxed{(2, 3)}", r"\Big\{x | 2 < x < 3\Big\}"),
    (r"\boxed{2, 3}", "②③"), (r"\boxed{\frac{640}{51}}", "$12.55"),
]


def test_the_clean_twins_of_the_attacks_stay_correct():
    wrong = [(r, g) for r, g, *problem in RECALL_TWINS if not verify_magic(r, g, *problem).correct]
    assert not wrong, wrong
