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


def compute_message_id(
    channel_id: str,
    sender_id: str,
    lamport_timestamp: int,
    content: bytes,
    causal_history: Sequence[str] = (),
) -> str:
    """The id of a content (or sync) message under the Chorus rule."""
    h = hashlib.sha256(_DOMAIN)
    for text in (channel_id, sender_id):
        raw = text.encode()
        h.update(struct.pack(">I", len(raw)))
        h.update(raw)
    h.update(struct.pack(">Q", lamport_timestamp & 0xFFFFFFFFFFFFFFFF))
    encoded = [mid.encode() for mid in causal_history]
    h.update(struct.pack(f">I{len(encoded)}I", len(encoded), *map(len, encoded)))
    h.update(b"".join(encoded))
    h.update(content)
    return h.hexdigest()


def compute_ephemeral_id(channel_id: str, sender_id: str, nonce: int, content: bytes) -> str:
    """The id of an ephemeral message (no Lamport time): ``nonce`` takes its place."""
    return compute_message_id(channel_id, sender_id, nonce, content)
