"""The sealed envelope: the bytes an encrypted channel publishes (``docs/encryption.md``).

::

    version (1) = 0x01 | epoch (u32) | timestamp ms (u64) | nonce (24) | ciphertext (n + 16)

    ad    = "chorus/e2e/v1" || u16 len(channel_id) || channel_id || header
    inner = u16 signer || ed25519 signature (64) || sds
    signed: "chorus/e2e-sig/v1" || u16 len(channel_id) || channel_id || header || sds

Sign, then encrypt: the signer stays hidden from whoever carries the envelope,
and the signature covers the channel and the whole header, so a member cannot
move a signed message to another channel, epoch, timestamp or nonce.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

from nacl.utils import random as random_bytes

from sdk.encryption._wire import SIGNATURE_SIZE, U16, accepts, aead_open, aead_seal
from sdk.encryption.errors import (
    AuthenticationFailed,
    EncryptionUsageError,
    ForgedSignature,
    MalformedEnvelope,
    RemoteEncryptionError,
    TruncatedEnvelope,
    UnknownSigner,
)
from sdk.encryption.keys import Epoch, Identity

#: The only envelope version.
VERSION = 1
_HEADER = struct.Struct(">BIQ24s")
#: Bytes before the ciphertext.
HEADER_SIZE = _HEADER.size
#: The AEAD tag.
TAG_SIZE = 16
#: Bytes an envelope adds to the SDS message it seals (119).
OVERHEAD = HEADER_SIZE + TAG_SIZE + U16.size + SIGNATURE_SIZE
#: The smallest well-formed envelope: a header and the tag of an empty plaintext.
MIN_SIZE = HEADER_SIZE + TAG_SIZE
#: Bytes of a seal record (:func:`seal_record`): header, signer and signature.
RECORD_SIZE = HEADER_SIZE + U16.size + SIGNATURE_SIZE
_AD_DOMAIN = b"chorus/e2e/v1"
_SIG_DOMAIN = b"chorus/e2e-sig/v1"
_MAX_TIMESTAMP = 2**64 - 1


class Header(NamedTuple):
    """An envelope's clear part: readable by anyone, authenticated by the seal."""

    version: int
    epoch: int
    #: The sender's clock at sealing, ms since the Unix epoch (the store's time key).
    timestamp: int
    nonce: bytes


def read_header(data: bytes, max_size: int) -> Header:
    """The header of ``data``, checking size bounds and version (not the seal).

    Raises :class:`TruncatedEnvelope` below :data:`MIN_SIZE`,
    :class:`MalformedEnvelope` above ``max_size`` or for another version.
    """
    if len(data) < MIN_SIZE:
        raise TruncatedEnvelope(f"{len(data)} bytes: an envelope has at least {MIN_SIZE}")
    if len(data) > max_size:
        raise MalformedEnvelope(f"{len(data)} bytes: over the {max_size}-byte bound")
    header = Header._make(_HEADER.unpack_from(data))
    if header.version != VERSION:
        raise MalformedEnvelope(f"envelope version {header.version}, expected {VERSION}")
    return header


#: ``_ed25519_batch.seal`` bound to libsodium (``sdk.documents.verifier.sealed_envelope_calls``).
Sealer = Callable[[bytes, bytes, bytes, int, int, int, bytes, bytes], bytes]
#: ``_ed25519_batch.open_sealed`` bound to libsodium: per envelope ``(answer, head, sds)``.
Opener = Callable[
    [bytes, bytes, list[bytes], list[bytes], list[bytes]],
    list[tuple[int, bytes | None, bytes | None]],
]


def seal(
    channel_binding: bytes,
    epoch: Epoch,
    signer: int,
    identity: Identity,
    sds: bytes,
    timestamp: int,
    sealer: Sealer | None = None,
) -> bytes:
    """Sign ``sds`` as roster member ``signer`` and seal it under ``epoch``.

    ``channel_binding`` is :func:`sdk.encryption._wire.channel_bytes` of the channel id.
    With ``sealer`` (the compiled loop's), the same steps in one native call: the same
    format, a signature by the same key (ed25519 is deterministic) and a fresh nonce.
    """
    if not 0 <= timestamp <= _MAX_TIMESTAMP:
        raise EncryptionUsageError("timestamp must fit in 64 bits")
    if sealer is not None:
        return sealer(
            identity.signing_secret,
            _SIG_DOMAIN + channel_binding,
            _AD_DOMAIN + channel_binding,
            epoch.number,
            timestamp,
            signer,
            epoch.key,
            sds,
        )
    header = _HEADER.pack(VERSION, epoch.number, timestamp, random_bytes(24))
    signature = identity.sign(_SIG_DOMAIN + channel_binding + header + sds)
    inner = U16.pack(signer) + signature + sds
    ad = _AD_DOMAIN + channel_binding + header
    return header + aead_seal(inner, ad, header[13:], epoch.key)


class Unsealed(NamedTuple):
    """An envelope whose seal opened: the signature is still to be checked
    (:func:`signature_ok`, or a batch of them off the event loop)."""

    #: The roster entry the envelope names as its signer.
    sender_id: str
    public_key: bytes
    #: The signed bytes followed by the signature (what a batch verifier takes:
    #: the signature covers all but the last 64 bytes).
    signed_and_signature: bytes
    signature: bytes
    sds: bytes
    #: The signer's index and the signature as sealed (``u16 signer || signature``): with
    #: the header, the envelope's seal record (:func:`seal_record`), without a second open.
    signer_and_signature: bytes


def unseal(channel_binding: bytes, epoch: Epoch, data: bytes) -> Unsealed:
    """Open the seal of ``data`` (its header already read, its epoch ``epoch``) and
    find its signer in the roster; the signature is not checked yet.

    Raises :class:`AuthenticationFailed`, :class:`UnknownSigner` or
    :class:`ForgedSignature` (no room for a signature).
    """
    header = data[:HEADER_SIZE]
    ad = _AD_DOMAIN + channel_binding + header
    inner = aead_open(data[HEADER_SIZE:], ad, header[13:], epoch.key)
    if inner is None:
        raise _refused(_SEAL_SHUT, epoch)
    if len(inner) < U16.size + SIGNATURE_SIZE:
        raise _refused(_NO_ROOM, epoch)
    (signer,) = U16.unpack_from(inner)
    if signer >= len(epoch.roster):
        raise _refused(_UNKNOWN_SIGNER, epoch, signer)
    sender_id, public = epoch.roster[signer]
    signer_and_signature = inner[: U16.size + SIGNATURE_SIZE]
    signature = signer_and_signature[U16.size :]
    sds = inner[U16.size + SIGNATURE_SIZE :]
    signed = _SIG_DOMAIN + channel_binding + header + sds + signature
    return Unsealed(sender_id, public, signed, signature, sds, signer_and_signature)


def signature_ok(unsealed: Unsealed) -> bool:
    """Whether the signer's key signed the unsealed envelope (libsodium, this thread)."""
    return accepts(unsealed.public_key, unsealed.signed_and_signature, unsealed.signature)


def forged(unsealed: Unsealed | Opened) -> ForgedSignature:
    """The error for an envelope whose signature is not its signer's."""
    return ForgedSignature(f"the signature is not {unsealed.sender_id!r}'s")


class Opened(NamedTuple):
    """An envelope whose seal opened and whose signature libsodium accepted
    (:func:`open_verified`)."""

    #: The roster entry that signed it.
    sender_id: str
    sds: bytes
    #: ``u16 signer || signature``, as :attr:`Unsealed.signer_and_signature`.
    signer_and_signature: bytes


# The compiled opener's answers (``_ed25519_batch.c``, ``OPENED_*``).
_ACCEPTED = 1
_FORGED = 2
_SEAL_SHUT = 4
_NO_ROOM = 5
_UNKNOWN_SIGNER = 6


def _refused(answer: int, epoch: Epoch, signer: int = 0) -> RemoteEncryptionError:
    """The error for an envelope that did not open under ``epoch`` (an answer of the
    compiled opener but accepted or forged): the same whichever way it was opened."""
    if answer == _SEAL_SHUT:
        return AuthenticationFailed(
            f"the seal does not open under epoch {epoch.number}'s key for this channel"
        )
    if answer == _NO_ROOM:
        # Only a key holder can seal this: a member's malformed envelope.
        return ForgedSignature("no room for a signer and signature inside the seal")
    return UnknownSigner(f"signer {signer} is not in epoch {epoch.number}'s roster")


def open_verified(
    channel_binding: bytes,
    epochs: list[Epoch],
    envelopes: list[bytes],
    opener: Opener | None = None,
) -> list[Opened | RemoteEncryptionError]:
    """Open each of ``envelopes`` (its header already read, its epoch ``epochs[i]``) and
    check its signature: per envelope, what :func:`unseal` then :func:`signature_ok`
    say, the error either raises (or :func:`forged`) in its place.

    With ``opener`` (the compiled loop's) every seal is opened and every signature
    checked in one native call that releases the GIL once, so a worker thread running
    this leaves the interpreter to the event loop (``docs/encryption.md``, "Costs");
    without it, through PyNaCl's library one envelope at a time. Same answers."""
    out: list[Opened | RemoteEncryptionError] = []
    if opener is None:
        from sdk.documents.verifier import check_on_this_thread

        unsealed_all: list[Unsealed | RemoteEncryptionError] = []
        for epoch, data in zip(epochs, envelopes, strict=True):
            try:
                unsealed_all.append(unseal(channel_binding, epoch, data))
            except RemoteEncryptionError as exc:
                unsealed_all.append(exc)
        unsealed = [u for u in unsealed_all if not isinstance(u, RemoteEncryptionError)]
        # libsodium's answers, as signature_ok gives them (one GIL release for them all
        # where only the envelope calls of the compiled loop are missing).
        accepted = iter(
            check_on_this_thread(
                [u.public_key for u in unsealed],
                [u.signed_and_signature for u in unsealed],
                [u.signature for u in unsealed],
            )
        )
        for u in unsealed_all:
            if isinstance(u, RemoteEncryptionError):
                out.append(u)
            elif next(accepted):
                out.append(Opened(u.sender_id, u.sds, u.signer_and_signature))
            else:
                out.append(forged(u))
        return out
    rosters: dict[int, bytes] = {}
    keys = []
    roster_keys = []
    for epoch in epochs:
        keys.append(epoch.key)
        roster = rosters.get(id(epoch))
        if roster is None:
            roster = rosters[id(epoch)] = b"".join(public for _, public in epoch.roster)
        roster_keys.append(roster)
    answers = opener(
        _SIG_DOMAIN + channel_binding, _AD_DOMAIN + channel_binding, envelopes, keys, roster_keys
    )
    for epoch, (answer, head, sds) in zip(epochs, answers, strict=True):
        if head is None or sds is None:
            out.append(_refused(answer, epoch))
            continue
        signer = (head[0] << 8) | head[1]
        if answer == _UNKNOWN_SIGNER:
            out.append(_refused(answer, epoch, signer))
            continue
        opened = Opened(epoch.roster[signer][0], sds, head)
        out.append(opened if answer == _ACCEPTED else forged(opened))
    return out


def seal_record(data: bytes, signer_and_signature: bytes) -> bytes:
    """What, with the SDS message and the epoch key, rebuilds envelope ``data`` byte for
    byte (:func:`reseal`): its header, then the signer and signature sealed inside it
    (:attr:`Unsealed.signer_and_signature`, kept when it opened). :data:`RECORD_SIZE`
    bytes, against the whole envelope's SDS size plus 119."""
    return data[:HEADER_SIZE] + signer_and_signature


def reseal(channel_binding: bytes, epoch: Epoch, record: bytes, sds: bytes) -> bytes:
    """The envelope :func:`seal_record` took ``record`` from, rebuilt around ``sds`` (the
    AEAD is deterministic: same key, nonce, associated data and plaintext, same bytes).
    The signature is the original sender's: nobody signs anything here."""
    header = record[:HEADER_SIZE]
    inner = record[HEADER_SIZE:] + sds
    ad = _AD_DOMAIN + channel_binding + header
    return header + aead_seal(inner, ad, header[13:], epoch.key)
