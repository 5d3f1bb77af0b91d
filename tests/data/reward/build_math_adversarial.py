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

# (rule, class, answer text, gold): the answer holds the gold where a lenient reading finds it
CASES: list[tuple[str, str, str, str]] = []


def add(rule: str, klass: str, answers: list[str], gold: str) -> None:
    CASES.extend((rule, klass, a, gold) for a in answers)


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

FORMS = {
    "bare": lambda a: a,
    "statement": lambda a: f"Adding everything up carefully.\nThe final answer is {a}.",
    "box": lambda a: f"So we get $\\boxed{{{a.strip('$')}}}$.",
}


def main() -> None:
    rows = []
    for i, (rule, klass, answer, gold) in enumerate(CASES):
        for form, render in FORMS.items():
            if form == "box" and ("$" in answer.strip("$") or "\n" in answer):
                continue  # several math spans: no one box holds them
            rows.append({"id": f"adv-{i:03d}-{form}", "rule": rule, "class": klass, "form": form, "response": render(answer), "gold": gold})
    OUT.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} cases to {OUT}")


if __name__ == "__main__":
    main()
