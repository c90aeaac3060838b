"""Key packages: one epoch delivered to one member, sealed to its X25519 key.

::

    "CKP1" | recipient X25519 public key (32) | crypto_box_seal(recipient, body)

    body = u16 len(channel_id) || channel_id || u32 epoch || key (32) || issuer (32)
           || u16 count || count x (u8 len(sender_id) || sender_id || ed25519 key (32))
           || issuer's signature (64) over "chorus/keypackage/v1" || recipient || the above

``crypto_box_seal`` has no sender, so the issuer signs; the recipient is in the
clear to say "not for you" before any decryption, and signed so a package cannot
be re-addressed. See ``docs/encryption.md``, "The key package".
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from typing import NamedTuple

from nacl.bindings import crypto_box_seal, crypto_box_seal_open
from nacl.exceptions import CryptoError

from sdk.encryption._wire import KEY_SIZE, SIGNATURE_SIZE, U16, U32, channel_bytes, verify
from sdk.encryption.errors import (
    EncryptionUsageError,
    KeyPackageNotForUs,
    MalformedKeyPackage,
    UntrustedKeyPackage,
)
from sdk.encryption.keys import MAX_ROSTER, Epoch, Identity, check_epoch_fields

MAGIC = b"CKP1"
_SIG_DOMAIN = b"chorus/keypackage/v1"
_SEAL_OVERHEAD = 48  # crypto_box_SEALBYTES: ephemeral public key and tag
_PREFIX = len(MAGIC) + KEY_SIZE
#: The largest key package: a roster of MAX_ROSTER members with 255-byte ids and a
#: maximal channel id.
MAX_SIZE = _PREFIX + _SEAL_OVERHEAD + 2 + 0xFFFF + 4 + 2 * KEY_SIZE + 2
MAX_SIZE += MAX_ROSTER * (1 + 255 + KEY_SIZE) + SIGNATURE_SIZE


class KeyPackage(NamedTuple):
    """What an opened key package says."""

    channel_id: str
    epoch: Epoch
    #: The ed25519 public key of the member who issued it.
    issuer: bytes


def seal_key_package(
    channel_id: str, epoch: Epoch, issuer: Identity, recipient_box_public: bytes
) -> bytes:
    """Seal ``epoch`` of ``channel_id`` to the member whose X25519 public key is
    ``recipient_box_public``, signed by ``issuer``."""
    if len(recipient_box_public) != KEY_SIZE:
        raise EncryptionUsageError("an X25519 public key is 32 bytes")
    parts = [
        channel_bytes(channel_id),
        U32.pack(epoch.number),
        epoch.key,
        issuer.signing_public,
        U16.pack(len(epoch.roster)),
    ]
    for sender_id, public in epoch.roster:
        raw = sender_id.encode()
        parts += (bytes([len(raw)]), raw, public)
    unsigned = b"".join(parts)
    signature = issuer.sign(_SIG_DOMAIN + recipient_box_public + unsigned)
    sealed = crypto_box_seal(unsigned + signature, recipient_box_public)
    return MAGIC + recipient_box_public + sealed


def recipient_of(data: bytes) -> bytes:
    """The X25519 public key a key package is sealed to (``MalformedKeyPackage`` if it
    is not one)."""
    if len(data) < _PREFIX + _SEAL_OVERHEAD or data[: len(MAGIC)] != MAGIC:
        raise MalformedKeyPackage("not a key package")
    if len(data) > MAX_SIZE:
        raise MalformedKeyPackage(f"{len(data)} bytes: over the {MAX_SIZE}-byte bound")
    return data[len(MAGIC) : _PREFIX]


def open_key_package(
    data: bytes, identity: Identity, trusted_issuers: Collection[bytes]
) -> KeyPackage:
    """Open a key package sealed to ``identity`` by one of ``trusted_issuers``
    (ed25519 public keys).

    Raises :class:`MalformedKeyPackage`, :class:`KeyPackageNotForUs` (sealed to
    another key) or :class:`UntrustedKeyPackage`.
    """
    recipient = recipient_of(data)
    if recipient != identity.box_public:
        raise KeyPackageNotForUs("the key package is sealed to another member's key")
    try:
        body = crypto_box_seal_open(data[_PREFIX:], identity.box_public, identity.box_secret)
    except CryptoError:
        raise MalformedKeyPackage("the sealed box does not open") from None
    if len(body) < SIGNATURE_SIZE:
        raise MalformedKeyPackage("no signature")
    unsigned, signature = body[:-SIGNATURE_SIZE], body[-SIGNATURE_SIZE:]
    package = _parse_body(unsigned)
    if package.issuer not in trusted_issuers:
        raise UntrustedKeyPackage("issued by a key this member does not trust")
    if not verify(package.issuer, _SIG_DOMAIN + recipient + unsigned, signature):
        raise UntrustedKeyPackage("the issuer's signature does not verify")
    return package


def _parse_body(body: bytes) -> KeyPackage:
    try:
        pos = 0
        (n,) = U16.unpack_from(body, pos)
        pos += 2
        channel_id = body[pos : pos + n].decode()
        if len(channel_id.encode()) != n or n == 0:
            raise MalformedKeyPackage("bad channel id")
        pos += n
        (number,) = U32.unpack_from(body, pos)
        pos += 4
        key = body[pos : pos + KEY_SIZE]
        issuer = body[pos + KEY_SIZE : pos + 2 * KEY_SIZE]
        pos += 2 * KEY_SIZE
        (count,) = U16.unpack_from(body, pos)
        pos += 2
        if count > MAX_ROSTER:
            raise MalformedKeyPackage(f"a roster of {count} members: over {MAX_ROSTER}")
        roster = []
        for _ in range(count):
            size = body[pos]
            sender_id = body[pos + 1 : pos + 1 + size].decode()
            public = body[pos + 1 + size : pos + 1 + size + KEY_SIZE]
            pos += 1 + size + KEY_SIZE
            roster.append((sender_id, public))
        if pos != len(body):
            raise MalformedKeyPackage("trailing or missing bytes")
        roster_t = tuple(roster)
        check_epoch_fields(number, key, roster_t)
    except (IndexError, UnicodeDecodeError, ValueError, struct.error) as exc:
        raise MalformedKeyPackage(f"bad key package body: {exc}") from None
    if len(issuer) != KEY_SIZE:
        raise MalformedKeyPackage("bad issuer key")
    return KeyPackage(channel_id, Epoch(number, key, roster_t), issuer)
