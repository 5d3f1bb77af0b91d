"""The LLM judge's effect on the labelled corpus: false positives and negatives with and without it.

Point it at an OpenAI-compatible server that serves your judge model (a vLLM server:
`python -m vllm.entrypoints.openai.api_server --model <judge>`):

    .venv/bin/python benchmarks/math_judge.py --url http://127.0.0.1:8000 --model <judge>

Every case of tests/data/reward/math_corpus.jsonl is scored by the rules alone, then with the
judge asked about the answers the rules reject (`Scorer` with `math.judge.enabled`). Prints how
many cases reached the judge, its decisions, and the false positives (labelled wrong, accepted)
and false negatives (labelled right, rejected) of both. The judge's false-positive rate is the
share of the labelled-wrong cases it was asked about that it accepted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from magic.reward.scoring import Sample, Scorer
from magic.reward.settings import RewardSettings

CORPUS = Path(__file__).parents[1] / "tests" / "data" / "reward" / "math_corpus.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    cases = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    samples = [Sample("math", c["response"], c["gold"], problem=c.get("problem", "")) for c in cases]
    rules = RewardSettings(math={"workers": args.workers})
    judged = RewardSettings(math={"workers": args.workers, "judge": {"enabled": True, "url": args.url, "model": args.model}})
    with Scorer(rules) as s:
        plain = [s.verdict(x)[1] for x in samples]
    with Scorer(judged) as s:
        helped = [s.verdict(x)[1] for x in samples]
    asked = [k for k, v in enumerate(plain) if v.status.value == "wrong" and v.answer]
    for name, verdicts in (("rules", plain), ("rules + judge", helped)):
        fp = sum(1 for c, v in zip(cases, verdicts) if v.correct and not c["expected"])
        fn = sum(1 for c, v in zip(cases, verdicts) if not v.correct and c["expected"])
        print(f"{name:14s} false positives {fp:3d} / {sum(not c['expected'] for c in cases)}, false negatives {fn:3d} / {sum(c['expected'] for c in cases)}")
    negatives = [k for k in asked if not cases[k]["expected"]]
    accepted = [k for k in negatives if helped[k].correct]
    print(f"asked about {len(asked)} answers the rules rejected ({len(negatives)} labelled wrong, {len(asked) - len(negatives)} labelled right)")
    if negatives:
        print(f"judge false-positive rate: {len(accepted)}/{len(negatives)} = {len(accepted) / len(negatives):.1%} of the labelled-wrong answers it was asked about")
    return 0


if __name__ == "__main__":
    sys.exit(main())
