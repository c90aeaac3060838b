"""The document layer's exception tree.

::

    DocumentError                      every error this package raises; ``rule`` names the rule
     ├── UsageError                    the caller misused the API (also a ValueError)
     ├── MissingDependency             not an error of the input: something it needs has not
     │                                 arrived yet (backlink, previous operation, schema); hold it
     └── InvalidInput                  bytes or data from a peer broke a rule; nothing was stored
          ├── MalformedInput           the bytes do not decode
          │    ├── VarU64Error         VarU64 truncated or not in its shortest form
          │    ├── HashError           not a YASMF-BLAKE3 hash (type 0, length 32)
          │    ├── CBORError           not the CBOR subset operations use, or not canonical
          │    ├── EntryFormatError    Bamboo entry layout (tag, links, trailing bytes)
          │    │    └── SequenceError  sequence number 0 or above 2^63 - 1
          │    ├── OperationFormatError operation array shape, version, action, ids
          │    └── SizeLimitExceeded   an entry, operation, field or list over its bound
          └── ValidationError          well-formed, but does not fit what is stored
               ├── InvalidSignature    ed25519 signature does not verify
               ├── PayloadMismatch     payload size or hash differs from the entry
               ├── BacklinkMismatch    backlink is not the hash of the previous entry
               ├── LipmaaLinkMismatch  lipmaa link is not the hash of the lipmaa entry
               ├── ForkDetected        a different entry at an existing sequence number
               ├── LogMismatch         log id used for another document, or not fresh
               ├── SchemaMismatch      fields do not fit the schema, or wrong schema
               ├── PreviousMismatch    previous operations of another document / a CREATE
               └── DocumentDeletedError the operation builds on a DELETE

Decoders (``decode_entry``, ``decode_operation``, ``decode_payload``) raise only
``MalformedInput`` subclasses on any byte string; any other exception is a bug.
The store raises ``InvalidInput`` or ``MissingDependency`` and then has changed
nothing. :class:`~sdk.documents.channel.DocumentChannel` turns both into events.
"""

from __future__ import annotations

from typing import ClassVar


class DocumentError(Exception):
    """Base class of every error the document layer raises."""

    #: Short, stable name of the rule that failed (also a counter key).
    rule: ClassVar[str] = "document"

    def __init__(self, detail: str) -> None:
        super().__init__(f"{self.rule}: {detail}")
        self.detail = detail


class UsageError(DocumentError, ValueError):
    """The caller used the API wrongly; the message says what to do instead."""

    rule = "usage"


class MissingDependency(DocumentError):
    """The input refers to entries or operations that are not stored yet.

    ``missing`` holds their hashes (lowercase hex YASMF ids), so a caller can
    hold the input and retry when one of them arrives.
    """

    rule = "missing_dependency"

    def __init__(self, detail: str, missing: tuple[str, ...]) -> None:
        super().__init__(detail)
        self.missing = missing


class InvalidInput(DocumentError):
    """Input from a peer broke a rule; it was rejected and nothing changed."""

    rule = "invalid"


class MalformedInput(InvalidInput):
    """Bytes that do not decode to an entry, operation or payload."""

    rule = "malformed"


class VarU64Error(MalformedInput):
    """A VarU64 is truncated or not in its shortest (canonical) form."""

    rule = "varu64"


class HashError(MalformedInput):
    """A hash is not a YASMF-BLAKE3 hash (type 0, 32-byte digest)."""

    rule = "hash"


class CBORError(MalformedInput):
    """Not the definite-length CBOR subset operations use, or not canonical."""

    rule = "cbor"


class EntryFormatError(MalformedInput):
    """The Bamboo entry layout is wrong (tag, links, sizes, trailing bytes)."""

    rule = "entry_format"


class OperationFormatError(MalformedInput):
    """The operation array has the wrong shape, version, action or ids."""

    rule = "operation_format"


class SizeLimitExceeded(MalformedInput):
    """An entry, operation, field value or list is larger than its bound."""

    rule = "size_limit"


class ValidationError(InvalidInput):
    """Well-formed input that does not fit what is stored."""

    rule = "validation"


class InvalidSignature(ValidationError):
    """The ed25519 signature does not verify under the entry's author."""

    rule = "signature"


class PayloadMismatch(ValidationError):
    """The operation bytes do not have the entry's payload size or hash."""

    rule = "payload"


class SequenceError(EntryFormatError):
    """The sequence number is 0 (logs start at 1) or beyond what a log can hold."""

    rule = "seq_num"


class BacklinkMismatch(ValidationError):
    """The backlink is not the hash of the stored entry at ``seq_num - 1``."""

    rule = "backlink"


class LipmaaLinkMismatch(ValidationError):
    """The lipmaa link is not the hash of the stored entry at ``lipmaa(seq_num)``."""

    rule = "lipmaa_link"


class ForkDetected(ValidationError):
    """A different entry exists at this author, log id and sequence number."""

    rule = "fork"


class LogMismatch(ValidationError):
    """The log id belongs to another document, or a new document reuses a log."""

    rule = "log_id"


class SchemaMismatch(ValidationError):
    """The fields do not fit the schema, or the schema is not the document's."""

    rule = "schema"


class PreviousMismatch(ValidationError):
    """``previous`` names operations of another document."""

    rule = "previous"


class DocumentDeletedError(ValidationError):
    """The operation builds on a DELETE: the document has ended."""

    rule = "document_deleted"


__all__ = [
    "BacklinkMismatch",
    "CBORError",
    "DocumentDeletedError",
    "DocumentError",
    "EntryFormatError",
    "ForkDetected",
    "HashError",
    "InvalidInput",
    "InvalidSignature",
    "LipmaaLinkMismatch",
    "LogMismatch",
    "MalformedInput",
    "MissingDependency",
    "OperationFormatError",
    "PayloadMismatch",
    "PreviousMismatch",
    "SchemaMismatch",
    "SequenceError",
    "SizeLimitExceeded",
    "UsageError",
    "ValidationError",
    "VarU64Error",
]
