"""Stream entry codec: a protobuf message <-> the two fields of a Redis stream entry.

An entry is `{type: <message name>, pb: <serialized bytes>}`. Decoding checks the type and
parses strictly (a field the type does not define is refused: another message's bytes under a
forged type); anything that does not parse raises `PoisonMessage`, which consumers turn into
a dead letter instead of crashing.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from magic.protocol.pb import messages_pb2 as pb

M = TypeVar("M", bound=Message)

TYPE_FIELD = b"type"
PAYLOAD_FIELD = b"pb"

_BY_NAME: dict[str, type[Message]] = {
    cls.DESCRIPTOR.name: cls
    for cls in (
        pb.PromptGroup,
        pb.RolloutGroup,
        pb.ScoredGroup,
        pb.WeightUpdate,
        pb.Event,
        pb.DeadLetter,
    )
}


class PoisonMessage(ValueError):
    """A stream entry that cannot be decoded into the expected message."""


def encode(msg: Message) -> dict[bytes, bytes]:
    """The fields of a stream entry carrying `msg`."""
    name = msg.DESCRIPTOR.name
    if name not in _BY_NAME:
        raise TypeError(f"{name} is not a stream message")
    return {TYPE_FIELD: name.encode(), PAYLOAD_FIELD: msg.SerializeToString()}


def encode_around(msg: Message, field: str, payload: bytes) -> dict[bytes, bytes]:
    """The fields of a stream entry carrying `msg` with its message field `field` set to the
    message whose serialized bytes are `payload` — without parsing or copying them: protobuf's
    wire format lets a message's fields come in any order, so the bytes are `field`'s tag, its
    length and `payload`, then `msg`'s own. The reward service wraps each rollout group it read
    this way (≈ 1 MB at the paper's shape) instead of copying and re-encoding it.

    >>> g = pb.RolloutGroup(worker="r0"); s = pb.ScoredGroup(worker="w")
    >>> decode(encode_around(s, "rollout", g.SerializeToString()), pb.ScoredGroup) == pb.ScoredGroup(rollout=g, worker="w")
    True
    """
    fd = msg.DESCRIPTOR.fields_by_name[field]
    if fd.message_type is None or fd.is_repeated or msg.HasField(field):
        raise ValueError(f"{msg.DESCRIPTOR.name}.{field} must be an unset singular message field")
    fields = encode(msg)
    head = _varint((fd.number << 3) | 2) + _varint(len(payload))  # wire type 2: length-delimited
    fields[PAYLOAD_FIELD] = head + payload + fields[PAYLOAD_FIELD]
    return fields


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def decode(fields: dict[bytes, bytes], cls: type[M]) -> M:
    """Parse an entry's fields as `cls`; raise PoisonMessage if the entry is not one."""
    kind = fields.get(TYPE_FIELD)
    payload = fields.get(PAYLOAD_FIELD)
    if kind is None or payload is None:
        raise PoisonMessage(f"entry lacks the 'type' or 'pb' field (fields: {sorted(k.decode(errors='replace') for k in fields)})")
    expected = cls.DESCRIPTOR.name
    if kind.decode(errors="replace") != expected:
        raise PoisonMessage(f"expected a {expected}, got type {kind.decode(errors='replace')!r}")
    msg = cls()
    try:
        msg.ParseFromString(payload)
    except DecodeError as exc:
        raise PoisonMessage(f"cannot parse {expected}: {exc}") from exc
    unknown = len(UnknownFieldSet(msg))
    if unknown:  # another message's bytes under this type parse without an error: refuse them
        raise PoisonMessage(f"the {expected} carries {unknown} fields it does not define (another message's bytes?)")
    return msg
