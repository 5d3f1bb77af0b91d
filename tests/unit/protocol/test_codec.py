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


@pytest.mark.parametrize("samples, text_bytes", [(0, 0), (1, 10), (16, 20_000)])  # lengths past a one- and a two-byte varint
def test_a_message_wrapped_around_encoded_bytes_is_the_message_encoded_whole(samples, text_bytes):
    group = pb.RolloutGroup(prompt=pb.PromptGroup(group_id="3:00001", step=3), prompt_ids=[1, 2, 3], worker="r0")
    for i in range(samples):
        group.samples.add(response_ids=list(range(i * 100)), logprobs=[-0.5] * (i * 100), text="x" * text_bytes)
    scored = pb.ScoredGroup(worker="reward-0")
    scored.scores.add(reward=1.0, correctness=1.0, details="ok")
    fields = codec.encode_around(scored, "rollout", codec.encode(group)[codec.PAYLOAD_FIELD])
    whole = pb.ScoredGroup(rollout=group, scores=scored.scores, worker="reward-0")
    assert codec.decode(fields, pb.ScoredGroup) == whole
    assert fields == codec.encode(whole)  # the same bytes: field 1 first, then the message's own


def test_only_an_unset_singular_message_field_is_wrapped_around():
    payload = pb.RolloutGroup(worker="r0").SerializeToString()
    for msg, field in [(pb.ScoredGroup(), "scores"), (pb.ScoredGroup(), "worker"), (pb.ScoredGroup(rollout=pb.RolloutGroup()), "rollout")]:
        with pytest.raises(ValueError, match="unset singular message field"):
            codec.encode_around(msg, field, payload)
