"""How Chorus derives message ids, and how a receiver checks one.

``@waku/sds`` uses ``hex(sha256(payload))``, so two senders posting the same
text produce the same id, and one sender cannot post the same text twice. The
reliable-channel API asks for ids unique per logical message; Chorus binds the
id to everything that makes a message distinct::

    message_id = hex(sha256("chorus-sds-id/1" 0x00
                            len(channel_id) channel_id
                            len(sender_id) sender_id
                            u64be(lamport_timestamp)
                            count(causal_history) len(id_1) ... len(id_n)
                            id_1 ... id_n
                            content))

(lengths and the count are u32 big-endian; strings are UTF-8; all lengths
come before the ids they delimit). Covering the
causal history means a peer cannot replay a verified id with forged
dependencies to keep the real message from being delivered. A receiver that knows the rule
can recompute it (``ChannelConfig.verify_message_ids``); peers that use another
rule, such as ``@waku/sds``, interoperate as long as verification is off.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

_DOMAIN = b"chorus-sds-id/1\x00"
_U32 = struct.Struct(">I")
_LAMPORT_COUNT = struct.Struct(">QI")
#: SHA-256 states fed with the constant head of the rule (domain, channel id, sender
#: id), by ``(channel_id, sender_id)``: a sender hashes the same head for every message.
_heads: dict[tuple[str, str], hashlib._Hash] = {}
_HEADS = 1_024


def _head(channel_id: str, sender_id: str) -> hashlib._Hash:
    c = channel_id.encode()
    s = sender_id.encode()
    h = hashlib.sha256(_DOMAIN + _U32.pack(len(c)) + c + _U32.pack(len(s)) + s)
    if len(_heads) >= _HEADS:
        _heads.clear()
    _heads[(channel_id, sender_id)] = h
    return h


def compute_message_id(
    channel_id: str,
    sender_id: str,
    lamport_timestamp: int,
    content: bytes,
    causal_history: Sequence[str] = (),
) -> str:
    """The id of a content (or sync) message under the Chorus rule."""
    head = _heads.get((channel_id, sender_id)) or _head(channel_id, sender_id)
    h = head.copy()
    n = len(causal_history)
    h.update(_LAMPORT_COUNT.pack(lamport_timestamp & 0xFFFFFFFFFFFFFFFF, n))
    if n:
        # One pass of len() over the ids (200 of them with a long history), then, in
        # the usual case of ids all as long as the first (hex digests), the length
        # block is one repeated 4-byte word instead of a 200-argument struct.pack.
        lengths = list(map(len, causal_history))
        joined = "".join(causal_history).encode()
        if len(joined) != sum(lengths):
            # Some id is not ASCII: its UTF-8 length is not its length in characters.
            lengths = [len(mid.encode()) for mid in causal_history]
        first = lengths[0]
        if lengths.count(first) == n and first <= 0xFFFFFFFF:
            h.update(_U32.pack(first) * n)
        else:
            h.update(struct.pack(f">{n}I", *lengths))
        h.update(joined)
    h.update(content)
    return h.hexdigest()


def compute_ephemeral_id(channel_id: str, sender_id: str, nonce: int, content: bytes) -> str:
    """The id of an ephemeral message (no Lamport time): ``nonce`` takes its place."""
    return compute_message_id(channel_id, sender_id, nonce, content)
