"""Penalties: graded and flat repetition, and the per-stage settings a prompt group carries."""

from __future__ import annotations

import doctest

import pytest

from magic.config.schema import PenaltySettings, StageConfig
from magic.protocol.pb import messages_pb2 as pb
from magic.reward import penalties
from magic.reward.penalties import PenaltyInput, compute_penalties
from magic.reward.worker import samples_of

LOOP = "the answer is the answer is the answer is the answer is"


def test_doctests():
    assert doctest.testmod(penalties).failed == 0


def test_flat_repetition_gives_the_full_penalty_only_past_the_threshold():
    flat = PenaltySettings(repetition_max=1.0, repetition_ngram=3, repetition_flat=True, repetition_threshold=0.5)
    graded = flat.model_copy(update={"repetition_flat": False})
    assert compute_penalties(PenaltyInput(LOOP), flat) == {"repetition": -1.0}
    assert -1.0 < compute_penalties(PenaltyInput(LOOP), graded)["repetition"] < -0.5
    varied = "first we add two and three then we multiply the sum by four"
    assert compute_penalties(PenaltyInput(varied), flat) == {"repetition": 0.0}
    assert compute_penalties(PenaltyInput(LOOP), PenaltySettings()) == {}  # off by default


def test_a_group_carries_its_stages_penalties_to_scoring():
    stage = StageConfig(steps=1, T=8, D_R=1, gs=2, penalties={"repetition_max": 1.0, "repetition_flat": True})
    prompt = pb.PromptGroup(group_id="0:0", data_source="math", ground_truth="1", penalties_json=stage.penalties.model_dump_json())
    group = pb.RolloutGroup(prompt=prompt, samples=[pb.Sample(text=LOOP, response_ids=[1, 2]), pb.Sample(text="1")])
    samples = samples_of(group)
    assert [s.penalties for s in samples] == [stage.penalties] * 2
    assert samples_of(pb.RolloutGroup(prompt=pb.PromptGroup(group_id="0:1"), samples=[pb.Sample(text="x")]))[0].penalties is None


@pytest.mark.parametrize("raw", ["{not json", '{"repetition_max": -1}', '{"surprise": 1}'])
def test_malformed_group_penalties_are_refused_with_the_group_named(raw):
    group = pb.RolloutGroup(prompt=pb.PromptGroup(group_id="3:7", penalties_json=raw), samples=[pb.Sample(text="x")])
    with pytest.raises(ValueError, match="group 3:7: malformed penalties_json"):
        samples_of(group)
