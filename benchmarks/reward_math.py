"""Math verifications per second over a realistic mix, with p50/p99/max latency.

The mix: every case of the labelled corpus (tests/data/reward/math_corpus.jsonl), each wrapped
in a chain of thought of 1-12 KB (random lengths, seeded), so extraction scans text of the size
real responses have; cases are repeated to --n verifications in a shuffled order. Verification
goes through the service's own path — `Scorer` with its timeboxed worker processes — from as
many threads as there are workers, as the reward worker scores a batch.

    .venv/bin/python benchmarks/reward_math.py                 # 2 workers, 2000 verifications
    .venv/bin/python benchmarks/reward_math.py --verifier skywork-or1 --workers 2 --n 1000

Prints throughput, latency percentiles (inside the worker, and end to end including the wait for
a free worker), verdict counts and accuracy against the corpus labels.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from magic.reward.scoring import Sample, Scorer
from magic.reward.settings import MathRewardSettings, RewardSettings

CORPUS = Path(__file__).parents[1] / "tests" / "data" / "reward" / "math_corpus.jsonl"
STEPS = [
    "Let $x$ be the unknown. Then $2x + 3 = 11$, so $x = 4$.",
    "We expand $(a+b)^2 = a^2 + 2ab + b^2$ and compare coefficients.",
    "Wait, let me double-check this step: $\\frac{3}{4} \\cdot \\frac{8}{9} = \\frac{2}{3}$.",
    "By the triangle inequality, $|u + v| \\le |u| + |v|$, with equality when the vectors are parallel.",
    "Summing the geometric series gives $\\sum_{k=0}^{n} r^k = \\frac{1 - r^{n+1}}{1 - r}$.",
    "Hmm, that contradicts the earlier bound, so the case $n = 1$ must be treated separately.",
]


def realistic(response: str, rng: random.Random) -> str:
    words = []
    target = rng.randint(1000, 12000)
    while sum(len(w) for w in words) < target:
        words.append(rng.choice(STEPS))
    thought = "\n".join(words)
    if response.startswith("<think>"):
        return response.replace("<think>", "<think>\n" + thought + "\n", 1)
    return thought + "\n\n" + response


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="verifications")
    ap.add_argument("--workers", type=int, default=2, help="verifier processes (the 2 cores here)")
    ap.add_argument("--verifier", default="magic", help="registered verifier: magic or skywork-or1")
    ap.add_argument("--timeout", type=float, default=5.0, help="hard bound per response (s)")
    args = ap.parse_args()

    rows = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    rng = random.Random(0)
    cases = [rows[i % len(rows)] for i in range(args.n)]
    rng.shuffle(cases)
    samples = [(Sample("math", realistic(r["response"], rng), r["gold"], r.get("problem", "")), r["expected"]) for r in cases]
    mean_chars = statistics.mean(len(s.response) for s, _ in samples)

    settings = RewardSettings(math=MathRewardSettings(workers=args.workers, timeout_seconds=args.timeout, verifier=args.verifier))
    with Scorer(settings) as scorer:
        scorer.warm_up()
        end_to_end: list[float] = []

        def one(item):
            sample, expected = item
            t0 = time.perf_counter()
            score = scorer.score(sample)
            end_to_end.append(time.perf_counter() - t0)
            return score, expected

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.workers) as ex:
            results = list(ex.map(one, samples))
        wall = time.perf_counter() - t0

    inside = sorted(s.seconds for s, _ in results)
    e2e = sorted(end_to_end)
    pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    verdicts = Counter(s.verdict for s, _ in results)
    agree = sum((s.correctness == 1.0) == exp for s, exp in results)
    from magic.protocol.pb import messages_pb2 as pb

    print(f"math verifier {args.verifier!r}: {args.n} verifications, {args.workers} worker processes, bound {args.timeout:g}s")
    print(f"  responses: mean {mean_chars / 1000:.1f} KB (corpus of {len(rows)} cases, repeated and shuffled)")
    print(f"  throughput: {args.n / wall:.1f} verifications/s ({wall:.1f}s wall)")
    print(f"  latency in worker: p50 {pct(inside, 0.5) * 1000:.1f} ms  p99 {pct(inside, 0.99) * 1000:.1f} ms  max {inside[-1] * 1000:.1f} ms")
    print(f"  latency end to end: p50 {pct(e2e, 0.5) * 1000:.1f} ms  p99 {pct(e2e, 0.99) * 1000:.1f} ms  max {e2e[-1] * 1000:.1f} ms")
    print("  verdicts: " + ", ".join(f"{pb.Verdict.Name(k).removeprefix('VERDICT_').lower()} {v}" for k, v in sorted(verdicts.items())))
    print(f"  agreement with the corpus labels: {agree}/{args.n}")


if __name__ == "__main__":
    main()
