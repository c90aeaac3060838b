"""Session setup: roles, greedy or safe transmission, compression windows.

Spec, "Session Setup" and "Running Bamboo-Point-2-Point Over Bymux": each
endpoint sends one byte whose first six bits are ignored, whose seventh bit
(0x02) says it wants to send greedily and whose eighth bit (0x01) says it wants
to receive greedily, then the largest compression window it sends with and the
largest it accepts, as VarU64s. Either side may send protocol data right after
its own setup bytes, without waiting for the other's.

An endpoint announces ``EndpointConfig.compression_window`` for both windows (0 by
default); with a negotiated window of 0, compressed payloads (data byte 9) are a
protocol violation (see :mod:`.lzfoo`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sdk.documents.varu64 import encode_varu64
from sdk.sync.bamboo_p2p.entries import EntryReader

_SEND_GREEDY = 0x02
_RECEIVE_GREEDY = 0x01


class Role(Enum):
    """Who uses even proposal ids (proactive: the side that connected) and who odd ones."""

    PROACTIVE = "proactive"
    REACTIVE = "reactive"

    @property
    def id_parity(self) -> int:
        """0 for even ids, 1 for odd ids."""
        return 0 if self is Role.PROACTIVE else 1


@dataclass(frozen=True, slots=True)
class SetupInfo:
    """What one endpoint announces before the protocol starts."""

    send_greedy: bool = False
    receive_greedy: bool = False
    send_window: int = 0
    receive_window: int = 0

    def encode(self) -> bytes:
        """The setup bytes."""
        flags = _SEND_GREEDY if self.send_greedy else 0
        flags |= _RECEIVE_GREEDY if self.receive_greedy else 0
        windows = encode_varu64(self.send_window) + encode_varu64(self.receive_window)
        return bytes((flags,)) + windows


def setup_length(data: bytes) -> int | None:
    """How many bytes the setup at the start of ``data`` takes (its VarU64s' first bytes
    say), or ``None`` if more bytes are needed; the bytes are not checked."""
    pos = 1
    for _ in range(2):
        if pos >= len(data):
            return None
        first = data[pos]
        pos += 1 if first < 248 else 1 + (first - 247)
    return None if pos > len(data) else pos


def decode_setup(data: bytes) -> tuple[SetupInfo, int] | None:
    """Decode setup bytes at the start of ``data``: ``(info, length)``, or ``None`` if
    more bytes are needed. Raises only :class:`MalformedMessage`."""
    if setup_length(data) is None:
        return None
    r = EntryReader(data, 1)
    flags = data[0]
    info = SetupInfo(
        send_greedy=bool(flags & _SEND_GREEDY),
        receive_greedy=bool(flags & _RECEIVE_GREEDY),
        send_window=r.u64("setup: send window"),
        receive_window=r.u64("setup: receive window"),
    )
    return info, r.pos


@dataclass(frozen=True, slots=True)
class SessionParams:
    """What both endpoints derive once both setups are known (spec, "Session Setup")."""

    send_greedy: bool
    receive_greedy: bool
    compression_window: int
    decompression_window: int


def negotiate(mine: SetupInfo, theirs: SetupInfo) -> SessionParams:
    """The send/receive modes and windows of the endpoint that announced ``mine``."""
    return SessionParams(
        send_greedy=mine.send_greedy and theirs.receive_greedy,
        receive_greedy=mine.receive_greedy and theirs.send_greedy,
        compression_window=min(mine.send_window, theirs.receive_window),
        decompression_window=min(mine.receive_window, theirs.send_window),
    )


__all__ = ["Role", "SessionParams", "SetupInfo", "decode_setup", "negotiate"]
