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
from collections.abc import Iterable, Sequence

_DOMAIN = b"chorus-sds-id/1\x00"


def compute_message_id(
    channel_id: str,
    sender_id: str,
    lamport_timestamp: int,
    content: bytes,
    causal_history: Sequence[str] = (),
) -> str:
    """The id of a content (or sync) message under the Chorus rule."""
    c = channel_id.encode()
    s = sender_id.encode()
    joined = "".join(causal_history).encode()
    n = len(causal_history)
    lengths: Iterable[int] = map(len, causal_history)
    if len(joined) != sum(map(len, causal_history)):
        # Some id is not ASCII: its UTF-8 length is not its length in characters.
        lengths = [len(mid.encode()) for mid in causal_history]
    h = hashlib.sha256(
        struct.pack(
            f">16sI{len(c)}sI{len(s)}sQI{n}I",
            _DOMAIN,
            len(c),
            c,
            len(s),
            s,
            lamport_timestamp & 0xFFFFFFFFFFFFFFFF,
            n,
            *lengths,
        )
    )
    if joined:
        h.update(joined)
    h.update(content)
    return h.hexdigest()


def compute_ephemeral_id(channel_id: str, sender_id: str, nonce: int, content: bytes) -> str:
    """The id of an ephemeral message (no Lamport time): ``nonce`` takes its place."""
    return compute_message_id(channel_id, sender_id, nonce, content)
