"""The Scalable Data Sync (SDS) protocol core: a pure, clock-injected state machine.

Importing this package imports no asyncio, sockets or clocks. Feed it bytes and
the time; drain bytes to broadcast, events, and the next timer::

    from sdk.sds import MessageChannel, ChannelConfig, MessageDelivered

    alice = MessageChannel("room", "alice", now=0)
    mid = alice.send(b"hello", now=0)
    for datagram in alice.datagrams_to_send():
        bob.receive(datagram.data, now=5)
    while (event := bob.next_event()) is not None:
        if isinstance(event, MessageDelivered):
            print(event.content)

Every participant of a channel must use the same bloom filter profile
(``ChannelConfig.bloom``: :data:`WAKU`, bit-compatible with ``@waku/sds``, or
:data:`COMPACT`) and should use the same SDS-R settings.
"""

from __future__ import annotations

from sdk.sds.archive import LogArchive, MemoryArchive
from sdk.sds.bloom import COMPACT, PROFILES, WAKU, BloomFilter, BloomProfile, RollingBloomFilter
from sdk.sds.channel import Datagram, MessageChannel
from sdk.sds.config import ChannelConfig, RepairConfig
from sdk.sds.errors import (
    LocalProtocolError,
    MessageTooLarge,
    RejectReason,
    RemoteProtocolError,
    SDSError,
)
from sdk.sds.events import (
    BloomProfileMismatch,
    EphemeralReceived,
    Event,
    MessageAcknowledged,
    MessageDelivered,
    MessageLost,
    MessageMissing,
    MessagePossiblyAcknowledged,
    MessageRejected,
    MessageSendExpired,
    MessageSent,
    RetrieveRange,
)
from sdk.sds.limits import DEFAULT_LIMITS, Limits
from sdk.sds.message import HistoryEntry, Message, MessageKind, decode_message, encode_message
from sdk.sds.message_id import compute_message_id
from sdk.sds.outgoing import OutgoingState
from sdk.sds.participant import Participant

__all__ = [
    "COMPACT",
    "DEFAULT_LIMITS",
    "PROFILES",
    "WAKU",
    "BloomFilter",
    "BloomProfile",
    "BloomProfileMismatch",
    "ChannelConfig",
    "Datagram",
    "EphemeralReceived",
    "Event",
    "HistoryEntry",
    "Limits",
    "LocalProtocolError",
    "LogArchive",
    "MemoryArchive",
    "Message",
    "MessageAcknowledged",
    "MessageChannel",
    "MessageDelivered",
    "MessageKind",
    "MessageLost",
    "MessageMissing",
    "MessagePossiblyAcknowledged",
    "MessageRejected",
    "MessageSendExpired",
    "MessageSent",
    "MessageTooLarge",
    "OutgoingState",
    "Participant",
    "RejectReason",
    "RemoteProtocolError",
    "RepairConfig",
    "RetrieveRange",
    "RollingBloomFilter",
    "SDSError",
    "compute_message_id",
    "decode_message",
    "encode_message",
]
