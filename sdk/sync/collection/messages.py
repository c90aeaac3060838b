"""Beelay messages as bytes: requests, responses and notifications of collection sync.

The grammar is ``beelay.txt`` (Messages). Where that text and Beelay's code
disagree on bytes both peers must produce, the code decides (automerge/beelay
at c817e9e):

- a notification's message type is **3**, not 2 (``src/messages/encoding_types.rs``
  lines 29 and 40);
- a document id is **16 raw bytes** with no length prefix, in requests and
  notifications alike (``src/lib.rs`` line 165, ``DocumentId::parse``);
- a coded symbol is the 48-byte sum, then its 64-bit checksum **big-endian**,
  then its count as **signed LEB128** (``src/riblt.rs`` lines 444-447); the
  spec's ``coded_symbol`` leaves the last two out;
- fetch_sedimentree's answer is ``0`` (not found) or ``1`` and two summaries,
  each ``uleb128 n, n stratum metas, uleb128 m, m loose commits``
  (``src/sedimentree.rs`` lines 498-525), not opaque bundles;
- LEB128 numbers in their shortest form only, at most 64 bits (``src/leb128.rs``).

Message layout: ``type (0 request, 1 response, 3 notification)``, then for
requests and responses a 16-byte request id, a type byte and the body.

Chorus serves the snapshot requests (create_snapshot 04, snapshot_symbols 05,
fetch_sedimentree 01, fetch_blob_part 02, listen 06) and answers the uploads
(upload commits 00, upload blob 03) with an error response:
:func:`decode_message` raises :class:`UnsupportedRequest` carrying their
request id.

Bounds (:class:`MessageLimits`) apply before anything is allocated: a count
that the remaining bytes cannot hold is malformed, and counts over the limits
raise :class:`LimitExceeded`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from sdk.sds.varint import VarintError, read_canonical_uvarint, write_uvarint
from sdk.sync.collection.errors import (
    CollectionUsageError,
    LimitExceeded,
    MalformedMessage,
    UnsupportedRequest,
)
from sdk.sync.collection.symbols import DOCUMENT_KEY_SIZE, SYMBOL_SIZE
from sdk.sync.riblt import CodedSymbol

ID_SIZE = 16
HASH_SIZE = 32

MESSAGE_REQUEST = 0
MESSAGE_RESPONSE = 1
MESSAGE_NOTIFICATION = 3

REQUEST_UPLOAD_COMMITS = 0
REQUEST_FETCH_SEDIMENTREE = 1
REQUEST_FETCH_BLOB_PART = 2
REQUEST_UPLOAD_BLOB = 3
REQUEST_CREATE_SNAPSHOT = 4
REQUEST_SNAPSHOT_SYMBOLS = 5
REQUEST_LISTEN = 6

RESPONSE_ERROR = 0
RESPONSE_UPLOAD_COMMITS = 1
RESPONSE_FETCH_SEDIMENTREE = 2
RESPONSE_FETCH_BLOB_PART = 3
RESPONSE_CREATE_SNAPSHOT = 4
RESPONSE_SNAPSHOT_SYMBOLS = 5
RESPONSE_LISTEN = 6

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

# -- encoding --------------------------------------------------------------------------


def _uleb(out: bytearray, value: int) -> None:
    if not 0 <= value <= 0xFFFFFFFFFFFFFFFF:
        raise CollectionUsageError(f"{value} does not fit an unsigned 64-bit LEB128")
    write_uvarint(out, value)


def _sleb(out: bytearray, value: int) -> None:
    if not _I64_MIN <= value <= _I64_MAX:
        raise CollectionUsageError(f"{value} does not fit a signed 64-bit LEB128")
    while True:
        byte = value & 0x7F
        value >>= 7
        if (value == 0 and not byte & 0x40) or (value == -1 and byte & 0x40):
            out.append(byte)
            return
        out.append(byte | 0x80)


def _fixed(out: bytearray, data: bytes, size: int, what: str) -> None:
    if len(data) != size:
        raise CollectionUsageError(f"{what} is {size} bytes, got {len(data)}")
    out += data


def _symbols(out: bytearray, symbols: tuple[CodedSymbol, ...]) -> None:
    _uleb(out, len(symbols))
    for symbol in symbols:
        _fixed(out, symbol.sum, SYMBOL_SIZE, "a coded symbol's sum")
        out += (symbol.checksum & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")
        _sleb(out, symbol.count)


def _hashes(out: bytearray, hashes: tuple[bytes, ...]) -> None:
    _uleb(out, len(hashes))
    for h in hashes:
        _fixed(out, h, HASH_SIZE, "a commit hash")


def _optional_hash(out: bytearray, h: bytes | None) -> None:
    if h is None:
        out.append(0)
    else:
        out.append(1)
        _fixed(out, h, HASH_SIZE, "a commit hash")


def _blob_meta(out: bytearray, blob: BlobMeta) -> None:
    _fixed(out, blob.hash, HASH_SIZE, "a blob hash")
    _uleb(out, blob.size)


def _summary(out: bytearray, summary: SedimentreeSummary) -> None:
    _uleb(out, len(summary.strata))
    for stratum in summary.strata:
        _optional_hash(out, stratum.start)
        _fixed(out, stratum.end, HASH_SIZE, "a commit hash")
        _blob_meta(out, stratum.blob)
    _uleb(out, len(summary.commits))
    for commit in summary.commits:
        _fixed(out, commit.hash, HASH_SIZE, "a commit hash")
        _hashes(out, commit.parents)
        _blob_meta(out, commit.blob)


def _upload_item(out: bytearray, item: UploadItem) -> None:
    blob = item.blob
    if (blob.hash is None) == (blob.data is None):
        raise CollectionUsageError("a BlobRef has either a hash or inline data")
    if blob.hash is not None:
        out.append(0)
        _fixed(out, blob.hash, HASH_SIZE, "a blob hash")
    else:
        assert blob.data is not None
        out.append(1)
        _uleb(out, len(blob.data))
        out += blob.data
    part = item.tree_part
    if isinstance(part, StratumPart):
        out.append(0)
        _optional_hash(out, part.start)
        _fixed(out, part.end, HASH_SIZE, "a commit hash")
        _hashes(out, part.checkpoints)
    else:
        out.append(1)
        _fixed(out, part.hash, HASH_SIZE, "a commit hash")
        _hashes(out, part.parents)


def _text(out: bytearray, text: str) -> None:
    data = text.encode("utf-8")
    _uleb(out, len(data))
    out += data


def encode_message(message: Message) -> bytes:
    """The bytes of ``message``."""
    out = bytearray()
    if isinstance(message, Notification):
        out.append(MESSAGE_NOTIFICATION)
        _text(out, message.from_peer)
        _fixed(out, message.document, DOCUMENT_KEY_SIZE, "a document id")
        _upload_item(out, message.item)
        return bytes(out)
    if isinstance(message, Request):
        out.append(MESSAGE_REQUEST)
        _fixed(out, message.request_id, ID_SIZE, "a request id")
        req = message.body
        if isinstance(req, CreateSnapshotRequest):
            out.append(REQUEST_CREATE_SNAPSHOT)
            _fixed(out, req.root, DOCUMENT_KEY_SIZE, "a document id")
        elif isinstance(req, SnapshotSymbolsRequest):
            out.append(REQUEST_SNAPSHOT_SYMBOLS)
            _fixed(out, req.snapshot_id, ID_SIZE, "a snapshot id")
        elif isinstance(req, FetchSedimentreeRequest):
            out.append(REQUEST_FETCH_SEDIMENTREE)
            _fixed(out, req.document, DOCUMENT_KEY_SIZE, "a document id")
        elif isinstance(req, FetchBlobPartRequest):
            out.append(REQUEST_FETCH_BLOB_PART)
            _fixed(out, req.blob, HASH_SIZE, "a blob hash")
            _uleb(out, req.offset)
            _uleb(out, req.length)
        else:
            out.append(REQUEST_LISTEN)
            _fixed(out, req.snapshot_id, ID_SIZE, "a snapshot id")
        return bytes(out)
    out.append(MESSAGE_RESPONSE)
    _fixed(out, message.request_id, ID_SIZE, "a request id")
    resp = message.body
    if isinstance(resp, CreateSnapshotResponse):
        out.append(RESPONSE_CREATE_SNAPSHOT)
        _fixed(out, resp.snapshot_id, ID_SIZE, "a snapshot id")
        _symbols(out, resp.symbols)
    elif isinstance(resp, SnapshotSymbolsResponse):
        out.append(RESPONSE_SNAPSHOT_SYMBOLS)
        _symbols(out, resp.symbols)
    elif isinstance(resp, FetchSedimentreeResponse):
        out.append(RESPONSE_FETCH_SEDIMENTREE)
        if resp.content is None:
            out.append(0)
        else:
            out.append(1)
            _summary(out, resp.content)
            _summary(out, resp.index)
    elif isinstance(resp, FetchBlobPartResponse):
        out.append(RESPONSE_FETCH_BLOB_PART)
        _uleb(out, len(resp.data))
        out += resp.data
    elif isinstance(resp, ListenResponse):
        out.append(RESPONSE_LISTEN)
    else:
        out.append(RESPONSE_ERROR)
        _text(out, resp.message)
    return bytes(out)


# -- decoding --------------------------------------------------------------------------


class _Reader:
    __slots__ = ("data", "limits", "pos")

    def __init__(self, data: bytes, limits: MessageLimits) -> None:
        self.data = data
        self.pos = 0
        self.limits = limits

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def byte(self, what: str) -> int:
        if self.pos >= len(self.data):
            raise MalformedMessage(f"message ends before {what}")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def take(self, n: int, what: str) -> bytes:
        if n > self.remaining():
            raise MalformedMessage(f"message ends inside {what}")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def uleb(self, what: str) -> int:
        try:
            value, self.pos = read_canonical_uvarint(self.data, self.pos)
        except VarintError as exc:
            if exc.truncated:
                raise MalformedMessage(f"message ends before {what}") from None
            if exc.reason == "too long":
                raise MalformedMessage(f"{what}: LEB128 over 64 bits") from None
            raise MalformedMessage(f"{what}: LEB128 not in its shortest form") from None
        return value

    def sleb(self, what: str) -> int:
        value = shift = 0
        while True:
            byte = self.byte(what)
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
        _sleb(check, value)
        if len(check) != shift // 7:
            raise MalformedMessage(f"{what}: LEB128 not in its shortest form")
        return value

    def count(self, what: str, limit: int, min_item_size: int) -> int:
        n = self.uleb(what)
        if n > limit:
            raise LimitExceeded(f"{n} {what}, over the limit of {limit}")
        if n * min_item_size > self.remaining():
            raise MalformedMessage(f"{n} {what} cannot fit in the rest of the message")
        return n

    def symbols(self) -> tuple[CodedSymbol, ...]:
        n = self.count("coded symbols", self.limits.max_symbols, SYMBOL_SIZE + 9)
        out = []
        for _ in range(n):
            total = self.take(SYMBOL_SIZE, "a coded symbol")
            checksum = int.from_bytes(self.take(8, "a coded symbol's checksum"), "big")
            out.append(CodedSymbol(total, checksum, self.sleb("a coded symbol's count")))
        return tuple(out)

    def hashes(self, what: str) -> tuple[bytes, ...]:
        n = self.count(what, self.limits.max_hashes, HASH_SIZE)
        return tuple(self.take(HASH_SIZE, what) for _ in range(n))

    def optional_hash(self) -> bytes | None:
        # Beelay writes 0 or 1; its parse::maybe (src/parse.rs line 116) would also take
        # any other non-zero byte as "present". Only 0 and 1 are accepted here, so every
        # message has exactly one encoding.
        tag = self.byte("an option tag")
        if tag > 1:
            raise MalformedMessage(f"option tag {tag} (0 or 1)")
        return self.take(HASH_SIZE, "a commit hash") if tag else None

    def blob_meta(self) -> BlobMeta:
        return BlobMeta(self.take(HASH_SIZE, "a blob hash"), self.uleb("a blob size"))

    def summary(self) -> SedimentreeSummary:
        n = self.count("strata", self.limits.max_hashes, 1 + 2 * HASH_SIZE + 1)
        strata = tuple(
            StratumMeta(
                self.optional_hash(), self.take(HASH_SIZE, "a commit hash"), self.blob_meta()
            )
            for _ in range(n)
        )
        m = self.count("commits", self.limits.max_hashes, 2 * HASH_SIZE + 2)
        commits = tuple(
            LooseCommit(
                self.take(HASH_SIZE, "a commit hash"), self.hashes("parents"), self.blob_meta()
            )
            for _ in range(m)
        )
        return SedimentreeSummary(strata, commits)

    def text(self, what: str) -> str:
        n = self.uleb(what)
        if n > self.limits.max_text_bytes:
            raise LimitExceeded(f"{what} of {n} bytes, over the limit")
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedMessage(f"{what} is not UTF-8") from exc

    def upload_item(self) -> UploadItem:
        tag = self.byte("a blob reference")
        if tag == 0:
            blob = BlobRef(hash=self.take(HASH_SIZE, "a blob hash"))
        elif tag == 1:
            size = self.uleb("an inline blob's length")
            blob = BlobRef(data=self.take(size, "an inline blob"))
        else:
            raise MalformedMessage(f"unknown blob reference tag {tag}")
        tag = self.byte("a tree part")
        part: StratumPart | CommitPart
        if tag == 0:
            part = StratumPart(
                self.optional_hash(),
                self.take(HASH_SIZE, "a commit hash"),
                self.hashes("checkpoints"),
            )
        elif tag == 1:
            part = CommitPart(self.take(HASH_SIZE, "a commit hash"), self.hashes("parents"))
        else:
            raise MalformedMessage(f"unknown tree part tag {tag}")
        return UploadItem(blob, part)


def decode_message(data: bytes, limits: MessageLimits = DEFAULT_LIMITS) -> Message:
    """Decode one whole message (trailing bytes are an error).

    Raises :class:`MalformedMessage`, :class:`LimitExceeded`, or
    :class:`UnsupportedRequest` for request types Chorus does not serve.
    """
    if len(data) > limits.max_message_bytes:
        raise LimitExceeded(f"a message of {len(data)} bytes, over the limit")
    r = _Reader(bytes(data), limits)
    kind = r.byte("the message type")
    message: Message
    if kind == MESSAGE_NOTIFICATION:
        message = Notification(
            r.text("a peer id"), r.take(DOCUMENT_KEY_SIZE, "a document id"), r.upload_item()
        )
    elif kind == MESSAGE_REQUEST:
        request_id = r.take(ID_SIZE, "a request id")
        req_type = r.byte("the request type")
        req: RequestBody
        if req_type == REQUEST_CREATE_SNAPSHOT:
            req = CreateSnapshotRequest(r.take(DOCUMENT_KEY_SIZE, "a document id"))
        elif req_type == REQUEST_SNAPSHOT_SYMBOLS:
            req = SnapshotSymbolsRequest(r.take(ID_SIZE, "a snapshot id"))
        elif req_type == REQUEST_FETCH_SEDIMENTREE:
            req = FetchSedimentreeRequest(r.take(DOCUMENT_KEY_SIZE, "a document id"))
        elif req_type == REQUEST_FETCH_BLOB_PART:
            req = FetchBlobPartRequest(
                r.take(HASH_SIZE, "a blob hash"), r.uleb("an offset"), r.uleb("a length")
            )
        elif req_type == REQUEST_LISTEN:
            req = ListenRequest(r.take(ID_SIZE, "a snapshot id"))
        elif req_type in (REQUEST_UPLOAD_COMMITS, REQUEST_UPLOAD_BLOB):
            raise UnsupportedRequest(f"request type {req_type} is not served", request_id)
        else:
            raise MalformedMessage(f"unknown request type {req_type}")
        message = Request(request_id, req)
    elif kind == MESSAGE_RESPONSE:
        request_id = r.take(ID_SIZE, "a request id")
        resp_type = r.byte("the response type")
        resp: ResponseBody
        if resp_type == RESPONSE_CREATE_SNAPSHOT:
            resp = CreateSnapshotResponse(r.take(ID_SIZE, "a snapshot id"), r.symbols())
        elif resp_type == RESPONSE_SNAPSHOT_SYMBOLS:
            resp = SnapshotSymbolsResponse(r.symbols())
        elif resp_type == RESPONSE_FETCH_SEDIMENTREE:
            found = r.byte("the found tag")
            if found == 0:
                resp = FetchSedimentreeResponse(None)
            elif found == 1:
                resp = FetchSedimentreeResponse(r.summary(), r.summary())
            else:
                raise MalformedMessage(f"unknown sedimentree tag {found}")
        elif resp_type == RESPONSE_FETCH_BLOB_PART:
            size = r.uleb("a blob part's length")
            if size > limits.max_blob_part_bytes:
                raise LimitExceeded(f"a blob part of {size} bytes, over the limit")
            resp = FetchBlobPartResponse(r.take(size, "a blob part"))
        elif resp_type == RESPONSE_LISTEN:
            resp = ListenResponse()
        elif resp_type == RESPONSE_ERROR:
            resp = ErrorResponse(r.text("an error message"))
        else:
            raise MalformedMessage(f"unknown or unsupported response type {resp_type}")
        message = Response(request_id, resp)
    else:
        raise MalformedMessage(f"unknown message type {kind}")
    if r.remaining():
        raise MalformedMessage(f"{r.remaining()} bytes after the message")
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
]
