"""Bounds on everything a peer controls in an entry or an operation.

The decoders check them before allocating, so a hostile peer cannot make a
participant buffer or scan without limit. The reference, p2panda-rs 0.8.1
(``p2panda-rs/src`` at commit 7dceb7b36f140ee6a6e7d0266480021a641bf19a), caps
one value: a ``blob_piece_v1`` piece's ``data`` at 256 * 1000 bytes
(``schema/validate/blob_piece.rs:7-14``); it has no cap on other values or on
the size of an operation. Ours must bound peer input, so: every str or bytes
value is capped at that same 256,000 bytes (a valid piece fits, one byte more
does not) and an operation at that plus 64 KiB, room for a full-size piece
with a ``previous`` of ``MAX_LIST_LENGTH`` ids (1024 * 35 bytes) and its CBOR
framing. Values over 256,000 bytes in application schemas, valid in the
reference, are the one thing we reject that it accepts.

Field-name and schema-name lengths follow p2panda's schema rules.
"""

from __future__ import annotations

#: p2panda-rs ``MAX_BLOB_PIECE_LENGTH`` (``schema/validate/blob_piece.rs:7``).
MAX_BLOB_PIECE_LENGTH = 256 * 1000
#: Largest str or bytes field value (ours: the reference's only value cap).
MAX_VALUE_SIZE = MAX_BLOB_PIECE_LENGTH
#: Largest encoded operation (the entry's payload) accepted or produced (ours).
MAX_OPERATION_SIZE = MAX_BLOB_PIECE_LENGTH + 64 * 1024
#: Largest encoded entry: tag, author, two VarU64s, two links, size, hash, signature.
MAX_ENTRY_SIZE = 1 + 32 + 9 + 9 + 34 + 34 + 9 + 34 + 64
#: Most fields in one operation (p2panda: a schema has at most 1024 fields).
MAX_FIELDS = 1024
#: Longest field name (p2panda: ``[A-Za-z][A-Za-z0-9_]{0,63}``).
MAX_FIELD_NAME_LENGTH = 64
#: Most ids in ``previous``, a view id, or a relation list.
MAX_LIST_LENGTH = 1024
#: Deepest CBOR nesting an operation needs: array > map > list > list.
MAX_CBOR_DEPTH = 4
#: Entries (with their operations) a DocumentChannel holds while dependencies are missing.
MAX_PENDING_ENTRIES = 1024
#: Bytes of held entries and operations, so large operations cannot exhaust memory.
MAX_PENDING_BYTES = 16 * 1024 * 1024

__all__ = [
    "MAX_BLOB_PIECE_LENGTH",
    "MAX_CBOR_DEPTH",
    "MAX_ENTRY_SIZE",
    "MAX_FIELDS",
    "MAX_FIELD_NAME_LENGTH",
    "MAX_LIST_LENGTH",
    "MAX_OPERATION_SIZE",
    "MAX_PENDING_BYTES",
    "MAX_PENDING_ENTRIES",
    "MAX_VALUE_SIZE",
]
