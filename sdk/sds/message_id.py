"""How Chorus derives message ids, and how a receiver checks one.

``@waku/sds`` uses ``hex(sha256(payload))``, so two senders posting the same
text produce the same id, and one sender cannot post the same text twice. The
reliable-channel API asks for ids unique per logical message; Chorus binds the
id to everything that makes a message distinct::

    message_id = hex(sha256("chorus-sds-id/1" 0x00
                            len(channel_id) channel_id
                            len(sender_id) sender_id
                            u64be(lamport_timestamp)
                            content))

(lengths are u32 big-endian of the UTF-8 bytes). A receiver that knows the rule
can recompute it (``ChannelConfig.verify_message_ids``); peers that use another
rule, such as ``@waku/sds``, interoperate as long as verification is off.
"""

from __future__ import annotations

import hashlib
import struct

_DOMAIN = b"chorus-sds-id/1\x00"


def compute_message_id(
    channel_id: str, sender_id: str, lamport_timestamp: int, content: bytes
) -> str:
    """The id of a content (or sync) message under the Chorus rule."""
    c = channel_id.encode()
    s = sender_id.encode()
    h = hashlib.sha256(_DOMAIN)
    h.update(struct.pack(">I", len(c)))
    h.update(c)
    h.update(struct.pack(">I", len(s)))
    h.update(s)
    h.update(struct.pack(">Q", lamport_timestamp & 0xFFFFFFFFFFFFFFFF))
    h.update(content)
    return h.hexdigest()


def compute_ephemeral_id(channel_id: str, sender_id: str, nonce: int, content: bytes) -> str:
    """The id of an ephemeral message (no Lamport time): ``nonce`` takes its place."""
    return compute_message_id(channel_id, sender_id, nonce, content)
