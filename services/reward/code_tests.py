"""Tests of code problems: the ground-truth format, and how a test's output is judged.

Ground truth (``reward_model.ground_truth`` of a record whose ``data_source`` is a code source)
is a JSON object whose ``type`` says how the program is tested:

``{"type": "stdin_stdout", "inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}``
    The program reads the input on stdin and writes the answer on stdout.
``{"type": "call", "fn_name": "twoSum", "inputs": [[[2, 7, 11, 15], 9], ...], "outputs": [[0, 1], ...]}``
    Each input is the list of arguments of ``Solution().twoSum(...)`` — or of the module-level
    function ``twoSum`` when the program defines no ``class Solution`` — and the output its value.
``{"type": "assert", "tests": ["assert add(1, 2) == 3", ...], "entry_point": null}``
    Each test is Python run after the program, in its own process; it passes when it runs to
    its end. With ``"entry_point": "add"`` each test defines ``check(candidate)`` and is run as
    ``check(add)`` (the HumanEval convention).

Every type takes an optional ``"time_limit_seconds"`` (per test). Ground truth without a
``type`` in the shapes Skywork-OR1's data uses is converted: LiveCodeBench/TACO
``{"inputs", "outputs"[, "fn_name"]}`` (inputs as newline-separated JSON arguments when strings),
``{"assert_case": [...]}``, and HumanEval-style ``{"test_code", "entry_point"[, "import_prefix"]}``.

Judging follows LiveCodeBench's ``testing_util.py``:

* **stdin/stdout** — both outputs are stripped and split into lines; the line counts must
  match; each pair of lines (stripped) must be equal, or else both must split on whitespace
  into tokens that all parse as decimals with equal values (``Decimal``, so ``1.0`` equals ``1``
  but ``0.333`` does not equal ``0.3333``: no float tolerance);
* **call** — a tuple result counts as a list, then ``result == expected`` with Python equality
  on the JSON-decoded expected value;
* **assert** — every ``assert <expr> == <literal>`` (or ``<literal> == <expr>``, or
  ``assert <expr> is True/False/None``) is rewritten so that the program's side only reports
  the value of ``<expr>``; the literal stays in the reward process, which compares. Other
  asserts are evaluated inside the sandbox on plain data. A test passes when it ran to its end,
  every report matched, and every assert that is not inside a loop, branch or ``try`` reported
  at least once (so a program cannot pass by silencing the reports).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator


class GroundTruthError(ValueError):
    """The ground truth of a code problem is malformed; the message says what to fix."""


class _Tests(BaseModel):
    model_config = ConfigDict(extra="forbid")

    time_limit_seconds: float | None = Field(default=None, gt=0, le=600)
    """Wall-clock limit of one test; None uses the sandbox's default."""


class StdinStdoutTests(_Tests):
    type: Literal["stdin_stdout"]
    inputs: list[str] = Field(min_length=1)
    """What the program reads on stdin, one string per test."""
    outputs: list[str] = Field(min_length=1)
    """What it must write on stdout, one string per test."""

    @model_validator(mode="after")
    def _same_length(self) -> "StdinStdoutTests":
        if len(self.inputs) != len(self.outputs):
            raise ValueError(f"{len(self.inputs)} inputs but {len(self.outputs)} outputs")
        return self


class CallTests(_Tests):
    type: Literal["call"]
    fn_name: str = Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The method of ``class Solution`` (or module-level function) to call."""
    inputs: list[list[Any]] = Field(min_length=1)
    """The arguments of each call."""
    outputs: list[Any] = Field(min_length=1)
    """The value each call must return."""

    @model_validator(mode="after")
    def _same_length(self) -> "CallTests":
        if len(self.inputs) != len(self.outputs):
            raise ValueError(f"{len(self.inputs)} inputs but {len(self.outputs)} outputs")
        return self


class AssertTests(_Tests):
    type: Literal["assert"]
    tests: list[str] = Field(min_length=1)
    """Python run after the program, one process per entry."""
    entry_point: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """When set, each test defines ``check(candidate)`` and runs as ``check(<entry_point>)``."""


TestSpec = Annotated[Union[StdinStdoutTests, CallTests, AssertTests], Field(discriminator="type")]
_SPEC = TypeAdapter(TestSpec)
TEST_TYPES = ("stdin_stdout", "call", "assert")


def _legacy(obj: dict) -> dict:
    """The Skywork-OR1 / LiveCodeBench / HumanEval shapes, as an explicit spec."""
    if "assert_case" in obj:
        return {"type": "assert", "tests": obj["assert_case"]}
    if "test_code" in obj and "entry_point" in obj:
        return {"type": "assert", "tests": [obj.get("import_prefix", "") + obj["test_code"]], "entry_point": obj["entry_point"]}
    if "inputs" in obj and "outputs" in obj:
        if obj.get("fn_name"):
            inputs = [_lcb_args(x) for x in obj["inputs"]]
            outputs = [json.loads(y) if isinstance(y, str) else y for y in obj["outputs"]]
            return {"type": "call", "fn_name": obj["fn_name"], "inputs": inputs, "outputs": outputs}
        join = lambda v: "\n".join(v) if isinstance(v, list) else v  # noqa: E731 (APPS lists of lines)
        return {"type": "stdin_stdout", "inputs": [join(x) for x in obj["inputs"]], "outputs": [join(y) for y in obj["outputs"]]}
    raise GroundTruthError(f"code ground truth needs a 'type' ({', '.join(TEST_TYPES)}); got keys {sorted(obj)[:8]}")


def _lcb_args(x: Any) -> list:
    if isinstance(x, str):  # LiveCodeBench: one JSON value per line, one line per argument
        return [json.loads(line) for line in x.split("\n") if line.strip()]
    if isinstance(x, list):
        return x
    raise GroundTruthError("call inputs must be argument lists (or LiveCodeBench's JSON lines)")


def parse_ground_truth(text: str) -> StdinStdoutTests | CallTests | AssertTests:
    """Read a code problem's ground truth (see the module docstring); GroundTruthError if malformed.

    >>> parse_ground_truth('{"type": "call", "fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}').fn_name
    'add'
    >>> parse_ground_truth('{"inputs": ["1 2\\\\n"], "outputs": ["3\\\\n"]}').type
    'stdin_stdout'
    >>> parse_ground_truth('{"type": "stdin", "inputs": []}')
    Traceback (most recent call last):
    ...
    magic.reward.code_tests.GroundTruthError: invalid code ground truth: Input tag 'stdin' found using 'type' does not match any of the expected tags: 'stdin_stdout', 'call', 'assert'
    """
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise GroundTruthError(f"code ground truth is not JSON: {str(exc)[:100]}") from None
    if not isinstance(obj, dict):
        raise GroundTruthError("code ground truth must be a JSON object")
    try:
        if "type" not in obj:
            obj = _legacy(obj)
        return _SPEC.validate_python(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise GroundTruthError(f"invalid code ground truth: {first['msg']}" + (f" (at {where})" if where else "")) from None
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise GroundTruthError(f"invalid code ground truth: {str(exc)[:200]}") from None


# -- stdin/stdout: LiveCodeBench's comparison ----------------------------------------------------


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(tok) for tok in line.split()]
    except (InvalidOperation, ValueError):
        return None


def stdout_matches(output: str, expected: str) -> tuple[bool, str]:
    """LiveCodeBench's stdin/stdout comparison; returns (equal, reason when not).

    >>> stdout_matches("3\\n", "3")
    (True, '')
    >>> stdout_matches("1.0 2\\n", "1 2.00")
    (True, '')
    >>> stdout_matches("0.333", "0.3333")[0]
    False
    >>> stdout_matches("1\\n2", "1")
    (False, 'wrong answer: 2 lines, expected 1')
    """
    got, want = _lines(output), _lines(expected)
    if len(got) != len(want):
        return False, f"wrong answer: {len(got)} lines, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        if g == w:
            continue
        gd, wd = _decimals(g), _decimals(w)
        if gd is None or wd is None or gd != wd:
            return False, f"wrong answer at line {k + 1}: {g[:40]!r} != {w[:40]!r}"
    return True, ""


# -- call: values as plain data ------------------------------------------------------------------


class WireError(ValueError):
    """A value reported by the sandbox is not well-formed plain data."""


def from_wire(obj: Any, depth: int = 0) -> Any:
    """Decode plain data reported by the sandbox (tagged tuples, sets, dicts, bytes, complex)."""
    if depth > 200:
        raise WireError("data nested too deeply")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [from_wire(v, depth + 1) for v in obj]
    if isinstance(obj, dict) and len(obj) == 1:
        (tag, v), = obj.items()
        if tag == "$t" and isinstance(v, list):
            return tuple(from_wire(x, depth + 1) for x in v)
        if tag in ("$s", "$fs") and isinstance(v, list):
            items = [from_wire(x, depth + 1) for x in v]
            try:
                return set(items) if tag == "$s" else frozenset(items)
            except TypeError as exc:
                raise WireError("unhashable set element") from exc
        if tag == "$d" and isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v):
            try:
                return {from_wire(k, depth + 1): from_wire(x, depth + 1) for k, x in v}
            except TypeError as exc:
                raise WireError("unhashable dict key") from exc
        if tag == "$b" and isinstance(v, str):
            return bytes.fromhex(v)
        if tag == "$c" and isinstance(v, list) and len(v) == 2:
            return complex(float(v[0]), float(v[1]))
    raise WireError(f"not plain data: {type(obj).__name__}")


def call_matches(value: Any, expected: Any) -> bool:
    """LiveCodeBench's call-based comparison: a tuple counts as a list, then ``==``.

    >>> call_matches((0, 1), [0, 1]), call_matches([1.0], [1]), call_matches([[1, 2]], [(1, 2)])
    (True, True, False)
    """
    if isinstance(value, tuple):
        value = list(value)
    try:
        return bool(value == expected)
    except RecursionError:
        return False


def read_reports(text: str, limit: int = 100_000) -> list[dict]:
    """The JSON lines a program's harness reported; malformed lines raise WireError."""
    out = []
    for line in text.splitlines()[:limit]:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            raise WireError(f"malformed report line: {str(exc)[:80]}") from None
        if not isinstance(obj, dict):
            raise WireError("report lines must be objects")
        out.append(obj)
    return out


# -- assert: moving expected values out of the sandbox -------------------------------------------

_NO_LITERAL = object()


@dataclass(frozen=True)
class Expectation:
    """What the reward process expects for one rewritten assert."""

    value: Any
    identity: bool = False  # "is True/False/None": the value must be exactly that object


@dataclass
class RewrittenTest:
    """A test with its literal expectations taken out (see the module docstring)."""

    code: str
    expectations: dict[int, Expectation] = field(default_factory=dict)
    mandatory: set[int] = field(default_factory=set)  # reported at least once when the test completes


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NO_LITERAL


class _AssertRewriter(ast.NodeTransformer):
    def __init__(self) -> None:
        self.out = RewrittenTest(code="")
        self._nested = 0
        self._next = 0

    def _guarded(self, node):
        self._nested += 1
        try:
            return self.generic_visit(node)
        finally:
            self._nested -= 1

    visit_If = visit_For = visit_While = visit_Try = visit_With = visit_AsyncFor = _guarded  # noqa: N815
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _guarded  # noqa: N815

    def visit_FunctionDef(self, node):  # noqa: N802 — a function body starts a fresh nesting level
        saved, self._nested = self._nested, 0
        try:
            return self.generic_visit(node)
        finally:
            self._nested = saved

    def visit_Assert(self, node: ast.Assert):  # noqa: N802
        i = self._next
        self._next += 1
        call = self._expectation(i, node.test)
        if call is None:
            call = _call("__magic_truth__", i, node.test)
        if not self._nested:
            self.out.mandatory.add(i)
        return ast.copy_location(ast.Expr(call), node)

    def _expectation(self, i: int, test: ast.AST):
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
            return None
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, ast.Eq):
            for expr, lit in ((left, right), (right, left)):
                value = _literal(lit)
                if value is not _NO_LITERAL:
                    self.out.expectations[i] = Expectation(value)
                    return _call("__magic_expect__", i, expr)
        if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value in (True, False, None):
            self.out.expectations[i] = Expectation(right.value, identity=True)
            return _call("__magic_expect__", i, left)
        return None


def _call(name: str, i: int, arg: ast.AST) -> ast.Call:
    return ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=[ast.Constant(i), arg], keywords=[])


def rewrite_asserts(test_code: str) -> RewrittenTest:
    """Take the literal expectations out of a test's asserts (SyntaxError if it does not parse).

    >>> t = rewrite_asserts("assert f(2) == 4\\nfor x in range(3):\\n    assert f(x) >= 0")
    >>> print(t.code)
    __magic_expect__(0, f(2))
    for x in range(3):
        __magic_truth__(1, f(x) >= 0)
    >>> t.expectations, t.mandatory
    ({0: Expectation(value=4, identity=False)}, {0})
    """
    tree = ast.parse(test_code)
    rewriter = _AssertRewriter()
    tree = ast.fix_missing_locations(rewriter.visit(tree))
    rewriter.out.code = ast.unparse(tree)
    return rewriter.out


def judge_reports(reports: list[dict], test: RewrittenTest) -> tuple[bool, str]:
    """Did an assert-based test pass, given what its program side reported?"""
    seen: set[int] = set()
    completed = False
    for rep in reports:
        if rep.get("completed") is True:
            completed = True
        elif "e" in rep:
            i = rep["e"]
            exp = test.expectations.get(i) if isinstance(i, int) else None
            if exp is None:
                return False, f"report for an unknown assert {i!r}"
            value = from_wire(rep.get("v"))
            ok = value is exp.value if exp.identity else _equal(value, exp.value)
            if not ok:
                return False, f"assert {i} failed: got {_short(value)}, expected {_short(exp.value)}"
            seen.add(i)
        elif "t" in rep:
            if rep.get("ok") is not True:
                return False, f"assert {rep.get('t')} failed"
            if isinstance(rep["t"], int):
                seen.add(rep["t"])
        else:
            return False, "unrecognised report"
    if not completed:
        return False, "the test did not run to its end"
    missing = sorted(test.mandatory - seen)
    if missing:
        return False, f"asserts {missing[:5]} never reported"
    return True, ""


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except RecursionError:
        return False


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # e.g. an int too long to print
        return f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."
