"""p2panda operations: CREATE, UPDATE and DELETE, and their CBOR encoding.

An operation is the CBOR array (p2panda specification, "Operation Format";
the encoding of p2panda-rs 0.8, which the vectors pin)::

    CREATE  [version, 0, schema_id, fields]
    UPDATE  [version, 1, schema_id, previous, fields]
    DELETE  [version, 2, schema_id, previous]

``version`` is 1, ``schema_id`` a text string, ``previous`` the document view id
the author saw: a non-empty array of operation ids, each a 34-byte YASMF hash as
a CBOR byte string, sorted and without duplicates. ``fields`` is a map from
field name to value, keys in plain string order (see :mod:`.cbor`):

=====================  ==========================================  ======================
field type             Python value                                CBOR
=====================  ==========================================  ======================
``bool``               ``bool``                                    true / false
``int``                ``int`` (i64)                               integer
``float``              ``float`` (f64)                             shortest lossless float
``str``                ``str``                                     text string
``bytes``              ``bytes``                                   byte string
``relation``           :class:`Relation`                           hash as byte string
``relation_list``      :class:`RelationList`                       array of hashes
``pinned_relation``    :class:`PinnedRelation`                     array of hashes
``pinned_relation_list`` :class:`PinnedRelationList`               array of arrays
=====================  ==========================================  ======================

A peer's bytes are *plain*: a 34-byte string could be ``bytes`` or a relation,
an array of hashes a relation list or a pinned relation. :func:`decode_operation`
returns plain values (``bytes``, ``tuple[bytes, ...]``,
``tuple[tuple[bytes, ...], ...]``); the schema resolves them
(:meth:`sdk.documents.schema.Schema.resolve`). Both forms encode to the same bytes.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache
from typing import TypeAlias

from sdk.documents import cbor
from sdk.documents.errors import (
    DocumentError,
    HashError,
    OperationFormatError,
    SizeLimitExceeded,
    UsageError,
)
from sdk.documents.hashing import HASH_SIZE, YASMF_BLAKE3_PREFIX, check_hash_id
from sdk.documents.limits import (
    MAX_CBOR_DEPTH,
    MAX_FIELD_NAME_LENGTH,
    MAX_FIELDS,
    MAX_LIST_LENGTH,
    MAX_OPERATION_SIZE,
    MAX_VALUE_SIZE,
)

#: The only operation format version (p2panda specification, "Operation Version").
OPERATION_VERSION = 1

#: p2panda field names: a letter, then up to 63 letters, digits or underscores.
FIELD_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
#: Schema ids: an application name and a view id, or a system schema name.
_SCHEMA_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}[A-Za-z0-9]")
_SYSTEM_SCHEMA_RE = re.compile(r"[a-z][a-z_]*_v[0-9]+")


class Action(IntEnum):
    """The operation action (p2panda specification, "Operation Actions")."""

    CREATE = 0
    UPDATE = 1
    DELETE = 2


@dataclass(frozen=True, slots=True)
class Relation:
    """A ``relation`` value: the id of another document."""

    document_id: str

    def __post_init__(self) -> None:
        check_hash_id(self.document_id)


@dataclass(frozen=True, slots=True)
class RelationList:
    """A ``relation_list`` value: ids of other documents, order kept."""

    document_ids: tuple[str, ...]

    def __post_init__(self) -> None:
        for document_id in self.document_ids:
            check_hash_id(document_id)


@dataclass(frozen=True, slots=True)
class PinnedRelation:
    """A ``pinned_relation`` value: a view id (sorted operation ids) of another document."""

    view_id: tuple[str, ...]

    def __post_init__(self) -> None:
        check_view_id(self.view_id)


@dataclass(frozen=True, slots=True)
class PinnedRelationList:
    """A ``pinned_relation_list`` value: view ids of other documents, order kept."""

    view_ids: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        for view_id in self.view_ids:
            check_view_id(view_id)


PlainList: TypeAlias = tuple[bytes, ...]
FieldValue: TypeAlias = (
    "bool | int | float | str | bytes | Relation | RelationList | PinnedRelation "
    "| PinnedRelationList | PlainList | tuple[PlainList, ...]"
)
"""A field value: typed (built locally or resolved by a schema) or plain (decoded)."""


def check_view_id(view_id: tuple[str, ...]) -> tuple[str, ...]:
    """Return ``view_id`` if it is non-empty, sorted, unique hash ids; else raise.

    A document view id is a set of operation ids; p2panda encodes it sorted so
    one view has one encoding (and one schema id).
    """
    if not view_id:
        raise OperationFormatError("a document view id holds at least one operation id")
    if len(view_id) > MAX_LIST_LENGTH:
        raise SizeLimitExceeded(f"view id of {len(view_id)} ids, limit {MAX_LIST_LENGTH}")
    for operation_id in view_id:
        check_hash_id(operation_id)
    if any(a >= b for a, b in itertools.pairwise(view_id)):
        raise OperationFormatError("operation ids in a view id must be sorted and unique")
    return view_id


def check_schema_id(schema_id: str) -> str:
    """Return ``schema_id`` if it has the form ``<name>_<view id>`` or ``<system>_v<n>``."""
    _check_schema_id(schema_id)
    return schema_id


@lru_cache(maxsize=1024)
def _check_schema_id(schema_id: str) -> None:
    """Raise unless ``schema_id`` is well formed; cached, as every operation names one
    of a few schemas (an error is raised again each time, not cached)."""
    name, _, rest = schema_id.partition("_0020")
    if rest:
        if not _SCHEMA_NAME_RE.fullmatch(name):
            raise OperationFormatError(f"schema name {name[:80]!r} is not allowed")
        check_view_id(tuple(("0020" + rest).split("_")))
        return
    if not _SYSTEM_SCHEMA_RE.fullmatch(schema_id):
        raise OperationFormatError(f"{schema_id[:80]!r} is not a schema id")


def check_field_name(name: str) -> str:
    """Return ``name`` if it is an allowed p2panda field name, else raise."""
    if not _is_field_name(name):
        raise OperationFormatError(f"field name {name[:80]!r} is not allowed")
    return name


@lru_cache(maxsize=1024)
def _is_field_name(name: str) -> bool:
    """Whether ``name`` matches :data:`FIELD_NAME_RE`; cached, as every operation of a
    schema names the same few fields."""
    return FIELD_NAME_RE.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation, as built locally or decoded from a peer.

    ``previous`` is the document view id the author built on (``None`` for
    CREATE). ``fields`` is ``None`` for DELETE.
    """

    action: Action
    schema_id: str
    previous: tuple[str, ...] | None = None
    fields: Mapping[str, FieldValue] | None = field(default=None)
    version: int = OPERATION_VERSION

    def __post_init__(self) -> None:
        if self.version != OPERATION_VERSION:
            raise OperationFormatError(f"operation version {self.version}, only 1 exists")
        check_schema_id(self.schema_id)
        if self.action is Action.CREATE:
            if self.previous is not None:
                raise OperationFormatError("CREATE has no previous")
        elif self.previous is None:
            raise OperationFormatError(f"{self.action.name} needs previous")
        else:
            check_view_id(self.previous)
        if self.action is Action.DELETE:
            if self.fields is not None:
                raise OperationFormatError("DELETE has no fields")
        elif not self.fields:
            raise OperationFormatError(f"{self.action.name} needs at least one field")
        else:
            if len(self.fields) > MAX_FIELDS:
                raise SizeLimitExceeded(f"{len(self.fields)} fields, limit {MAX_FIELDS}")
            for name in self.fields:
                check_field_name(name)


def with_fields(operation: Operation, fields: Mapping[str, FieldValue]) -> Operation:
    """``operation`` with ``fields`` instead of its fields, not checked again.

    For a schema's typed values of a checked operation: the same field names,
    so every rule of :meth:`Operation.__post_init__` still holds.
    """
    if fields.keys() != (operation.fields or {}).keys():
        raise UsageError("with_fields keeps the operation's field names")
    new = object.__new__(Operation)
    for name, value in (
        ("action", operation.action),
        ("schema_id", operation.schema_id),
        ("previous", operation.previous),
        ("fields", fields),
        ("version", operation.version),
    ):
        object.__setattr__(new, name, value)
    return new


def _is_i64(value: int) -> bool:
    return -(1 << 63) <= value < (1 << 63)


def _id_bytes(value: str) -> bytes:
    return bytes.fromhex(value)


def _plain(value: FieldValue) -> cbor.CBORValue:
    """The CBOR value of a field (p2panda-rs 0.8 ``PlainValue``)."""
    if isinstance(value, Relation):
        return _id_bytes(value.document_id)
    if isinstance(value, RelationList):
        return [_id_bytes(i) for i in value.document_ids]
    if isinstance(value, PinnedRelation):
        return [_id_bytes(i) for i in value.view_id]
    if isinstance(value, PinnedRelationList):
        return [[_id_bytes(i) for i in view] for view in value.view_ids]
    if isinstance(value, str | bytes) and len(value) > MAX_VALUE_SIZE:
        raise SizeLimitExceeded(f"field value of {len(value)}, limit {MAX_VALUE_SIZE}")
    if isinstance(value, int) and not isinstance(value, bool) and not _is_i64(value):
        raise SizeLimitExceeded("int fields are 64-bit signed")
    return value


def encode_operation(operation: Operation) -> bytes:
    """Encode ``operation`` byte for byte as the p2panda reference does."""
    array: list[cbor.CBORValue] = [
        operation.version,
        int(operation.action),
        operation.schema_id,
    ]
    if operation.previous is not None:
        array.append([_id_bytes(i) for i in operation.previous])
    if operation.fields is not None:
        array.append({name: _plain(v) for name, v in operation.fields.items()})
    data = cbor.encode(array)
    if len(data) > MAX_OPERATION_SIZE:
        raise SizeLimitExceeded(f"operation of {len(data)} bytes, limit {MAX_OPERATION_SIZE}")
    return data


def _hash_from_cbor(value: cbor.CBORValue) -> str:
    if not isinstance(value, bytes) or len(value) != HASH_SIZE:
        raise HashError("expected a 34-byte YASMF hash as a byte string")
    if value[:2] != YASMF_BLAKE3_PREFIX:
        raise HashError("hash is not YASMF BLAKE3 (type 0, length 32)")
    return value.hex()


def _is_hash(value: cbor.CBORValue) -> bool:
    return isinstance(value, bytes) and len(value) == HASH_SIZE and value[:2] == b"\x00\x20"


def _plain_value_from_cbor(name: str, value: cbor.CBORValue) -> FieldValue:
    """Check one decoded field value against the plain value shapes."""
    if isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 63):
            raise SizeLimitExceeded(f"field {name!r}: integer outside i64")
        return value
    if isinstance(value, str | bytes):
        if len(value) > MAX_VALUE_SIZE:
            raise SizeLimitExceeded(f"field {name!r}: {len(value)} bytes, limit {MAX_VALUE_SIZE}")
        return value
    if isinstance(value, list):
        if len(value) > MAX_LIST_LENGTH:
            raise SizeLimitExceeded(
                f"field {name!r}: list of {len(value)}, limit {MAX_LIST_LENGTH}"
            )
        # p2panda-rs tries "list of hashes" first, then "list of lists of hashes".
        if all(_is_hash(item) for item in value):
            return tuple(item for item in value if isinstance(item, bytes))
        lists: list[PlainList] = []
        for item in value:
            if not isinstance(item, list) or not all(_is_hash(i) for i in item):
                raise OperationFormatError(
                    f"field {name!r}: lists hold hashes or lists of hashes only"
                )
            if len(item) > MAX_LIST_LENGTH:
                raise SizeLimitExceeded(f"field {name!r}: inner list over {MAX_LIST_LENGTH}")
            lists.append(tuple(i for i in item if isinstance(i, bytes)))
        return tuple(lists)
    raise OperationFormatError(f"field {name!r}: unsupported value")


_ACTIONS = tuple(Action)


def is_create(data: bytes) -> bool:
    """Whether canonically encoded operation bytes are a CREATE, read from the header only.

    A CREATE is ``[1, 0, schema_id, fields]``: array of 4 (``0x84``), version 1,
    action 0. For operations already validated (e.g. read back from the store)
    this answers without decoding them; for anything else use
    :func:`decode_operation`.
    """
    return data[:3] == b"\x84\x01\x00"


def decode_operation(data: bytes) -> Operation:
    """Decode an operation from a peer's bytes, with plain field values.

    Strict: only the canonical encoding (:func:`encode_operation` of the result
    gives ``data`` back) is accepted. Raises only
    :class:`~sdk.documents.errors.MalformedInput` subclasses.
    """
    if len(data) > MAX_OPERATION_SIZE:
        raise SizeLimitExceeded(f"operation of {len(data)} bytes, limit {MAX_OPERATION_SIZE}")
    operation = _decode_common(data)
    if operation is not None:
        return operation
    return _decode_general(data)


def _decode_common(data: bytes) -> Operation | None:
    """The common CREATE or UPDATE read straight from its bytes, else ``None``.

    The fast path of :func:`decode_operation`: ``[1, action, schema_id,
    (previous,) fields]`` with a schema id, previous and field names in their
    usual forms, each field value read inline (small integers, booleans, short
    text) or by the CBOR decoder. It returns an operation only when every rule
    of :func:`_decode_general` holds for ``data``, so the result is the one
    :func:`_decode_general` gives; anything else (errors included) gives
    ``None``, and :func:`_decode_general` decides.
    """
    n = len(data)
    if n < 6 or data[1] != 1 or type(data) is not bytes:
        return None
    # Array of 4 with action 0 (CREATE) or of 5 with action 1 (UPDATE), version 1.
    head, action = data[0], data[2]
    if head == 0x84:
        if action != 0:
            return None
    elif head != 0x85 or action != 1:
        return None
    # The schema id: a text string, its length in the shortest form.
    span = cbor.string_span(data, 3, 3)
    if span is None or span[1] >= n:
        return None
    start, end = span
    raw = data[start:end]
    schema_id = _SCHEMA_IDS.get(raw)
    if schema_id is None:
        try:
            schema_id = raw.decode("utf-8")
            _check_schema_id(schema_id)
        except (UnicodeDecodeError, DocumentError):
            return None
        _remember(_SCHEMA_IDS, raw, schema_id)
    pos = end
    previous: tuple[str, ...] | None = None
    if action == 1:
        # Previous: 1 to 23 byte strings of 34 bytes, each a YASMF-BLAKE3 hash
        # (58 22 00 20 ...), sorted and unique.
        count = data[pos] - 0x80
        if not 0 < count < 24:
            return None
        pos += 1
        ids: list[str] = []
        for _ in range(count):
            end = pos + 2 + HASH_SIZE
            if end > n or data[pos : pos + 4] != _HASH_HEAD:
                return None
            ids.append(data[pos + 2 : end].hex())
            pos = end
        if count > 1 and any(a >= b for a, b in itertools.pairwise(ids)):
            return None
        previous = tuple(ids)
        if pos >= n:
            return None
    # Fields: a map of 1 to 255 entries (a count over 23 in one byte, shortest form).
    count = data[pos] - 0xA0
    pos += 1
    if count >= 24:
        if count != 24 or pos >= n or data[pos] < 24:
            return None
        count = data[pos]
        pos += 1
    elif count < 1:
        return None
    fields: dict[str, FieldValue] = {}
    name = ""
    decoder: cbor._Decoder | None = None
    for _ in range(count):
        # A field name: text of 1 to 64 bytes, its length in the shortest form;
        # greater than the one before; an allowed name.
        span = cbor.string_span(data, pos, 3)
        if span is None:
            return None
        start, end = span
        if not 0 < end - start <= MAX_FIELD_NAME_LENGTH or end >= n:
            return None
        raw = data[start:end]
        key = _FIELD_NAMES.get(raw)
        if key is None:
            try:
                key = raw.decode("utf-8")
            except UnicodeDecodeError:
                return None
            if not _is_field_name(key):
                return None
            _remember(_FIELD_NAMES, raw, key)
        if key <= name:
            return None
        name = key
        pos = end
        # A value: a small unsigned integer, a boolean or short text inline; anything
        # else through the CBOR decoder and the plain value rules.
        head = data[pos]
        if head < 0x18:
            fields[key] = head
            pos += 1
        elif head == 0xF4 or head == 0xF5:
            fields[key] = head == 0xF5
            pos += 1
        elif 0x60 <= head < 0x78 and pos + 1 + head - 0x60 <= n:
            end = pos + 1 + head - 0x60
            try:
                fields[key] = data[pos + 1 : end].decode("utf-8")
            except UnicodeDecodeError:
                return None
            pos = end
        else:
            if decoder is None:
                decoder = cbor._Decoder(data, MAX_CBOR_DEPTH)
            try:
                value, pos = decoder.item(pos, 2)
                fields[key] = _plain_value_from_cbor(key, value)
            except DocumentError:
                return None
    if pos != n:
        return None
    operation = _new_operation(Operation)
    _set_action(operation, _ACTIONS[action])
    _set_schema_id(operation, schema_id)
    _set_previous(operation, previous)
    _set_fields(operation, fields)
    _set_version(operation, OPERATION_VERSION)
    return operation


#: Schema ids and field names _decode_common has read and found well formed, by
#: their bytes: the operations of a catch-up name a few schemas and their fields.
_SCHEMA_IDS: dict[bytes, str] = {}
_FIELD_NAMES: dict[bytes, str] = {}
#: At most this many of each are kept (a schema id read here is under 64 KiB).
_REMEMBER = 256


def _remember(known: dict[bytes, str], raw: bytes, text: str) -> None:
    if len(known) >= _REMEMBER:
        known.clear()
    known[raw] = text


#: The head of a hash in previous: a 34-byte string (58 22), YASMF-BLAKE3 (00 20).
_HASH_HEAD = b"\x58\x22" + YASMF_BLAKE3_PREFIX
# _decode_common builds its Operation through the slots' descriptors, without
# __post_init__: it has checked every rule of it already.
_new_operation = object.__new__
_OPERATION_SLOTS = Operation.__dict__
_set_action = _OPERATION_SLOTS["action"].__set__
_set_schema_id = _OPERATION_SLOTS["schema_id"].__set__
_set_previous = _OPERATION_SLOTS["previous"].__set__
_set_fields = _OPERATION_SLOTS["fields"].__set__
_set_version = _OPERATION_SLOTS["version"].__set__


def _decode_general(data: bytes) -> Operation:
    """:func:`decode_operation` without its fast path (any size; the limit is checked there)."""
    value = cbor.decode(data)
    if not isinstance(value, list) or not 4 <= len(value) <= 5:
        raise OperationFormatError("an operation is an array of 4 or 5 items")
    version, action, schema_id = value[0], value[1], value[2]
    if version != OPERATION_VERSION or isinstance(version, bool | float):
        raise OperationFormatError(f"unknown operation version {version!r}")
    if not isinstance(action, int) or isinstance(action, bool) or action not in (0, 1, 2):
        raise OperationFormatError(f"unknown operation action {action!r}")
    if not isinstance(schema_id, str):
        raise OperationFormatError("schema id must be a text string")
    act = _ACTIONS[action]
    expected = 5 if act is Action.UPDATE else 4
    if len(value) != expected:
        raise OperationFormatError(f"{act.name} is an array of {expected} items")
    previous: tuple[str, ...] | None = None
    fields: dict[str, FieldValue] | None = None
    if act is not Action.CREATE:
        raw_previous = value[3]
        if not isinstance(raw_previous, list):
            raise OperationFormatError("previous must be an array of operation ids")
        if len(raw_previous) > MAX_LIST_LENGTH:
            raise SizeLimitExceeded(f"previous of {len(raw_previous)}, limit {MAX_LIST_LENGTH}")
        previous = tuple(_hash_from_cbor(item) for item in raw_previous)
    if act is not Action.DELETE:
        raw_fields = value[-1]
        if not isinstance(raw_fields, dict):
            raise OperationFormatError("fields must be a map")
        if len(raw_fields) > MAX_FIELDS:
            raise SizeLimitExceeded(f"{len(raw_fields)} fields, limit {MAX_FIELDS}")
        fields = {}
        for name, v in raw_fields.items():
            # Booleans and short text, most fields, need no further check.
            if isinstance(v, bool) or (isinstance(v, str) and len(v) <= MAX_VALUE_SIZE):
                fields[name] = v
            else:
                fields[name] = _plain_value_from_cbor(name, v)
    try:
        return Operation(act, schema_id, previous, fields)
    except HashError as exc:
        raise OperationFormatError(exc.detail) from exc


__all__ = [
    "FIELD_NAME_RE",
    "OPERATION_VERSION",
    "Action",
    "FieldValue",
    "Operation",
    "PinnedRelation",
    "PinnedRelationList",
    "PlainList",
    "Relation",
    "RelationList",
    "check_field_name",
    "check_schema_id",
    "check_view_id",
    "decode_operation",
    "encode_operation",
    "is_create",
    "with_fields",
]
