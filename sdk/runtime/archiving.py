"""A transport wrapper that archives every content message published through it.

It stands in for a store node that never misses a message (specs/sds.md's
high-availability cache) in tests, the demo and single-process apps: wrap each
participant's transport and hand the same :class:`~sdk.store.client.InMemoryStore`
to the runtime as its store client.
"""

from __future__ import annotations

from sdk.sds import RemoteProtocolError, decode_message
from sdk.store.client import InMemoryStore
from transports.base import Subscription, Transport


class ArchivingTransport(Transport):
    """Wraps ``inner``; every SDS content message published is archived into ``store``."""

    def __init__(self, inner: Transport, store: InMemoryStore) -> None:
        self.inner = inner
        self.store = store
        self.max_payload_size = inner.max_payload_size

    async def publish(self, topic: str, payload: bytes) -> bytes:
        """Publish through ``inner``, then archive the message under its retrieval hint."""
        hint = await self.inner.publish(topic, payload)
        try:
            message = decode_message(payload)
        except RemoteProtocolError:
            return hint
        if message.lamport_timestamp is not None and message.content:
            self.store.archive(message.channel_id, message.message_id, payload, hint)
        return hint

    async def subscribe(self, topic: str) -> Subscription:
        """Subscribe through ``inner``."""
        return await self.inner.subscribe(topic)

    async def close(self) -> None:
        """Close ``inner``."""
        await self.inner.close()
