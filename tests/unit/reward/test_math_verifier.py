"""The math verifier on the labelled corpus (tests/data/reward/math_corpus.jsonl), next to the
plain Skywork-OR1 procedure, plus the doctests of the math modules."""

from __future__ import annotations

import doctest
import json
import logging
from pathlib import Path

import pytest

from magic.reward import math_equiv, math_extract, math_verifier
from magic.reward.verdict import Status

CORPUS = Path(__file__).parents[2] / "data" / "reward" / "math_corpus.jsonl"
CATEGORIES = {
    "integer", "fraction", "decimal", "radical", "pi", "interval", "set", "tuple", "matrix",
    "expression", "equation", "unit", "percent", "degree", "choice",
    "matrix_structure", "unit_letters", "clock_time", "function", "set_builder", "unicode", "list_gold",
}


def load_corpus() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def errors(verifier_name: str, rows: list[dict]) -> tuple[list[str], list[str]]:
    """(false positives, false negatives) of a registered verifier on `rows`."""
    verify = math_verifier.get_verifier(verifier_name)
    fp, fn = [], []
    for row in rows:
        got = verify(row["response"], row["gold"], row.get("problem", "")).correct
        if got and not row["expected"]:
            fp.append(row["id"])
        elif not got and row["expected"]:
            fn.append(row["id"])
    return fp, fn


@pytest.fixture(scope="module", autouse=True)
def quiet_math_verify():
    logging.getLogger("math_verify").setLevel(logging.ERROR)


@pytest.mark.parametrize("module", [math_extract, math_equiv, math_verifier])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_corpus_is_large_labelled_and_covers_every_category():
    rows = load_corpus()
    assert len(rows) >= 300
    assert len({r["id"] for r in rows}) == len(rows)
    assert CATEGORIES <= {r["category"] for r in rows}
    assert all(isinstance(r["expected"], bool) for r in rows)
    # both labels in every category: a verifier that says yes (or no) to everything fails it
    for cat in CATEGORIES:
        labels = {r["expected"] for r in rows if r["category"] == cat}
        assert labels == {True, False}, cat


def test_magic_verifier_has_no_false_positives_or_negatives_on_the_corpus():
    fp, fn = errors("magic", load_corpus())
    assert fp == [] and fn == [], (fp, fn)


def test_the_plain_skywork_procedure_errs_where_the_issue_says():
    """The baseline's known failures, reproduced: the README's comparison is measured, not claimed."""
    rows = {r["id"]: r for r in load_corpus()}
    fp, fn = errors("skywork-or1", list(rows.values()))
    assert {"fraction-013", "equation-007", "unit-002"} <= set(fp)  # 1/2^99 vs 1/2^98, x^2-4=0 vs 0, 10 m vs 10 cm
    assert {"degree-000", "interval-000", "choice-options-000"} <= set(fn)
    assert len(fp) + len(fn) > 40


@pytest.mark.parametrize(
    "response, gold, status",
    [
        ("8+2+7\n10+7\n17\n\\boxed{17}", "17", Status.correct),
        ("\\boxed{18}", "17", Status.wrong),
        ("8+2+7\n10+7\n1", "17", Status.no_answer),
        ("<think>maybe \\boxed{3}</think> so \\boxed{\\frac{1}{2}}", "0.5", Status.correct),
        ("<think>\\boxed{17}</think> I am not sure", "17", Status.no_answer),
        ("<think>\\boxed{17}</think> the answer is 18", "17", Status.wrong),
        ("\\boxed{17", "17", Status.no_answer),
        ("\\boxed{" + "1" * 5000 + "}", "1", Status.wrong),
        ("\\boxed{" + "{" * 100 + "1" + "}" * 100 + "}", "1", Status.wrong),
    ],
)
def test_verdicts(response, gold, status):
    assert math_verifier.verify_magic(response, gold).status is status


def test_registering_a_verifier_twice_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        math_verifier.register("magic")(math_verifier.verify_magic)
    with pytest.raises(ValueError, match="unknown math verifier"):
        math_verifier.get_verifier("nope")
