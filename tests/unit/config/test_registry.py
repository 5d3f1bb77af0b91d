"""The one name registry (advantage estimators, math verifiers, penalties)."""

import pytest

from magic.config.registry import Registry
from magic.learner import core_algos
from magic.reward import penalties
from magic.reward.math import verifier as math_verifier


def test_register_lookup_and_refuse_a_second_registration():
    reg: Registry = Registry("widget")

    @reg.register("a")
    def a():
        return 1

    assert reg.lookup("a") is a and reg["a"] is a and "a" in reg and list(reg) == ["a"] and len(reg) == 1
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a")(lambda: 2)
    assert reg.lookup("a") is a  # not overwritten
    with pytest.raises(ValueError, match=r"unknown widget 'b'; known: \['a'\]"):
        reg.lookup("b")


@pytest.mark.parametrize(
    "register, existing",
    [(core_algos.register_advantage, "grpo"), (math_verifier.register, "magic"), (penalties.register, "repetition")],
)
def test_every_registry_of_the_platform_refuses_a_name_twice(register, existing):
    with pytest.raises(ValueError, match="already registered"):
        register(existing)(lambda *a: None)
