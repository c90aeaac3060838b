"""The SDS wire message (specs/sds.md, "Message") and its codec.

The protobuf schema is ``proto/sds/v1/sds.proto``; this module converts between
its bytes and small immutable Python values, and classifies a message as
content, sync or ephemeral the way the spec (and ``@waku/sds``) does:

========== ===================== ===============
kind       ``lamport_timestamp`` ``content``
========== ===================== ===============
content    set                   non-empty
sync       set                   empty / unset
ephemeral  unset                 non-empty
========== ===================== ===============

Anything else is rejected as :attr:`RejectReason.INVALID_KIND`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from sdk._proto.sds.v1 import sds_pb2
from sdk.sds.errors import RejectReason, RemoteProtocolError
from sdk.sds.limits import DEFAULT_LIMITS, Limits
from sdk.sds.records import fast_init
from sdk.sds.varint import UVARINTS, encode_uvarint, read_uvarint


class MessageKind(Enum):
    """What a message is for (see the module docstring)."""

    CONTENT = "content"
    SYNC = "sync"
    EPHEMERAL = "ephemeral"


@dataclass(frozen=True, slots=True)
class Datagram:
    """Bytes to broadcast on the channel's topic."""

    channel_id: str
    data: bytes
    #: Id of the message carried (for retrieval hints); sync messages have one too.
    message_id: str
    kind: MessageKind


fast_init(Datagram)  # one per message sent: see sdk/sds/records.py


class HistoryEntry(NamedTuple):
    """A reference to a message: its id, and optionally how to fetch it and who sent it.

    A named tuple rather than a dataclass: hundreds are built per message with
    a long causal history, and tuples construct and hash in C.
    """

    message_id: str
    retrieval_hint: bytes | None = None
    #: Original sender; populated when SDS-R is enabled.
    sender_id: str | None = None


class Message(NamedTuple):
    """One SDS message, as on the wire (an immutable named tuple: one is built per
    message received, on the hot path)."""

    sender_id: str
    message_id: str
    channel_id: str
    lamport_timestamp: int | None = None
    causal_history: tuple[HistoryEntry, ...] = ()
    bloom_filter: bytes | None = None
    content: bytes | None = None
    repair_request: tuple[HistoryEntry, ...] = ()

    @property
    def kind(self) -> MessageKind:
        """Content, sync or ephemeral; raises :class:`RemoteProtocolError` for neither."""
        if self.lamport_timestamp is not None:
            return MessageKind.CONTENT if self.content else MessageKind.SYNC
        if self.content:
            return MessageKind.EPHEMERAL
        raise RemoteProtocolError(RejectReason.INVALID_KIND, "no lamport_timestamp and no content")


def _len_field(tag: bytes, payload: bytes) -> bytes:
    n = len(payload)
    return tag + (UVARINTS[n] if n < 32_768 else encode_uvarint(n)) + payload


# Wire tags (field number << 3 | wire type) of the fields we write.
_T_SENDER, _T_ID, _T_CHANNEL = b"\x0a", b"\x12", b"\x1a"
_T_LAMPORT, _T_HISTORY, _T_BLOOM, _T_REPAIR = b"\x50", b"\x5a", b"\x62", b"\x6a"
_T_CONTENT = b"\xa2\x01"
_E_ID, _E_HINT, _E_SENDER = b"\x0a", b"\x12", b"\x1a"

# Encoded causal-history fields: the same few entries go into many consecutive
# messages, so each is encoded once. Bounded; cleared when full.
_history_field_cache: dict[HistoryEntry, bytes] = {}
_CACHE_SIZE = 16_384


# Encoded sender and channel id fields: one participant writes the same two into
# every message. Bounded; cleared when full.
_id_field_cache: dict[tuple[bytes, str], bytes] = {}


def _id_field(tag: bytes, value: str) -> bytes:
    field = _len_field(tag, value.encode())
    if len(_id_field_cache) >= _CACHE_SIZE:
        _id_field_cache.clear()
    _id_field_cache[(tag, value)] = field
    return field


def _entry_body(entry: HistoryEntry) -> bytes:
    body = _len_field(_E_ID, entry.message_id.encode())
    if entry.retrieval_hint is not None:
        body += _len_field(_E_HINT, entry.retrieval_hint)
    if entry.sender_id is not None:
        body += _len_field(_E_SENDER, entry.sender_id.encode())
    return body


def history_field(entry: HistoryEntry) -> bytes:
    """``entry`` encoded as one ``causal_history`` field of a message (tag and length
    included): what :func:`encode_fields` writes for it."""
    return _history_field(entry)


def _history_field(entry: HistoryEntry) -> bytes:
    field = _history_field_cache.get(entry)
    if field is None:
        field = _len_field(_T_HISTORY, _entry_body(entry))
        if len(_history_field_cache) >= _CACHE_SIZE:
            _history_field_cache.clear()
        _history_field_cache[entry] = field
    return field


def encode_message(message: Message) -> bytes:
    """Serialize ``message`` to its protobuf bytes.

    Written by hand, in field-number order exactly as protobuf serializes
    (``tests/sds/test_message.py`` checks it against hand-built bytes and the
    generated code), because sending is on the hot path and causal-history
    entries repeat from message to message.
    """
    return encode_fields(
        message.sender_id,
        message.message_id,
        message.channel_id,
        message.lamport_timestamp,
        message.causal_history,
        message.bloom_filter,
        message.content,
        message.repair_request,
    )


def encode_fields(
    sender_id: str,
    message_id: str,
    channel_id: str,
    lamport_timestamp: int | None,
    causal_history: tuple[HistoryEntry, ...],
    bloom_filter: bytes | None,
    content: bytes | None,
    repair_request: tuple[HistoryEntry, ...] = (),
    encoded_history: bytes | None = None,
) -> bytes:
    """:func:`encode_message` without building a :class:`Message` first.

    ``encoded_history``, when given, is ``causal_history`` already encoded (the
    :func:`history_field` of each entry, joined), written as is.
    """
    parts = []
    if sender_id:
        parts.append(_id_field_cache.get((_T_SENDER, sender_id)) or _id_field(_T_SENDER, sender_id))
    if message_id:
        parts.append(_len_field(_T_ID, message_id.encode()))
    if channel_id:
        parts.append(
            _id_field_cache.get((_T_CHANNEL, channel_id)) or _id_field(_T_CHANNEL, channel_id)
        )
    if lamport_timestamp is not None:
        parts.append(_T_LAMPORT + encode_uvarint(lamport_timestamp))
    if encoded_history is not None:
        parts.append(encoded_history)
    elif causal_history:
        fields = list(map(_history_field_cache.get, causal_history))
        if None in fields:
            # New entries are the newest, at the end: start at the first one.
            for i in range(fields.index(None), len(fields)):
                if fields[i] is None:
                    fields[i] = _history_field(causal_history[i])
        parts.extend(fields)  # type: ignore[arg-type]  # every None was replaced
    if bloom_filter is not None:
        # Tag and length apart from the payload: the filter is copied once, by join.
        parts.append(_T_BLOOM + encode_uvarint(len(bloom_filter)))
        parts.append(bloom_filter)
    for entry in repair_request:
        parts.append(_len_field(_T_REPAIR, _entry_body(entry)))
    if content is not None:
        parts.append(_T_CONTENT + encode_uvarint(len(content)))
        parts.append(content)
    return b"".join(parts)


def _check_id(value: str, what: str, limits: Limits) -> None:
    # len(str) <= len(utf8) <= 4*len(str): only encode when the cheap bound is inconclusive.
    if len(value) > limits.max_id_length or (
        4 * len(value) > limits.max_id_length and len(value.encode()) > limits.max_id_length
    ):
        raise RemoteProtocolError(
            RejectReason.FIELD_TOO_LONG, f"{what} longer than {limits.max_id_length} bytes"
        )


def _raw_message_class() -> type:
    """``proto/sds/v1/sds.proto``'s ``Message`` with ``causal_history`` and
    ``repair_request`` read as ``repeated bytes``.

    The same wire format (a length-delimited submessage is a length-delimited
    byte string), so parsing yields each entry's encoded bytes in C instead of
    a Python object per entry; :func:`_decode_entries` turns them into
    :class:`HistoryEntry` values through a cache, because one peer's
    consecutive messages repeat all but a few of their entries.
    """
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="chorus/sds/v1/sds_raw_entries.proto",
        package="chorus.sds.v1.raw",
        syntax="proto3",
    )
    msg = fdp.message_type.add(name="Message")
    fields = (
        ("sender_id", 1, f.TYPE_STRING, f.LABEL_OPTIONAL, False),
        ("message_id", 2, f.TYPE_STRING, f.LABEL_OPTIONAL, False),
        ("channel_id", 3, f.TYPE_STRING, f.LABEL_OPTIONAL, False),
        ("lamport_timestamp", 10, f.TYPE_UINT64, f.LABEL_OPTIONAL, True),
        ("causal_history", 11, f.TYPE_BYTES, f.LABEL_REPEATED, False),
        ("bloom_filter", 12, f.TYPE_BYTES, f.LABEL_OPTIONAL, True),
        ("repair_request", 13, f.TYPE_BYTES, f.LABEL_REPEATED, False),
        ("content", 20, f.TYPE_BYTES, f.LABEL_OPTIONAL, True),
    )
    for name, number, kind, label, optional in fields:
        field = msg.field.add(name=name, number=number, type=kind, label=label)
        if optional:
            # proto3 ``optional``: explicit presence through a synthetic oneof.
            field.oneof_index = len(msg.oneof_decl)
            field.proto3_optional = True
            msg.oneof_decl.add(name=f"_{name}")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("chorus.sds.v1.raw.Message"))


_RawMessage = _raw_message_class()

#: What the entry cache holds for an entry whose ids are not UTF-8: it is dropped
#: and the message kept, because ``@waku/sds`` echoes ids in later histories byte
#: for byte, so one peer's bad id would otherwise make us reject every later
#: message of every peer that references it (docs/interop.md).
_DROPPED = HistoryEntry("")


class _EntryCache:
    """Decoded and bound-checked entries by their bytes, for one :class:`Limits` (the
    checks depend on them). Bounded: cleared when full."""

    __slots__ = ("drops", "last", "limits", "table")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.table: dict[bytes, HistoryEntry] = {}
        #: How many entries in ``table`` are :data:`_DROPPED`.
        self.drops = 0
        #: The last long history decoded: its entries' bytes and the entries.
        self.last: tuple[list[bytes], list[HistoryEntry]] | None = None


#: By ``id(limits)`` (hashing a Limits costs more than a small history's lookups);
#: an entry is used only for that very object, which it keeps alive.
_entry_caches: dict[int, _EntryCache] = {}


def _decode_entry(raw: bytes, what: str, limits: Limits) -> HistoryEntry:
    """One causal-history or repair-request entry from its bytes, checked against
    ``limits``; :data:`_DROPPED` for an entry whose ids are not UTF-8."""
    try:
        e = sds_pb2.HistoryEntry.FromString(raw)
    except (DecodeError, ValueError, RuntimeError):
        try:
            if not _entry_is_valid(raw):
                return _DROPPED
        except ValueError:
            pass
        raise RemoteProtocolError(RejectReason.DECODE, f"invalid {what} entry") from None
    # An empty hint or sender id carries no information: treat it as unset.
    entry = HistoryEntry(e.message_id, e.retrieval_hint or None, e.sender_id or None)
    mid = entry.message_id
    if not mid:
        raise RemoteProtocolError(RejectReason.MISSING_ID, f"{what} entry without message_id")
    max_id = limits.max_id_length
    if len(mid) * 4 > max_id:
        _check_id(mid, f"{what} message_id", limits)
    hint = entry.retrieval_hint
    if hint is not None and len(hint) > limits.max_retrieval_hint_size:
        raise RemoteProtocolError(
            RejectReason.FIELD_TOO_LONG, f"{what} retrieval_hint of {len(hint)} bytes"
        )
    sender = entry.sender_id
    if sender is not None and len(sender) * 4 > max_id:
        _check_id(sender, f"{what} sender_id", limits)
    return entry


#: Histories this long are checked against the previous one (see _decode_entries).
_SHIFT_MIN = 16
#: How far into the previous history the first entry is looked for.
_SHIFT_MAX = 64


def _decode_entries(
    raws: list[bytes], what: str, limit: int, reason: RejectReason, limits: Limits
) -> tuple[HistoryEntry, ...]:
    if len(raws) > limit:
        raise RemoteProtocolError(reason, f"{what} has {len(raws)} entries, limit {limit}")
    cache = _entry_caches.get(id(limits))
    if cache is None or cache.limits is not limits:
        cache = _entry_caches[id(limits)] = _EntryCache(limits)
    table = cache.table
    # Typically every entry but the newest was seen in an earlier message, and a long
    # history is the previous one shifted by the few messages sent since: then its
    # entries are found by comparing bytes (memcmp) instead of hashing each entry's
    # bytes anew for the table (most of the decoding time of a 200-entry history).
    entries: list[HistoryEntry | None] | None = None
    # Whether some entry was not found; only the part looked up in the table can
    # hold None (``None in`` a list of 200 entries costs a comparison each).
    missing = False
    last = cache.last
    if last is not None and len(raws) >= _SHIFT_MIN:
        last_raws, last_entries = last
        try:
            start = last_raws.index(raws[0], 0, _SHIFT_MAX)
        except ValueError:
            pass
        else:
            same = min(len(last_raws) - start, len(raws))
            if last_raws[start : start + same] == raws[:same]:
                shifted: list[HistoryEntry | None] = list(last_entries[start : start + same])
                if same < len(raws):
                    tail = list(map(table.get, raws[same:]))
                    missing = None in tail
                    shifted.extend(tail)
                entries = shifted
    if entries is None:
        entries = list(map(table.get, raws))
        missing = None in entries
    if missing:
        if len(table) + len(raws) > _CACHE_SIZE:
            table.clear()
            # Entries taken from the last history may be dropped ones no longer counted.
            cache.drops = entries.count(_DROPPED) if last is not None else 0
        # New entries are the newest, at the end: start at the first one.
        for i in range(entries.index(None), len(entries)):
            if entries[i] is None:
                raw = raws[i]
                entry = table.get(raw)  # the same entry twice in one message
                if entry is None:
                    entry = table[raw] = _decode_entry(raw, what, limits)
                    if entry is _DROPPED:
                        cache.drops += 1
                entries[i] = entry
    if len(raws) >= _SHIFT_MIN:
        cache.last = (raws, entries)  # type: ignore[assignment]  # no None left
    if cache.drops:
        return tuple([e for e in entries if e is not _DROPPED])  # type: ignore[misc]
    return tuple(entries)  # type: ignore[arg-type]  # every None was replaced


def _fields(data: bytes) -> list[tuple[int, int, int, int]]:
    """``(field number, wire type, start, end)`` of every top-level field; ``end``
    bounds the whole field, a length-delimited payload is ``data[end - n:end]``."""
    out = []
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = read_uvarint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = read_uvarint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            n, pos = read_uvarint(data, pos)
            pos += n
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated field")
        out.append((number, wire, start, pos))
    return out


def _entry_is_valid(entry: bytes) -> bool:
    for number, wire, start, end in _fields(entry):
        if number in (1, 3) and wire == 2:
            _, body = read_uvarint(entry, start)
            _, body = read_uvarint(entry, body)
            try:
                entry[body:end].decode()
            except UnicodeDecodeError:
                return False
    return True


def decode_message(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Parse and bound-check bytes from a peer.

    Raises :class:`RemoteProtocolError` (never anything else) when the bytes are
    not a valid SDS message within ``limits``. The message kind is checked too,
    so a returned message always has a valid :attr:`Message.kind`.
    """
    if len(data) > limits.max_message_size:
        raise RemoteProtocolError(
            RejectReason.TOO_LARGE, f"{len(data)} bytes, limit {limits.max_message_size}"
        )
    pb = _RawMessage()
    try:
        pb.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise RemoteProtocolError(RejectReason.DECODE, str(exc) or "invalid protobuf") from None
    sender_id = pb.sender_id
    message_id = pb.message_id
    channel_id = pb.channel_id
    if not message_id:
        raise RemoteProtocolError(RejectReason.MISSING_ID, "message without message_id")
    # Cheap bound first (a character is at most 4 UTF-8 bytes); exact check only if needed.
    quarter = limits.max_id_length // 4
    if len(sender_id) > quarter or len(message_id) > quarter or len(channel_id) > quarter:
        _check_id(sender_id, "sender_id", limits)
        _check_id(message_id, "message_id", limits)
        _check_id(channel_id, "channel_id", limits)
    bloom = pb.bloom_filter if pb.HasField("bloom_filter") else None
    if bloom is not None and len(bloom) > limits.max_bloom_filter_size:
        raise RemoteProtocolError(
            RejectReason.FILTER_TOO_LARGE,
            f"bloom_filter of {len(bloom)} bytes, limit {limits.max_bloom_filter_size}",
        )
    history = pb.causal_history
    repair = pb.repair_request
    lamport = pb.lamport_timestamp if pb.HasField("lamport_timestamp") else None
    content = pb.content if pb.HasField("content") else None
    if lamport is None and not content:
        raise RemoteProtocolError(RejectReason.INVALID_KIND, "no lamport_timestamp and no content")
    return Message(
        sender_id,
        message_id,
        channel_id,
        lamport,
        _decode_entries(
            list(history),
            "causal_history",
            limits.max_causal_history,
            RejectReason.HISTORY_TOO_LONG,
            limits,
        )
        if history
        else (),
        bloom,
        content,
        _decode_entries(
            list(repair),
            "repair_request",
            limits.max_repair_request,
            RejectReason.REPAIR_REQUEST_TOO_LONG,
            limits,
        )
        if repair
        else (),
    )


#: What :func:`decode_archive_fields` returns: ``(sender_id, message_id,
#: channel_id, lamport_timestamp, causal-history message ids, content)``.
ArchiveFields = tuple[str, str, str, "int | None", tuple[str, ...], "bytes | None"]

_parse_typed = sds_pb2.Message.FromString


def decode_archive_fields(data: bytes, limits: Limits = DEFAULT_LIMITS) -> ArchiveFields:
    """What a store's archive row needs of a message: :func:`decode_message` projected
    to ``(m.sender_id, m.message_id, m.channel_id, m.lamport_timestamp, tuple(e.message_id
    for e in m.causal_history), m.content)``.

    Accepts and rejects exactly what :func:`decode_message` does, with the same
    :class:`RemoteProtocolError` reason (``tests/sds/test_archive_fields.py``
    checks the two against each other). Usually twice as fast: a store sees each
    history entry in only a few messages, so :func:`decode_message`'s entry cache
    mostly misses, and decoding each entry's bytes on its own costs more than the
    protobuf parser reading the entries as messages in one pass. That parser
    rejects a message whose entry ids are not UTF-8 (which :func:`decode_message`
    drops instead), and any check below failing leaves the verdict to
    :func:`decode_message` too, so the reason is its own.
    """
    if len(data) <= limits.max_message_size:
        try:
            pb = _parse_typed(data)
        except (DecodeError, ValueError, RuntimeError):
            pb = None
        if pb is not None:
            fields = _archive_fields(pb, data, limits)
            if fields is not None:
                return fields
    m = decode_message(data, limits)
    return (
        m.sender_id,
        m.message_id,
        m.channel_id,
        m.lamport_timestamp,
        tuple([e.message_id for e in m.causal_history]),
        m.content,
    )


def _archive_fields(pb: sds_pb2.Message, data: bytes, limits: Limits) -> ArchiveFields | None:
    """:func:`decode_archive_fields` of a parsed message when it passes every check
    :func:`decode_message` makes, else ``None``. ``data``: the message's bytes."""
    sender_id = pb.sender_id
    message_id = pb.message_id
    channel_id = pb.channel_id
    if not message_id:
        return None
    max_id = limits.max_id_length
    quarter = max_id // 4
    if (len(sender_id) > quarter or len(message_id) > quarter or len(channel_id) > quarter) and (
        len(sender_id.encode()) > max_id
        or len(message_id.encode()) > max_id
        or len(channel_id.encode()) > max_id
    ):
        return None
    # A field is no longer than the message: a short one needs no filter size check.
    if len(data) > limits.max_bloom_filter_size and len(pb.bloom_filter) > (
        limits.max_bloom_filter_size
    ):
        return None
    lamport = pb.lamport_timestamp if pb.HasField("lamport_timestamp") else None
    content = pb.content if pb.HasField("content") else None
    if lamport is None and not content:
        return None
    history = pb.causal_history
    if len(history) > limits.max_causal_history:
        return None
    # A message no longer than a hint may be holds no hint that is too long.
    check_hints = len(data) > limits.max_retrieval_hint_size
    ids = _checked_entry_ids(history, limits, check_hints)
    if ids is None:
        return None
    repair = pb.repair_request
    if repair:
        if len(repair) > limits.max_repair_request:
            return None
        if _checked_entry_ids(repair, limits, check_hints) is None:
            return None
    return sender_id, message_id, channel_id, lamport, tuple(ids), content


def _checked_entry_ids(
    entries: Iterable[sds_pb2.HistoryEntry], limits: Limits, check_hints: bool
) -> list[str] | None:
    """The ids of parsed history entries when every entry passes
    :func:`decode_message`'s entry checks, else ``None`` (:func:`_archive_fields`)."""
    max_id = limits.max_id_length
    quarter = max_id // 4
    max_hint = limits.max_retrieval_hint_size
    ids = []
    for entry in entries:
        mid = entry.message_id
        sender = entry.sender_id
        if (
            not mid
            or (check_hints and len(entry.retrieval_hint) > max_hint)
            or (len(mid) > quarter and len(mid.encode()) > max_id)
            or (len(sender) > quarter and len(sender.encode()) > max_id)
        ):
            return None
        ids.append(mid)
    return ids
