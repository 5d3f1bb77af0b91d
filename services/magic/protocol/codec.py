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
