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

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

from sdk.sds.limits import DEFAULT_LIMITS
from sdk.sds.varint import write_uvarint
from sdk.sync import rbsr
from sdk.sync.errors import MalformedMessage
from sdk.sync.framing import FieldReader
from transports.base import MAX_CHANNEL_ID_BYTES

#: Version of this protocol; a peer speaking another is refused.
VERSION = 1
#: Bytes of a sync key: the timestamp (8, big-endian) and the message hash (32).
KEY_SIZE = 40

T = TypeVar("T")

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


#: Each range tag's message class and fields in wire order: ``can_respond`` is one byte
#: (0 or 1), ``fingerprint`` :data:`~sdk.sync.rbsr.FINGERPRINT_SIZE` bytes, any other a key.
_RANGE_FIELDS: dict[int, tuple[type, tuple[str, ...]]] = {
    _EMPTY_SET: (rbsr.EmptySet, ("can_respond",)),
    _LOWER: (rbsr.LowerBound, ("bound",)),
    _PAYLOAD: (rbsr.Payload, ("key",)),
    _PAYLOAD_LAST: (rbsr.Payload, ("can_respond", "key", "upper_bound")),
    _EMPTY: (rbsr.EmptyPayload, ("upper_bound",)),
    _RANGE_DONE: (rbsr.Done, ("upper_bound",)),
    _FP: (rbsr.Fingerprint, ("fingerprint", "upper_bound")),
    _TERMINAL: (rbsr.Terminal, ()),
}
_TAGS = {cls: tag for tag, (cls, _) in _RANGE_FIELDS.items() if tag != _PAYLOAD_LAST}
_FIELD_SIZES = {"can_respond": 1, "fingerprint": rbsr.FINGERPRINT_SIZE}


def _range_tag(m: rbsr.RangeMessage) -> int:
    if isinstance(m, rbsr.Payload) and m.upper_bound is not None:
        return _PAYLOAD_LAST
    return _TAGS[type(m)]


def _encode_range(out: bytearray, m: rbsr.RangeMessage) -> None:
    tag = _range_tag(m)
    out.append(tag)
    for name in _RANGE_FIELDS[tag][1]:
        value = getattr(m, name)
        if name == "can_respond":
            out.append(int(value))
        elif name == "fingerprint":
            out += value
        elif len(value) != KEY_SIZE:
            raise ValueError(f"a sync key is {KEY_SIZE} bytes, got {len(value)}")
        else:
            out += value


def range_size(m: rbsr.RangeMessage) -> int:
    """Encoded bytes of one range message (to fill frames without encoding twice)."""
    return 1 + sum(_FIELD_SIZES.get(name, KEY_SIZE) for name in _RANGE_FIELDS[_range_tag(m)][1])


def encode(message: WireMessage) -> bytes:
    """The bytes of one message (without its frame prefix)."""
    out = bytearray()
    if isinstance(message, Hello):
        out += bytes((_HELLO, message.version)) + message.floor_ms.to_bytes(8, "big")
    elif isinstance(message, Ranges):
        out.append(_RANGES)
        for m in message.items:
            _encode_range(out, m)
    elif isinstance(message, Messages):
        out.append(_MESSAGES)
        for channel_id, data in message.items:
            for field in (channel_id.encode(), data):
                write_uvarint(out, len(field))
                out += field
    else:
        out.append(_DONE)
    return bytes(out)


def _decode_range(r: FieldReader) -> rbsr.RangeMessage:
    tag = r.byte("range tag")
    if tag not in _RANGE_FIELDS:
        raise MalformedMessage(f"unknown range tag {tag}")
    cls, names = _RANGE_FIELDS[tag]
    fields: dict[str, object] = {}
    for name in names:
        if name == "can_respond":
            flag = r.byte(name)
            if flag > 1:
                raise MalformedMessage(f"{name} is {flag}, not 0 or 1")
            fields[name] = flag == 1
        else:
            fields[name] = r.take(_FIELD_SIZES.get(name, KEY_SIZE), name.replace("_", " "))
    return cls(**fields)  # type: ignore[no-any-return]


def decode(data: bytes, *, max_message_size: int = DEFAULT_LIMITS.max_message_size) -> WireMessage:
    """Decode one message; raise :class:`MalformedMessage` for anything else."""
    if not data:
        raise MalformedMessage("an empty message")
    r = FieldReader(data)
    kind = r.byte("type")
    if kind == _HELLO:
        version = r.byte("version")
        floor = int.from_bytes(r.take(8, "floor"), "big")
        if r.left:
            raise MalformedMessage("bytes after Hello")
        return Hello(version, floor)
    if kind == _DONE:
        if r.left:
            raise MalformedMessage("bytes after Done")
        return Finished()
    if kind == _RANGES:
        items: list[rbsr.RangeMessage] = []
        while r.left:
            items.append(_decode_range(r))
        if not items:
            raise MalformedMessage("Ranges without a range message")
        return Ranges(tuple(items))
    if kind == _MESSAGES:
        messages: list[tuple[str, bytes]] = []
        while r.left:
            size = r.uvarint("channel id length", max_bytes=5)
            if size == 0 or size > MAX_CHANNEL_ID_BYTES:
                raise MalformedMessage(f"a channel id of {size} bytes")
            try:
                channel = r.take(size, "channel id").decode("utf-8")
            except UnicodeDecodeError as exc:
                raise MalformedMessage("a channel id that is not UTF-8") from exc
            size = r.uvarint("message length", max_bytes=5)
            if size == 0 or size > max_message_size:
                raise MalformedMessage(f"an SDS message of {size} bytes")
            messages.append((channel, r.take(size, "message")))
        if not messages:
            raise MalformedMessage("Messages without a message")
        return Messages(tuple(messages))
    raise MalformedMessage(f"unknown message type {kind}")


def item_size(item: tuple[str, bytes]) -> int:
    """Encoded bytes of one :class:`Messages` item, at most (its two lengths as 5 bytes each)."""
    return len(item[0].encode()) + len(item[1]) + 10


def chunks(items: Iterable[T], size: Callable[[T], int], max_bytes: int) -> Iterator[tuple[T, ...]]:
    """``items`` in order, in groups of at most ``max_bytes`` encoded bytes with the type
    byte (``size``: one item's; an item larger than that is a group of its own)."""
    chunk: list[T] = []
    total = 1
    for item in items:
        n = size(item)
        if chunk and total + n > max_bytes:
            yield tuple(chunk)
            chunk, total = [], 1
        chunk.append(item)
        total += n
    if chunk:
        yield tuple(chunk)


__all__ = [
    "KEY_SIZE",
    "VERSION",
    "Finished",
    "Hello",
    "Messages",
    "Ranges",
    "WireMessage",
    "chunks",
    "decode",
    "encode",
    "item_size",
    "range_size",
]
