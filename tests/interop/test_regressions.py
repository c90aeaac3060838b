"""Chorus fixes that interop with ``@waku/sds`` called for (no node needed)."""

from __future__ import annotations

import hashlib

from sdk.sds import (
    COMPACT,
    WAKU,
    BloomFilter,
    ChannelConfig,
    Message,
    MessageChannel,
    OutgoingState,
    RollingBloomFilter,
    encode_message,
)

T0 = 1_700_000_000_000


def _ids(n: int, prefix: str) -> list[str]:
    return [hashlib.sha256(f"{prefix}{i}".encode()).hexdigest() for i in range(n)]


def _filled(n: int, profile=WAKU) -> bytes:  # type: ignore[no-untyped-def]
    f = BloomFilter(profile)
    for mid in _ids(n, "filled"):
        f.insert(mid)
    return f.to_bytes()


def test_saturated_peer_filters_acknowledge_nothing() -> None:
    """The reference never rolls its filter over; past capacity its hits are mostly false.
    Two such filters used to acknowledge (and stop resending) any message."""
    config = ChannelConfig(bloom=WAKU, verify_message_ids=False, sync_interval_ms=0)
    chorus = MessageChannel("room", "c1", T0, config)
    mid = chorus.send(b"only chorus has this", T0)
    saturated = b"\xff" * WAKU.size_bytes
    for peer in ("j1", "j2"):
        peer_message = Message(
            sender_id=peer,
            message_id=hashlib.sha256(peer.encode()).hexdigest(),
            channel_id="room",
            lamport_timestamp=T0 + 5,
            bloom_filter=saturated,
            content=peer.encode(),
        )
        chorus.receive(encode_message(peer_message), T0 + 10)
    assert chorus.outgoing_state(mid) is OutgoingState.UNACKNOWLEDGED
    assert chorus.stats["filter_saturated"] == 2
    assert chorus.stats["acknowledged"] == 0


def test_saturation_threshold() -> None:
    """At capacity a filter still counts; well past it (as the reference's gets) it doesn't."""
    assert not WAKU.is_saturated(bytes(WAKU.size_bytes))
    assert not WAKU.is_saturated(_filled(WAKU.capacity))
    assert WAKU.is_saturated(_filled(2 * WAKU.capacity))
    assert not COMPACT.is_saturated(_filled(COMPACT.capacity, COMPACT))
    assert COMPACT.is_saturated(_filled(2 * COMPACT.capacity, COMPACT))


def test_rolling_filter_never_saturates() -> None:
    """Chorus's own filter rolls over, so peers never discard it."""
    rolling = RollingBloomFilter(COMPACT)
    for i, mid in enumerate(_ids(5 * COMPACT.capacity, "rolling")):
        rolling.insert(mid)
        if i % 50 == 0:
            assert not COMPACT.is_saturated(rolling.to_bytes())
