"""Helpers of the offline-client end-to-end test: a filtering transport, a counting store client."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence

from sdk.sds import decode_message
from sdk.sds.errors import RemoteProtocolError
from sdk.store.grpc import GrpcStoreClient
from transports.base import Envelope, Subscription, Transport


class _FilteredSubscription(Subscription):
    def __init__(self, inner: Subscription, owner: DropIdsTransport) -> None:
        self.inner = inner
        self.topic = inner.topic
        self._owner = owner

    async def __anext__(self) -> Envelope:
        while True:
            envelope = await self.inner.__anext__()
            if self._owner.admit(envelope):
                return envelope

    async def close(self) -> None:
        await self.inner.close()


class DropIdsTransport(Transport):
    """Wraps ``inner``; drops every incoming envelope whose SDS message id is in ``drop_ids``.

    With ``drop_ids`` = the messages a client missed while offline, the client
    cannot get them from its peers (rebroadcasts, resends, repairs), only from
    a store. Publishing is untouched.
    """

    def __init__(self, inner: Transport, drop_ids: set[str]) -> None:
        self.inner = inner
        self.drop_ids = drop_ids
        self.max_payload_size = inner.max_payload_size
        #: Copies of dropped messages, by message id.
        self.dropped: Counter[str] = Counter()
        #: Message ids of everything let through.
        self.admitted: Counter[str] = Counter()

    def admit(self, envelope: Envelope) -> bool:
        try:
            mid = decode_message(envelope.payload).message_id
        except RemoteProtocolError:
            return True
        if mid in self.drop_ids:
            self.dropped[mid] += 1
            return False
        self.admitted[mid] += 1
        return True

    async def publish(self, topic: str, payload: bytes) -> bytes:
        return await self.inner.publish(topic, payload)

    async def subscribe(self, topic: str) -> Subscription:
        return _FilteredSubscription(await self.inner.subscribe(topic), self)

    async def close(self) -> None:
        await self.inner.close()


class CountingStoreClient(GrpcStoreClient):
    """A :class:`GrpcStoreClient` that records every ``get_messages`` and ``messages_between``
    call and what they returned."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.calls = 0
        self.range_calls = 0
        #: Every time window asked for, ``(time_start, time_end)`` in epoch ms.
        self.windows: list[tuple[int, int | None]] = []
        self.requested: Counter[str] = Counter()
        #: Message ids returned by the store, with how many times each came back.
        self.returned: Counter[str] = Counter()

    async def get_messages(
        self,
        channel_id: str,
        message_ids: Sequence[str],
        retrieval_hints: Sequence[bytes] = (),
    ) -> list[bytes]:
        self.calls += 1
        self.requested.update(message_ids)
        found = await super().get_messages(channel_id, message_ids, retrieval_hints)
        self.returned.update(decode_message(data).message_id for data in found)
        return found

    async def messages_between(
        self, channel_id: str, time_start: int, time_end: int | None = None
    ) -> AsyncIterator[list[bytes]]:
        self.range_calls += 1
        self.windows.append((time_start, time_end))
        async for page in super().messages_between(channel_id, time_start, time_end):
            self.returned.update(decode_message(data).message_id for data in page)
            yield page
