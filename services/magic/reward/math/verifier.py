"""Math answers: the Skywork-OR1 procedure (§7) and MAGIC's stricter, broader version of it.

Two verifiers, registered by name (`VERIFIERS`); both have the signature

    verifier(response: str, gold: str, problem: str = "") -> MathVerdict

* ``"skywork-or1"`` — the paper's procedure exactly as Skywork-OR1 released it: take the text
  after ``</think>``, parse it with Math-Verify (its default extraction), return correct if the
  parsed string equals the gold, else run Math-Verify's `verify` against the gold wrapped in
  ``\\boxed{}``. Kept as the baseline the corpus figures of docs/reward.md compare against.
* ``"magic"`` (the default) — the same steps (answer after the reasoning; direct string match
  first; then equivalence with the gold read as a boxed answer), with MAGIC's extraction
  (`magic.reward.math.extract`) and comparison (`magic.reward.math.equiv`): it accepts the
  equivalent forms the plain procedure misses (units, degrees, percentages, intervals written
  as inequalities, sets in any order, multiple-choice letters vs option text, mixed numbers)
  and rejects what it wrongly accepts (``1/2^99`` for ``1/2^98``, ``10 m`` for ``10 cm``,
  ``x^2-4=0`` for ``0``, one of several answers).

Neither bounds its own running time: sympy can run for minutes on hostile input, and
Math-Verify's timeouts use SIGALRM, which works only in a main thread. Callers run these
functions through `magic.reward.timeboxed.TimeboxedPool`, which enforces a hard wall-clock bound
per response from any thread by killing the worker process that overruns.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

from magic.config.registry import Registry
from magic.reward.math.extract import BOX_COMMANDS, brace_depth, clean_latex, extract_answer, parse_choices, trailing_boxes
from magic.protocol.verdict import Status, Verdict

MathVerdict = Verdict
"""A math verifier's verdict (the shared `Verdict`)."""


MathVerifier = Callable[..., MathVerdict]
VERIFIERS: Registry[MathVerifier] = Registry("math verifier")


register = VERIFIERS.register
"""Decorator registering a math verifier under a name (twice is an error)."""


def get_verifier(name: str) -> MathVerifier:
    """The math verifier registered under `name` (ValueError listing the known ones otherwise)."""
    return VERIFIERS.lookup(name)


RECALL_RULES = (
    "unmarked", "unit-drop", "label", "percent", "degrees", "thousands", "mixed-number", "choices",
    "ordinal", "list-label", "equals-chain", "equation-solved", "relations", "conditions-union", "rule-domain",
    "parameter", "plus-minus-point", "ordered-values", "word-list", "infinity-words", "set-minus", "function-rule",
)
"""The rules by which the "magic" verifier accepts an answer that is not the gold's own text: a
short response read without a box or statement (`extract.unmarked_answer`), a unit dropped where
the gold has none, a name before ``=`` read as a label, percent signs, degree marks, thousands
separators, mixed numbers, choice letters. Precision first: each has adversarial twins — wrong
answers written to be accepted through it — in tests/data/reward/math_adversarial.jsonl, which the
verifier must refuse, all of them; a rule added here without its twins fails the tests."""

MAX_ANSWER_CHARS = 1000
"""Final answers longer than this are judged wrong without parsing them."""
MAX_NESTING = 40
"""Final answers nested deeper than this (brackets and braces) are judged wrong without parsing."""


@register("magic")
def verify_magic(response: str, gold: str, problem: str = "") -> MathVerdict:
    """Judge `response` against the gold answer `gold`; `problem` supplies multiple-choice options.

    >>> verify_magic("<think>2+2</think> So $\\\\boxed{4}$.", "4").status.value
    'correct'
    >>> verify_magic("The answer is \\\\boxed{10 \\\\text{ m}}", "10 \\\\text{ cm}").status.value
    'wrong'
    >>> verify_magic("<think>it is 4", "4").status.value
    'no_answer'
    """
    from magic.reward.math.equiv import Judgement, domains_of, equivalent  # heavy (sympy, ANTLR): loaded in the processes that judge

    t0 = time.perf_counter()
    answer = extract_answer(response)
    if answer is None:
        return MathVerdict(Status.no_answer, "", "no final answer after the reasoning", time.perf_counter() - t0)
    shown = answer[:200]
    if len(answer) > MAX_ANSWER_CHARS or brace_depth(answer) > MAX_NESTING:
        return MathVerdict(Status.wrong, shown, "answer too long or too deeply nested to be a final answer", time.perf_counter() - t0)
    golds = gold_answers(gold)
    if any(clean_latex(answer) == clean_latex(g) for g in golds):
        return MathVerdict(Status.correct, shown, "same text as the gold", time.perf_counter() - t0)
    choices = parse_choices(problem) if problem else None
    domains = domains_of(problem) if problem else ()
    reasons = []
    for g in golds:
        try:
            judgement = equivalent(g, answer, choices, domains)
        except (ArithmeticError, TypeError, ValueError, AttributeError, RecursionError, NotImplementedError) as exc:
            # sympy on an answer it cannot compare (NaN comparisons, undefined forms): never accepted, never a crash
            judgement = Judgement(False, f"the answer cannot be compared ({type(exc).__name__})")
        if judgement.equal:
            return MathVerdict(Status.correct, shown, judgement.reason, time.perf_counter() - t0)
        reasons.append(judgement.reason)
    return MathVerdict(Status.wrong, shown, reasons[0], time.perf_counter() - t0)


MAX_GOLDS = 16
"""A list ground truth holding more accepted forms than this is an error of the data."""


def gold_answers(gold: str) -> list[str]:
    """The accepted forms of a ground truth: verl data may give a JSON list of strings
    (``["72", "72.0"]``), any of which is correct; a worked solution (MATH's ``solution``
    field) stands for the answer it boxes; any other text is one gold answer (``[1, 2]`` stays
    the interval).

    >>> gold_answers('["72", "72.0"]'), gold_answers("[1, 2]"), gold_answers("72")
    (['72', '72.0'], ['[1, 2]'], ['72'])
    >>> gold_answers("So $N = 14{,}916$, and $\\\\boxed{14{,}916}$ is our answer.")
    ['14{,}916']
    """
    text = gold.strip()
    forms = [gold]
    if text.startswith("[") and text.endswith("]") and '"' in text:
        try:
            listed = json.loads(text)
        except ValueError:
            listed = None
        if isinstance(listed, list) and 0 < len(listed) <= MAX_GOLDS and all(isinstance(f, str) for f in listed):
            forms = listed
    golds = []
    for form in forms:  # the gold as written, and as repaired where the data mangled it
        for g in (_boxed_gold(form), repair_gold(_boxed_gold(form))):
            if g not in golds:
                golds.append(g)
    return golds


_CONTROL_ESCAPES = {"\x07": "\\a", "\x08": "\\b", "\x0c": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\x0b": "\\v"}
_ESCAPED_COMMAND = re.compile(
    "\\\\?(?:\x07(?=lpha|pprox|ngle)|\x08(?=eta|oxed|ar\\b|egin|inom|ig)|\x0c(?=rac)|\n(?=eq|ot\\b|abla|u\\b|e\\b|eg\\b)"
    "|\r(?=ho\\b|ight|m\\b|angle)|\t(?=ext|imes|an\\b|heta|au\\b|frac|o\\b|riangle|ilde)|\x0b(?=ec\\b|arphi|ee\\b|dots))"
)
"""A control character that was the backslash of one of these commands (``\\f`` + ``rac``)."""
_DOUBLED_COMMAND = re.compile(r"(?<!\\)\\\\(?=(?:frac|dfrac|sqrt|pi|sin|cos|tan|ln|log|cdot|times|infty|left|right|big|Big|bigg|Bigg|text)\b)")
"""A command written with two backslashes (``\\\\frac``), outside a matrix (where ``\\\\`` ends a row)."""


def repair_gold(gold: str) -> str:
    """A ground truth as its author wrote it, where the dataset mangled it (gold only: a
    response is judged as the policy wrote it):

    * a LaTeX command whose backslash became a control character when the data went through a
      JSON or Python string (``\\frac`` written ``"\\frac"`` reads as a form feed and ``rac``);
    * commands with doubled backslashes (``\\\\frac``) — a row break is never followed by a letter
      in an answer;
    * math delimiters inside the answer (``$f(x)=-1$,$f(x)=x+1$``), when they pair up (a lone
      ``$`` is a currency sign);
    * a stray full stop before the closing bracket (``(-\\frac12, \\sqrt2.]``).

    >>> repair_gold("[\x0crac{1}{2}, 1)"), repair_gold("$f(x)=-1$,$f(x)=x+1$"), repair_gold("$12.55")
    ('[\\\\frac{1}{2}, 1)', 'f(x)=-1,f(x)=x+1', '$12.55')
    """
    s = _ESCAPED_COMMAND.sub(lambda m: _CONTROL_ESCAPES[m.group(0)[-1]], gold)  # "\\" + "\f" too
    if "\\begin" not in s:
        s = _DOUBLED_COMMAND.sub(lambda m: "\\", s)
    dollars = [k for k, c in enumerate(s) if c == "$" and (k == 0 or s[k - 1] != "\\")]
    if len(dollars) >= 2 and len(dollars) % 2 == 0:
        s = "".join(c for k, c in enumerate(s) if k not in set(dollars))
    return re.sub(r"\.\s*([\])])\s*$", r"\1", s.strip())


def _boxed_gold(form: str) -> str:
    """The boxed answer of a gold written as a solution; the gold itself otherwise."""
    if not any(command in form for command in BOX_COMMANDS):
        return form
    boxes = trailing_boxes(form)
    return ", ".join(b.strip() for b in boxes) if boxes else form


@register("skywork-or1")
def verify_skywork(response: str, gold: str, problem: str = "") -> MathVerdict:
    """The plain Skywork-OR1 procedure (their released `math_verify_reward_function`).

    Math-Verify's own timeouts are left on (5 s, as released): this runs in a worker process's
    main thread, where SIGALRM works.
    """
    from math_verify import parse, verify

    t0 = time.perf_counter()
    text = response.split("</think>")[1] if "</think>" in response else response
    try:
        parsed = parse(text, parsing_timeout=5)
    except Exception as exc:  # noqa: BLE001 — as released: a parse failure scores 0
        return MathVerdict(Status.error, "", f"parse failed: {type(exc).__name__}", time.perf_counter() - t0)
    if len(parsed) < 2:
        return MathVerdict(Status.no_answer, "", "Math-Verify found no answer", time.perf_counter() - t0)
    shown = str(parsed[1])[:200]  # the extracted string, never a sympy object
    if parsed[1] == gold:
        return MathVerdict(Status.correct, shown, "string match", time.perf_counter() - t0)
    try:
        ok = verify(parse(f"\\boxed{{{gold}}}", parsing_timeout=5), parsed, timeout_seconds=5)
    except Exception as exc:  # noqa: BLE001
        return MathVerdict(Status.error, shown, f"verify failed: {type(exc).__name__}", time.perf_counter() - t0)
    return MathVerdict(Status.correct if ok else Status.wrong, shown, "Math-Verify", time.perf_counter() - t0)
