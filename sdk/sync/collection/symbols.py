"""The RIBLT items of collection sync: one per document, ``document key ‖ state digest``.

A Beelay coded symbol sums 48-byte items, "a document ID" and "the hash of the
heads of the document" (``beelay.txt``, Create Snapshot). For a p2panda document
the **document key** is the first 16 bytes of the BLAKE3 digest inside its id
(it names the document on the wire wherever Beelay puts a document id), and the
**state digest** is BLAKE3 of the document id and the operation ids of its
current view id, sorted: any new operation changes it (docs/collection-sync.md,
"Items"). The item checksum is Beelay's ``DocAndHeadsSymbol::hash``
(``src/riblt.rs`` at c817e9e, lines 393-397): SipHash-1-3 with a zero key over
``le64(16) ‖ key ‖ le64(32) ‖ digest``.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from blake3 import blake3

from sdk.documents.hashing import YASMF_BLAKE3_PREFIX, check_hash_id
from sdk.sync.riblt import SymbolFormat, siphash

DOCUMENT_KEY_SIZE = 16
STATE_DIGEST_SIZE = 32
SYMBOL_SIZE = DOCUMENT_KEY_SIZE + STATE_DIGEST_SIZE

_ZERO_KEY = bytes(16)
_PREFIX_KEY = (DOCUMENT_KEY_SIZE).to_bytes(8, "little")
_PREFIX_DIGEST = (STATE_DIGEST_SIZE).to_bytes(8, "little")
_STATE_CONTEXT = b"chorus collection state v1\x00"


@lru_cache(maxsize=1 << 16)
def item_checksum(item: bytes) -> int:
    """Beelay's ``DocAndHeadsSymbol`` checksum of a 48-byte item.

    Cached (64 Ki items, about 10 MB): a store node snapshots the same mostly
    unchanged collections again and again, and SipHash in Python costs tens of
    microseconds per item.
    """
    document, digest = split_item(item)
    return siphash(_ZERO_KEY, _PREFIX_KEY + document + _PREFIX_DIGEST + digest, 1, 3)


#: The symbol format both peers of collection sync use.
DOC_AND_STATE = SymbolFormat(SYMBOL_SIZE, item_checksum)


def document_key(document_id: str) -> bytes:
    """The 16-byte key of a p2panda document id (hex of a YASMF-BLAKE3 hash)."""
    check_hash_id(document_id)
    raw = bytes.fromhex(document_id)
    return raw[len(YASMF_BLAKE3_PREFIX) : len(YASMF_BLAKE3_PREFIX) + DOCUMENT_KEY_SIZE]


def state_digest(document_id: str, view_id: Iterable[str]) -> bytes:
    """The 32-byte digest of a document at a view (its current tips)."""
    hasher = blake3(_STATE_CONTEXT)
    hasher.update(bytes.fromhex(document_id))
    for operation_id in sorted(view_id):
        hasher.update(bytes.fromhex(operation_id))
    return hasher.digest()


def document_item(document_id: str, view_id: Iterable[str]) -> bytes:
    """The RIBLT item of a document at a view: ``key ‖ state digest``."""
    return document_key(document_id) + state_digest(document_id, view_id)


def split_item(item: bytes) -> tuple[bytes, bytes]:
    """``(document key, state digest)`` of a 48-byte item."""
    return item[:DOCUMENT_KEY_SIZE], item[DOCUMENT_KEY_SIZE:]


__all__ = [
    "DOCUMENT_KEY_SIZE",
    "DOC_AND_STATE",
    "STATE_DIGEST_SIZE",
    "SYMBOL_SIZE",
    "document_item",
    "document_key",
    "item_checksum",
    "split_item",
    "state_digest",
]
