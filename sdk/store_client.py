"""The store-client interface the runtime uses to fetch missing messages.

A store node (``store_node``) archives every message of a channel. When the SDS
core reports a dependency missing, the runtime asks a :class:`StoreClient` for
it by message id and, when known, by retrieval hint, and feeds whatever comes
back into the channel as if it had arrived from the transport. Store queries
come before SDS-R repair, which asks peers to rebroadcast.

:class:`InMemoryStore` is a complete in-process implementation (archive and
client in one) for tests, the demo and single-process apps; the gRPC client for
a real store node implements the same protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


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
        result; order is unspecified. Raises on transport/service failure.
        """
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class InMemoryStore:
    """An archive in a dict, usable directly as a :class:`StoreClient`."""

    def __init__(self) -> None:
        self._by_id: dict[tuple[str, str], bytes] = {}
        self._by_hint: dict[bytes, bytes] = {}

    def archive(
        self, channel_id: str, message_id: str, data: bytes, retrieval_hint: bytes | None = None
    ) -> None:
        """Keep ``data`` (idempotent on ``(channel_id, message_id)``)."""
        self._by_id.setdefault((channel_id, message_id), data)
        if retrieval_hint is not None:
            self._by_hint.setdefault(retrieval_hint, data)

    def __len__(self) -> int:
        return len(self._by_id)

    def lookup(
        self, channel_id: str, message_ids: Sequence[str], retrieval_hints: Sequence[bytes] = ()
    ) -> list[bytes]:
        """Synchronous form of :meth:`get_messages`, for sans-I/O simulations."""
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

    async def close(self) -> None:
        """Nothing to release."""
