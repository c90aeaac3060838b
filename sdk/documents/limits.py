"""Bounds on everything a peer controls in an entry or an operation.

The decoders check them before allocating, so a hostile peer cannot make a
participant buffer or scan without limit. Field-name and schema-name lengths
follow p2panda's schema rules; the byte bounds keep an entry plus its operation
well inside one SDS message (``sdk.sds.limits``: 256 KiB).
"""

from __future__ import annotations

#: Largest encoded operation (the entry's payload) accepted or produced.
MAX_OPERATION_SIZE = 128 * 1024
#: Largest encoded entry: tag, author, two VarU64s, two links, size, hash, signature.
MAX_ENTRY_SIZE = 1 + 32 + 9 + 9 + 34 + 34 + 9 + 34 + 64
#: Largest str or bytes field value.
MAX_VALUE_SIZE = 64 * 1024
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
