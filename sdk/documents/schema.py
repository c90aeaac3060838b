"""Schemas: the shape of a document, and the check of operations against it.

A schema names its fields and their types (p2panda specification, "Schemas").
Application schema ids are ``<name>_<view id>``, the view id being the
operation ids (joined by ``_``) of the ``schema_definition_v1`` document that
defines the schema; the vectors' ``venue_0020c655...`` is one. System schemas
are built in and have versioned names (``schema_definition_v1``,
``schema_field_definition_v1``, ``blob_v1``, ``blob_piece_v1``).

Field type names are p2panda's: ``bool``, ``int``, ``float``, ``str``,
``bytes``, and ``relation(<schema id>)``, ``relation_list(<schema id>)``,
``pinned_relation(<schema id>)``, ``pinned_relation_list(<schema id>)``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from sdk.documents.errors import DocumentError, SchemaMismatch, UsageError
from sdk.documents.hashing import is_hash_id
from sdk.documents.limits import MAX_BLOB_PIECE_LENGTH
from sdk.documents.operation import (
    Action,
    FieldValue,
    Operation,
    PinnedRelation,
    PinnedRelationList,
    Relation,
    RelationList,
    check_field_name,
    check_schema_id,
    check_view_id,
    with_fields,
)

#: p2panda: a schema description is at most 256 characters.
MAX_DESCRIPTION_LENGTH = 256


class FieldKind(StrEnum):
    """The kinds of field p2panda schemas can declare."""

    BOOL = "bool"
    INT = "int"
    FLOAT = "float"
    STR = "str"
    BYTES = "bytes"
    RELATION = "relation"
    RELATION_LIST = "relation_list"
    PINNED_RELATION = "pinned_relation"
    PINNED_RELATION_LIST = "pinned_relation_list"


_RELATION_KINDS = frozenset(
    {
        FieldKind.RELATION,
        FieldKind.RELATION_LIST,
        FieldKind.PINNED_RELATION,
        FieldKind.PINNED_RELATION_LIST,
    }
)
_TYPE_RE = re.compile(r"([a-z_]+)(?:\(([^()]+)\))?")


@dataclass(frozen=True, slots=True)
class FieldType:
    """A field's type; relations also name the schema of the documents they point to."""

    kind: FieldKind
    schema_id: str | None = None

    def __post_init__(self) -> None:
        if (self.kind in _RELATION_KINDS) != (self.schema_id is not None):
            raise UsageError(
                f"{self.kind} fields {'need' if self.schema_id is None else 'take no'} schema id"
            )
        if self.schema_id is not None:
            check_schema_id(self.schema_id)

    @classmethod
    def parse(cls, text: str) -> FieldType:
        """Parse p2panda's type notation, e.g. ``"str"`` or ``"relation(venue_0020...)"``."""
        match = _TYPE_RE.fullmatch(text)
        try:
            if match is None:
                raise ValueError(text)
            return cls(FieldKind(match.group(1)), match.group(2))
        except (ValueError, DocumentError) as exc:
            raise SchemaMismatch(f"{text[:120]!r} is not a field type") from exc

    def __str__(self) -> str:
        return self.kind.value if self.schema_id is None else f"{self.kind}({self.schema_id})"


def _fail(name: str, field_type: FieldType, value: object) -> SchemaMismatch:
    return SchemaMismatch(f"field {name!r} must be {field_type}, got {type(value).__name__}")


def _id(value: object) -> str:
    """A hash id from a hex str (local input) or 34 hash bytes (decoded input)."""
    if isinstance(value, bytes):
        value = value.hex()
    if not isinstance(value, str) or not is_hash_id(value):
        raise ValueError("not a hash")
    return value


def _ids(value: object) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, tuple | list):
        raise ValueError("not a list")
    return tuple(_id(item) for item in value)


#: Kinds whose values are exactly one Python type, taken as they are.
_PLAIN_TYPES: dict[FieldKind, type] = {
    FieldKind.BOOL: bool,
    FieldKind.FLOAT: float,
    FieldKind.STR: str,
    FieldKind.BYTES: bytes,
}


def _resolve_value(name: str, field_type: FieldType, value: object) -> FieldValue:
    """Check ``value`` against ``field_type``; return it typed (relations as wrappers).

    Accepts what a peer's bytes decode to (hashes as bytes, lists as tuples) and
    what a local caller naturally passes (hex ids, lists, ints for floats).
    """
    kind = field_type.kind
    if type(value) is _PLAIN_TYPES.get(kind):
        return value  # type: ignore[return-value]
    try:
        if kind is FieldKind.INT and isinstance(value, int) and not isinstance(value, bool):
            if not -(1 << 63) <= value < (1 << 63):
                raise SchemaMismatch(f"field {name!r}: int outside i64")
            return value
        if kind is FieldKind.FLOAT and isinstance(value, float):
            return value
        if kind is FieldKind.STR and isinstance(value, str):
            return value
        if kind is FieldKind.BYTES and isinstance(value, bytes):
            return value
        if kind is FieldKind.RELATION:
            if isinstance(value, Relation):
                return value
            return Relation(_id(value))
        if kind is FieldKind.RELATION_LIST:
            if isinstance(value, RelationList):
                return value
            return RelationList(_ids(value))
        if kind is FieldKind.PINNED_RELATION:
            if isinstance(value, PinnedRelation):
                return value
            return PinnedRelation(check_view_id(_ids(value)))
        if kind is FieldKind.PINNED_RELATION_LIST:
            if isinstance(value, PinnedRelationList):
                return value
            if isinstance(value, str | bytes) or not isinstance(value, tuple | list):
                raise ValueError("not a list")
            return PinnedRelationList(tuple(check_view_id(_ids(view)) for view in value))
    except (ValueError, DocumentError) as exc:
        if isinstance(exc, SchemaMismatch):
            raise
        raise _fail(name, field_type, value) from exc
    raise _fail(name, field_type, value)


@dataclass(frozen=True, slots=True)
class Schema:
    """A schema: its id, a description and its fields (name to type)."""

    id: str
    description: str
    fields: Mapping[str, FieldType] = field(default_factory=dict)
    #: Field name to the one Python type its values have when :meth:`resolve` has
    #: nothing to check but that type (``int``: also the i64 range); ``None`` when
    #: some field is a relation or the schema has extra rules (system schemas).
    _plain: Mapping[str, type] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_schema_id(self.id)
        if not self.fields:
            raise UsageError("a schema has at least one field")
        if len(self.description) > MAX_DESCRIPTION_LENGTH:
            raise UsageError(f"schema descriptions are at most {MAX_DESCRIPTION_LENGTH} chars")
        for name in self.fields:
            check_field_name(name)
        object.__setattr__(self, "fields", MappingProxyType(dict(sorted(self.fields.items()))))
        plain: dict[str, type] = {}
        for name, field_type in self.fields.items():
            kind = field_type.kind
            exact = int if kind is FieldKind.INT else _PLAIN_TYPES.get(kind)
            if exact is None:
                break
            plain[name] = exact
        full_check = len(plain) < len(self.fields) or self.id in SYSTEM_FIELD_RULES
        object.__setattr__(self, "_plain", None if full_check else plain)

    @classmethod
    def application(
        cls,
        name: str,
        view_id: tuple[str, ...],
        description: str,
        fields: Mapping[str, FieldType | str],
    ) -> Schema:
        """An application schema whose definition document has view ``view_id``."""
        schema_id = f"{name}_{'_'.join(check_view_id(tuple(sorted(view_id))))}"
        return cls(
            schema_id,
            description,
            {k: v if isinstance(v, FieldType) else FieldType.parse(v) for k, v in fields.items()},
        )

    @property
    def name(self) -> str:
        """The schema's name: the id without its view id (system ids are their own name)."""
        return self.id.partition("_0020")[0]

    @property
    def is_system(self) -> bool:
        """True for the built-in system schemas."""
        return self.id in SYSTEM_SCHEMAS

    def resolve_fields(
        self, fields: Mapping[str, object], *, complete: bool, local: bool = True
    ) -> dict[str, FieldValue]:
        """Check ``fields`` against this schema and return them typed.

        ``complete`` (CREATE) requires every field of the schema; otherwise
        (UPDATE) any non-empty subset. ``local`` input may give an ``int`` for a
        ``float`` field; a peer's may not (its bytes must already be a float).
        Raises :class:`SchemaMismatch`.
        """
        unknown = fields.keys() - self.fields.keys()
        if unknown:
            raise SchemaMismatch(f"fields {sorted(unknown)} are not in schema {self.name}")
        if complete and len(fields) != len(self.fields):
            missing = sorted(self.fields.keys() - fields.keys())
            raise SchemaMismatch(f"CREATE lacks fields {missing} of schema {self.name}")
        if not fields:
            raise SchemaMismatch("an UPDATE changes at least one field")
        resolved: dict[str, FieldValue] = {}
        rules = SYSTEM_FIELD_RULES.get(self.id)
        types = self.fields
        for name in sorted(fields):
            field_type = types[name]
            value = fields[name]
            if local and field_type.kind is FieldKind.FLOAT and type(value) is int:
                # A local caller writing 3 for a float field means 3.0.
                value = float(value)
            resolved[name] = _resolve_value(name, field_type, value)
            rule = None if rules is None else rules.get(name)
            if rule is not None and not rule[0](resolved[name]):
                raise SchemaMismatch(f"{self.id} field {name!r}: {rule[1]}")
        return resolved

    def resolve(self, operation: Operation) -> Operation:
        """Check ``operation`` against this schema; return it with typed values."""
        if operation.schema_id != self.id:
            raise SchemaMismatch(f"operation has schema {operation.schema_id}, not {self.id}")
        plain = operation.fields
        if plain is None:
            return operation
        exact = self._plain
        if exact is not None and (
            len(plain) == len(exact) if operation.action is Action.CREATE else plain
        ):
            # The common case, checked without building the typed fields: every field
            # of the schema (CREATE) or some (UPDATE), each value of its field's one
            # type. Anything else takes the full check, which says what is wrong.
            for name, value in plain.items():
                kind = exact.get(name)
                if type(value) is not kind or (
                    kind is int and not -(1 << 63) <= value < (1 << 63)  # type: ignore[operator]
                ):
                    break
            else:
                return operation
        fields = self.resolve_fields(plain, complete=operation.action is Action.CREATE, local=False)
        if all(value is plain[name] for name, value in fields.items()):
            # Nothing to type (no relations): the checked operation is its own result.
            return operation
        return with_fields(operation, fields)


_BLOB_MIME_TYPE_RE = re.compile(r"[a-z-]{1,12}/(([a-z0-9]{1,18})[.|+-]){0,6}[a-z0-9]{1,16}")
_SCHEMA_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}[A-Za-z0-9]")
_FIELD_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


def _is_field_type(value: FieldValue) -> bool:
    try:
        FieldType.parse(str(value))
    except SchemaMismatch:
        return False
    return True


#: The extra rules of the system schemas' fields, as p2panda-rs checks them
#: (``p2panda-rs/src/schema/validate/`` at commit 7dceb7b3): schema id to field
#: name to (predicate, what it requires). Rust's ``^...$`` is ``fullmatch`` here.
SYSTEM_FIELD_RULES: Mapping[str, Mapping[str, tuple[Callable[[FieldValue], bool], str]]] = {
    # blob_piece.rs:7-14
    "blob_piece_v1": {
        "data": (
            lambda v: isinstance(v, bytes) and len(v) <= MAX_BLOB_PIECE_LENGTH,
            f"at most {MAX_BLOB_PIECE_LENGTH} bytes",
        ),
    },
    # blob.rs:13-20 (mime type), blob.rs:24-27 (pieces not empty)
    "blob_v1": {
        "mime_type": (
            lambda v: isinstance(v, str) and _BLOB_MIME_TYPE_RE.fullmatch(v) is not None,
            "a mime type such as image/png",
        ),
        "pieces": (
            lambda v: isinstance(v, PinnedRelationList) and len(v.view_ids) > 0,
            "at least one piece",
        ),
    },
    # schema_definition.rs:16-22 (name), :29-31 (description); its fields list is
    # capped at 1024 (:36-38) like every list (limits.MAX_LIST_LENGTH).
    "schema_definition_v1": {
        "name": (
            lambda v: isinstance(v, str) and _SCHEMA_NAME_RE.fullmatch(v) is not None,
            "a letter, then up to 62 letters, digits or _, ending in a letter or digit",
        ),
        "description": (
            lambda v: isinstance(v, str) and len(v) <= MAX_DESCRIPTION_LENGTH,
            f"at most {MAX_DESCRIPTION_LENGTH} characters",
        ),
    },
    # schema_field_definition.rs:17-22 (name), :101-131 (type)
    "schema_field_definition_v1": {
        "name": (
            lambda v: isinstance(v, str) and _FIELD_NAME_RE.fullmatch(v) is not None,
            "a letter, then up to 63 letters, digits or _",
        ),
        "type": (_is_field_type, "a field type such as str or relation(<schema id>)"),
    },
}


def _system(schema_id: str, description: str, fields: dict[str, str]) -> Schema:
    return Schema(schema_id, description, {k: FieldType.parse(v) for k, v in fields.items()})


SCHEMA_FIELD_DEFINITION_V1 = _system(
    "schema_field_definition_v1",
    "Define fields for application data schemas.",
    {"name": "str", "type": "str"},
)
SCHEMA_DEFINITION_V1 = _system(
    "schema_definition_v1",
    "Publish data schemas for your application.",
    {
        "name": "str",
        "description": "str",
        "fields": "pinned_relation_list(schema_field_definition_v1)",
    },
)
BLOB_PIECE_V1 = _system("blob_piece_v1", "A piece of binary data.", {"data": "bytes"})
BLOB_V1 = _system(
    "blob_v1",
    "Binary data made of pieces.",
    {"length": "int", "mime_type": "str", "pieces": "pinned_relation_list(blob_piece_v1)"},
)

#: The built-in system schemas by id.
SYSTEM_SCHEMAS: Mapping[str, Schema] = MappingProxyType(
    {s.id: s for s in (SCHEMA_FIELD_DEFINITION_V1, SCHEMA_DEFINITION_V1, BLOB_PIECE_V1, BLOB_V1)}
)


def schema_view_id(schema_id: str) -> tuple[str, ...] | None:
    """The definition view id inside an application schema id (``None`` for system ids)."""
    _, sep, rest = schema_id.partition("_0020")
    return tuple(("0020" + rest).split("_")) if sep else None


def application_schemas(path: str | os.PathLike[str]) -> list[Schema]:
    """The application schemas of a JSON file: a list of objects with ``name``, ``view_id``
    (the definition's operation ids), ``description`` and ``fields`` (name -> type), the
    format ``python -m sdk.sync --schema-json`` and the store node's
    ``replication.schema_file`` take. Raises ``OSError`` (the file), ``ValueError`` (its
    JSON), ``KeyError`` or ``TypeError`` (an item of the wrong shape), and what
    :meth:`Schema.application` raises for a bad definition."""
    with open(path, encoding="utf-8") as f:
        items = json.load(f)
    return [
        Schema.application(i["name"], tuple(i["view_id"]), i["description"], i["fields"])
        for i in items
    ]


__all__ = [
    "BLOB_PIECE_V1",
    "BLOB_V1",
    "MAX_DESCRIPTION_LENGTH",
    "SCHEMA_DEFINITION_V1",
    "SCHEMA_FIELD_DEFINITION_V1",
    "SYSTEM_FIELD_RULES",
    "SYSTEM_SCHEMAS",
    "FieldKind",
    "FieldType",
    "Schema",
    "application_schemas",
    "schema_view_id",
]
