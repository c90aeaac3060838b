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

from sdk.documents.bamboo import AUTHOR_SIZE, SIGNATURE_SIZE, Entry
from sdk.documents.errors import DocumentError
from sdk.documents.hashing import HASH_SIZE, decode_hash
from sdk.documents.varu64 import decode_varu64, encode_varu64
from sdk.sync.bamboo_p2p.entries import decode_full_entry
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
_ADJ_END = 0x08
_ADJ_UPPER = 0x04
_ADJ_MIN = 0x02
_ADJ_MAX = 0x01
_REQ_FINITE = 0x10
_REQ_OFFSET = 0x08
_REQ_PAYLOAD_ONLY = 0x04
_REQ_SPARSE = 0x02
_REQ_MANDATORY = 0x01
_REQ_FIRST = 0x80

# Data channel first bytes.
D_SWITCH = 0
D_NOTIFY = 2
D_NOTIFY_N = 3
D_SKIP_SMALL = 4
D_SKIP_LARGE = 5
D_SKIP_UNAVAILABLE = 6
D_SKIP_BYTES = 7
D_PAYLOAD = 8
D_COMPRESSED = 9
D_APOLOGY = 16
D_CANCELLED = 32
D_METADATA_TAG0 = 128
D_METADATA_TAG1 = 129

# -------------------------------------------------------------------- primitives


def _u64(data: bytes, pos: int, what: str) -> tuple[int, int]:
    try:
        return decode_varu64(data, pos)
    except DocumentError as exc:
        raise MalformedMessage(f"{what}: {exc.detail}") from exc


def _hash(data: bytes, pos: int, what: str) -> tuple[bytes, int]:
    try:
        value, end = decode_hash(data, pos)
    except DocumentError as exc:
        raise MalformedMessage(f"{what}: {exc.detail}") from exc
    return bytes(value), end


def _raw(data: bytes, pos: int, n: int, what: str) -> tuple[bytes, int]:
    end = pos + n
    if end > len(data):
        raise MalformedMessage(f"data ends inside {what}")
    return bytes(data[pos:end]), end


def _eager_bits(eagerness: Eagerness) -> int:
    return int(eagerness.mode) << _EAGER_SHIFT


def _eager_tail(eagerness: Eagerness) -> bytes:
    return encode_varu64(eagerness.payload_limit) if eagerness.mode is EagerMode.UP_TO else b""


def _decode_eagerness(bits: int, data: bytes, pos: int) -> tuple[Eagerness | None, int]:
    if bits == 0:
        return None, pos
    mode = EagerMode(bits)
    if mode is EagerMode.UP_TO:
        limit, pos = _u64(data, pos, "eagerness payload limit")
        return Eagerness(mode, limit), pos
    return Eagerness(mode), pos


# --------------------------------------------------------------- control channel


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
    flags = 0
    tail = []
    if m.eagerness is not None:
        flags |= _eager_bits(m.eagerness)
        tail.append(_eager_tail(m.eagerness))
    if m.allow_skip:
        flags |= _ADJ_ALLOW_SKIP
    for bit, value in (
        (_ADJ_END, m.end),
        (_ADJ_UPPER, m.upper_certpool),
        (_ADJ_MIN, m.min_payload),
        (_ADJ_MAX, m.max_payload),
    ):
        if value is not None:
            flags |= bit
            tail.append(encode_varu64(value))
    return bytes((flags,)) + encode_varu64(m.request_id) + b"".join(tail)


def _encode_cancel(m: Cancel) -> bytes:
    out = bytes((int(m.reason),)) + encode_varu64(m.request_id)
    if m.reason is CancelReason.HASH_MISMATCH:
        if m.entry is None:
            raise ValueError("a hash-mismatch cancellation carries the mismatching entry")
        return out + m.entry.encoded
    if m.reason is CancelReason.END_OF_LOG:
        if m.seq_num is None:
            raise ValueError("an end-of-log cancellation carries the entry's sequence number")
        return out + encode_varu64(m.seq_num)
    if m.reason is CancelReason.FORKED:
        if m.entry is None or m.other_entry is None:
            raise ValueError("a fork cancellation carries the two entries of the fork proof")
        return out + m.entry.encoded + m.other_entry.encoded
    return out


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
    flags = _REQ_FIRST | _eager_bits(m.eagerness)
    if m.end is not None:
        flags |= _REQ_FINITE
    if m.offset is not None:
        flags |= _REQ_OFFSET
    if m.payload_only:
        flags |= _REQ_PAYLOAD_ONLY
    if m.sparse:
        flags |= _REQ_SPARSE
    if m.mandatory:
        flags |= _REQ_MANDATORY
    parts = [
        bytes((flags,)),
        encode_varu64(m.request_id),
        m.author,
        encode_varu64(m.log_id),
        encode_varu64(m.start),
    ]
    if m.lower_certpool is not None:
        parts.append(encode_varu64(m.lower_certpool))
    parts += [encode_varu64(m.min_payload), encode_varu64(m.max_payload)]
    if m.expected_hash is not None:
        parts.append(m.expected_hash)
    parts.append(_eager_tail(m.eagerness))
    if m.end is not None and m.upper_certpool is not None:
        parts += [encode_varu64(m.end), encode_varu64(m.upper_certpool)]
    if m.offset is not None:
        parts.append(encode_varu64(m.offset))
    return b"".join(parts)


def decode_control(data: bytes, pos: int = 0) -> tuple[ControlMessage, int]:
    """Decode one control message at ``pos``; return it and the offset after it."""
    if pos >= len(data):
        raise MalformedMessage("data ends before a control message")
    first = data[pos]
    pos += 1
    if first == 0:
        amount, pos = _u64(data, pos, "credit amount")
        return GrantCredit(amount), pos
    if first < 128:
        return _decode_adjust(first, data, pos)
    if first <= CancelReason.FORKED:
        return _decode_cancel(CancelReason(first), data, pos)
    if first < 160:
        raise MalformedMessage(f"unused control byte {first}")
    return _decode_propose(first, data, pos)


def _decode_adjust(flags: int, data: bytes, pos: int) -> tuple[Adjust, int]:
    request_id, pos = _u64(data, pos, "request number")
    eagerness, pos = _decode_eagerness((flags >> _EAGER_SHIFT) & 0b11, data, pos)
    values: list[int | None] = []
    for bit in (_ADJ_END, _ADJ_UPPER, _ADJ_MIN, _ADJ_MAX):
        if flags & bit:
            value, pos = _u64(data, pos, "adjusted value")
            values.append(value)
        else:
            values.append(None)
    end, upper, min_payload, max_payload = values
    return (
        Adjust(
            request_id,
            eagerness=eagerness,
            allow_skip=bool(flags & _ADJ_ALLOW_SKIP),
            end=end,
            upper_certpool=upper,
            min_payload=min_payload,
            max_payload=max_payload,
        ),
        pos,
    )


def _decode_cancel(reason: CancelReason, data: bytes, pos: int) -> tuple[Cancel, int]:
    request_id, pos = _u64(data, pos, "request number")
    if reason is CancelReason.HASH_MISMATCH:
        entry, pos = decode_full_entry(data, pos)
        return Cancel(request_id, reason, entry=entry), pos
    if reason is CancelReason.END_OF_LOG:
        seq_num, pos = _u64(data, pos, "end-of-log sequence number")
        return Cancel(request_id, reason, seq_num=seq_num), pos
    if reason is CancelReason.FORKED:
        entry, pos = decode_full_entry(data, pos)
        other, pos = decode_full_entry(data, pos)
        return Cancel(request_id, reason, entry=entry, other_entry=other), pos
    return Cancel(request_id, reason), pos


def _decode_propose(flags: int, data: bytes, pos: int) -> tuple[Propose, int]:
    request_id, pos = _u64(data, pos, "request number")
    author, pos = _raw(data, pos, AUTHOR_SIZE, "the author")
    log_id, pos = _u64(data, pos, "log id")
    start, pos = _u64(data, pos, "start")
    lower: int | None = None
    has_offset = bool(flags & _REQ_OFFSET)
    if not has_offset:
        lower, pos = _u64(data, pos, "lower certpool info")
    min_payload, pos = _u64(data, pos, "minimum payload size")
    max_payload, pos = _u64(data, pos, "maximum payload size")
    expected: bytes | None = None
    if has_offset or lower != 1:
        expected, pos = _hash(data, pos, "expected starting hash")
    eagerness, pos = _decode_eagerness((flags >> _EAGER_SHIFT) & 0b11, data, pos)
    assert eagerness is not None  # first byte >= 160: the eagerness bits are not 00
    end = upper = offset = None
    if flags & _REQ_FINITE:
        end, pos = _u64(data, pos, "end")
        upper, pos = _u64(data, pos, "upper certpool info")
    if has_offset:
        offset, pos = _u64(data, pos, "offset")
    return (
        Propose(
            request_id=request_id,
            author=author,
            log_id=log_id,
            start=start,
            lower_certpool=lower,
            min_payload=min_payload,
            max_payload=max_payload,
            expected_hash=expected,
            eagerness=eagerness,
            end=end,
            upper_certpool=upper,
            offset=offset,
            payload_only=bool(flags & _REQ_PAYLOAD_ONLY),
            sparse=bool(flags & _REQ_SPARSE),
            mandatory=bool(flags & _REQ_MANDATORY),
        ),
        pos,
    )


# ------------------------------------------------------------------ data channel


def encode_data(message: DataMessage) -> bytes:
    """The bytes of one data-channel message."""
    if isinstance(message, Metadata):
        first = D_METADATA_TAG1 if message.tag == 1 else D_METADATA_TAG0
        if message.tag not in (0, 1):
            raise ValueError("entry tags are 0 and 1")
        return b"".join(
            (
                bytes((first,)),
                message.backlink or b"",
                encode_varu64(message.payload_size),
                message.payload_hash,
                message.signature,
            )
        )
    if isinstance(message, PayloadChunk):
        return bytes((D_PAYLOAD,)) + encode_varu64(len(message.data)) + message.data
    if isinstance(message, Notify):
        if message.count == 1:
            return bytes((D_NOTIFY,))
        return bytes((D_NOTIFY_N,)) + encode_varu64(message.count)
    if isinstance(message, SwitchRequest):
        return bytes((D_SWITCH,)) + encode_varu64(message.request_id)
    if isinstance(message, CancelMarker):
        return bytes((D_CANCELLED,)) + encode_varu64(message.request_id)
    if isinstance(message, SkipBytes):
        return bytes((D_SKIP_BYTES,)) + encode_varu64(message.count)
    if isinstance(message, CompressedPayload):
        return (
            bytes((D_COMPRESSED,))
            + encode_varu64(message.uncompressed_length)
            + encode_varu64(len(message.data))
            + message.data
        )
    return bytes((_SIMPLE_BYTES[type(message)],))


_SIMPLE_BYTES: dict[type, int] = {
    SkipTooSmall: D_SKIP_SMALL,
    SkipTooLarge: D_SKIP_LARGE,
    SkipUnavailable: D_SKIP_UNAVAILABLE,
    Apology: D_APOLOGY,
}


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
    pos += 1
    if first in (D_METADATA_TAG0, D_METADATA_TAG1):
        backlink: bytes | None = None
        if backlink_expected():
            backlink, pos = _hash(data, pos, "backlink")
        size, pos = _u64(data, pos, "payload size")
        payload_hash, pos = _hash(data, pos, "payload hash")
        signature, pos = _raw(data, pos, SIGNATURE_SIZE, "the signature")
        return Metadata(first - D_METADATA_TAG0, backlink, size, payload_hash, signature), pos
    if first == D_PAYLOAD:
        n, pos = _u64(data, pos, "payload length")
        chunk, pos = _raw(data, pos, n, "payload bytes")
        return PayloadChunk(chunk), pos
    if first == D_NOTIFY:
        return Notify(1), pos
    if first == D_NOTIFY_N:
        n, pos = _u64(data, pos, "notify count")
        return Notify(n), pos
    if first == D_SWITCH:
        request_id, pos = _u64(data, pos, "request number")
        return SwitchRequest(request_id), pos
    if first == D_CANCELLED:
        request_id, pos = _u64(data, pos, "request number")
        return CancelMarker(request_id), pos
    if first == D_SKIP_SMALL:
        return SkipTooSmall(), pos
    if first == D_SKIP_LARGE:
        return SkipTooLarge(), pos
    if first == D_SKIP_UNAVAILABLE:
        return SkipUnavailable(), pos
    if first == D_SKIP_BYTES:
        n, pos = _u64(data, pos, "skipped byte count")
        return SkipBytes(n), pos
    if first == D_APOLOGY:
        return Apology(), pos
    if first == D_COMPRESSED:
        ulen, pos = _u64(data, pos, "uncompressed length")
        clen, pos = _u64(data, pos, "compressed length")
        chunk, pos = _raw(data, pos, clen, "compressed bytes")
        return CompressedPayload(ulen, chunk), pos
    raise MalformedMessage(f"unused data byte {first}")


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
    entry, end = decode_full_entry(data, 0)
    if end != len(data):
        raise MalformedMessage(f"{len(data) - end} bytes after the entry")
    return entry


__all__ = [
    "HASH_SIZE",
    "decode_all_control",
    "decode_control",
    "decode_data",
    "encode_control",
    "encode_data",
    "entry_from_cancel_bytes",
]
