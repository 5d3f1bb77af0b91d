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
* **assert** — the test code runs in a *judge* process that the program cannot reach; every
  name the program defines is, in the judge, a stand-in whose calls go to the program's process
  as requests and come back as plain data (`sandbox_child`, the ``call`` model generalised).
  The test passes when the judge ran the test code to its end; every comparison is the
  judge's. Nothing the program writes or does (forged reports, ``os._exit``, patched frames)
  can make the judge report completion.
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from magic.codejudge.sandbox.child import WireError, unplain

__all__ = ["WireError"]  # raised by from_wire and read_reports; defined with the wire format


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
    magic.codejudge.cases.GroundTruthError: invalid code ground truth: Input tag 'stdin' found using 'type' does not match any of the expected tags: 'stdin_stdout', 'call', 'assert'
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
    """The line's tokens as decimals; None unless every token is a number (NaN, signalling or
    not, is no number: it equals nothing).

    >>> _decimals("1 2.50"), _decimals("sNaN 1"), _decimals("NaN")
    ([Decimal('1'), Decimal('2.50')], None, None)
    """
    try:
        values = [Decimal(tok) for tok in line.split()]
    except (InvalidOperation, ValueError):
        return None
    return None if any(v.is_nan() for v in values) else values


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


class _Unmatched:
    """A reported value that no JSON value can equal (a set, bytes, a dict keyed by non-strings):
    kept opaque instead of being built, so the reward process never hashes values the program
    chose (a set of integers that all hash alike would take quadratic time to build)."""

    __slots__ = ("kind",)

    def __init__(self, kind: str):
        self.kind = kind

    def __eq__(self, other) -> bool:
        return False

    __hash__ = None

    def __repr__(self) -> str:
        return f"<{self.kind}>"


def from_wire(obj: Any) -> Any:
    """Decode a value a program reported, in time linear in its size, for comparison with a
    ground truth that is JSON: lists, str-keyed dicts, numbers, strings, tuples (a top-level tuple
    counts as a list) and complex numbers come out as themselves; sets, bytes and dicts with other
    keys, which no JSON value equals, come out opaque (`_Unmatched`). WireError if malformed. One
    decoder: `sandbox_child.unplain`, shared with the judge.

    >>> from_wire({"$t": [1, {"$d": [["a", 2.5]]}]})
    (1, {'a': 2.5})
    >>> from_wire({"$s": [1, 2]}) == [1, 2], from_wire({"$d": [[1, 2]]}) == {"1": 2}
    (False, False)
    """
    return unplain(obj, opaque=_Unmatched)


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
