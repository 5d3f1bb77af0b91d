import doctest

import pytest

from magic.common.pb import messages_pb2 as pb
from magic.reward import math_verifier


def test_doctests():
    assert doctest.testmod(math_verifier).failed == 0


@pytest.mark.parametrize(
    "response, gold, verdict",
    [
        ("8+2+7\n10+7\n17\n\\boxed{17}", "17", pb.VERDICT_CORRECT),
        ("\\boxed{18}", "17", pb.VERDICT_WRONG),
        ("8+2+7\n10+7\n1", "17", pb.VERDICT_NO_ANSWER),
        ("<think>maybe \\boxed{3}</think> so \\boxed{\\frac{1}{2}}", "0.5", pb.VERDICT_CORRECT),
        ("<think>\\boxed{17}</think> the answer is 18", "17", pb.VERDICT_NO_ANSWER),
        ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", pb.VERDICT_CORRECT),
        ("\\boxed{17", "17", pb.VERDICT_NO_ANSWER),
    ],
)
def test_verdicts(response, gold, verdict):
    assert math_verifier.verify(response, gold).verdict == verdict
