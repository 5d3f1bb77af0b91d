"""Code answers: run a program on the problem's tests in the sandbox.

    verifier = CodeVerifier(sandbox)
    verdict = verifier.verify(program, ground_truth)   # -> Verdict

The reward service takes the program out of the response (`magic.reward.code.extract_code`: the
last fenced block after the reasoning) and sends it here with the problem's tests.

1. Check its syntax with `ast` in this process; a syntax error is ``wrong`` without running
   anything (Skywork-OR1 §7).
2. Run it on the tests in the sandbox (`magic.codejudge.sandbox.runner`), one fresh process per
   test, and stop at the first failing test; compare each output here with LiveCodeBench's
   semantics (`magic.codejudge.cases`). All tests pass -> ``correct``; any failure (wrong answer,
   runtime error, time or memory limit, a program that exits early or kills its helper) ->
   ``wrong`` with the reason; malformed ground truth or a sandbox failure -> ``error``.
"""

from __future__ import annotations

import ast
import time
from collections.abc import Callable

from magic.codejudge.cases import (
    AssertTests,
    CallTests,
    GroundTruthError,
    call_matches,
    from_wire,
    parse_ground_truth,
    read_reports,
    stdout_matches,
)
from magic.codejudge.sandbox.runner import Program, Sandbox, TestRun
from magic.protocol.codejudge import MAX_CODE_CHARS
from magic.protocol.verdict import Status, Verdict



def syntax_error(code: str) -> str | None:
    """Why `code` is not valid Python (None when it is)."""
    try:
        ast.parse(code)
    except SyntaxError as exc:
        return f"syntax error at line {exc.lineno}: {exc.msg}"
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"not a Python program ({type(exc).__name__})"
    return None


def _failure(run: TestRun, limit: float) -> str | None:
    """Why a test run did not end normally (None when it did)."""
    if run.status == "timeout":
        return f"time limit exceeded ({limit:g}s)"
    if run.status == "output_limit":
        return "output limit exceeded"
    if run.status == "memory_limit":
        return "memory limit exceeded (all processes together)"
    if run.status == "cpu_limit":
        return "CPU limit exceeded (more than the slot's cores, all processes together)"
    if run.status == "crashed":
        last = run.stderr.strip().splitlines()[-1:] or [""]
        if run.signal is not None:
            return f"killed by signal {run.signal}" + (f" ({last[0][:120]})" if last[0] else "")
        return f"runtime error (exit {run.exit_code})" + (f": {last[0][:160]}" if last[0] else "")
    return None


class CodeVerifier:
    """Judges code responses in a `Sandbox` (see the module docstring)."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox

    def verify(self, code: str, ground_truth: str) -> Verdict:
        """The verdict on the program `code` against the tests of `ground_truth` (never raises
        for anything the program or the data does)."""
        t0 = time.perf_counter()
        try:
            spec = parse_ground_truth(ground_truth)
        except GroundTruthError as exc:
            return Verdict(Status.error, "", str(exc), time.perf_counter() - t0)
        shown = code[:200]
        if len(code) > MAX_CODE_CHARS:
            return Verdict(Status.wrong, shown, f"program longer than {MAX_CODE_CHARS} characters", time.perf_counter() - t0)
        bad = syntax_error(code)
        if bad:
            return Verdict(Status.wrong, shown, bad, time.perf_counter() - t0)
        try:
            program, tests, judge = self._plan(spec, code)
        except GroundTruthError as exc:
            return Verdict(Status.error, shown, str(exc), time.perf_counter() - t0)
        limit = spec.time_limit_seconds or self.sandbox.settings.test_timeout_seconds
        reasons: list[str] = []

        def judged(test: dict, run: TestRun) -> bool:
            why = _failure(run, limit)
            if why is None:
                try:
                    why = judge(test, run)
                except Exception as exc:  # noqa: BLE001 — output the judge cannot read (malformed, NaN, too deep) fails the test
                    why = f"malformed output ({type(exc).__name__}: {str(exc)[:80]})"
            if why:
                reasons.append(f"test {run.index + 1}/{len(tests)}: {why}")
            return why is None

        result = self.sandbox.run(program, tests, judged, time_limit=spec.time_limit_seconds)
        seconds = time.perf_counter() - t0
        if result.error:
            return Verdict(Status.error, shown, f"sandbox: {result.error}", seconds)
        if result.passed:
            return Verdict(Status.correct, shown, f"passed {len(tests)}/{len(tests)} tests", seconds)
        return Verdict(Status.wrong, shown, reasons[-1] if reasons else result.stopped, seconds)

    def _plan(self, spec, code: str) -> tuple[Program, list[dict], Callable[[dict, TestRun], str | None]]:
        """The program, its tests (inputs only) and the judge of one test (reason when failed)."""
        if isinstance(spec, CallTests):
            expected = list(spec.outputs)

            def judge_call(test: dict, run: TestRun) -> str | None:
                reports = read_reports(run.report)
                if len(reports) != 1 or "value" not in reports[0]:
                    return "no return value reported"
                value = from_wire(reports[0]["value"])
                return None if call_matches(value, expected[test["i"]]) else "wrong answer"

            tests = [{"i": k, "args": args} for k, args in enumerate(spec.inputs)]
            return Program("call", code, fn_name=spec.fn_name), tests, judge_call
        if isinstance(spec, AssertTests):
            for k, test_code in enumerate(spec.tests):
                bad = syntax_error(test_code)
                if bad:
                    raise GroundTruthError(f"test {k + 1} of the ground truth is not valid Python: {bad}")

            def judge_assert(test: dict, run: TestRun) -> str | None:
                # the judge process (trusted) ran the test code: only its completion counts
                reports = read_reports(run.report)
                return None if reports == [{"completed": True}] else "the test did not run to its end"

            tests = [{"i": k, "code": code} for k, code in enumerate(spec.tests)]
            return Program("assert", code, entry_point=spec.entry_point), tests, judge_assert
        outputs = list(spec.outputs)

        def judge_stdout(test: dict, run: TestRun) -> str | None:
            ok, why = stdout_matches(run.stdout, outputs[test["i"]])
            return None if ok else why

        tests = [{"i": k, "input": text} for k, text in enumerate(spec.inputs)]
        return Program("stdin_stdout", code), tests, judge_stdout
