"""Bounds on everything a peer controls in an SDS message.

Checked by the decoder before anything reaches channel state, so a hostile
peer cannot make a participant allocate, scan or buffer without limit.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-message bounds enforced by :func:`sdk.sds.message.decode_message`."""

    #: Whole encoded message. The reference stack keeps SDS payloads well under
    #: Waku's 150 KB routing limit; 256 KiB leaves room for a waku filter and content.
    max_message_size: int = 256 * 1024
    #: Length of ``sender_id``, ``message_id``, ``channel_id`` and history ids (UTF-8 bytes).
    max_id_length: int = 256
    #: Entries in ``causal_history``; the reliable-channel API defaults to 200.
    max_causal_history: int = 512
    #: Entries in ``repair_request`` (SDS-R recommends at most 3 per message).
    max_repair_request: int = 32
    #: Bytes of ``bloom_filter`` (the waku profile sends 18,752).
    max_bloom_filter_size: int = 64 * 1024
    #: Bytes of a ``retrieval_hint``.
    max_retrieval_hint_size: int = 1024


DEFAULT_LIMITS = Limits()
