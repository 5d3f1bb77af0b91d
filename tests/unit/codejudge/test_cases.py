"""Code ground truth, LiveCodeBench comparisons, plain data on the wire (and references to a program's objects)."""

from __future__ import annotations

import doctest
import json
import time

import pytest

from magic.codejudge import cases as code_tests
from magic.codejudge import verifier as code_verifier
from magic.codejudge.cases import GroundTruthError, WireError, call_matches, from_wire, parse_ground_truth, stdout_matches
from magic.codejudge.sandbox import child as sandbox_child
from magic.codejudge.sandbox.child import _exception, plain, unplain


@pytest.mark.parametrize("module", [code_tests, code_verifier, sandbox_child])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_explicit_types():
    s = parse_ground_truth(json.dumps({"type": "stdin_stdout", "inputs": ["1\n"], "outputs": ["2\n"], "time_limit_seconds": 2}))
    assert (s.type, s.inputs, s.time_limit_seconds) == ("stdin_stdout", ["1\n"], 2)
    c = parse_ground_truth(json.dumps({"type": "call", "fn_name": "f", "inputs": [[1, [2]]], "outputs": [{"a": 1}]}))
    assert (c.fn_name, c.inputs, c.outputs) == ("f", [[1, [2]]], [{"a": 1}])
    a = parse_ground_truth(json.dumps({"type": "assert", "tests": ["assert f() == 1"], "entry_point": "f"}))
    assert (a.tests, a.entry_point) == (["assert f() == 1"], "f")


def test_legacy_shapes_are_converted():
    lcb = parse_ground_truth(json.dumps({"inputs": ["[2, 7]\n9"], "outputs": ["[0, 1]"], "fn_name": "twoSum"}))
    assert (lcb.type, lcb.inputs, lcb.outputs) == ("call", [[[2, 7], 9]], [[0, 1]])
    apps = parse_ground_truth(json.dumps({"inputs": [["1 2", "3"]], "outputs": [["3"]]}))
    assert (apps.type, apps.inputs, apps.outputs) == ("stdin_stdout", ["1 2\n3"], ["3"])
    sky = parse_ground_truth(json.dumps({"assert_case": ["assert f(1) == 2"]}))
    assert (sky.type, sky.tests) == ("assert", ["assert f(1) == 2"])
    he = parse_ground_truth(json.dumps({"test_code": "def check(c):\n    assert c() == 1", "entry_point": "g", "import_prefix": "import math\n"}))
    assert (he.type, he.entry_point, he.tests[0].startswith("import math\n")) == ("assert", "g", True)


@pytest.mark.parametrize(
    "text, message",
    [
        ("not json", "not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"type": "call", "inputs": [[1]], "outputs": [1]}', "fn_name"),
        ('{"type": "stdin_stdout", "inputs": ["1"], "outputs": []}', "outputs"),
        ('{"type": "stdin_stdout", "inputs": ["1", "2"], "outputs": ["1"]}', "2 inputs but 1 outputs"),
        ('{"type": "assert", "tests": ["x"], "entry_point": "1bad"}', "entry_point"),
        ('{"tests": ["assert 1"]}', "needs a 'type'"),
        ('{"type": "stdin_stdout", "inputs": ["1"], "outputs": ["1"], "extra": 1}', "extra"),
    ],
)
def test_malformed_ground_truth_says_what_is_wrong(text, message):
    with pytest.raises(GroundTruthError, match=message):
        parse_ground_truth(text)


@pytest.mark.parametrize(
    "out, expected, equal",
    [
        ("3\n", "3", True),
        ("  3  \n\n", "3\n", True),
        ("1 2 3\n", "1 2 3", True),
        ("1.0 2.50\n", "1 2.5", True),
        ("1e2\n", "100", True),
        ("0.333", "0.3333", False),
        ("50000000000000000", "50000000000000001", False),
        ("YES", "yes", False),
        ("1\n2\n", "1 2", False),
        ("", "0", False),
        ("abc def", "abc  def", False),
    ],
)
def test_stdout_comparison_follows_livecodebench(out, expected, equal):
    assert stdout_matches(out, expected)[0] is equal


def test_call_comparison_and_wire_round_trip():
    assert call_matches((1, 2), [1, 2]) and not call_matches([(1, 2)], [[1, 2]])
    assert call_matches(True, 1)  # Python's == (as LiveCodeBench)
    value = (1, {2, 3}, {(1,): "x"}, b"\xff", 1 + 2j, {"k": [1.5]})
    wire = json.loads(json.dumps(plain(value)))
    assert unplain(wire) == value  # the judge's decoding: every type as itself
    for bad in ({"$x": 1}, {"$t": 1}, {"$s": [[1]]}, {"a": 1, "b": 2}, {"$d": [[[1], 2]]}):
        with pytest.raises(WireError):
            unplain(bad)
    for bad in ({"$x": 1}, {"$t": 1}, {"a": 1, "b": 2}, {"$s": [{"$x": 1}]}, {"$d": [[1, {"$t": 1}]]}):
        with pytest.raises(WireError):
            from_wire(bad)


def test_the_reward_process_decodes_reports_without_hashing_what_the_program_chose():
    """A set of integers that all hash alike takes quadratic time to build: the reward process
    builds no set, and no dict but with (salted) str keys; no JSON ground truth equals those."""
    decoded = from_wire(json.loads(json.dumps(plain((1, {2, 3}, {(1,): "x"}, b"\xff", 1 + 2j, {"k": [1.5]})))))
    assert decoded[0] == 1 and decoded[4] == 1 + 2j and decoded[5] == {"k": [1.5]}
    assert [repr(v) for v in decoded[1:4]] == ["<set>", "<dict with non-string keys>", "<bytes>"]
    assert not call_matches(decoded[1], [2, 3]) and not call_matches(decoded[2], {"(1,)": "x"})
    collide = 2**61 - 1  # n * (2**61 - 1) all hash to 0
    report = json.dumps({"$s": [k * collide for k in range(1, 200_001)]})  # as `plain` reports such a set
    t0 = time.perf_counter()
    assert not call_matches(from_wire(json.loads(report)), [])
    assert time.perf_counter() - t0 < 5.0  # built as a set: minutes


def test_references_cross_the_wire_as_numbers_only():
    objects = [object()]
    wire = plain([1, objects[0], (2, objects[0])], ref=lambda v: objects.index(v))
    assert wire == [1, {"$r": 0}, {"$t": [2, {"$r": 0}]}]
    assert unplain(wire, ref=lambda k: ("ref", k)) == [1, ("ref", 0), (2, ("ref", 0))]
    with pytest.raises(WireError):
        unplain(wire)  # no references where none are expected (the reward process)
    with pytest.raises(TypeError):
        plain(object())


def test_a_programs_exception_becomes_a_builtin_one_in_the_judge():
    assert type(_exception(["InvalidInput", "ValueError", "Exception", "BaseException", "object"], "bad")) is ValueError
    assert type(_exception(["StopIteration", "Exception"], "")) is StopIteration
    exit_ = _exception(["SystemExit", "BaseException", "object"], "0")  # never ends the judge
    assert type(exit_) is RuntimeError
    assert type(_exception("garbage", None)) is RuntimeError


def test_syntax_is_checked_without_running():
    assert code_verifier.syntax_error("def f(:\n  pass").startswith("syntax error at line 1")
    assert code_verifier.syntax_error("x = 1\0") is not None
    assert code_verifier.syntax_error("(" * 10000) is not None
    assert code_verifier.syntax_error("print(1)") is None
