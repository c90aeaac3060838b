"""The store-sync wire messages and their typed, bounded decoder (sans I/O).

Each message is one frame of :mod:`sdk.sync.framing` (a LEB128 length, then
the message); the first byte of a message is its type:

============ ==== =================================================================
message      type body
============ ==== =================================================================
``Hello``    1    protocol version (1 byte), floor: the oldest timestamp the sender
                  syncs (8 bytes, big-endian milliseconds; 0 = everything)
``Ranges``   2    range messages of :mod:`sdk.sync.rbsr`, each a tag byte and fixed
                  fields (below), to the end of the frame; a round may span frames
                  and ends with a Terminal
``Messages`` 3    archived SDS messages: ``varint len, channel_id (UTF-8), varint
                  len, raw SDS bytes`` to the end of the frame
``Done``     4    nothing: "I have reconciled and sent you everything you lack"
============ ==== =================================================================

Range-message tags: 0 EmptySet (``can_respond`` byte), 1 LowerBound (key),
2 Payload (key), 3 last Payload of a range (``can_respond`` byte, key, upper
bound), 4 EmptyPayload (upper bound), 5 Done (upper bound), 6 Fingerprint (16
bytes, upper bound), 7 Terminal. Every key and bound is a fixed
:data:`KEY_SIZE`-byte sync key (:func:`store_node.store_sync.index.sync_key`),
so no key needs a length and a wrong size is caught at once.

Everything a peer controls is bounded: the frame (``max_frame``), the items
per frame (by the frame), a channel id (:data:`transports.base.MAX_CHANNEL_ID_BYTES`)
and an SDS message (``max_message_size``). Any other input raises
:class:`sdk.sync.errors.MalformedMessage`; nothing else escapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeAlias

from sdk.sds.limits import DEFAULT_LIMITS
from sdk.sds.varint import write_uvarint
from sdk.sync import fields, rbsr
from sdk.sync.errors import MalformedMessage
from transports.base import MAX_CHANNEL_ID_BYTES

#: Version of this protocol; a peer speaking another is refused.
VERSION = 1
#: Bytes of a sync key: the timestamp (8, big-endian) and the message hash (32).
KEY_SIZE = 40

_HELLO, _RANGES, _MESSAGES, _DONE = 1, 2, 3, 4
_EMPTY_SET, _LOWER, _PAYLOAD, _PAYLOAD_LAST, _EMPTY, _RANGE_DONE, _FP, _TERMINAL = range(8)


@dataclass(frozen=True, slots=True)
class Hello:
    """Opens a session in both directions; ``floor_ms``: keys older are not synced."""

    version: int = VERSION
    floor_ms: int = 0


@dataclass(frozen=True, slots=True)
class Ranges:
    """Part of a reconciliation round (a round ends with :class:`sdk.sync.rbsr.Terminal`)."""

    items: tuple[rbsr.RangeMessage, ...]


@dataclass(frozen=True, slots=True)
class Messages:
    """Archived SDS messages the receiver lacks: ``(channel_id, raw SDS bytes)``."""

    items: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Finished:
    """The sender has finished reconciling and has sent every message the receiver lacks."""


WireMessage: TypeAlias = "Hello | Ranges | Messages | Finished"


#: Range messages, by tag (see the module docstring); ``can_respond`` is 0 or 1.
_KEY = fields.fixed(KEY_SIZE, "a sync key")
_CAN_RESPOND = fields.flag("can_respond")
_RANGE = fields.tagged(
    "range tag",
    {
        _EMPTY_SET: fields.body(rbsr.EmptySet, _CAN_RESPOND),
        _LOWER: fields.body(rbsr.LowerBound, _KEY),
        _PAYLOAD: fields.body(rbsr.Payload, _KEY),
        _PAYLOAD_LAST: fields.body(
            rbsr.Payload, can_respond=_CAN_RESPOND, key=_KEY, upper_bound=_KEY
        ),
        _EMPTY: fields.body(rbsr.EmptyPayload, _KEY),
        _RANGE_DONE: fields.body(rbsr.Done, _KEY),
        _FP: fields.body(
            rbsr.Fingerprint, fields.fixed(rbsr.FINGERPRINT_SIZE, "a fingerprint"), _KEY
        ),
        _TERMINAL: fields.body(rbsr.Terminal),
    },
    lambda m: _PAYLOAD_LAST if isinstance(m, rbsr.Payload) and m.upper_bound is not None else None,
)


def _write_item(out: bytearray, item: tuple[str, bytes]) -> None:
    for part in (item[0].encode(), item[1]):
        write_uvarint(out, len(part))
        out += part


def _sized(r: fields.FieldReader, what: str, limit: int) -> bytes:
    size = r.uvarint("a length", max_bytes=5)
    if size == 0 or size > limit:
        raise MalformedMessage(f"{what} of {size} bytes")
    return r.take(size, what)


def _read_item(r: fields.FieldReader) -> tuple[str, bytes]:
    try:
        channel = _sized(r, "a channel id", MAX_CHANNEL_ID_BYTES).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedMessage("a channel id that is not UTF-8") from exc
    return channel, _sized(r, "an SDS message", r.limits)


#: One item of a Messages: a channel id and the raw SDS bytes.
_ITEM: fields.Field = (_write_item, _read_item)
#: Messages by type; a Ranges or a Messages runs to the end of its frame.
_MESSAGE = fields.tagged(
    "message type",
    {
        _HELLO: fields.body(Hello, fields.integer(1, "version"), fields.integer(8, "floor")),
        _RANGES: fields.body(Ranges, fields.to_end(_RANGE, "a range message")),
        _MESSAGES: fields.body(Messages, fields.to_end(_ITEM, "a message")),
        _DONE: fields.body(Finished),
    },
)


def encode(message: WireMessage) -> bytes:
    """The bytes of one message (without its frame prefix)."""
    return fields.encode(_MESSAGE, message)


def decode(data: bytes, *, max_message_size: int = DEFAULT_LIMITS.max_message_size) -> WireMessage:
    """Decode one message; raise :class:`MalformedMessage` for anything else."""
    if not data:
        raise MalformedMessage("an empty message")
    r = fields.FieldReader(data, limits=max_message_size)
    message: WireMessage = _MESSAGE[1](r)
    if r.left:  # after a Hello or a Done (Finished): the others run to the end
        raise MalformedMessage(f"bytes after {'Hello' if isinstance(message, Hello) else 'Done'}")
    return message


def pack(message: Ranges | Messages, max_bytes: int) -> Iterator[bytes]:
    """The bytes of messages of ``message``'s type that carry its items in order, each at
    most ``max_bytes`` (an item larger than that is a message of its own); every item
    is encoded once."""
    kind, write = (_RANGES, _RANGE[0]) if isinstance(message, Ranges) else (_MESSAGES, _ITEM[0])
    out = bytearray((kind,))
    for item in message.items:
        end = len(out)
        write(out, item)
        if end > 1 and len(out) > max_bytes:
            yield bytes(out[:end])
            out = bytearray((kind,)) + out[end:]
    if len(out) > 1:
        yield bytes(out)


__all__ = [
    "KEY_SIZE",
    "VERSION",
    "Finished",
    "Hello",
    "Messages",
    "Ranges",
    "WireMessage",
    "decode",
    "encode",
    "pack",
]
