"""Bamboo point-to-point: replicate ranges of Bamboo logs between two endpoints.

The protocol of ``specs/bamboo-point-2-point.md`` as a sans-I/O machine
(:class:`~sdk.sync.bamboo_p2p.machine.BambooMachine`: bytes in, bytes out, events,
and requests for its store), and :class:`Endpoint`: the machine with its requests
carried out on a store at once. See ``docs/bamboo-p2p.md``.

::

    a = Endpoint(Role.PROACTIVE, store_a)          # the side that connected
    b = Endpoint(Role.REACTIVE, store_b)
    b.receive_data(a.data_to_send()); a.receive_data(b.data_to_send())
    a.propose((author, log_id), start=1, end=100)  # once b granted credit
    ...                                            # keep exchanging bytes
    while (event := a.next_event()) is not None: ...
"""

from __future__ import annotations

from sdk.sync.bamboo_p2p.certpool import (
    certificate_pool,
    lower_pool,
    next_boundary,
    shortest_path,
    upper_pool,
)
from sdk.sync.bamboo_p2p.codec import decode_control, decode_data, encode_control, encode_data
from sdk.sync.bamboo_p2p.endpoint import Endpoint
from sdk.sync.bamboo_p2p.entries import is_end_of_log, sign_log_entry
from sdk.sync.bamboo_p2p.errors import (
    AdjustmentViolation,
    ApologyViolation,
    BambooP2PError,
    CompressionViolation,
    CreditViolation,
    DataOrderViolation,
    EagernessViolation,
    FramingError,
    InvalidData,
    LocalProtocolError,
    MalformedMessage,
    PayloadSizeViolation,
    RangeViolation,
    RemoteProtocolError,
    RequestIdViolation,
    SkipViolation,
    UnknownRequest,
)
from sdk.sync.bamboo_p2p.events import (
    ConnectionDropped,
    EndOfLogDetected,
    EntryReceived,
    EntryUnverifiable,
    Event,
    LogForkDetected,
    PayloadReceived,
    ProposalConfirmed,
    ProposalDropped,
    ProposalReceived,
    RequestCancelled,
    RequestClosed,
    RequestStalled,
    SessionEstablished,
    StartingHashMismatch,
)
from sdk.sync.bamboo_p2p.framing import MAX_FRAME_SIZE, Channel, ChannelFrameDecoder, encode_frame
from sdk.sync.bamboo_p2p.machine import BambooMachine, EndpointConfig, EndpointStats
from sdk.sync.bamboo_p2p.messages import (
    ALL,
    NOTIFY,
    Adjust,
    Apology,
    Cancel,
    CancelMarker,
    CancelReason,
    CompressedPayload,
    ControlMessage,
    DataMessage,
    EagerMode,
    Eagerness,
    GrantCredit,
    Metadata,
    Notify,
    PayloadChunk,
    Propose,
    SkipBytes,
    SkipTooLarge,
    SkipTooSmall,
    SkipUnavailable,
    SwitchRequest,
)
from sdk.sync.bamboo_p2p.setup import Role, SessionParams, SetupInfo, decode_setup, negotiate
from sdk.sync.bamboo_p2p.sqlite_store import SqliteLogStore
from sdk.sync.bamboo_p2p.store import (
    LogKey,
    LogStore,
    MemoryLogStore,
    append_entry,
    resume_offset,
)

__all__ = [
    "ALL",
    "MAX_FRAME_SIZE",
    "NOTIFY",
    "Adjust",
    "AdjustmentViolation",
    "Apology",
    "ApologyViolation",
    "BambooMachine",
    "BambooP2PError",
    "Cancel",
    "CancelMarker",
    "CancelReason",
    "Channel",
    "ChannelFrameDecoder",
    "CompressedPayload",
    "CompressionViolation",
    "ConnectionDropped",
    "ControlMessage",
    "CreditViolation",
    "DataMessage",
    "DataOrderViolation",
    "EagerMode",
    "Eagerness",
    "EagernessViolation",
    "EndOfLogDetected",
    "Endpoint",
    "EndpointConfig",
    "EndpointStats",
    "EntryReceived",
    "EntryUnverifiable",
    "Event",
    "FramingError",
    "GrantCredit",
    "InvalidData",
    "LocalProtocolError",
    "LogForkDetected",
    "LogKey",
    "LogStore",
    "MalformedMessage",
    "MemoryLogStore",
    "Metadata",
    "Notify",
    "PayloadChunk",
    "PayloadReceived",
    "PayloadSizeViolation",
    "ProposalConfirmed",
    "ProposalDropped",
    "ProposalReceived",
    "Propose",
    "RangeViolation",
    "RemoteProtocolError",
    "RequestCancelled",
    "RequestClosed",
    "RequestIdViolation",
    "RequestStalled",
    "Role",
    "SessionEstablished",
    "SessionParams",
    "SetupInfo",
    "SkipBytes",
    "SkipTooLarge",
    "SkipTooSmall",
    "SkipUnavailable",
    "SkipViolation",
    "SqliteLogStore",
    "StartingHashMismatch",
    "SwitchRequest",
    "UnknownRequest",
    "append_entry",
    "certificate_pool",
    "decode_control",
    "decode_data",
    "decode_setup",
    "encode_control",
    "encode_data",
    "encode_frame",
    "is_end_of_log",
    "lower_pool",
    "negotiate",
    "next_boundary",
    "resume_offset",
    "shortest_path",
    "sign_log_entry",
    "upper_pool",
]
