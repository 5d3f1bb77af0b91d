"""Hostile expressions: every one is judged within the per-response bound, none is accepted,
and the verifier keeps working afterwards."""

from __future__ import annotations

import random
import re
import time

import pytest

from magic.reward.math.extract import strip_closing
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


# -- degenerate responses: long runs of white space or repeated remarks, where a backtracking
# pattern over the response's end would take time polynomial (up to cubic) in the run's length --

RUN = 3000
NEAR = 1900  # a statement is read only in the response's last 2,000 characters (extract._ANSWER_TAIL_CHARS)
DEGENERATE = {
    # name: (response, the verdict its statement gives against gold 7)
    "line breaks between two words": ("x" + "\n" * RUN + "y", "no_answer"),
    "spaces between two words": ("a" + " " * 20_000 + "b", "no_answer"),
    "spaces after the statement's verb": ("The answer is" + " " * NEAR + "7", "correct"),
    "line breaks after the statement's verb": ("The final answer is" + "\n" * NEAR + "7.", "correct"),
    "an empty answer line": ("Answer:" + "\n" * RUN + "x", "no_answer"),
    "line breaks after a statement": ("Final answer: 7" + "\n \n" * RUN, "correct"),
    "white space before a GSM8K line": ("<think>3+4</think>" + "\t\n" * RUN + "#### 7", "correct"),
    "a box left open": ("\\boxed{" + "\n" * RUN, "no_answer"),
    "stars and line breaks": ("*\n" * RUN + "Answer: 7", "correct"),
    "closing remarks repeated": ("The answer is 7." + " I hope it helps" * RUN, "correct"),
    "a chain of thought cut at T": ("We add the numbers one at a time and check each partial sum. " * 1000, "no_answer"),
}


@pytest.mark.parametrize("name", sorted(DEGENERATE))
def test_a_degenerate_response_is_judged_not_timed_out(pool, name):
    """Each is judged in milliseconds (before the end of the response was read by patterns that
    backtracked over white space, 2,000 line breaks took minutes): within the bound, with the
    verdict its final statement gives."""
    response, verdict = DEGENERATE[name]
    result = pool.call(verify_math, "magic", response, "7", "")
    assert result.status == "ok", f"{name}: {result.status} after {result.seconds:.1f}s"
    assert result.value.status.value == verdict, (name, result.value)


_CLOSING_AS_ONE_PATTERN = re.compile(  # strip_closing's former definition: one pattern searched over the whole text
    r"(?:\s*(?:I hope (?:it|this) is correct|I hope (?:this|that|it) helps|Hope (?:this|that|it) helps)[.!]?"
    r"|\s*<\|(?:im_end|endoftext|eot_id|im_start)\|>(?:user|assistant)?|\s*</s>)+\s*$",
    re.IGNORECASE,
)


def test_strip_closing_reads_from_the_end_as_the_pattern_over_the_whole_text_did():
    pieces = ["I hope it is correct", "i HOPE this helps", "Hope that helps", "hope it helps", "I ", "I", " ", "\n", "\t",
              ".", "!", "x", "42", "$5$", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|im_start|>", "user", "assistant",
              "</s>", "<|im_end|>user", "Hope", "helps", "correct", "\u00a0", "\u2003"]
    rng = random.Random(0)
    for _ in range(50_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 9)))
        assert strip_closing(text) == _CLOSING_AS_ONE_PATTERN.sub("", text), repr(text)
