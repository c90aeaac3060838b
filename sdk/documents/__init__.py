"""p2panda-style documents over SDS channels.

Operations (CREATE / UPDATE / DELETE) on schema-typed key-value documents,
encoded byte for byte as the p2panda reference does, signed as Bamboo entries
(ed25519, YASMF-BLAKE3, lipmaa links), validated and stored per author log in
SQLite, and materialized into document views exactly as p2panda-rs 0.8.1
orders and reduces the operation graph (``materialize`` holds those rules).
:class:`DocumentChannel` converts delivered SDS content into document events
and local operations into content to send.

Module map: ``varu64``, ``hashing``, ``cbor``, ``operation``, ``schema``,
``keys``, ``bamboo``, ``materialize``, ``events``, ``store``, ``channel``,
``errors`` (the exception tree), ``limits`` (bounds on peer input).
"""

from __future__ import annotations

from sdk.documents.bamboo import Entry, decode_entry, lipmaa, sign_entry
from sdk.documents.channel import DocumentChannel, decode_payload, encode_payload
from sdk.documents.errors import (
    BacklinkMismatch,
    CBORError,
    DocumentDeletedError,
    DocumentError,
    EntryFormatError,
    ForkDetected,
    HashError,
    InvalidInput,
    InvalidSignature,
    LipmaaLinkMismatch,
    LogMismatch,
    MalformedInput,
    MissingDependency,
    OperationFormatError,
    PayloadMismatch,
    PreviousMismatch,
    SchemaMismatch,
    SequenceError,
    SizeLimitExceeded,
    UsageError,
    ValidationError,
    VarU64Error,
)
from sdk.documents.events import (
    DocumentCreated,
    DocumentDeleted,
    DocumentEvent,
    DocumentUpdated,
    OperationRejected,
)
from sdk.documents.hashing import hash_id, yasmf_hash
from sdk.documents.keys import KeyPair
from sdk.documents.materialize import (
    DocumentGraph,
    DocumentView,
    OperationRecord,
    materialize,
    topological_order,
)
from sdk.documents.operation import (
    Action,
    FieldValue,
    Operation,
    PinnedRelation,
    PinnedRelationList,
    Relation,
    RelationList,
    decode_operation,
    encode_operation,
)
from sdk.documents.schema import SYSTEM_SCHEMAS, FieldKind, FieldType, Schema, application_schemas
from sdk.documents.store import DocumentStore, Published
from sdk.documents.varu64 import decode_varu64, encode_varu64

__all__ = [
    "SYSTEM_SCHEMAS",
    "Action",
    "BacklinkMismatch",
    "CBORError",
    "DocumentChannel",
    "DocumentCreated",
    "DocumentDeleted",
    "DocumentDeletedError",
    "DocumentError",
    "DocumentEvent",
    "DocumentGraph",
    "DocumentStore",
    "DocumentUpdated",
    "DocumentView",
    "Entry",
    "EntryFormatError",
    "FieldKind",
    "FieldType",
    "FieldValue",
    "ForkDetected",
    "HashError",
    "InvalidInput",
    "InvalidSignature",
    "KeyPair",
    "LipmaaLinkMismatch",
    "LogMismatch",
    "MalformedInput",
    "MissingDependency",
    "Operation",
    "OperationFormatError",
    "OperationRecord",
    "OperationRejected",
    "PayloadMismatch",
    "PinnedRelation",
    "PinnedRelationList",
    "PreviousMismatch",
    "Published",
    "Relation",
    "RelationList",
    "Schema",
    "SchemaMismatch",
    "SequenceError",
    "SizeLimitExceeded",
    "UsageError",
    "ValidationError",
    "VarU64Error",
    "application_schemas",
    "decode_entry",
    "decode_operation",
    "decode_payload",
    "decode_varu64",
    "encode_operation",
    "encode_payload",
    "encode_varu64",
    "hash_id",
    "lipmaa",
    "materialize",
    "sign_entry",
    "topological_order",
    "yasmf_hash",
]
