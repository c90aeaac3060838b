"""The SDS wire message (specs/sds.md, "Message") and its codec.

The protobuf schema is ``proto/sds/v1/sds.proto``; this module converts between
its bytes and small immutable Python values, and classifies a message as
content, sync or ephemeral the way the spec (and ``@waku/sds``) does:

========== ===================== ===============
kind       ``lamport_timestamp`` ``content``
========== ===================== ===============
content    set                   non-empty
sync       set                   empty / unset
ephemeral  unset                 non-empty
========== ===================== ===============

Anything else is rejected as :attr:`RejectReason.INVALID_KIND`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from google.protobuf.message import DecodeError

from sdk._proto.sds.v1 import sds_pb2
from sdk.sds.errors import RejectReason, RemoteProtocolError
from sdk.sds.limits import DEFAULT_LIMITS, Limits


class MessageKind(Enum):
    """What a message is for (see the module docstring)."""

    CONTENT = "content"
    SYNC = "sync"
    EPHEMERAL = "ephemeral"


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """A reference to a message: its id, and optionally how to fetch it and who sent it."""

    message_id: str
    retrieval_hint: bytes | None = None
    #: Original sender; populated when SDS-R is enabled.
    sender_id: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One SDS message, as on the wire."""

    sender_id: str
    message_id: str
    channel_id: str
    lamport_timestamp: int | None = None
    causal_history: tuple[HistoryEntry, ...] = ()
    bloom_filter: bytes | None = None
    content: bytes | None = None
    repair_request: tuple[HistoryEntry, ...] = ()

    @property
    def kind(self) -> MessageKind:
        """Content, sync or ephemeral; raises :class:`RemoteProtocolError` for neither."""
        if self.lamport_timestamp is not None:
            return MessageKind.CONTENT if self.content else MessageKind.SYNC
        if self.content:
            return MessageKind.EPHEMERAL
        raise RemoteProtocolError(RejectReason.INVALID_KIND, "no lamport_timestamp and no content")


def _entry_to_pb(entry: HistoryEntry, out: sds_pb2.HistoryEntry) -> None:
    out.message_id = entry.message_id
    if entry.retrieval_hint is not None:
        out.retrieval_hint = entry.retrieval_hint
    if entry.sender_id is not None:
        out.sender_id = entry.sender_id


def encode_message(message: Message) -> bytes:
    """Serialize ``message`` to its protobuf bytes."""
    pb = sds_pb2.Message(
        sender_id=message.sender_id,
        message_id=message.message_id,
        channel_id=message.channel_id,
    )
    if message.lamport_timestamp is not None:
        pb.lamport_timestamp = message.lamport_timestamp
    for entry in message.causal_history:
        _entry_to_pb(entry, pb.causal_history.add())
    if message.bloom_filter is not None:
        pb.bloom_filter = message.bloom_filter
    for entry in message.repair_request:
        _entry_to_pb(entry, pb.repair_request.add())
    if message.content is not None:
        pb.content = message.content
    return pb.SerializeToString()


def _check_id(value: str, what: str, limits: Limits) -> None:
    # len(str) <= len(utf8) <= 4*len(str): only encode when the cheap bound is inconclusive.
    if len(value) > limits.max_id_length or (
        4 * len(value) > limits.max_id_length and len(value.encode()) > limits.max_id_length
    ):
        raise RemoteProtocolError(
            RejectReason.FIELD_TOO_LONG, f"{what} longer than {limits.max_id_length} bytes"
        )


def _entries(
    pb_entries: object, what: str, limit: int, reason: RejectReason, limits: Limits
) -> tuple[HistoryEntry, ...]:
    items = list(pb_entries)  # type: ignore[call-overload]
    if len(items) > limit:
        raise RemoteProtocolError(reason, f"{what} has {len(items)} entries, limit {limit}")
    out = []
    for e in items:
        mid = e.message_id
        if not mid:
            raise RemoteProtocolError(RejectReason.MISSING_ID, f"{what} entry without message_id")
        _check_id(mid, f"{what} message_id", limits)
        hint = e.retrieval_hint if e.HasField("retrieval_hint") else None
        if hint is not None and len(hint) > limits.max_retrieval_hint_size:
            raise RemoteProtocolError(
                RejectReason.FIELD_TOO_LONG, f"{what} retrieval_hint of {len(hint)} bytes"
            )
        sender = e.sender_id if e.HasField("sender_id") else None
        if sender is not None:
            _check_id(sender, f"{what} sender_id", limits)
        out.append(HistoryEntry(mid, hint, sender))
    return tuple(out)


def decode_message(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Parse and bound-check bytes from a peer.

    Raises :class:`RemoteProtocolError` (never anything else) when the bytes are
    not a valid SDS message within ``limits``. The message kind is checked too,
    so a returned message always has a valid :attr:`Message.kind`.
    """
    if len(data) > limits.max_message_size:
        raise RemoteProtocolError(
            RejectReason.TOO_LARGE, f"{len(data)} bytes, limit {limits.max_message_size}"
        )
    pb = sds_pb2.Message()
    try:
        pb.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise RemoteProtocolError(RejectReason.DECODE, str(exc) or "invalid protobuf") from None
    if not pb.message_id:
        raise RemoteProtocolError(RejectReason.MISSING_ID, "message without message_id")
    _check_id(pb.sender_id, "sender_id", limits)
    _check_id(pb.message_id, "message_id", limits)
    _check_id(pb.channel_id, "channel_id", limits)
    bloom = pb.bloom_filter if pb.HasField("bloom_filter") else None
    if bloom is not None and len(bloom) > limits.max_bloom_filter_size:
        raise RemoteProtocolError(
            RejectReason.FILTER_TOO_LARGE,
            f"bloom_filter of {len(bloom)} bytes, limit {limits.max_bloom_filter_size}",
        )
    message = Message(
        sender_id=pb.sender_id,
        message_id=pb.message_id,
        channel_id=pb.channel_id,
        lamport_timestamp=pb.lamport_timestamp if pb.HasField("lamport_timestamp") else None,
        causal_history=_entries(
            pb.causal_history,
            "causal_history",
            limits.max_causal_history,
            RejectReason.HISTORY_TOO_LONG,
            limits,
        )
        if pb.causal_history
        else (),
        bloom_filter=bloom,
        content=pb.content if pb.HasField("content") else None,
        repair_request=_entries(
            pb.repair_request,
            "repair_request",
            limits.max_repair_request,
            RejectReason.REPAIR_REQUEST_TOO_LONG,
            limits,
        )
        if pb.repair_request
        else (),
    )
    message.kind  # noqa: B018 - raises for a message that is neither content, sync nor ephemeral
    return message
