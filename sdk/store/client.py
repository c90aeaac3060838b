"""The store-client interface the runtime uses to fetch missing messages.

A store node (``store_node``) archives every message of a channel. The runtime
asks a :class:`StoreClient` in two ways and feeds whatever comes back into the
channel as if it had arrived from the transport:

* by message id and, when known, retrieval hint, when the SDS core reports a
  dependency missing (before SDS-R repair asks peers to rebroadcast);
* by time range (:meth:`StoreClient.messages_between`), when a channel is
  joined again after a restart, after a transport reconnect and on request
  (``ReliableChannel.catch_up``): everything the store received while this
  participant was away, without waiting for a peer to reveal the gap.

:class:`InMemoryStore` is a complete in-process implementation (archive and
client in one) for tests, the demo and single-process apps; the gRPC client for
a real store node implements the same protocol.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Protocol, runtime_checkable

from sdk.store.errors import NotArchived


@runtime_checkable
class StoreClient(Protocol):
    """Fetches archived SDS messages."""

    async def get_messages(
        self,
        channel_id: str,
        message_ids: Sequence[str],
        retrieval_hints: Sequence[bytes] = (),
    ) -> list[bytes]:
        """Return the raw SDS message bytes of every requested message the store has.

        A message matches if its id is in ``message_ids`` or its retrieval hint
        is in ``retrieval_hints``. Missing ones are simply absent from the
        result; order is unspecified. Raises on transport/service failure, and
        :class:`~sdk.store.errors.NotArchived` when the store does not archive
        ``channel_id``.
        """
        ...

    def messages_between(
        self, channel_id: str, time_start: int, time_end: int | None = None
    ) -> AsyncIterator[list[bytes]]:
        """The raw SDS bytes of the channel's archived messages that reached the store in
        ``[time_start, time_end)`` (epoch ms on the store's arrival clock; ``None``: up to
        now), oldest first, one list per page (an empty range: one empty page). Raises on
        transport/service failure, and :class:`~sdk.store.errors.NotArchived` when the
        store does not archive ``channel_id`` (never an empty answer for it)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class InMemoryStore:
    """An archive in a dict, usable directly as a :class:`StoreClient`.

    ``channels``: the channels it archives (queries for others raise
    :class:`~sdk.store.errors.NotArchived`, as a store node does); ``None``: any.
    """

    #: Messages per page of :meth:`messages_between`.
    page_size = 256

    def __init__(self, channels: Collection[str] | None = None) -> None:
        self.channels = None if channels is None else frozenset(channels)
        self._by_id: dict[tuple[str, str], bytes] = {}
        self._by_hint: dict[bytes, bytes] = {}
        #: Per channel, ``(arrival ms, data)`` in arrival order.
        self._arrivals: dict[str, list[tuple[int, bytes]]] = {}

    def archive(
        self,
        channel_id: str,
        message_id: str,
        data: bytes,
        retrieval_hint: bytes | None = None,
        arrived_at: int | None = None,
    ) -> None:
        """Keep ``data`` (idempotent on ``(channel_id, message_id)``); ``arrived_at`` is the
        arrival time in epoch ms (the wall clock when ``None``)."""
        key = (channel_id, message_id)
        if key in self._by_id:
            return
        self._by_id[key] = data
        if retrieval_hint is not None:
            self._by_hint.setdefault(retrieval_hint, data)
        at = time.time_ns() // 1_000_000 if arrived_at is None else arrived_at
        self._arrivals.setdefault(channel_id, []).append((at, data))

    def __len__(self) -> int:
        return len(self._by_id)

    def _check_archived(self, channel_id: str) -> None:
        if self.channels is not None and channel_id not in self.channels:
            raise NotArchived(channel_id, f"this store does not archive channel {channel_id!r}")

    def lookup(
        self, channel_id: str, message_ids: Sequence[str], retrieval_hints: Sequence[bytes] = ()
    ) -> list[bytes]:
        """Synchronous form of :meth:`get_messages`, for sans-I/O simulations."""
        self._check_archived(channel_id)
        found: dict[int, bytes] = {}
        for mid in message_ids:
            data = self._by_id.get((channel_id, mid))
            if data is not None:
                found[id(data)] = data
        for hint in retrieval_hints:
            data = self._by_hint.get(hint)
            if data is not None:
                found[id(data)] = data
        return list(found.values())

    async def get_messages(
        self,
        channel_id: str,
        message_ids: Sequence[str],
        retrieval_hints: Sequence[bytes] = (),
    ) -> list[bytes]:
        """See :meth:`StoreClient.get_messages`."""
        return self.lookup(channel_id, message_ids, retrieval_hints)

    async def messages_between(
        self, channel_id: str, time_start: int, time_end: int | None = None
    ) -> AsyncIterator[list[bytes]]:
        """See :meth:`StoreClient.messages_between`."""
        self._check_archived(channel_id)
        arrivals = sorted(self._arrivals.get(channel_id, ()), key=lambda a: a[0])
        selected = [
            data
            for at, data in arrivals
            if at >= time_start and (time_end is None or at < time_end)
        ]
        for start in range(0, len(selected), self.page_size):
            yield selected[start : start + self.page_size]

    async def close(self) -> None:
        """Nothing to release."""
