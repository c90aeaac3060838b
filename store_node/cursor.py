"""Opaque, tamper-evident pagination cursors.

Waku Store v3 uses a message hash as cursor; this store pages by keyset
``(first_arrival, seq)`` instead (exact under ties, stable when retention
deletes the row a cursor points at). The key is sealed with an HMAC over the
key *and* a fingerprint of the query, so a client can neither forge a position
nor reuse a cursor with different criteria (the spec's "all other fields MUST
be the same"); either is ``INVALID_ARGUMENT``. The secret lives in the archive's
metadata, so cursors survive a restart of the node.

Layout (25 bytes): ``version:u8 first_arrival:i64be seq:i64be mac:16``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct

from store_node.archive.base import Criteria, Key
from store_node.errors import InvalidCursor

_VERSION = 1
_BODY = struct.Struct(">Bqq")
_MAC_SIZE = 16
#: Size of every cursor this version issues.
CURSOR_SIZE = _BODY.size + _MAC_SIZE
#: Archive metadata key of the HMAC secret.
SECRET_META_KEY = "cursor_secret"


def query_fingerprint(criteria: Criteria, forward: bool) -> bytes:
    """A digest of everything that defines a query's result order and membership."""
    canonical = json.dumps(
        [
            criteria.channel_id,
            criteria.time_start,
            criteria.time_end,
            sorted(criteria.message_ids),
            sorted(h.hex() for h in criteria.message_hashes),
            forward,
        ],
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).digest()


class CursorCodec:
    """Seals and opens cursors with one secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("cursor secret must be at least 16 bytes")
        self._secret = secret

    def _mac(self, body: bytes, fingerprint: bytes) -> bytes:
        return hmac.new(self._secret, body + fingerprint, hashlib.sha256).digest()[:_MAC_SIZE]

    def seal(self, key: Key, fingerprint: bytes) -> bytes:
        """The cursor for continuing after ``key`` in the query ``fingerprint`` names."""
        body = _BODY.pack(_VERSION, key[0], key[1])
        return body + self._mac(body, fingerprint)

    def open(self, cursor: bytes, fingerprint: bytes) -> Key:
        """The key inside ``cursor``; :class:`InvalidCursor` unless ours and for this query."""
        if len(cursor) != CURSOR_SIZE:
            raise InvalidCursor(f"pagination_cursor must be {CURSOR_SIZE} bytes, got {len(cursor)}")
        body, mac = cursor[: _BODY.size], cursor[_BODY.size :]
        if not hmac.compare_digest(mac, self._mac(body, fingerprint)):
            raise InvalidCursor("pagination_cursor was not issued for this query")
        version, first_arrival, seq = _BODY.unpack(body)
        if version != _VERSION:
            raise InvalidCursor(f"unknown cursor version {version}")
        return (first_arrival, seq)
