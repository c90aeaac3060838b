"""Beelay messages as bytes: requests, responses and notifications of collection sync.

The grammar is ``beelay.txt`` (Messages); where that text and Beelay's code
(automerge/beelay at c817e9e) disagree on bytes both peers must produce, the code
decides: a notification is type **3**, a document id **16 raw bytes**, a coded
symbol carries a big-endian checksum and a signed-LEB128 count, fetch_sedimentree
answers with two summaries, LEB128 is in its shortest form and at most 64 bits.
docs/collection-sync.md ("Messages") gives each difference with Beelay's source
lines.

A message is its type (0 request, 1 response, 3 notification), then for requests
and responses a 16-byte request id, a type byte and the body. Chorus serves
create_snapshot (04), snapshot_symbols (05), fetch_sedimentree (01),
fetch_blob_part (02) and listen (06); for the uploads (00, 03)
:func:`decode_message` raises :class:`UnsupportedRequest` carrying the request id,
to be answered with an error response. Bounds (:class:`MessageLimits`) apply
before anything is allocated: a count the remaining bytes cannot hold is
malformed, one over the limits :class:`LimitExceeded`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TypeAlias, TypeVar

from sdk.sync import fields
from sdk.sync.collection.errors import (
    CollectionProtocolError,
    CollectionUsageError,
    LimitExceeded,
    MalformedMessage,
    RemoteProtocolError,
    UnsupportedRequest,
)
from sdk.sync.collection.symbols import DOCUMENT_KEY_SIZE, SYMBOL_SIZE
from sdk.sync.riblt import CodedSymbol

ID_SIZE = 16
HASH_SIZE = 32
MESSAGE_REQUEST, MESSAGE_RESPONSE, MESSAGE_NOTIFICATION = 0, 1, 3
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class MessageLimits:
    """Bounds on what a peer's message may hold."""

    max_message_bytes: int = 16 * 1024 * 1024
    max_symbols: int = 100_000
    max_hashes: int = 100_000
    max_text_bytes: int = 4096
    max_blob_part_bytes: int = 1024 * 1024


DEFAULT_LIMITS = MessageLimits()

# -- bodies ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateSnapshotRequest:
    """Ask for a snapshot of the collection reachable from ``root`` (a document key)."""

    root: bytes


@dataclass(frozen=True, slots=True)
class SnapshotSymbolsRequest:
    """Ask for more coded symbols of a snapshot."""

    snapshot_id: bytes


@dataclass(frozen=True, slots=True)
class FetchSedimentreeRequest:
    """Ask for one document's sedimentree (content and reachability index summaries)."""

    document: bytes


@dataclass(frozen=True, slots=True)
class FetchBlobPartRequest:
    """Ask for ``length`` bytes from ``offset`` of the blob with hash ``blob``."""

    blob: bytes
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class ListenRequest:
    """Ask for notifications of later changes to a snapshot's documents."""

    snapshot_id: bytes


@dataclass(frozen=True, slots=True)
class BlobMeta:
    """A blob's hash and size."""

    hash: bytes
    size: int


@dataclass(frozen=True, slots=True)
class StratumMeta:
    """A stratum of a sedimentree: the commits from ``start`` (exclusive) to ``end``."""

    start: bytes | None
    end: bytes
    blob: BlobMeta


@dataclass(frozen=True, slots=True)
class LooseCommit:
    """A commit not yet in any stratum."""

    hash: bytes
    parents: tuple[bytes, ...]
    blob: BlobMeta


@dataclass(frozen=True, slots=True)
class SedimentreeSummary:
    """Strata and loose commits that summarise a commit graph."""

    strata: tuple[StratumMeta, ...] = ()
    commits: tuple[LooseCommit, ...] = ()


@dataclass(frozen=True, slots=True)
class CreateSnapshotResponse:
    """The snapshot's id and its first coded symbols."""

    snapshot_id: bytes
    symbols: tuple[CodedSymbol, ...]


@dataclass(frozen=True, slots=True)
class SnapshotSymbolsResponse:
    """The next coded symbols of a snapshot."""

    symbols: tuple[CodedSymbol, ...]


@dataclass(frozen=True, slots=True)
class FetchSedimentreeResponse:
    """A document's content and reachability-index summaries; ``content`` is ``None``
    when the document is not found."""

    content: SedimentreeSummary | None
    index: SedimentreeSummary = SedimentreeSummary()


@dataclass(frozen=True, slots=True)
class FetchBlobPartResponse:
    """The requested part of a blob."""

    data: bytes


@dataclass(frozen=True, slots=True)
class ListenResponse:
    """The listen request was accepted."""


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """A request failed; ``message`` says why (UTF-8)."""

    message: str


@dataclass(frozen=True, slots=True)
class BlobRef:
    """A blob by hash, or inline (``data``)."""

    hash: bytes | None = None
    data: bytes | None = None


@dataclass(frozen=True, slots=True)
class StratumPart:
    """A tree part that is a stratum."""

    start: bytes | None
    end: bytes
    checkpoints: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class CommitPart:
    """A tree part that is one commit and its parents."""

    hash: bytes
    parents: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class UploadItem:
    """A blob and where it sits in the document's tree."""

    blob: BlobRef
    tree_part: StratumPart | CommitPart


RequestBody: TypeAlias = (
    CreateSnapshotRequest
    | SnapshotSymbolsRequest
    | FetchSedimentreeRequest
    | FetchBlobPartRequest
    | ListenRequest
)
ResponseBody: TypeAlias = (
    CreateSnapshotResponse
    | SnapshotSymbolsResponse
    | FetchSedimentreeResponse
    | FetchBlobPartResponse
    | ListenResponse
    | ErrorResponse
)


@dataclass(frozen=True, slots=True)
class Request:
    """A request and the 16-byte id its response will carry."""

    request_id: bytes
    body: RequestBody


@dataclass(frozen=True, slots=True)
class Response:
    """A response to the request with ``request_id``."""

    request_id: bytes
    body: ResponseBody


@dataclass(frozen=True, slots=True)
class Notification:
    """A change to ``document`` (a key) that ``from_peer`` made, sent to listeners."""

    from_peer: str
    document: bytes
    item: UploadItem


Message: TypeAlias = Request | Response | Notification
_Body = TypeVar("_Body", bound=ResponseBody)


def expected_body(
    response: Response,
    kind: type[_Body],
    request: str,
    errors: tuple[type[RemoteProtocolError], ...] = (),
) -> _Body:
    """``response``'s body, which must be a ``kind`` answering the ``request`` named.

    An :class:`ErrorResponse` is raised as the first of ``errors`` whose name starts
    its message (how a server words a peer's error), else as
    :class:`CollectionProtocolError`, as is a body of another kind.
    """
    body = response.body
    if isinstance(body, ErrorResponse):
        for error in errors:
            if body.message.startswith(error.__name__):
                raise error(body.message)
        raise CollectionProtocolError(f"{request} refused: {body.message}")
    if not isinstance(body, kind):
        raise CollectionProtocolError(f"{request} answered with another response")
    return body


# -- the codec ---------------------------------------------------------------------------
# Each part of a message is a field of :mod:`sdk.sync.fields`: a body is a dataclass written
# field by field, every choice (message type, body type, tree part) a tag byte and its variant.


def _write_sleb(out: bytearray, value: int) -> None:
    if not _I64_MIN <= value <= _I64_MAX:
        raise CollectionUsageError(f"{value} does not fit a signed 64-bit LEB128")
    while True:
        byte = value & 0x7F
        value >>= 7
        if (value == 0 and not byte & 0x40) or (value == -1 and byte & 0x40):
            out.append(byte)
            return
        out.append(byte | 0x80)


def _read_sleb(r: fields.FieldReader) -> int:
    what = "a coded symbol's count"
    start, value, shift, byte = r.pos, 0, 0, 0x80
    while byte & 0x80:  # the last byte read had the continuation bit
        if shift > 63:
            raise MalformedMessage(f"{what}: LEB128 over 64 bits")
        byte = r.byte(what)
        value |= (byte & 0x7F) << shift
        shift += 7
    if byte & 0x40:  # the sign bit of the last byte
        value -= 1 << shift
    if not _I64_MIN <= value <= _I64_MAX:
        raise MalformedMessage(f"{what}: out of the signed 64-bit range")
    check = bytearray()
    _write_sleb(check, value)
    if len(check) != r.pos - start:
        raise MalformedMessage(f"{what}: LEB128 not in its shortest form")
    return value


_fixed = partial(fields.fixed, usage=CollectionUsageError)
_uleb = partial(fields.uleb, usage=CollectionUsageError)
_ID = _fixed(ID_SIZE, "an id")
_DOC = _fixed(DOCUMENT_KEY_SIZE, "a document id")
_HASH = _fixed(HASH_SIZE, "a hash")
_HASHES = fields.listed(_HASH, "hashes", "max_hashes", HASH_SIZE)
_SYMBOL = fields.struct(
    CodedSymbol,
    _fixed(SYMBOL_SIZE, "a coded symbol"),
    fields.integer(8, "a coded symbol's checksum"),
    (_write_sleb, _read_sleb),
)
_SYMBOLS = fields.listed(_SYMBOL, "coded symbols", "max_symbols", SYMBOL_SIZE + 9)
_BLOB_META = fields.struct(BlobMeta, _HASH, _uleb("a blob size"))
_STRATUM_META = fields.struct(StratumMeta, fields.option(_HASH), _HASH, _BLOB_META)
_LOOSE_COMMIT = fields.struct(LooseCommit, _HASH, _HASHES, _BLOB_META)
_SUMMARY = fields.struct(
    SedimentreeSummary,
    fields.listed(_STRATUM_META, "strata", "max_hashes", 1 + 2 * HASH_SIZE + 1),
    fields.listed(_LOOSE_COMMIT, "commits", "max_hashes", 2 * HASH_SIZE + 2),
)


def _blob_tag(blob: BlobRef) -> int:
    if (blob.hash is None) == (blob.data is None):
        raise CollectionUsageError("a BlobRef has either a hash or inline data")
    return int(blob.hash is None)


# A blob is referred to by its hash (tag 0) or given inline (tag 1).
_BLOB_REF = fields.tagged(
    "blob reference",
    {
        0: fields.body(BlobRef, hash=_HASH),
        1: fields.body(BlobRef, data=fields.prefixed("an inline blob")),
    },
    _blob_tag,
)
_TREE_PART = fields.tagged(
    "tree part",
    {
        0: fields.body(StratumPart, fields.option(_HASH), _HASH, _HASHES),
        1: fields.body(CommitPart, _HASH, _HASHES),
    },
)
# A sedimentree response is an option: tag 0 when the document is not found.
_FOUND = fields.option(fields.struct(FetchSedimentreeResponse, _SUMMARY, _SUMMARY))
_SEDIMENTREE: fields.Field = (
    lambda out, resp: _FOUND[0](out, None if resp.content is None else resp),
    lambda r: _FOUND[1](r) or FetchSedimentreeResponse(None),
)

#: Request types Beelay has and Chorus does not serve: the uploads.
_UPLOADS = (0, 3)
_REQUEST_BODY = fields.tagged(
    "request type",
    {
        1: fields.body(FetchSedimentreeRequest, _DOC),
        2: fields.body(FetchBlobPartRequest, _HASH, _uleb("an offset"), _uleb("a length")),
        4: fields.body(CreateSnapshotRequest, _DOC),
        5: fields.body(SnapshotSymbolsRequest, _ID),
        6: fields.body(ListenRequest, _ID),
    },
)
_BLOB_PART = fields.prefixed("a blob part", "max_blob_part_bytes")
_RESPONSE_BODY = fields.tagged(
    "response type",
    {
        0: fields.body(ErrorResponse, fields.text("an error message", "max_text_bytes")),
        2: (FetchSedimentreeResponse, _SEDIMENTREE),
        3: fields.body(FetchBlobPartResponse, _BLOB_PART),
        4: fields.body(CreateSnapshotResponse, _ID, _SYMBOLS),
        5: fields.body(SnapshotSymbolsResponse, _SYMBOLS),
        6: fields.body(ListenResponse),
    },
)
_UPLOAD_ITEM = fields.struct(UploadItem, _BLOB_REF, _TREE_PART)
_PEER_ID = fields.text("a peer id", "max_text_bytes")
_MESSAGE = fields.tagged(
    "message type",
    {
        MESSAGE_REQUEST: fields.body(Request, _ID, _REQUEST_BODY),
        MESSAGE_RESPONSE: fields.body(Response, _ID, _RESPONSE_BODY),
        MESSAGE_NOTIFICATION: fields.body(Notification, _PEER_ID, _DOC, _UPLOAD_ITEM),
    },
)


def encode_message(message: Message) -> bytes:
    """The bytes of ``message``."""
    return fields.encode(_MESSAGE, message)


def decode_message(data: bytes, limits: MessageLimits = DEFAULT_LIMITS) -> Message:
    """Decode one whole message (trailing bytes are an error); raises :class:`MalformedMessage`,
    :class:`LimitExceeded` or :class:`UnsupportedRequest` (module docstring)."""
    if len(data) > limits.max_message_bytes:
        raise LimitExceeded(f"a message of {len(data)} bytes, over the limit")
    data = bytes(data)
    if len(data) > 1 + ID_SIZE and data[0] == MESSAGE_REQUEST and data[1 + ID_SIZE] in _UPLOADS:
        kind, request_id = data[1 + ID_SIZE], data[1 : 1 + ID_SIZE]
        raise UnsupportedRequest(f"request type {kind} is not served", request_id)
    r = fields.FieldReader(data, MalformedMessage, limits)
    message: Message = _MESSAGE[1](r)
    if r.left:
        raise MalformedMessage(f"{r.left} bytes after the message")
    return message


__all__ = [
    "DEFAULT_LIMITS",
    "BlobMeta",
    "BlobRef",
    "CommitPart",
    "CreateSnapshotRequest",
    "CreateSnapshotResponse",
    "ErrorResponse",
    "FetchBlobPartRequest",
    "FetchBlobPartResponse",
    "FetchSedimentreeRequest",
    "FetchSedimentreeResponse",
    "ListenRequest",
    "ListenResponse",
    "LooseCommit",
    "Message",
    "MessageLimits",
    "Notification",
    "Request",
    "RequestBody",
    "Response",
    "ResponseBody",
    "SedimentreeSummary",
    "SnapshotSymbolsRequest",
    "SnapshotSymbolsResponse",
    "StratumMeta",
    "StratumPart",
    "UploadItem",
    "decode_message",
    "encode_message",
    "expected_body",
]
