"""The math verifier on HardVerify-Math: false negatives on answers that are hard to verify.

HardVerify-Math (TinyV, arXiv 2505.14625) holds 250 problems whose gold answers are easy to
misjudge; each comes with `fn_output`, a correct answer in another form (a rule-based verifier that
rejects it has a false negative), and `tn_output`, a wrong answer (accepting it is a false
positive). Fetch it yourself — it is not vendored: `benchmarks/HardVerify-Math.json` of
github.com/uw-nsl/TinyV, or the Hugging Face dataset `zhangchenxu/HardVerify-Math` saved as JSON
(a list of records with `question`, `ground_truth`, `fn_output`, `tn_output`) — then

    .venv/bin/python benchmarks/hardverify_math.py path/to/HardVerify-Math.json [--show 20]

Each answer is judged as a response that boxes it (``The final answer is $\\boxed{...}$``), with
the question as the problem, by every registered verifier. The dataset's labels are TinyV's:
some "false negatives" are answers a careful grader rejects (``85.71`` for ``600/7``, ``300`` for
``299.94``, an open interval for a closed one); the figure is reported against them as labelled.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from magic.reward.math.verifier import VERIFIERS


def response(answer: str) -> str:
    return f"The final answer is $\\boxed{{{answer}}}$."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", type=Path, help="HardVerify-Math as JSON (a list of records)")
    ap.add_argument("--show", type=int, default=0, help="print this many misjudged cases per verifier")
    ap.add_argument("--verifier", action="append", help="only these verifiers (default: all registered)")
    args = ap.parse_args()
    try:
        records = json.loads(args.data.read_text())
    except (OSError, ValueError) as exc:
        print(f"cannot read {args.data}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(records, list) or not all({"ground_truth", "fn_output", "tn_output"} <= set(r) for r in records):
        print(f"{args.data}: expected a list of records with ground_truth, fn_output and tn_output", file=sys.stderr)
        return 2
    for name in args.verifier or list(VERIFIERS):
        verify = VERIFIERS.lookup(name)
        fn, fp = [], []
        for r in records:
            gold, problem = str(r["ground_truth"]), str(r.get("question", ""))
            if not verify(response(str(r["fn_output"])), gold, problem).correct:
                fn.append(r)
            if verify(response(str(r["tn_output"])), gold, problem).correct:
                fp.append(r)
        n = len(records)
        print(f"{name:12s} false negatives {len(fn):3d} / {n} ({100 * len(fn) / n:.1f}%)   false positives {len(fp):3d} / {n} ({100 * len(fp) / n:.1f}%)")
        for r in fn[: args.show]:
            print(f"    FN  gold {r['ground_truth'][:70]!r}  answer {r['fn_output'][:70]!r}")
        for r in fp[: args.show]:
            print(f"    FP  gold {r['ground_truth'][:70]!r}  answer {r['tn_output'][:70]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
