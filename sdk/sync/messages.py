"""p2panda replication messages and their CBOR encoding.

Every message is a CBOR array whose first element is its type
(``specs/p2panda-replication.txt``). For the types aquadoggo implemented the
bytes are aquadoggo's (last release, v0.9.1), which decides where the spec text
is loose:

* Announce ``[0, version, timestamp, [schema_id, ...]]``
  (``aquadoggo/src/replication/announcement.rs`` lines 57-67);
* SyncRequest ``[1, session_id, mode, [schema_id, ...]]``, Entry
  ``[2, session_id, entry, operation]``, SyncDone ``[3, session_id, live_mode]``
  and Have ``[10, session_id, [[public_key, [[log_id, seq_num], ...]], ...]]``
  (``aquadoggo/src/replication/message.rs`` lines 81-117). Entries, operations
  and public keys are CBOR byte strings, not text: p2panda-rs serializes them
  with ``serde_bytes`` in non-human-readable formats (the Have test in
  ``message.rs`` lines 135-158 spells the key as ``serde_bytes::Bytes``).
* Decoding follows ``aquadoggo/src/network/peers/message.rs`` lines 26-162:
  schema id lists must be sorted (system schemas first, then application ids)
  without duplicates, a SyncRequest's list must not be empty, and extra array
  elements are an error. One difference: aquadoggo accepts ``null`` for an
  Entry's operation; we cannot validate an entry without it, so we reject it.

The set-reconciliation messages (types 20-26) were never implemented upstream;
their layout is the spec's: EmptySet ``[20, sid, can_respond]``, LowerBound
``[21, sid, bound]``, Payload ``[22, sid, item]`` or, on the last item of a
range, ``[22, sid, item, can_respond, upper_bound]``, EmptyPayload ``[23, sid,
upper_bound]``, Done ``[24, sid, upper_bound]``, Fingerprint ``[25, sid,
fingerprint, upper_bound]`` and Terminal ``[26, sid]``; the fingerprint (the
spec's ``lift_type {TODO}``) is a 16-byte string (:mod:`sdk.sync.rbsr`). An
*item* is one of

* ``[public_key, log_id, seq_num]``, a *whole item*: the public key a 32-byte
  string like everywhere else in aquadoggo's encoding, the others unsigned
  64-bit integers (the key ``public_key || log_id || seq_num``, big-endian);
* ``[log_id, seq_num]``, a *same-author item*: the public key is that of the
  latest whole item earlier in the same round (:class:`RoundContext`); with
  none, the message is malformed.

A *bound* (LowerBound, upper_bound) is an item or a *prefix*: a public key
prefix of 0 to 31 bytes that stands for itself as a key (it sorts before every
item whose public key starts with it; :func:`short_bound`), written as a bare
byte string or as ``[prefix, 0, 0]``. Anything else there is malformed.

:func:`encode` without a context writes only whole items and ``[prefix, 0,
0]`` (the first form of this protocol); with a context (what sessions use) it
writes a same-author item whenever it may and prefixes bare, which takes a cut
inside one author's logs from about 37 bytes to 3. :func:`decode` reads every
form; same-author items only with a context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeAlias, TypeGuard

from sdk.documents import cbor
from sdk.documents.cbor import _SMALL_HEADS, _head
from sdk.documents.errors import DocumentError
from sdk.sync import rbsr
from sdk.sync.errors import MalformedMessage

#: The replication protocol version this module speaks (Announce).
PROTOCOL_VERSION = 1

ANNOUNCE_TYPE, SYNC_REQUEST_TYPE, ENTRY_TYPE, SYNC_DONE_TYPE, HAVE_TYPE = 0, 1, 2, 3, 10
EMPTY_SET_TYPE, LOWER_BOUND_TYPE, PAYLOAD_TYPE, EMPTY_PAYLOAD_TYPE = 20, 21, 22, 23
DONE_TYPE, FINGERPRINT_TYPE, TERMINAL_TYPE = 24, 25, 26

PUBLIC_KEY_SIZE = 32
#: Bytes of an item key: public key, log id and sequence number (both 8 bytes, big-endian),
#: so byte order is the lexical order of ``(public_key, log_id, seq_num)``.
KEY_SIZE = PUBLIC_KEY_SIZE + 16
#: Bytes at the start of an item key that name its log (public key, log id).
LOG_PREFIX_SIZE = PUBLIC_KEY_SIZE + 8
_MAX_U64 = (1 << 64) - 1

#: System schema ids in p2panda-rs's ``SchemaId`` variant order (they sort before
#: application ids in a schema id set; ``schema_id_set.rs`` lines 30-45).
SYSTEM_SCHEMA_ORDER = (
    "blob_v1",
    "blob_piece_v1",
    "schema_definition_v1",
    "schema_field_definition_v1",
)


class Mode(IntEnum):
    """How a session finds the difference (SyncRequest ``mode``)."""

    LOG_HEIGHT = 0
    SET_RECONCILIATION = 1


def schema_sort_key(schema_id: str) -> tuple[int, int, str, str]:
    """Where ``schema_id`` goes in a schema id set (system first, then by name, view id)."""
    if schema_id in SYSTEM_SCHEMA_ORDER:
        return (0, SYSTEM_SCHEMA_ORDER.index(schema_id), "", "")
    name, _, view = schema_id.partition("_0020")
    return (1, 0, name, view)


def schema_id_set(schema_ids: Iterable[str]) -> tuple[str, ...]:
    """Deduplicated and sorted the way aquadoggo's ``SchemaIdSet::new`` sorts."""
    return tuple(sorted(set(schema_ids), key=schema_sort_key))


def item_key(public_key: bytes, log_id: int, seq_num: int) -> bytes:
    """The reconciliation key of ``(public_key, log_id, seq_num)``."""
    return bytes(public_key) + log_id.to_bytes(8, "big") + seq_num.to_bytes(8, "big")


def key_item(key: bytes) -> tuple[bytes, int, int]:
    """``(public_key, log_id, seq_num)`` of a reconciliation key."""
    return (
        key[:PUBLIC_KEY_SIZE],
        int.from_bytes(key[PUBLIC_KEY_SIZE:LOG_PREFIX_SIZE], "big"),
        int.from_bytes(key[LOG_PREFIX_SIZE:], "big"),
    )


def short_bound(prev: bytes, key: bytes) -> bytes:
    """A range bound between two item keys (``prev < bound <= key``), as short as allowed.

    When the two keys differ within the public key, the bound is the shortest
    prefix of ``key``'s public key that is greater than ``prev`` (a few bytes on
    the wire instead of 32); otherwise ``key`` itself, a full item. The idea is
    negentropy's: its bounds carry only as much of the id as separates the two
    neighbours (hoytech/negentropy ``cpp/negentropy.h`` line 302,
    ``getMinimalBound``, used at line 245 for the cut between two neighbours).
    """
    last = PUBLIC_KEY_SIZE - 1
    if len(prev) > last and prev[last] == key[last] and prev[:last] == key[:last]:
        # Neighbours of one author, common in a split's window (rbsr.SPLIT_WINDOW
        # pairs tried per cut): two comparisons rather than a loop over 32 bytes.
        return key
    for i in range(PUBLIC_KEY_SIZE):
        if i >= len(prev) or prev[i] != key[i]:
            return key[: i + 1] if i + 1 < PUBLIC_KEY_SIZE else key
    return key


@dataclass(frozen=True, slots=True)
class Announce:
    """The schemas a peer is interested in; a newer ``timestamp`` replaces older state."""

    timestamp: int
    schema_ids: tuple[str, ...]
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class SyncRequest:
    """Open session ``session_id`` over ``schema_ids`` in ``mode``."""

    session_id: int
    mode: Mode
    schema_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EntryMessage:
    """One Bamboo entry and its operation."""

    session_id: int
    entry: bytes
    operation: bytes


@dataclass(frozen=True, slots=True)
class SyncDone:
    """The sender sent all it had; ``live_mode`` asks to keep pushing new entries."""

    session_id: int
    live_mode: bool


@dataclass(frozen=True, slots=True)
class Have:
    """Log heights: ``((public_key, ((log_id, seq_num), ...)), ...)``."""

    session_id: int
    log_heights: tuple[tuple[bytes, tuple[tuple[int, int], ...]], ...]


@dataclass(frozen=True, slots=True)
class RangeSync:
    """A set-reconciliation message (types 20-26) of a session; keys are item keys."""

    session_id: int
    message: rbsr.RangeMessage


Message: TypeAlias = "Announce | SyncRequest | EntryMessage | SyncDone | Have | RangeSync"


class RoundContext:
    """What same-author items refer to: per session, the latest whole item's public key.

    One context per direction of a connection (one for what we encode, one for
    what we decode). An item or bound "earlier in the same round" (module
    docstring) is of the same session and direction, in message order; within a
    message, the Payload key comes before its upper bound. A round ends with
    Terminal (26) or EmptySet (20), which forget the public key. Prefix bounds
    and same-author items leave it as it is.

    At most ``max_sessions`` sessions are remembered; beyond that the oldest is
    forgotten (a peer cannot make this grow: its later same-author item for a
    forgotten session is a :class:`MalformedMessage`).
    """

    def __init__(self, max_sessions: int = 256) -> None:
        self.max_sessions = max_sessions
        self._public_keys: dict[int, bytes] = {}

    def public_key(self, session_id: int) -> bytes | None:
        """The public key same-author items of ``session_id``'s current round stand for."""
        return self._public_keys.get(session_id)

    def note(self, session_id: int, public_key: bytes) -> None:
        """A whole item of ``session_id`` with ``public_key`` was written or read."""
        self._public_keys.pop(session_id, None)
        self._public_keys[session_id] = public_key
        if len(self._public_keys) > self.max_sessions:
            del self._public_keys[next(iter(self._public_keys))]

    def end_round(self, session_id: int) -> None:
        """``session_id``'s round ended: nothing to refer to until its next whole item."""
        self._public_keys.pop(session_id, None)


# -- the codec --------------------------------------------------------------------------
# A message is a CBOR array: its type, its session id (all but Announce), then its fields,
# which _FIELDS lists per class in wire order as ``(attribute, reader)``; a set-reconciliation
# message's are those of its rbsr message. A reader takes a CBOR value to a field or raises
# MalformedMessage. Items and bounds are read and written within a round, ``(context,
# session_id)``, so they have writers (_WRITERS); every other field is written as it is.

_Round: TypeAlias = "tuple[RoundContext | None, int]"
_Read: TypeAlias = Callable[[cbor.CBORValue, str, _Round], Any]
_Field: TypeAlias = "tuple[str, _Read]"
_Log: TypeAlias = tuple[bytes, tuple[tuple[int, int], ...]]


def _is_u64(value: object) -> TypeGuard[int]:
    # Decoded CBOR holds exact ints and bools only, and a bool is not an integer here.
    return type(value) is int and 0 <= value <= _MAX_U64


def _u64(value: cbor.CBORValue, what: str, _: object = None) -> int:
    if not _is_u64(value):
        raise MalformedMessage(f"{what} is not an unsigned 64-bit integer")
    return value


def _typed(kind: type, noun: str, size: int | None = None) -> Callable[..., Any]:
    """A reader of ``kind`` values (of ``size`` bytes, if given)."""

    def read(value: cbor.CBORValue, what: str, _: object = None) -> Any:
        if not isinstance(value, kind):
            raise MalformedMessage(f"{what} is not {noun}")
        if size is not None and len(value) != size:  # type: ignore[arg-type]
            raise MalformedMessage(f"a {what} of {len(value)} bytes")  # type: ignore[arg-type]
        return value

    return read


_bool, _bytes = _typed(bool, "a boolean"), _typed(bytes, "a byte string")
_public_key = _typed(bytes, "a byte string", PUBLIC_KEY_SIZE)
_fingerprint = _typed(bytes, "a byte string", rbsr.FINGERPRINT_SIZE)


def _schema_ids(value: cbor.CBORValue, what: str, _: object = None) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise MalformedMessage("schema ids are not a list of strings")
    ids = tuple(str(s) for s in value)
    if ids != schema_id_set(ids):
        # aquadoggo: SchemaIdSetError::UnsortedSchemaIds (schema_id_set.rs).
        raise MalformedMessage("schema ids are unsorted or duplicated")
    return ids


def _target_set(value: cbor.CBORValue, what: str, _: object = None) -> tuple[str, ...]:
    if not (ids := _schema_ids(value, what)):
        raise MalformedMessage("empty target set in sync request message")
    return ids


def _mode(value: cbor.CBORValue, what: str, _: object = None) -> Mode:
    if (mode := _u64(value, what)) not in (0, 1):
        raise MalformedMessage(f"unknown replication mode {mode}")
    return Mode(mode)


def _heights(value: cbor.CBORValue, what: str, _: object = None) -> tuple[_Log, ...]:
    if not isinstance(value, list):
        raise MalformedMessage("log heights are not a list")
    heights: list[_Log] = []
    for group in value:
        if not isinstance(group, list) or len(group) != 2 or not isinstance(group[1], list):
            raise MalformedMessage("log heights are [[public_key, [[log_id, seq_num], ...]], ...]")
        public_key = _public_key(group[0], "public key")
        logs: list[tuple[int, int]] = []
        for pair in group[1]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise MalformedMessage("a log height is [log_id, seq_num]")
            logs.append((_u64(pair[0], "log_id"), _u64(pair[1], "seq_num")))
        heights.append((public_key, tuple(logs)))
    return tuple(heights)


def _item(value: cbor.CBORValue, what: str, r: _Round) -> bytes:
    context, sid = r
    if isinstance(value, list) and len(value) == 2:
        public_key = None if context is None else context.public_key(sid)
        if public_key is None:
            raise MalformedMessage("a same-author item with no whole item before it")
        return item_key(public_key, _u64(value[0], "log_id"), _u64(value[1], "seq_num"))
    if not isinstance(value, list) or len(value) != 3:
        raise MalformedMessage("an item is [public_key, log_id, seq_num] or [log_id, seq_num]")
    public_key = _public_key(value[0], "public key")
    key = item_key(public_key, _u64(value[1], "log_id"), _u64(value[2], "seq_num"))
    if context is not None:
        context.note(sid, public_key)
    return key


def _bound(value: cbor.CBORValue, what: str, r: _Round) -> bytes:
    if isinstance(value, bytes):
        if len(value) >= PUBLIC_KEY_SIZE:
            raise MalformedMessage(f"a bound prefix of {len(value)} bytes")
        return value
    if isinstance(value, list) and len(value) == 3:
        prefix = value[0]
        if isinstance(prefix, bytes) and len(prefix) < PUBLIC_KEY_SIZE:
            if any(type(v) is not int or v != 0 for v in value[1:]):
                raise MalformedMessage("a short bound is [public_key prefix, 0, 0]")
            return prefix
    return _item(value, what, r)


def _write_item(key: bytes, r: _Round) -> cbor.CBORValue:
    (context, sid), (public_key, log_id, seq_num) = r, key_item(key)
    if context is not None:
        if context.public_key(sid) == public_key:
            return [log_id, seq_num]
        context.note(sid, public_key)
    return [public_key, log_id, seq_num]


def _write_bound(bound: bytes, r: _Round) -> cbor.CBORValue:
    if len(bound) < PUBLIC_KEY_SIZE:
        return bound if r[0] is not None else [bound, 0, 0]
    return _write_item(bound, r)


#: The writers of fields read within a round, by reader. Tuples, Mode and bytes are written
#: as they are (cbor writes a tuple as an array).
_WRITERS: dict[_Read, Callable[[bytes, _Round], cbor.CBORValue]] = {
    _item: _write_item,
    _bound: _write_bound,
}
_UPPER: _Field = ("upper_bound", _bound)
#: Message class -> its type and its fields in wire order.
_FIELDS: dict[type, tuple[int, tuple[_Field, ...]]] = {
    Announce: (
        ANNOUNCE_TYPE,
        (("version", _u64), ("timestamp", _u64), ("schema_ids", _schema_ids)),
    ),
    SyncRequest: (SYNC_REQUEST_TYPE, (("mode", _mode), ("schema_ids", _target_set))),
    EntryMessage: (ENTRY_TYPE, (("entry", _bytes), ("operation", _bytes))),
    SyncDone: (SYNC_DONE_TYPE, (("live_mode", _bool),)),
    Have: (HAVE_TYPE, (("log_heights", _heights),)),
    rbsr.EmptySet: (EMPTY_SET_TYPE, (("can_respond", _bool),)),
    rbsr.LowerBound: (LOWER_BOUND_TYPE, (("bound", _bound),)),
    rbsr.Payload: (PAYLOAD_TYPE, (("key", _item), ("can_respond", _bool), _UPPER)),
    rbsr.EmptyPayload: (EMPTY_PAYLOAD_TYPE, (_UPPER,)),
    rbsr.Done: (DONE_TYPE, (_UPPER,)),
    rbsr.Fingerprint: (FINGERPRINT_TYPE, (("fingerprint", _fingerprint), _UPPER)),
    rbsr.Terminal: (TERMINAL_TYPE, ()),
}
#: Type -> class and, per array length, the fields it holds.
_KINDS: dict[int, tuple[type, dict[int, tuple[_Field, ...]]]] = {
    kind: (cls, {len(fields) + (kind != ANNOUNCE_TYPE) + 1: fields})
    for cls, (kind, fields) in _FIELDS.items()
}
# A Payload that is not the last of its range ends after its key.
_KINDS[PAYLOAD_TYPE][1][3] = _FIELDS[rbsr.Payload][1][:1]


def encode(message: Message, context: RoundContext | None = None) -> bytes:
    """The CBOR bytes of ``message``; with ``context`` (the sender's :class:`RoundContext` of
    this connection, which notes what is written) in the short forms of the module docstring."""
    if type(message) is Have and (data := _encode_have(message)) is not None:
        return data
    body: Any = message
    sid: int | None = getattr(message, "session_id", None)
    if type(message) is RangeSync:
        body = message.message
        if type(body) in (rbsr.EmptySet, rbsr.Terminal) and context is not None:
            context.end_round(message.session_id)
    kind, fields = _FIELDS[type(body)]
    if type(body) is rbsr.Payload and body.upper_bound is None:
        fields = fields[:1]
    r = (context, sid or 0)
    out: list[cbor.CBORValue] = [kind] if sid is None else [kind, sid]
    for name, read in fields:  # a loop, not a comprehension: no closure cells per call
        write = _WRITERS.get(read)
        out.append(getattr(body, name) if write is None else write(getattr(body, name), r))
    return cbor.encode(out)


#: ``[2, session_id`` of an Entry message, per session id (a handful per connection).
_ENTRY_PREFIXES: dict[int, bytes] = {}
#: Heads of byte strings under 256 bytes (every entry, most operations).
_STRING_HEADS = tuple(_head(2, n) for n in range(256))


def encode_entry(session_id: int, entry: bytes, operation: bytes) -> bytes:
    """The bytes of ``encode(EntryMessage(session_id, entry, operation))``: a catch-up writes
    one per entry, so they are joined from a cached ``[2, session_id`` prefix and two byte
    string heads rather than walked as a value."""
    prefix = _ENTRY_PREFIXES.get(session_id)
    if prefix is None:
        if not _is_u64(session_id):
            raise ValueError("a session id is an unsigned 64-bit integer")
        prefix = b"\x84" + _head(0, ENTRY_TYPE) + _head(0, session_id)
        if len(_ENTRY_PREFIXES) < 1024:
            _ENTRY_PREFIXES[session_id] = prefix
    n, m = len(entry), len(operation)
    entry_head = _STRING_HEADS[n] if n < 256 else _head(2, n)
    operation_head = _STRING_HEADS[m] if m < 256 else _head(2, m)
    return b"".join((prefix, entry_head, entry, operation_head, operation))


def _encode_have(message: Have) -> bytes | None:
    """A Have written directly (it lists every log: thousands of small arrays); ``None``
    if it holds anything but byte strings and u64 integers (:mod:`cbor` decides those)."""
    if not _is_u64(message.session_id):
        return None
    out = [b"\x83", _head(0, HAVE_TYPE), _head(0, message.session_id)]
    out.append(_head(4, len(message.log_heights)))
    uint = _SMALL_HEADS  # cbor's one-byte heads: of major 0, indexed by the argument
    for public_key, logs in message.log_heights:
        if type(public_key) is not bytes:
            return None
        out += (b"\x82", _head(2, len(public_key)), public_key, _head(4, len(logs)))
        for log_id, seq_num in logs:
            if type(log_id) is not int or type(seq_num) is not int:
                return None
            if not (0 <= log_id <= _MAX_U64 and 0 <= seq_num <= _MAX_U64):
                return None
            out += (
                b"\x82",
                uint[log_id] if log_id < 24 else _head(0, log_id),
                uint[seq_num] if seq_num < 24 else _head(0, seq_num),
            )
    return b"".join(out)


def decode(data: bytes, context: RoundContext | None = None) -> Message:
    """Decode one message; raise :class:`MalformedMessage` for anything else. ``context``
    (the receiver's :class:`RoundContext` of this connection, fed every message of it in
    order) resolves same-author items; without it they are malformed."""
    if (parts := entry_parts(data)) is not None:
        return EntryMessage(*parts)
    return _decode(data, context)


def entry_parts(data: bytes) -> tuple[int, bytes, bytes] | None:
    """``(session_id, entry, operation)`` of the common Entry frame, else ``None``.

    The fast path of :func:`decode` (a catch-up is thousands of Entry
    messages): it reads ``[2, session_id, entry, operation]`` straight from the
    CBOR heads (array of 4, type 2, an unsigned session id and two byte strings
    filling the rest, every argument in its shortest form) and slices out the
    two strings. Anything else, valid or not, gives ``None``: :func:`decode`
    then decides it, so what is accepted and every error are the general
    decoder's. A bytes-like ``data`` other than ``bytes`` also gives ``None``.
    """
    n = len(data)
    # 0x84: array of 4; 0x02: the Entry type. One bytes comparison covers both.
    if n < 5 or data[:2] != b"\x84\x02" or type(data) is not bytes:
        return None
    # Session id: major 0, shortest argument (below 24 in the head, else 1 or 2 bytes).
    sid = data[2]
    pos = 3
    if sid >= 24:
        if sid == 0x18 and data[3] >= 24:
            sid, pos = data[3], 4
        elif sid == 0x19 and n > 5 and data[3]:
            sid, pos = (data[3] << 8) | data[4], 5
        else:
            return None
    entry = cbor.string_span(data, pos, 2)
    # An entry is under 256 bytes: one with a longer length goes to the general decoder.
    if entry is None or entry[0] - pos > 2:
        return None
    start, end = entry
    operation = cbor.string_span(data, end, 2)
    if operation is None or operation[1] != n:
        return None
    return sid, data[start:end], data[operation[0] :]


def _decode(data: bytes, context: RoundContext | None) -> Message:
    """:func:`decode` without its Entry fast path: the general decoder."""
    try:
        value = cbor.decode(data, max_depth=5)
    except DocumentError as exc:
        raise MalformedMessage(f"not CBOR the protocol uses: {exc}") from exc
    if not isinstance(value, list) or not value:
        raise MalformedMessage("a message is a non-empty CBOR array")
    kind = _u64(value[0], "the message type")
    if kind not in _KINDS:
        raise MalformedMessage(f"unknown message type {kind}")
    cls, arities = _KINDS[kind]
    sid, start = 0, 1
    if kind != ANNOUNCE_TYPE:
        if len(value) < 2 or not _is_u64(value[1]):
            raise MalformedMessage(f"type {kind}: missing or invalid session id")
        sid, start = value[1], 2
    fields = arities.get(len(value))
    if fields is None:
        expected = " or ".join(map(str, sorted(arities)))
        raise MalformedMessage(f"type {kind}: {len(value)} elements, expected {expected}")
    r = (context, sid)
    values = []
    for i, (name, read) in enumerate(fields, start):  # no closure cells, as in encode
        values.append(read(value[i], name, r))
    if kind < EMPTY_SET_TYPE:
        if kind == ANNOUNCE_TYPE:
            return Announce(**{name: v for (name, _), v in zip(fields, values, strict=True)})
        return cls(sid, *values)  # type: ignore[no-any-return]
    if kind in (EMPTY_SET_TYPE, TERMINAL_TYPE) and context is not None:
        context.end_round(sid)
    return RangeSync(sid, cls(*values))


__all__ = [
    "KEY_SIZE",
    "PROTOCOL_VERSION",
    "Announce",
    "EntryMessage",
    "Have",
    "Message",
    "Mode",
    "RangeSync",
    "RoundContext",
    "SyncDone",
    "SyncRequest",
    "decode",
    "encode",
    "encode_entry",
    "entry_parts",
    "item_key",
    "key_item",
    "schema_id_set",
    "schema_sort_key",
    "short_bound",
]
