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
their layout is the spec's, with items ``[public_key, log_id, seq_num]`` where
the public key is a byte string like everywhere else in aquadoggo's encoding,
and the fingerprint (the spec's ``lift_type {TODO}``) a 16-byte string
(:mod:`sdk.sync.rbsr`). A Payload carries ``can_respond`` and ``upper_bound``
only on the last item of a range (3 or 5 elements).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TypeAlias

from sdk.documents import cbor
from sdk.documents.errors import DocumentError
from sdk.sync import rbsr
from sdk.sync.errors import MalformedMessage

#: The replication protocol version this module speaks (Announce).
PROTOCOL_VERSION = 1

ANNOUNCE_TYPE = 0
SYNC_REQUEST_TYPE = 1
ENTRY_TYPE = 2
SYNC_DONE_TYPE = 3
HAVE_TYPE = 10
EMPTY_SET_TYPE = 20
LOWER_BOUND_TYPE = 21
PAYLOAD_TYPE = 22
EMPTY_PAYLOAD_TYPE = 23
DONE_TYPE = 24
FINGERPRINT_TYPE = 25
TERMINAL_TYPE = 26

PUBLIC_KEY_SIZE = 32
#: Bytes of an item key: public key, log id and sequence number (both 8 bytes, big-endian),
#: so byte order is the lexical order of ``(public_key, log_id, seq_num)``.
KEY_SIZE = PUBLIC_KEY_SIZE + 16
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


def schema_id_set(schema_ids: tuple[str, ...] | list[str] | set[str]) -> tuple[str, ...]:
    """Deduplicated and sorted the way aquadoggo's ``SchemaIdSet::new`` sorts."""
    return tuple(sorted(set(schema_ids), key=schema_sort_key))


def item_key(public_key: bytes, log_id: int, seq_num: int) -> bytes:
    """The reconciliation key of ``(public_key, log_id, seq_num)``."""
    return bytes(public_key) + log_id.to_bytes(8, "big") + seq_num.to_bytes(8, "big")


def key_item(key: bytes) -> tuple[bytes, int, int]:
    """``(public_key, log_id, seq_num)`` of a reconciliation key."""
    return (
        key[:PUBLIC_KEY_SIZE],
        int.from_bytes(key[PUBLIC_KEY_SIZE : PUBLIC_KEY_SIZE + 8], "big"),
        int.from_bytes(key[PUBLIC_KEY_SIZE + 8 :], "big"),
    )


def short_bound(prev: bytes, key: bytes) -> bytes:
    """A range bound between two item keys (``prev < bound <= key``), as short as allowed.

    When the two keys differ within the public key, the bound is the shortest
    prefix of ``key``'s public key that is greater than ``prev``; on the wire it
    is ``[prefix, 0, 0]`` (a few bytes instead of 32). Otherwise it is ``key``
    itself, a full item. The idea is negentropy's: its bounds carry only as
    much of the id as separates the two neighbours (hoytech/negentropy
    ``cpp/negentropy.h`` line 302, ``getMinimalBound``, used at line 245 for the
    cut between two neighbours).
    """
    for i in range(min(len(prev), PUBLIC_KEY_SIZE)):
        if prev[i] != key[i]:
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


SessionMessage: TypeAlias = "SyncRequest | EntryMessage | SyncDone | Have | RangeSync"
Message: TypeAlias = "Announce | SessionMessage"


# -- encoding ---------------------------------------------------------------------------


def _item(key: bytes) -> list[cbor.CBORValue]:
    public_key, log_id, seq_num = key_item(key)
    return [public_key, log_id, seq_num]


def _bound_item(bound: bytes) -> list[cbor.CBORValue]:
    """A range bound: an item, or ``[public_key prefix, 0, 0]`` (:func:`short_bound`)."""
    if len(bound) < PUBLIC_KEY_SIZE:
        return [bound, 0, 0]
    return _item(bound)


def encode(message: Message) -> bytes:
    """The CBOR bytes of ``message``."""
    return cbor.encode(_plain(message))


def _plain(message: Message) -> list[cbor.CBORValue]:
    if isinstance(message, Announce):
        return [ANNOUNCE_TYPE, message.version, message.timestamp, list(message.schema_ids)]
    sid = message.session_id
    if isinstance(message, SyncRequest):
        return [SYNC_REQUEST_TYPE, sid, int(message.mode), list(message.schema_ids)]
    if isinstance(message, EntryMessage):
        return [ENTRY_TYPE, sid, message.entry, message.operation]
    if isinstance(message, SyncDone):
        return [SYNC_DONE_TYPE, sid, message.live_mode]
    if isinstance(message, Have):
        heights: list[cbor.CBORValue] = [
            [pk, [[log_id, seq] for log_id, seq in logs]] for pk, logs in message.log_heights
        ]
        return [HAVE_TYPE, sid, heights]
    m = message.message
    if isinstance(m, rbsr.EmptySet):
        return [EMPTY_SET_TYPE, sid, m.can_respond]
    if isinstance(m, rbsr.LowerBound):
        return [LOWER_BOUND_TYPE, sid, _bound_item(m.bound)]
    if isinstance(m, rbsr.Payload):
        if m.upper_bound is None:
            return [PAYLOAD_TYPE, sid, _item(m.key)]
        return [PAYLOAD_TYPE, sid, _item(m.key), m.can_respond, _bound_item(m.upper_bound)]
    if isinstance(m, rbsr.EmptyPayload):
        return [EMPTY_PAYLOAD_TYPE, sid, _bound_item(m.upper_bound)]
    if isinstance(m, rbsr.Done):
        return [DONE_TYPE, sid, _bound_item(m.upper_bound)]
    if isinstance(m, rbsr.Fingerprint):
        return [FINGERPRINT_TYPE, sid, m.fingerprint, _bound_item(m.upper_bound)]
    return [TERMINAL_TYPE, sid]


# -- decoding ---------------------------------------------------------------------------


def decode(data: bytes) -> Message:
    """Decode one message; raise :class:`MalformedMessage` for anything else."""
    try:
        value = cbor.decode(data, max_depth=5)
    except DocumentError as exc:
        raise MalformedMessage(f"not CBOR the protocol uses: {exc}") from exc
    if not isinstance(value, list) or not value:
        raise MalformedMessage("a message is a non-empty CBOR array")
    kind = _u64(value[0], "the message type")
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise MalformedMessage(f"unknown message type {kind}")
    if kind != ANNOUNCE_TYPE and (len(value) < 2 or not _is_u64(value[1])):
        raise MalformedMessage(f"type {kind}: missing or invalid session id")
    return decoder(value)


def _is_u64(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_U64


def _arity(value: list[cbor.CBORValue], *sizes: int) -> None:
    if len(value) not in sizes:
        raise MalformedMessage(
            f"type {value[0]!r}: {len(value)} elements, expected {' or '.join(map(str, sizes))}"
        )


def _u64(value: cbor.CBORValue, what: str) -> int:
    if not _is_u64(value):
        raise MalformedMessage(f"{what} is not an unsigned 64-bit integer")
    assert isinstance(value, int)
    return value


def _bool(value: cbor.CBORValue, what: str) -> bool:
    if not isinstance(value, bool):
        raise MalformedMessage(f"{what} is not a boolean")
    return value


def _bytes(value: cbor.CBORValue, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise MalformedMessage(f"{what} is not a byte string")
    return value


def _schema_ids(value: cbor.CBORValue) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise MalformedMessage("schema ids are not a list of strings")
    ids = tuple(str(s) for s in value)
    if ids != schema_id_set(ids):
        # aquadoggo: SchemaIdSetError::UnsortedSchemaIds (schema_id_set.rs).
        raise MalformedMessage("schema ids are unsorted or duplicated")
    return ids


def _key(value: cbor.CBORValue) -> bytes:
    if not isinstance(value, list) or len(value) != 3:
        raise MalformedMessage("an item is [public_key, log_id, seq_num]")
    public_key = _bytes(value[0], "an item's public key")
    if len(public_key) != PUBLIC_KEY_SIZE:
        raise MalformedMessage(f"a public key of {len(public_key)} bytes")
    return item_key(public_key, _u64(value[1], "log_id"), _u64(value[2], "seq_num"))


def _bound(value: cbor.CBORValue) -> bytes:
    """A range bound: an item, or a public key prefix with log id and seq num 0."""
    if (
        isinstance(value, list)
        and len(value) == 3
        and isinstance(value[0], bytes)
        and len(value[0]) < PUBLIC_KEY_SIZE
    ):
        if any(type(v) is not int or v != 0 for v in value[1:]):
            raise MalformedMessage("a short bound is [public_key prefix, 0, 0]")
        return bytes(value[0])
    return _key(value)


def _announce(v: list[cbor.CBORValue]) -> Message:
    _arity(v, 4)
    return Announce(
        version=_u64(v[1], "version"), timestamp=_u64(v[2], "timestamp"),
        schema_ids=_schema_ids(v[3]),
    )  # fmt: skip


def _sync_request(v: list[cbor.CBORValue]) -> Message:
    _arity(v, 4)
    mode = _u64(v[2], "mode")
    if mode not in (0, 1):
        raise MalformedMessage(f"unknown replication mode {mode}")
    ids = _schema_ids(v[3])
    if not ids:
        raise MalformedMessage("empty target set in sync request message")
    return SyncRequest(int(v[1]), Mode(mode), ids)  # type: ignore[arg-type]


def _entry(v: list[cbor.CBORValue]) -> Message:
    _arity(v, 4)
    return EntryMessage(int(v[1]), _bytes(v[2], "entry"), _bytes(v[3], "operation"))  # type: ignore[arg-type]


def _sync_done(v: list[cbor.CBORValue]) -> Message:
    _arity(v, 3)
    return SyncDone(int(v[1]), _bool(v[2], "live_mode"))  # type: ignore[arg-type]


def _have(v: list[cbor.CBORValue]) -> Message:
    _arity(v, 3)
    groups = v[2]
    if not isinstance(groups, list):
        raise MalformedMessage("log heights are not a list")
    heights: list[tuple[bytes, tuple[tuple[int, int], ...]]] = []
    for group in groups:
        if not isinstance(group, list) or len(group) != 2 or not isinstance(group[1], list):
            raise MalformedMessage("log heights are [[public_key, [[log_id, seq_num], ...]], ...]")
        public_key = _bytes(group[0], "a public key")
        if len(public_key) != PUBLIC_KEY_SIZE:
            raise MalformedMessage(f"a public key of {len(public_key)} bytes")
        logs: list[tuple[int, int]] = []
        for pair in group[1]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise MalformedMessage("a log height is [log_id, seq_num]")
            logs.append((_u64(pair[0], "log_id"), _u64(pair[1], "seq_num")))
        heights.append((public_key, tuple(logs)))
    return Have(int(v[1]), tuple(heights))  # type: ignore[arg-type]


def _range(v: list[cbor.CBORValue]) -> Message:
    kind, sid = v[0], int(v[1])  # type: ignore[arg-type]
    m: rbsr.RangeMessage
    if kind == EMPTY_SET_TYPE:
        _arity(v, 3)
        m = rbsr.EmptySet(_bool(v[2], "can_respond"))
    elif kind == LOWER_BOUND_TYPE:
        _arity(v, 3)
        m = rbsr.LowerBound(_bound(v[2]))
    elif kind == PAYLOAD_TYPE:
        _arity(v, 3, 5)
        if len(v) == 3:
            m = rbsr.Payload(_key(v[2]))
        else:
            m = rbsr.Payload(_key(v[2]), _bool(v[3], "can_respond"), _bound(v[4]))
    elif kind in (EMPTY_PAYLOAD_TYPE, DONE_TYPE):
        _arity(v, 3)
        bound = _bound(v[2])
        m = rbsr.EmptyPayload(bound) if kind == EMPTY_PAYLOAD_TYPE else rbsr.Done(bound)
    elif kind == FINGERPRINT_TYPE:
        _arity(v, 4)
        fp = _bytes(v[2], "fingerprint")
        if len(fp) != rbsr.FINGERPRINT_SIZE:
            raise MalformedMessage(f"a fingerprint of {len(fp)} bytes")
        m = rbsr.Fingerprint(fp, _bound(v[3]))
    else:
        _arity(v, 2)
        m = rbsr.Terminal()
    return RangeSync(sid, m)


_DECODERS = {
    ANNOUNCE_TYPE: _announce,
    SYNC_REQUEST_TYPE: _sync_request,
    ENTRY_TYPE: _entry,
    SYNC_DONE_TYPE: _sync_done,
    HAVE_TYPE: _have,
    **dict.fromkeys(range(EMPTY_SET_TYPE, TERMINAL_TYPE + 1), _range),
}


__all__ = [
    "KEY_SIZE",
    "PROTOCOL_VERSION",
    "Announce",
    "EntryMessage",
    "Have",
    "Message",
    "Mode",
    "RangeSync",
    "SessionMessage",
    "SyncDone",
    "SyncRequest",
    "decode",
    "encode",
    "item_key",
    "key_item",
    "schema_id_set",
    "schema_sort_key",
    "short_bound",
]
