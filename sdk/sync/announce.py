"""Announce over the pub/sub transports: who is interested in which schemas.

The spec leaves the announcement channel open ("a very suitable pattern is
publish-subscribe"). Over a :class:`~transports.base.Transport` topic a peer
publishes ``[peer_id, <Announce message>]``: the Announce message is
aquadoggo's bytes (:mod:`sdk.sync.messages`), wrapped with the sender's id
because pub/sub, unlike a libp2p connection, does not say who sent it.
:class:`Announcements` keeps one state per peer and replaces it only with a
newer timestamp (spec 1, :func:`supersedes`, the one place that rule lives: a
replication session follows it too); :func:`listen_announcements` feeds it from a topic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sdk.documents import cbor
from sdk.documents.errors import DocumentError
from sdk.sync.errors import MalformedMessage
from sdk.sync.messages import Announce, decode, encode

if TYPE_CHECKING:  # the pure state below (and session.py, which imports it) needs no transport
    from transports.base import Transport

#: The pub/sub topic announcements travel on by default.
ANNOUNCE_TOPIC = "chorus/p2panda/v1/announce"
_MAX_PEER_ID = 256


def supersedes(announce: Announce, current: Announce | None) -> bool:
    """Whether ``announce`` replaces a peer's ``current`` one: only a newer
    timestamp does (spec 1), so a replayed or reordered Announce changes nothing."""
    return current is None or announce.timestamp > current.timestamp


def encode_announcement(peer_id: str, announce: Announce) -> bytes:
    """The pub/sub payload of ``announce`` from ``peer_id``."""
    # A two-element array: the id, then the Announce message's own bytes.
    return b"\x82" + cbor.encode(peer_id) + encode(announce)


def decode_announcement(data: bytes) -> tuple[str, Announce]:
    """``(peer_id, announce)`` of a pub/sub payload; :class:`MalformedMessage` otherwise."""
    try:
        value = cbor.decode(data, max_depth=3)
    except DocumentError as exc:
        raise MalformedMessage(f"announcement is not CBOR the protocol uses: {exc}") from exc
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], str):
        raise MalformedMessage("an announcement is [peer_id, announce message]")
    peer_id = value[0]
    if not peer_id or len(peer_id) > _MAX_PEER_ID:
        raise MalformedMessage("a peer id of 1 to 256 characters")
    message = decode(cbor.encode(value[1]))
    if not isinstance(message, Announce):
        raise MalformedMessage("the wrapped message is not an Announce")
    return peer_id, message


class Announcements:
    """The latest Announce of every peer (pure state; no I/O)."""

    def __init__(self, max_peers: int = 10_000) -> None:
        self._by_peer: dict[str, Announce] = {}
        self.max_peers = max_peers
        self.rejected = 0

    def receive(self, peer_id: str, announce: Announce) -> bool:
        """Take an announcement; True if it replaced the peer's state (newer timestamp)."""
        current = self._by_peer.get(peer_id)
        if not supersedes(announce, current):
            return False
        if current is None and len(self._by_peer) >= self.max_peers:
            self.rejected += 1
            return False
        self._by_peer[peer_id] = announce
        return True

    def receive_bytes(self, data: bytes) -> str | None:
        """Take a pub/sub payload; the peer id if it replaced a state, else ``None``."""
        try:
            peer_id, announce = decode_announcement(data)
        except MalformedMessage:
            self.rejected += 1
            return None
        return peer_id if self.receive(peer_id, announce) else None

    def get(self, peer_id: str) -> Announce | None:
        """A peer's current announcement."""
        return self._by_peer.get(peer_id)

    def interested_in(self, schema_id: str) -> list[str]:
        """Peers whose current announcement lists ``schema_id``."""
        return sorted(p for p, a in self._by_peer.items() if schema_id in a.schema_ids)


async def publish_announcement(
    transport: Transport, peer_id: str, announce: Announce, topic: str = ANNOUNCE_TOPIC
) -> None:
    """Publish our announcement on ``topic``."""
    await transport.publish(topic, encode_announcement(peer_id, announce))


async def listen_announcements(
    transport: Transport,
    board: Announcements,
    topic: str = ANNOUNCE_TOPIC,
    on_new: Callable[[str, Announce], None] | None = None,
) -> None:
    """Feed ``board`` from ``topic`` until the subscription ends; bad payloads are counted."""
    subscription = await transport.subscribe(topic)
    try:
        async for envelope in subscription:
            peer_id = board.receive_bytes(envelope.payload)
            if peer_id is not None and on_new is not None:
                on_new(peer_id, board._by_peer[peer_id])
    finally:
        await subscription.close()


__all__ = [
    "ANNOUNCE_TOPIC",
    "Announcements",
    "decode_announcement",
    "encode_announcement",
    "listen_announcements",
    "publish_announcement",
    "supersedes",
]
