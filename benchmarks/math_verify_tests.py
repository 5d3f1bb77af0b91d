"""The math verifier on Math-Verify's own regression tests: false negatives and false positives.

Math-Verify (github.com/huggingface/Math-Verify) ships its test cases as pytest parametrizations
of (gold, prediction, expected) in tests/*.py. Fetch them yourself (MIT licensed, not vendored
here), then

    .venv/bin/python benchmarks/math_verify_tests.py path/to/Math-Verify/tests [--show 20]

Each case is judged by `verify_magic(prediction, gold)` (the prediction as the response, the gold
as the ground truth) and counted against `expected`: 1 (equivalent: a rejection is a false
negative) or 0 (not equivalent: an acceptance is a false positive). Cases whose test passes
options beyond the defaults (`precision`, `strict=False`, set relations)
are reported apart as "special". Prints the counts per file and overall.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

from magic.reward.math.verifier import verify_magic


def cases(path: Path):
    """(test name, gold, pred, expected, special) of every literal parametrization in `path`."""
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        body = ast.unparse(fn)
        special = any(k in body for k in ("precision=", "strict=False", "allow_set_relation_comp"))
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and ast.unparse(dec.func).endswith("parametrize") and len(dec.args) >= 2):
                continue
            try:
                names, values = ast.literal_eval(dec.args[0]), ast.literal_eval(dec.args[1])
            except ValueError:
                continue
            names = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
            if not {"gold", "pred", "expected"} <= set(names):
                continue
            for row in values:
                row = dict(zip(names, row))
                yield fn.name, str(row["gold"]), str(row["pred"]), int(bool(row["expected"])), special


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tests", type=Path, help="Math-Verify's tests/ directory")
    ap.add_argument("--show", type=int, default=0, help="print this many misjudged cases")
    args = ap.parse_args()
    totals: Counter = Counter()
    wrong = []
    for path in sorted(args.tests.glob("test_*.py")):
        per: Counter = Counter()
        for name, gold, pred, expected, special in cases(path):
            got = int(verify_magic(pred, gold).correct)
            kind = "special" if special else "plain"
            per[kind, expected, got == expected] += 1
            totals[kind, expected, got == expected] += 1
            if got != expected:
                wrong.append((path.name, name, gold, pred, expected))
        if per:
            print(f"{path.name:28s} agree {sum(v for (k, e, ok), v in per.items() if ok):4d} / {sum(per.values()):4d}")
    for kind in ("plain", "special"):
        fn_ = totals[kind, 1, False]
        fp = totals[kind, 0, False]
        pos = fn_ + totals[kind, 1, True]
        neg = fp + totals[kind, 0, True]
        print(f"{kind:8s} agree {pos + neg - fn_ - fp}/{pos + neg}: false negatives {fn_}/{pos}, false positives {fp}/{neg}")
    agree = sum(v for (k, e, ok), v in totals.items() if ok)
    print(f"all      agree {agree}/{sum(totals.values())}")
    for row in wrong[: args.show]:
        print("  ", row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
