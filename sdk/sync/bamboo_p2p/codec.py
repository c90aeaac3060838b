"""Byte encodings of the control and data channel messages.

Spec: ``specs/bamboo-point-2-point.md``, "Encodings". Bits of a first byte are
numbered from the most significant ("first bit" = 0x80), as the spec's ranges
imply (adjustments 1-127 have a zero first bit, proposals >= 160 a one first bit
and not both of the 2nd and 3rd bit zero).

Where the spec text is silent, this module decides, and the docs
(``docs/bamboo-p2p.md``, "Decisions") say the same:

* A cancellation (128-135) is followed by the request number as a VarU64, then by
  its reason-specific data; the spec lists only the latter, but a cancellation
  must name the request it cancels.
* "Metadata of an entry" inside a cancellation (133, 135) is the entry's full
  Bamboo encoding (tag, author, log id, sequence number, links, size, hash,
  signature), the only form that makes sense without the context of a request.
* In a proposal, the data that flags append (the payload limit of eagerness
  ``10``, end and upper certpool info, offset) follows the fixed fields including
  the expected starting hash, in the order of the flags.
* 136-159 are the unused cancellation bytes (the spec's "136-160" overlaps 160,
  which is a proposal with eagerness ``01``).

Every ``decode_*`` raises only :class:`MalformedMessage` on any bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sdk.documents.bamboo import AUTHOR_SIZE, SIGNATURE_SIZE, Entry
from sdk.documents.varu64 import encode_varu64
from sdk.sync.bamboo_p2p.entries import EntryReader
from sdk.sync.bamboo_p2p.errors import MalformedMessage
from sdk.sync.bamboo_p2p.messages import (
    Adjust,
    Apology,
    Cancel,
    CancelMarker,
    CancelReason,
    CompressedPayload,
    ControlMessage,
    DataMessage,
    EagerMode,
    Eagerness,
    GrantCredit,
    Metadata,
    Notify,
    PayloadChunk,
    Propose,
    SkipBytes,
    SkipTooLarge,
    SkipTooSmall,
    SkipUnavailable,
    SwitchRequest,
)

# Flag bits of adjustments and proposals (2nd and 3rd bit are the eagerness).
_EAGER_SHIFT = 5
_ADJ_ALLOW_SKIP = 0x10
_REQ_FINITE = 0x10
_REQ_OFFSET = 0x08
_REQ_FIRST = 0x80
#: Adjustment flags of the optional values, in the order the values follow.
_ADJ_VALUES = (
    (0x08, "end"),
    (0x04, "upper_certpool"),
    (0x02, "min_payload"),
    (0x01, "max_payload"),
)
#: Proposal flags that are booleans of :class:`Propose`.
_REQ_BOOLS = ((0x04, "payload_only"), (0x02, "sparse"), (0x01, "mandatory"))
#: The reason-specific fields of :class:`Cancel`, in wire order after the request number.
_CANCEL_DATA = {
    CancelReason.HASH_MISMATCH: ("entry",),
    CancelReason.END_OF_LOG: ("seq_num",),
    CancelReason.FORKED: ("entry", "other_entry"),
}

# --------------------------------------------------------------- control channel


def _eager_tail(eagerness: Eagerness) -> bytes:
    return encode_varu64(eagerness.payload_limit) if eagerness.mode is EagerMode.UP_TO else b""


def _read_eagerness(flags: int, r: EntryReader) -> Eagerness | None:
    bits = (flags >> _EAGER_SHIFT) & 0b11
    if bits == 0:
        return None
    mode = EagerMode(bits)
    return Eagerness(mode, r.u64("eagerness payload limit") if mode is EagerMode.UP_TO else 0)


def encode_control(message: ControlMessage) -> bytes:
    """The bytes of one control-channel message."""
    if isinstance(message, GrantCredit):
        return b"\x00" + encode_varu64(message.amount)
    if isinstance(message, Adjust):
        return _encode_adjust(message)
    if isinstance(message, Cancel):
        return _encode_cancel(message)
    return _encode_propose(message)


def _encode_adjust(m: Adjust) -> bytes:
    if m.is_empty():
        raise ValueError("an adjustment must adjust something (first byte 0 is a credit grant)")
    flags = _ADJ_ALLOW_SKIP if m.allow_skip else 0
    tail = []
    if m.eagerness is not None:
        flags |= m.eagerness.mode << _EAGER_SHIFT
        tail.append(_eager_tail(m.eagerness))
    for bit, name in _ADJ_VALUES:
        value = getattr(m, name)
        if value is not None:
            flags |= bit
            tail.append(encode_varu64(value))
    return bytes((flags,)) + encode_varu64(m.request_id) + b"".join(tail)


def _encode_cancel(m: Cancel) -> bytes:
    parts = [bytes((int(m.reason),)), encode_varu64(m.request_id)]
    for name in _CANCEL_DATA.get(m.reason, ()):
        value = getattr(m, name)
        if value is None:
            raise ValueError(f"a {m.reason.name.lower()} cancellation carries its {name}")
        parts.append(encode_varu64(value) if name == "seq_num" else value.encoded)
    return b"".join(parts)


def _encode_propose(m: Propose) -> bytes:
    if (m.offset is None) == (m.lower_certpool is None):
        raise ValueError("a proposal has either a lower certpool info or a starting offset")
    if (m.end is None) != (m.upper_certpool is None):
        raise ValueError("a finite range has both an end and an upper certpool info")
    if len(m.author) != AUTHOR_SIZE:
        raise ValueError("an author is a 32-byte public key")
    wants_hash = m.offset is not None or m.lower_certpool != 1
    if wants_hash != (m.expected_hash is not None):
        raise ValueError("expected starting hash: given exactly unless lower certpool info is 1")
    flags = _REQ_FIRST | m.eagerness.mode << _EAGER_SHIFT
    flags |= _REQ_FINITE if m.end is not None else 0
    flags |= _REQ_OFFSET if m.offset is not None else 0
    flags |= sum(bit for bit, name in _REQ_BOOLS if getattr(m, name))
    parts = [bytes((flags,))]
    # In wire order: an int is a VarU64, bytes go as they are, None is absent (as the
    # flags say).
    for value in (
        m.request_id,
        m.author,
        m.log_id,
        m.start,
        m.lower_certpool,
        m.min_payload,
        m.max_payload,
        m.expected_hash,
        _eager_tail(m.eagerness),
        m.end,
        m.upper_certpool,
        m.offset,
    ):
        if isinstance(value, int):
            parts.append(encode_varu64(value))
        elif value is not None:
            parts.append(value)
    return b"".join(parts)


def decode_control(data: bytes, pos: int = 0) -> tuple[ControlMessage, int]:
    """Decode one control message at ``pos``; return it and the offset after it."""
    if pos >= len(data):
        raise MalformedMessage("data ends before a control message")
    first = data[pos]
    r = EntryReader(data, pos + 1)
    message: ControlMessage
    if first == 0:
        message = GrantCredit(r.u64("credit amount"))
    elif first < 128:
        request_id = r.u64("request number")
        eagerness = _read_eagerness(first, r)
        values = [r.u64("adjusted value") if first & bit else None for bit, _ in _ADJ_VALUES]
        message = Adjust(request_id, eagerness, bool(first & _ADJ_ALLOW_SKIP), *values)
    elif first <= CancelReason.FORKED:
        message = _decode_cancel(CancelReason(first), r)
    elif first < 160:
        raise MalformedMessage(f"unused control byte {first}")
    else:
        message = _decode_propose(first, r)
    return message, r.pos


def _decode_cancel(reason: CancelReason, r: EntryReader) -> Cancel:
    request_id = r.u64("request number")
    data: dict[str, Any] = {
        name: r.u64("end-of-log sequence number") if name == "seq_num" else r.entry()
        for name in _CANCEL_DATA.get(reason, ())
    }
    return Cancel(request_id, reason, **data)


def _decode_propose(flags: int, r: EntryReader) -> Propose:
    request_id = r.u64("request number")
    author = r.take(AUTHOR_SIZE, "the author")
    log_id = r.u64("log id")
    start = r.u64("start")
    lower = None if flags & _REQ_OFFSET else r.u64("lower certpool info")
    min_payload = r.u64("minimum payload size")
    max_payload = r.u64("maximum payload size")
    expected = r.hash("expected starting hash") if lower != 1 else None
    eagerness = _read_eagerness(flags, r)
    assert eagerness is not None  # first byte >= 160: the eagerness bits are not 00
    finite = flags & _REQ_FINITE
    end = r.u64("end") if finite else None
    upper = r.u64("upper certpool info") if finite else None
    offset = None if lower is not None else r.u64("offset")
    return Propose(
        request_id,
        author,
        log_id,
        start,
        lower,
        min_payload,
        max_payload,
        expected,
        eagerness,
        end,
        upper,
        offset,
        **{name: bool(flags & bit) for bit, name in _REQ_BOOLS},
    )


# ------------------------------------------------------------------ data channel

#: Data messages by first byte (but metadata, 128 + its entry tag): how each is read
#: after that byte, and how each is written.
_METADATA = 128
_DATA_READERS: dict[int, Callable[[EntryReader], DataMessage]] = {
    0: lambda r: SwitchRequest(r.u64("request number")),
    2: lambda r: Notify(1),
    3: lambda r: Notify(r.u64("notify count")),
    4: lambda r: SkipTooSmall(),
    5: lambda r: SkipTooLarge(),
    6: lambda r: SkipUnavailable(),
    7: lambda r: SkipBytes(r.u64("skipped byte count")),
    8: lambda r: PayloadChunk(r.take(r.u64("payload length"), "payload bytes")),
    9: lambda r: CompressedPayload(
        r.u64("uncompressed length"), r.take(r.u64("compressed length"), "compressed bytes")
    ),
    16: lambda r: Apology(),
    32: lambda r: CancelMarker(r.u64("request number")),
}
_DATA_WRITERS: dict[type, Callable[[Any], bytes]] = {
    SwitchRequest: lambda m: bytes((0,)) + encode_varu64(m.request_id),
    Notify: lambda m: bytes((2,)) if m.count == 1 else bytes((3,)) + encode_varu64(m.count),
    SkipTooSmall: lambda m: bytes((4,)),
    SkipTooLarge: lambda m: bytes((5,)),
    SkipUnavailable: lambda m: bytes((6,)),
    SkipBytes: lambda m: bytes((7,)) + encode_varu64(m.count),
    PayloadChunk: lambda m: bytes((8,)) + encode_varu64(len(m.data)) + m.data,
    CompressedPayload: lambda m: (
        bytes((9,)) + encode_varu64(m.uncompressed_length) + encode_varu64(len(m.data)) + m.data
    ),
    Apology: lambda m: bytes((16,)),
    CancelMarker: lambda m: bytes((32,)) + encode_varu64(m.request_id),
}


def encode_data(message: DataMessage) -> bytes:
    """The bytes of one data-channel message."""
    if not isinstance(message, Metadata):
        return _DATA_WRITERS[type(message)](message)
    if message.tag not in (0, 1):
        raise ValueError("entry tags are 0 and 1")
    head = bytes((_METADATA + message.tag,)) + (message.backlink or b"")
    return head + encode_varu64(message.payload_size) + message.payload_hash + message.signature


def decode_data(
    data: bytes, pos: int = 0, backlink_expected: Callable[[], bool] = lambda: False
) -> tuple[DataMessage, int]:
    """Decode one data message at ``pos``; return it and the offset after it.

    Whether metadata carries a backlink depends on the request and the cursor, so
    the caller says it through ``backlink_expected``, which is called only when
    the message is metadata.
    """
    if pos >= len(data):
        raise MalformedMessage("data ends before a data message")
    first = data[pos]
    r = EntryReader(data, pos + 1)
    if first in (_METADATA, _METADATA + 1):
        backlink = r.hash("backlink") if backlink_expected() else None
        size = r.u64("payload size")
        payload_hash = r.hash("payload hash")
        signature = r.take(SIGNATURE_SIZE, "the signature")
        return Metadata(first - _METADATA, backlink, size, payload_hash, signature), r.pos
    read = _DATA_READERS.get(first)
    if read is None:
        raise MalformedMessage(f"unused data byte {first}")
    return read(r), r.pos


def decode_all_control(data: bytes) -> list[ControlMessage]:
    """Decode a byte string that holds whole control messages only."""
    out: list[ControlMessage] = []
    pos = 0
    while pos < len(data):
        message, pos = decode_control(data, pos)
        out.append(message)
    return out


def entry_from_cancel_bytes(data: bytes) -> Entry:
    """Decode one full entry as it travels inside a cancellation (for tests and tools)."""
    r = EntryReader(data)
    entry = r.entry()
    if r.left:
        raise MalformedMessage(f"{r.left} bytes after the entry")
    return entry


__all__ = [
    "decode_all_control",
    "decode_control",
    "decode_data",
    "encode_control",
    "encode_data",
    "entry_from_cancel_bytes",
]
