"""Optional reward penalties from the recipe family, each reported apart from correctness.

A penalty is a plain function registered by name (`PENALTIES`) with the signature

    penalty(sample: PenaltyInput, settings: PenaltySettings) -> float | None

returning a value <= 0 that is added to the reward, or None when it is switched off. All are
off by default — Skywork-OR1 trains on correctness alone; these are for recipes that punish
degenerate responses:

* ``repetition`` — repeated word n-grams (as TRL's ``get_repetition_penalty_reward``):
  ``-repetition_max * (1 - distinct n-grams / n-grams)``; or, with ``repetition_flat``, a flat
  ``-repetition_max`` once that fraction reaches ``repetition_threshold`` (the RLOO + entropy
  bonus + penalties recipe's -1 for a repetitive answer);
* ``overlong`` — DAPO's soft overlong punishment: 0 up to ``T - overlong_buffer_tokens``
  response tokens, then linear down to ``-overlong_max`` at T (truncated responses get the full
  penalty).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from magic.config.registry import Registry
from magic.config.schema import PenaltySettings


@dataclass(frozen=True)
class PenaltyInput:
    """What penalties look at: the text and, when known, its length and the context length T."""

    text: str
    response_tokens: int | None = None
    max_tokens: int | None = None  # T


Penalty = Callable[[PenaltyInput, PenaltySettings], "float | None"]
PENALTIES: Registry[Penalty] = Registry("penalty")


register = PENALTIES.register
"""Decorator registering a penalty under a name (twice is an error)."""


def repetition_score(text: str, ngram: int) -> float:
    """Fraction of repeated word n-grams in `text`: 0 when all are distinct, towards 1 when one repeats.

    >>> repetition_score("a b c d e f", 2)
    0.0
    >>> repetition_score("x y x y x y x y", 2)
    0.7142857142857143
    >>> repetition_score("too short", 3)
    0.0
    """
    words = text.split()
    grams = [tuple(words[i : i + ngram]) for i in range(len(words) - ngram + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


@register("repetition")
def repetition(sample: PenaltyInput, settings: PenaltySettings) -> float | None:
    """``-repetition_max * repetition_score`` (graded), or ``-repetition_max`` when the score
    reaches ``repetition_threshold`` and 0 otherwise (flat); None when `repetition_max` is 0.

    >>> repetition(PenaltyInput("x y x y x y x y"), PenaltySettings(repetition_max=1.0, repetition_ngram=2))
    -0.7142857142857143
    >>> flat = PenaltySettings(repetition_max=1.0, repetition_ngram=2, repetition_flat=True, repetition_threshold=0.5)
    >>> repetition(PenaltyInput("x y x y x y x y"), flat), repetition(PenaltyInput("a b c d a b"), flat)
    (-1.0, 0.0)
    """
    if settings.repetition_max <= 0:
        return None
    score = repetition_score(sample.text, settings.repetition_ngram)
    if settings.repetition_flat:
        return -settings.repetition_max if score >= settings.repetition_threshold else 0.0
    return -settings.repetition_max * score


@register("overlong")
def overlong(sample: PenaltyInput, settings: PenaltySettings) -> float | None:
    """DAPO's soft overlong punishment; None when disabled or the lengths are unknown.

    >>> s = PenaltySettings(overlong_buffer_tokens=100, overlong_max=1.0)
    >>> [overlong(PenaltyInput("", n, 1000), s) for n in (800, 900, 950, 1000, 1200)]
    [0.0, 0.0, -0.5, -1.0, -1.0]
    """
    buffer = settings.overlong_buffer_tokens
    if buffer <= 0 or not sample.response_tokens or not sample.max_tokens:
        return None
    start = sample.max_tokens - buffer
    excess = sample.response_tokens - start
    if excess <= 0:
        return 0.0
    return -settings.overlong_max * min(1.0, excess / buffer)


def compute_penalties(sample: PenaltyInput, settings: PenaltySettings) -> dict[str, float]:
    """Every enabled penalty's value, by name (empty when all are off)."""
    out = {}
    for name, fn in PENALTIES.items():
        value = fn(sample, settings)
        if value is not None:
            out[name] = float(value)
    return out
