import pytest

from magic.protocol import codec
from magic.protocol.pb import messages_pb2 as pb


def test_roundtrip_keeps_packed_token_ids_and_logprobs():
    group = pb.RolloutGroup(prompt=pb.PromptGroup(group_id="3:00001", step=3, policy_version=3), prompt_ids=[1, 2, 3])
    group.samples.add(response_ids=[5, 6, 258], logprobs=[-0.5, -1.25, -0.125], finish_reason=pb.FINISH_REASON_STOP, policy_version=3)
    back = codec.decode(codec.encode(group), pb.RolloutGroup)
    assert back == group
    assert list(back.samples[0].logprobs) == [-0.5, -1.25, -0.125]


@pytest.mark.parametrize(
    "fields, match",
    [
        ({b"pb": b"x"}, "lacks"),
        ({b"type": b"PromptGroup"}, "lacks"),
        ({b"type": b"WeightUpdate", b"pb": b""}, "expected a PromptGroup"),
        ({b"type": b"PromptGroup", b"pb": b"\xff\xff\xff\xff"}, "cannot parse"),
    ],
)
def test_poison_entries_raise_a_clear_error(fields, match):
    with pytest.raises(codec.PoisonMessage, match=match):
        codec.decode(fields, pb.PromptGroup)


def test_only_stream_messages_are_encoded():
    with pytest.raises(TypeError):
        codec.encode(pb.ChatMessage(role="user"))
