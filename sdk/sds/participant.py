"""A participant in many SDS channels at once.

Routes incoming bytes to the channel named in the message, shares one event
queue and one outbox across channels, and exposes the earliest timer of all of
them, so a runtime drives any number of channels with one timer.
"""

from __future__ import annotations

import random
from collections import deque

from sdk.sds.channel import Datagram, MessageChannel
from sdk.sds.config import ChannelConfig
from sdk.sds.errors import LocalProtocolError, RemoteProtocolError
from sdk.sds.events import Event, MessageRejected
from sdk.sds.limits import Limits
from sdk.sds.message import decode_message


class Participant:
    """One participant id, any number of channels."""

    def __init__(
        self,
        participant_id: str,
        *,
        config: ChannelConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not participant_id:
            raise LocalProtocolError("participant_id must be a non-empty string")
        self.participant_id = participant_id
        self.default_config = config or ChannelConfig()
        self.channels: dict[str, MessageChannel] = {}
        self._rng = rng or random.Random()
        self._events: deque[Event] = deque()
        self._outbox: list[Datagram] = []
        self.rejected = 0

    def join(
        self, channel_id: str, now: int, config: ChannelConfig | None = None
    ) -> MessageChannel:
        """Start participating in ``channel_id`` (idempotent); return its channel."""
        channel = self.channels.get(channel_id)
        if channel is None:
            channel = MessageChannel(
                channel_id,
                self.participant_id,
                now,
                config or self.default_config,
                rng=random.Random(self._rng.getrandbits(64)),
                events=self._events,
                outbox=self._outbox,
            )
            self.channels[channel_id] = channel
        return channel

    def leave(self, channel_id: str) -> None:
        """Stop participating; the channel's state is dropped."""
        self.channels.pop(channel_id, None)

    def channel(self, channel_id: str) -> MessageChannel:
        """A joined channel; raises :class:`LocalProtocolError` if not joined."""
        try:
            return self.channels[channel_id]
        except KeyError:
            raise LocalProtocolError(
                f"not a member of channel {channel_id!r}; join() it first"
            ) from None

    def send(self, channel_id: str, content: bytes, now: int) -> str:
        """Send reliably on a joined channel; return the message id."""
        return self.channel(channel_id).send(content, now)

    def receive(self, data: bytes, now: int, retrieval_hint: bytes | None = None) -> None:
        """Process bytes from any channel's topic; messages for channels not joined are ignored."""
        limits = self._loosest_limits()
        try:
            message = decode_message(data, limits)
        except RemoteProtocolError as exc:
            self.rejected += 1
            self._events.append(MessageRejected("", exc.reason, exc.detail))
            return
        channel = self.channels.get(message.channel_id)
        if channel is None:
            return
        if limits is not channel.config.limits:
            channel.receive(data, now, retrieval_hint)  # re-check under the channel's own bounds
        else:
            channel.receive_message(message, data, now, retrieval_hint)

    def handle_timer(self, now: int) -> None:
        """Run every channel whose timer is due."""
        for channel in self.channels.values():
            t = channel.get_timer()
            if t is not None and t <= now:
                channel.handle_timer(now)

    def get_timer(self) -> int | None:
        """The earliest timer of all channels."""
        times = [t for c in self.channels.values() if (t := c.get_timer()) is not None]
        return min(times) if times else None

    def next_event(self) -> Event | None:
        """The oldest undrained event of any channel."""
        return self._events.popleft() if self._events else None

    def datagrams_to_send(self) -> list[Datagram]:
        """Drain datagrams of every channel, in order."""
        out = self._outbox[:]
        self._outbox.clear()
        return out

    def _loosest_limits(self) -> Limits:
        configs = [c.config.limits for c in self.channels.values()]
        if not configs:
            return self.default_config.limits
        first = configs[0]
        if all(c is first for c in configs):
            return first
        return Limits(
            max_message_size=max(c.max_message_size for c in configs),
            max_id_length=max(c.max_id_length for c in configs),
            max_causal_history=max(c.max_causal_history for c in configs),
            max_repair_request=max(c.max_repair_request for c in configs),
            max_bloom_filter_size=max(c.max_bloom_filter_size for c in configs),
            max_retrieval_hint_size=max(c.max_retrieval_hint_size for c in configs),
        )
