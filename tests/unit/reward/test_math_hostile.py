"""Hostile expressions: every one is judged within the per-response bound, none is accepted,
and the verifier keeps working afterwards."""

from __future__ import annotations

import time

import pytest

from magic.reward.scoring import verify_math
from magic.reward.timeboxed import TimeboxedPool

BOUND = 3.0  # seconds; the service's default bound is MAGIC_MATH__TIMEOUT_SECONDS=5

HOSTILE = {
    "power tower": r"\boxed{10^{10^{10^{10}}}}",
    "taller tower": r"\boxed{" + "9^{" * 30 + "9" + "}" * 30 + "}",
    "huge factorial": r"\boxed{(10^{100})!}",
    "factorial of a tower": r"\boxed{(10^{10^{10}})!}",
    "huge integer literal": r"\boxed{" + "7" * 200_000 + "}",
    "huge exponent": r"\boxed{2^{100000000}}",
    "deep nesting": r"\boxed{" + r"\frac{1}{" * 300 + "2" + "}" * 300 + "}",
    "deep parentheses": r"\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}",
    "very long output": "blah " * 2_000_000 + r"\boxed{5}x",
    "thousands of boxed answers": " and ".join(rf"\boxed{{{k}}}" for k in range(5000)),
    "thousands of boxes, last wrong": r"\boxed{4} " * 5000 + r"\boxed{5}",
    "big matrix": r"\boxed{\begin{pmatrix}" + r"\\".join("&".join(str(i * j) for j in range(60)) for i in range(60)) + r"\end{pmatrix}}",
    "long sum": r"\boxed{" + "+".join(f"x^{{{k}}}" for k in range(3000)) + "}",
    "nested radicals": r"\boxed{" + r"\sqrt{2+" * 200 + "2" + "}" * 200 + "}",
    "sum to a billion": r"\boxed{\sum_{k=1}^{10^{9}} k}",
    "product to ten million": r"\boxed{\prod_{k=1}^{10^{7}} k}",
    "huge binomial": r"\boxed{\binom{10^{9}}{5 \cdot 10^{8}}}",
    "integral": r"\boxed{\int_0^1 e^{-x^2} \sin(x^{10}) dx}",
    "big polynomial power": r"\boxed{(x+y+z)^{500}}",
    "tower that cancels": r"\boxed{2^{2^{100}}-2^{2^{100}}+4}",
}


@pytest.fixture(scope="module")
def pool():
    with TimeboxedPool(workers=2, timeout=BOUND, preload=["magic.reward.scoring", "magic.reward.math.equiv", "math_verify"]) as p:
        assert p.call(verify_math, "magic", r"\boxed{1}", "1", "").value.correct  # warm
        yield p


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_answer_is_judged_within_the_bound(pool, name):
    t0 = time.monotonic()
    result = pool.call(verify_math, "magic", HOSTILE[name], "4", "")
    elapsed = time.monotonic() - t0
    assert elapsed < BOUND + 15.0, f"{name} took {elapsed:.1f}s"  # bounded (a loaded machine adds the respawn), not fast
    assert result.status in ("ok", "timeout")
    if result.status == "ok":
        assert not result.value.correct


def test_the_verifier_still_works_after_the_hostile_suite(pool):
    for gold, answer in [("4", r"\boxed{4}"), (r"\frac12", r"\boxed{0.5}")]:
        result = pool.call(verify_math, "magic", answer, gold, "")
        assert result.status == "ok" and result.value.correct
