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

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from sdk.sds.varint import write_uvarint
from sdk.sync.collection.errors import (
    CollectionProtocolError,
    CollectionUsageError,
    LimitExceeded,
    MalformedMessage,
    RemoteProtocolError,
    UnsupportedRequest,
)
from sdk.sync.collection.symbols import DOCUMENT_KEY_SIZE, SYMBOL_SIZE
from sdk.sync.framing import FieldReader
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
#
# Each part of a message is a field: a writer and a reader of one value. Bodies are
# dataclasses whose fields are written in order; every choice (the message type, a
# request's or response's body type, a tree part) is a tag byte, then the variant's
# fields: a message is a type byte, and for requests and responses a request id and
# the body's type byte.


class _Reader(FieldReader):
    __slots__ = ("limits",)

    def __init__(self, data: bytes, limits: MessageLimits) -> None:
        super().__init__(data, MalformedMessage)
        self.limits = limits

    def uleb(self, what: str) -> int:
        return self.uvarint(what, canonical=True)

    def limited(self, what: str, limit: int, min_item_size: int = 1) -> int:
        """A count or length: over ``limit`` is LimitExceeded, beyond the bytes left
        (at ``min_item_size`` each) malformed."""
        n = self.uleb(what)
        if n > limit:
            raise LimitExceeded(f"{n} {what}, over the limit of {limit}")
        if n * min_item_size > self.left:
            raise MalformedMessage(f"{n} {what} cannot fit in the rest of the message")
        return n


_Field: TypeAlias = tuple[Callable[[bytearray, Any], None], Callable[[_Reader], Any]]


def _write_uleb(out: bytearray, value: int) -> None:
    if not 0 <= value <= 0xFFFFFFFFFFFFFFFF:
        raise CollectionUsageError(f"{value} does not fit an unsigned 64-bit LEB128")
    write_uvarint(out, value)


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


def _read_sleb(r: _Reader) -> int:
    what = "a coded symbol's count"
    start, value, shift = r.pos, 0, 0
    while True:
        byte = r.byte(what)
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            if byte & 0x40:
                value -= 1 << shift
            break
        if shift > 63:
            raise MalformedMessage(f"{what}: LEB128 over 64 bits")
    if not _I64_MIN <= value <= _I64_MAX:
        raise MalformedMessage(f"{what}: out of the signed 64-bit range")
    check = bytearray()
    _write_sleb(check, value)
    if len(check) != r.pos - start:
        raise MalformedMessage(f"{what}: LEB128 not in its shortest form")
    return value


def _fixed(size: int, what: str) -> _Field:
    def write(out: bytearray, data: bytes) -> None:
        if len(data) != size:
            raise CollectionUsageError(f"{what} is {size} bytes, got {len(data)}")
        out += data

    return write, lambda r: r.take(size, what)


def _uleb(what: str) -> _Field:
    return _write_uleb, lambda r: r.uleb(what)


def _bytes(what: str, limit: str | None = None) -> _Field:
    """Length-prefixed bytes, at most ``limits.<limit>`` long."""

    def write(out: bytearray, data: bytes) -> None:
        _write_uleb(out, len(data))
        out += data

    def read(r: _Reader) -> bytes:
        n = r.uleb(what) if limit is None else r.limited(what, getattr(r.limits, limit))
        return r.take(n, what)

    return write, read


def _text(what: str) -> _Field:
    def read(r: _Reader) -> str:
        try:
            return r.take(r.limited(what, r.limits.max_text_bytes, 0), what).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedMessage(f"{what} is not UTF-8") from exc

    return lambda out, text: _bytes(what)[0](out, text.encode("utf-8")), read


def _list(item: _Field, what: str, limit: str, min_item_size: int) -> _Field:
    """A count, then that many items (at most ``limits.<limit>``)."""

    def write(out: bytearray, values: tuple[Any, ...]) -> None:
        _write_uleb(out, len(values))
        for value in values:
            item[0](out, value)

    def read(r: _Reader) -> tuple[Any, ...]:
        n = r.limited(what, getattr(r.limits, limit), min_item_size)
        return tuple(item[1](r) for _ in range(n))

    return write, read


def _tag(r: _Reader, what: str, tags: int = 2) -> int:
    tag = r.byte(what)
    if tag >= tags:
        raise MalformedMessage(f"unknown {what} tag {tag}")
    return tag


def _option(item: _Field) -> _Field:
    # Beelay writes 0 or 1; its parse::maybe (src/parse.rs line 116) would also take any
    # other non-zero byte as "present". Only 0 and 1 are accepted here, so every message
    # has exactly one encoding.
    def write(out: bytearray, value: Any) -> None:
        out.append(value is not None)
        if value is not None:
            item[0](out, value)

    return write, lambda r: item[1](r) if _tag(r, "option") else None


def _struct(cls: type, *parts: _Field) -> _Field:
    """A dataclass as its fields in order."""
    names = [f.name for f in dataclasses.fields(cls)][: len(parts)]

    def write(out: bytearray, value: Any) -> None:
        for (part, _), name in zip(parts, names, strict=True):
            part(out, getattr(value, name))

    return write, lambda r: cls(*(read(r) for _, read in parts))


def _tagged(what: str, variants: dict[int, tuple[type, _Field]]) -> _Field:
    """One of ``variants`` (tag -> class and codec): its tag byte, then its codec's bytes."""
    tags = {cls: tag for tag, (cls, _) in variants.items()}

    def write(out: bytearray, value: Any) -> None:
        tag = tags[type(value)]
        out.append(tag)
        variants[tag][1][0](out, value)

    def read(r: _Reader) -> Any:
        tag = r.byte(what)
        if tag not in variants:
            raise MalformedMessage(f"unknown {what} {tag}")
        return variants[tag][1][1](r)

    return write, read


_ID = _fixed(ID_SIZE, "an id")
_DOC = _fixed(DOCUMENT_KEY_SIZE, "a document id")
_HASH = _fixed(HASH_SIZE, "a hash")
_HASHES = _list(_HASH, "hashes", "max_hashes", HASH_SIZE)
_SYMBOLS = _list(
    _struct(
        CodedSymbol,
        _fixed(SYMBOL_SIZE, "a coded symbol"),
        (
            lambda out, c: out.extend((c & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")),
            lambda r: int.from_bytes(r.take(8, "a coded symbol's checksum"), "big"),
        ),
        (_write_sleb, _read_sleb),
    ),
    "coded symbols",
    "max_symbols",
    SYMBOL_SIZE + 9,
)
_BLOB_META = _struct(BlobMeta, _HASH, _uleb("a blob size"))
_SUMMARY = _struct(
    SedimentreeSummary,
    _list(
        _struct(StratumMeta, _option(_HASH), _HASH, _BLOB_META),
        "strata",
        "max_hashes",
        1 + 2 * HASH_SIZE + 1,
    ),
    _list(
        _struct(LooseCommit, _HASH, _HASHES, _BLOB_META), "commits", "max_hashes", 2 * HASH_SIZE + 2
    ),
)


def _write_blob_ref(out: bytearray, blob: BlobRef) -> None:
    if (blob.hash is None) == (blob.data is None):
        raise CollectionUsageError("a BlobRef has either a hash or inline data")
    out.append(blob.hash is None)
    if blob.hash is not None:
        _HASH[0](out, blob.hash)
    else:
        _INLINE[0](out, blob.data)


def _read_blob_ref(r: _Reader) -> BlobRef:
    if _tag(r, "blob reference"):
        return BlobRef(data=_INLINE[1](r))
    return BlobRef(hash=_HASH[1](r))


def _body(cls: type, *parts: _Field) -> tuple[type, _Field]:
    """A body's class and its codec, its fields in order."""
    return cls, _struct(cls, *parts)


_INLINE = _bytes("an inline blob")
_TREE_PART = _tagged(
    "tree part",
    {
        0: _body(StratumPart, _option(_HASH), _HASH, _HASHES),
        1: _body(CommitPart, _HASH, _HASHES),
    },
)
# A sedimentree response is an option: tag 0 when the document is not found.
_FOUND = _option(_struct(FetchSedimentreeResponse, _SUMMARY, _SUMMARY))
_SEDIMENTREE: _Field = (
    lambda out, resp: _FOUND[0](out, None if resp.content is None else resp),
    lambda r: _FOUND[1](r) or FetchSedimentreeResponse(None),
)

#: Request types Beelay has and Chorus does not serve: the uploads.
_UPLOADS = (0, 3)
_REQUEST_BODY = _tagged(
    "request type",
    {
        1: _body(FetchSedimentreeRequest, _DOC),
        2: _body(FetchBlobPartRequest, _HASH, _uleb("an offset"), _uleb("a length")),
        4: _body(CreateSnapshotRequest, _DOC),
        5: _body(SnapshotSymbolsRequest, _ID),
        6: _body(ListenRequest, _ID),
    },
)
_RESPONSE_BODY = _tagged(
    "response type",
    {
        0: _body(ErrorResponse, _text("an error message")),
        2: (FetchSedimentreeResponse, _SEDIMENTREE),
        3: _body(FetchBlobPartResponse, _bytes("a blob part", "max_blob_part_bytes")),
        4: _body(CreateSnapshotResponse, _ID, _SYMBOLS),
        5: _body(SnapshotSymbolsResponse, _SYMBOLS),
        6: _body(ListenResponse),
    },
)
_UPLOAD_ITEM = _struct(UploadItem, (_write_blob_ref, _read_blob_ref), _TREE_PART)
_MESSAGE = _tagged(
    "message type",
    {
        MESSAGE_REQUEST: _body(Request, _ID, _REQUEST_BODY),
        MESSAGE_RESPONSE: _body(Response, _ID, _RESPONSE_BODY),
        MESSAGE_NOTIFICATION: _body(Notification, _text("a peer id"), _DOC, _UPLOAD_ITEM),
    },
)


def encode_message(message: Message) -> bytes:
    """The bytes of ``message``."""
    out = bytearray()
    _MESSAGE[0](out, message)
    return bytes(out)


def decode_message(data: bytes, limits: MessageLimits = DEFAULT_LIMITS) -> Message:
    """Decode one whole message (trailing bytes are an error).

    Raises :class:`MalformedMessage`, :class:`LimitExceeded`, or
    :class:`UnsupportedRequest` for request types Chorus does not serve.
    """
    if len(data) > limits.max_message_bytes:
        raise LimitExceeded(f"a message of {len(data)} bytes, over the limit")
    data = bytes(data)
    # A request is its message type, its id, then its request type.
    if len(data) > 1 + ID_SIZE and data[0] == MESSAGE_REQUEST and data[1 + ID_SIZE] in _UPLOADS:
        kind, request_id = data[1 + ID_SIZE], data[1 : 1 + ID_SIZE]
        raise UnsupportedRequest(f"request type {kind} is not served", request_id)
    r = _Reader(data, limits)
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
