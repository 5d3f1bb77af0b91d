"""Builds math_adversarial.jsonl: wrong answers written to be accepted.

    python tests/data/reward/build_math_adversarial.py   # rewrites math_adversarial.jsonl next to it

Every case is a response a policy could learn to write in place of a clean answer — a hedge,
several candidates, a negation, a comparison, a word that changes the value, a function of the
unknown or a question-dependent name read as a label, a list or a near-miss form — whose text holds
the gold value where a lenient rule would find it (the last number, the last formula, the
right-hand side, the number before a "unit"). None is correct: the verifier must judge every one
`wrong` or `no_answer` (tests/unit/reward/test_math_adversarial.py). Each case names the recall
rule it attacks (`rule`: one of `magic.reward.math.verifier.RECALL_RULES`) and how the answer is
presented (`form`: a bare response, a final-answer statement, a box).
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("math_adversarial.jsonl")

# (rule, class, answer text, gold, problem): the answer holds the gold where a lenient reading finds it
CASES: list[tuple[str, str, str, str, str]] = []


def add(rule: str, klass: str, answers: list[str], gold: str, problem: str = "") -> None:
    CASES.extend((rule, klass, a, gold, problem) for a in answers)


for g, other in (("6", "5"), ("12", "7")):
    add("unmarked", "negation", [f"It is not {g}.", f"not {g}", f"impossible, not {g}", f"definitely not {g}", f"{g} is wrong"], g)
    add("unmarked", "range", [f"between {other} and {g}", f"from {other} to {g}", f"{other} < x < {g}"], g)
    add("unmarked", "candidates", [f"${other}$ or ${g}$", f"{other} or {g}", f"x = {other} or x = {g}", f"{other}, {g}"], g)
    add("unmarked", "comparison", [f"at least {g}", f"at most {g}", f"more than {g}", f"less than {g}", f"x > {g}", f"$x \\ge {g}$"], g)
    add("unmarked", "hedge", [f"maybe {g}", f"probably {g}", f"I think {g}", f"{g}?", f"possibly {g}"], g)
    add("unit-drop", "value word", [f"{g} squared", f"{g} million", f"{g} thousand", f"{g} cubed", f"{g} dozen", f"{g} or less", f"{g} times 2"], g)
    add("unmarked", "sign word", [f"minus {g}", f"negative {g}", f"$\\pm {g}$"], g)
    add("label", "function of the unknown", [f"$\\sqrt{{x}} = {g}$", f"$\\ln x = {g}$", f"$x! = {g}$", f"$x^2 = {g}$", f"$\\log_2 x = {g}$", f"$e^x = {g}$", f"$|x| = {g}$"], g)
    add("label", "question-dependent name", [f"perimeter = {g}", f"area = {g}", f"the sum = {g}", f"$\\text{{radius}} = {g}$"], g)
add("unit-drop", "second value or bound as a unit", ["5 \\text{ or 6}", "5 \\text{ (or 6)}", "5 \\text{ or greater}", "5 \\text{ and above}",
                                                   "5 \\text{ roughly}", "5 tops", "5 doubled", "5 or so"], "5")
add("unmarked", "operation", ["pi/2", "5 choose 2", "half of 2", "2 to the 3"], "2")
add("label", "function of the unknown", ["$\\sin x = \\frac12$", "$\\cos x = \\frac{1}{2}$", "$\\tan x = \\frac{1}{2}$"], "\\frac{1}{2}")
add("percent", "percent of something else", ["28 percent more", "28\\% or less", "0.28\\%"], "28")
add("degrees", "degree list", ["$30^\\circ$ or $150^\\circ$", "30 degrees less"], "30")
add("thousands", "separator", ["1,5", "12,34", "1,0,0,0"], "1000")
add("mixed-number", "mixed number", ["$2\\frac{1}{3}$"], "\\frac{2}{3}")
add("choices", "several letters", ["A or B", "(A) and (C)", "not B"], "B")
add("ordinal", "ordinal", ["12th or 13th", "not the 12th", "12nd", "12th root", "after the 12th"], "12")
add("list-label", "names that change the value", ["$\\sqrt{x} = 2, \\sqrt{y} = 3$", "twice: 2, half: 3", "$x^2 = 2, y^2 = 3$",
                                                  "$f(x) = 2, g(x) = 3$", "minus = 2, minus = 3"], "2, 3")
add("equals-chain", "chain through another value", ["x = 7 = 5", "x = 4 + 2 = 5", "$\\sqrt{x} = 2 + 3 = 5$", "x = 5 = y = 6"], "5")
add("equation-solved", "half of the curve", ["\\sqrt{1 - x^2}", "1 - x^2"], "x^2 + y^2 = 1")
add("equation-solved", "no variable left", ["6", "6x"], "xy = 6")
add("equation-solved", "two solutions", ["2", "-2"], "x^2 - 4 = 0")
add("relations", "other comparisons", ["a \\le b \\le c", "c < b < a", "a < b", "a < c < b"], "a < b < c")
add("conditions-union", "other conditions", ["x < 1 \\text{ or } x \\ge 2", "x < 1 \\text{ or } y > 2", "x < 1 \\text{ or } x = 2",
                                             "x < 1 \\text{ and } x > 2"], "(-\\infty, 1) \\cup (2, \\infty)")
add("rule-domain", "rule on part of the domain", ["f(x) = x \\text{ for all } x > 0", "f(x) = x \\text{ for some } x \\in \\mathbb{R}",
                                                  "f(x) = x \\text{ for all } x \\in \\mathbb{Z} \\text{ except } 0",
                                                  "f(x) = x \\text{ or } f(x) = 0 \\text{ for all } x \\in \\mathbb{R}"], "f(x) = x")
add("parameter", "another family", ["\\frac{\\pi}{6} + 2n\\pi", "\\frac{\\pi}{6} + n", "\\frac{\\pi}{6} + n\\pi^2", "\\frac{\\pi}{3} + n\\pi"],
    "\\frac{\\pi}{6} + k\\pi")
add("parameter", "declared parameter", ["(3t, 5t + 1) \\text{ for some integer } t", "(3t, 5s) \\text{ for some integer } t",
                                        "(3t, 5t) \\text{ for some integer } s"], "(3x, 5x)")
add("plus-minus-point", "signs that do not vary apart", ["(\\pm 1, \\pm 2)", "(\\pm 1, 2)", "(1, \\pm 2)"], "(1, 2), (-1, -2)")
add("ordered-values", "another order or length", ["(3, 2, 1)", "(x, y, z) = (1, 3, 2)", "(1, 2, 3, 4)"], "1, 2, 3")
add("ordered-values", "an interval for two values", ["(1, 2)", "[1, 2]"], "1, 2")
add("word-list", "other words", ["line segment or circle", "not line segment, circle", "line segment, circle, parabola",
                                 "\\text{line segment and not circle}"], "line segment, circle")
add("infinity-words", "not infinitely many", ["not infinitely many", "finitely many", "infinitely many or none", "-\\infty"], "infinitely many")
add("set-minus", "another set", ["\\{x | x < \\frac{3}{2}\\} - \\{-5\\}", "\\{x | x < \\frac{3}{2}\\} - \\{x\\}",
                                 "\\{x | x < \\frac{3}{2}\\} \\cup \\{-6\\}", "\\{x | x \\le \\frac{3}{2}\\} - \\{-6\\}"],
    "(-\\infty, -6) \\cup (-6, \\frac{3}{2})")
add("function-rule", "another variable or rule", ["e^{x}", "x(t) = e^{-t}", "e^{t} + C"], "x(t) = e^{t}")
add("percent", "near miss of a rounded percentage", ["\\frac{1}{14}", "0.0668", "\\frac{1}{16}"], "6.67\\%")
# a hostile review of the rules above (each accepted once)
add("list-label", "swapped or value-changing names", ["Minimum = 2, Maximum = 1", "T(10) = 4, T(11) = 2", "Reciprocal = 2, Reciprocal = 3",
                                                      "Wrong: 2, Wrong: 3", "Perhaps: 2, Perhaps: 3", "Double = 2, Triple = 3"], "2, 4")
add("list-label", "swapped names of a named gold", ["\\text{Maximum} = 1, \\text{Minimum} = 2", "\\text{Paolo}: 1, \\text{Sevilla}: 2"],
    "\\text{Maximum} = 2, \\text{Minimum} = 1")
add("list-label", "a product read as a name", ["x(2) = 5, x(3) = 7", "y(1) = 5, y(2) = 7"], "5, 7")
add("ordered-values", "variables in another order", ["(z, y, x) = (1, 2, 3)", "(3, 2, 1)"], "x = 1, y = 2, z = 3")
add("function-rule", "functions swapped", ["(Q(x), P(x)) = (2x, x^2)", "Q(x) = 2x, P(x) = x^2"], "P(x) = 2x, Q(x) = x^2")
add("rule-domain", "part of the problem's domain", ["f(x) = x \\text{ for all negative integers } x", "f(x) = x \\text{ for all } x \\in \\mathbb{R}_{>5}",
                                                    "f(x) = x \\text{ for all } x \\in \\mathbb{Z}_{<0}",
                                                    "f(x) = x \\text{ for all } x \\in \\mathbb{Z}, f(x) = 0 \\text{ for all } x \\in \\mathbb{Q}"],
    "f(x) = x", "Find all functions $f: \\mathbb{Z} \\to \\mathbb{Z}$ such that ...")
add("equals-chain", "a chain through a unit or percent", ["d = 5 \\text{ km} = 5", "p = 5\\% = 5", "x = 50 = 50\\%"], "5")
add("equals-chain", "a relation of variables as gold", ["c", "z"], "x = y = z")
add("equation-solved", "one of several solutions", ["8", "\\frac{\\pi}{4}", "\\pi"], "x^{2/3} = 4")
add("equation-solved", "a principal value", ["\\frac{\\pi}{4}", "\\frac{5\\pi}{4}"], "\\tan x = 1")
add("equation-solved", "a rational equation", ["x", "x + 1"], "\\frac{y^2 + 1}{y^3 + x} = x")
add("parameter", "a variable that is no parameter", ["\\pi r", "2\\pi h", "\\pi(a + c)"], "\\pi d")
add("parameter", "the unknown as the parameter", ["\\frac{\\pi}{6} + \\pi x"], "x = \\frac{\\pi}{6} + k\\pi")
add("parameter", "integer points of a curve", ["(t, t^2) \\text{ for some integer } t", "t^2 \\text{ for some integer } t"], "(x, x^2)")
add("ordinal", "an ordinal with a qualifier", ["3rd \\text{ smallest}", "3rd \\text{ from the right}", "12^{\\text{th}} \\text{ from the end}", "3rd \\text{ prime}"], "3")
add("word-list", "parts in another order", ["\\text{decreasing and increasing}", "decreasing, increasing"], "increasing, decreasing")
add("percent", "a one-digit rounded percentage", ["\\frac{1}{199}", "\\frac{1}{210}"], "0.5\\%")
add("set-minus", "another point, nearly", ["\\{x | x < \\frac{3}{2}\\} - \\{-6.000005\\}"], "(-\\infty, -6) \\cup (-6, \\frac{3}{2})")
add("conditions-union", "an undefined point", ["x < 1 \\text{ or } x = \\infty - \\infty", "x < 1 \\text{ and } x = 0 \\cdot \\infty", "x < 1 \\text{ or } x = 1^\\infty"], "(1, 2)")

FORMS = {
    "bare": lambda a: a,
    "statement": lambda a: f"Adding everything up carefully.\nThe final answer is {a}.",
    "box": lambda a: f"So we get $\\boxed{{{a.strip('$')}}}$.",
}


def main() -> None:
    rows = []
    for i, (rule, klass, answer, gold, problem) in enumerate(CASES):
        for form, render in FORMS.items():
            if form == "box" and ("$" in answer.strip("$") or "\n" in answer):
                continue  # several math spans: no one box holds them
            row = {"id": f"adv-{i:03d}-{form}", "rule": rule, "class": klass, "form": form, "response": render(answer), "gold": gold}
            rows.append({**row, "problem": problem} if problem else row)
    OUT.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} cases to {OUT}")


if __name__ == "__main__":
    main()
