"""A tiny harness wiring channels together by hand (no network, no faults)."""

from __future__ import annotations

import random

from sdk.sds import ChannelConfig, Event, MessageChannel

T0 = 1_700_000_000_000


def make(name: str, config: ChannelConfig | None = None, now: int = T0) -> MessageChannel:
    """A channel ``room`` for participant ``name`` with a seeded rng."""
    return MessageChannel("room", name, now, config, rng=random.Random(name))


def drain(channel: MessageChannel) -> list[Event]:
    """Every pending event."""
    out = []
    while (event := channel.next_event()) is not None:
        out.append(event)
    return out


def flush(src: MessageChannel, *dsts: MessageChannel, now: int) -> list[bytes]:
    """Deliver every datagram ``src`` has queued to every ``dsts``; return them."""
    sent = [d.data for d in src.datagrams_to_send()]
    for data in sent:
        for dst in dsts:
            dst.receive(data, now)
    return sent
