"""End-to-end encryption of channels (``docs/encryption.md``).

::

    from sdk.encryption import ChannelEncryption, Identity, KeyRing, new_epoch, seal_key_package

    admin, bob = Identity.generate(), Identity.generate()
    epoch = new_epoch(0, {"admin": admin.signing_public, "bob": bob.signing_public})
    package = seal_key_package("room", epoch, admin, bob.box_public)  # to bob, any channel

    ring = KeyRing("room", trusted_issuers={admin.signing_public})    # at bob's
    ring.accept(package, bob)
    room = await node.join("room", encryption=ChannelEncryption(ring, "bob", bob))

Modules: :mod:`~sdk.encryption.keys` (identities, epochs), :mod:`~sdk.encryption.ring`
(a member's epochs), :mod:`~sdk.encryption.envelope` (the sealed message),
:mod:`~sdk.encryption.key_package` (an epoch for one member),
:mod:`~sdk.encryption.channel` (the default handle), :mod:`~sdk.encryption.hook`
(the byte-boundary rule any handle gets), :mod:`~sdk.encryption.errors`.
"""

from __future__ import annotations

from sdk.encryption.channel import ChannelEncryption
from sdk.encryption.envelope import OVERHEAD, Header, read_header
from sdk.encryption.errors import (
    AuthenticationFailed,
    EncryptionError,
    EncryptionUsageError,
    ForgedSignature,
    KeyPackageNotForUs,
    MalformedEnvelope,
    MalformedKeyPackage,
    MalformedPlaintext,
    NotOurMessage,
    RemoteEncryptionError,
    SenderMismatch,
    TruncatedEnvelope,
    UnknownEpoch,
    UnknownSigner,
    UntrustedKeyPackage,
)
from sdk.encryption.hook import DecryptionFailed, Encryption, SealedChannel
from sdk.encryption.key_package import KeyPackage, open_key_package, seal_key_package
from sdk.encryption.keys import Epoch, Identity, new_epoch
from sdk.encryption.ring import KeyRing

__all__ = [
    "OVERHEAD",
    "AuthenticationFailed",
    "ChannelEncryption",
    "DecryptionFailed",
    "Encryption",
    "EncryptionError",
    "EncryptionUsageError",
    "Epoch",
    "ForgedSignature",
    "Header",
    "Identity",
    "KeyPackage",
    "KeyPackageNotForUs",
    "KeyRing",
    "MalformedEnvelope",
    "MalformedKeyPackage",
    "MalformedPlaintext",
    "NotOurMessage",
    "RemoteEncryptionError",
    "SealedChannel",
    "SenderMismatch",
    "TruncatedEnvelope",
    "UnknownEpoch",
    "UnknownSigner",
    "UntrustedKeyPackage",
    "new_epoch",
    "open_key_package",
    "read_header",
    "seal_key_package",
]
