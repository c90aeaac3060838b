"""The asyncio runtime: reliable group channels over any transport.

::

    from sdk.runtime import Node, Delivery
    from transports.memory import MemoryNetwork

    async with Node(transport, "alice", db="alice.db") as node:
        room = await node.join("room")
        handle = await room.send(b"hello")
        await handle.acknowledged(timeout=30)
        async for event in room.events():
            if isinstance(event, Delivery):
                print(event.sender_id, event.content.decode())

One :class:`Node` per participant: one transport, one timer, one database,
any number of :class:`ReliableChannel`. See ``docs/runtime.md``.
"""

from __future__ import annotations

from sdk.encryption.hook import DecryptionFailed, Encryption
from sdk.runtime.errors import (
    ChannelClosed,
    ChorusRuntimeError,
    RuntimeFailure,
    SendExpired,
    SendFailed,
)
from sdk.runtime.events import (
    CatchUpCompleted,
    CatchUpState,
    ChannelNotArchived,
    Delivery,
    NodeFailed,
    PublishFailed,
    StoreRetrievalFailed,
    StoreUnreachable,
    SubscriptionEnded,
    SyncState,
    SyncStatus,
    SyncStatusChanged,
)
from sdk.runtime.node import Node, RuntimeOptions, wall_clock_ms
from sdk.runtime.reliable_channel import ReliableChannel, SendHandle
from sdk.sds.events import (
    BloomProfileMismatch,
    EphemeralReceived,
    Event,
    MessageAcknowledged,
    MessageLost,
    MessageMissing,
    MessagePossiblyAcknowledged,
    MessageRejected,
    MessageSendExpired,
    MessageSent,
)

__all__ = [
    "BloomProfileMismatch",
    "CatchUpCompleted",
    "CatchUpState",
    "ChannelClosed",
    "ChannelNotArchived",
    "ChorusRuntimeError",
    "DecryptionFailed",
    "Delivery",
    "Encryption",
    "EphemeralReceived",
    "Event",
    "MessageAcknowledged",
    "MessageLost",
    "MessageMissing",
    "MessagePossiblyAcknowledged",
    "MessageRejected",
    "MessageSendExpired",
    "MessageSent",
    "Node",
    "NodeFailed",
    "PublishFailed",
    "ReliableChannel",
    "RuntimeFailure",
    "RuntimeOptions",
    "SendExpired",
    "SendFailed",
    "SendHandle",
    "StoreRetrievalFailed",
    "StoreUnreachable",
    "SubscriptionEnded",
    "SyncState",
    "SyncStatus",
    "SyncStatusChanged",
    "wall_clock_ms",
]
