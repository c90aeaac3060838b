"""The encryption package's exception tree.

::

    EncryptionError
     ├── EncryptionUsageError (ValueError)  the caller's misuse: key sizes, not a member
     │    └── NotOurMessage                 sealing another member's message (only its
     │                                      original envelope carries its signature)
     └── RemoteEncryptionError              a peer's bytes refused (``reason`` says why)
          ├── MalformedEnvelope             not a known envelope version, or over a bound
          │    └── TruncatedEnvelope        shorter than any envelope
          ├── UnknownEpoch                  an epoch this member holds no key for
          ├── AuthenticationFailed          AEAD tag fails: key, channel, epoch or bytes
          ├── UnknownSigner                 signer index outside the epoch's roster
          ├── ForgedSignature               signature not the roster key's
          ├── SenderMismatch                the SDS sender_id is not the signer's
          ├── MalformedPlaintext            a valid seal around something not SDS
          ├── MalformedKeyPackage           not a key package, or over a bound
          ├── KeyPackageNotForUs            sealed to someone else, or another channel
          └── UntrustedKeyPackage           untrusted issuer, bad signature, changed epoch

Every ``RemoteEncryptionError`` carries ``reason``, a short stable code used in
events and counters (``DecryptionFailed.reason``, ``stats["decrypt_failed.<reason>"]``).
"""

from __future__ import annotations


class EncryptionError(Exception):
    """Base class of every error of :mod:`sdk.encryption`."""


class EncryptionUsageError(EncryptionError, ValueError):
    """The caller used the API wrongly (the message says what to do)."""


class NotOurMessage(EncryptionUsageError):
    """Asked to seal another member's SDS message whose envelope is not remembered:
    sealed by us it would carry our signature, and members refuse it
    (``docs/encryption.md``, "One envelope per message"). ``sender_id`` is its sender,
    ``message_id`` its id."""

    def __init__(self, sender_id: str, message_id: str) -> None:
        super().__init__(
            f"message {message_id[:64]!r} is {sender_id[:64]!r}'s: only its original "
            "envelope can carry it"
        )
        self.sender_id = sender_id
        self.message_id = message_id


class RemoteEncryptionError(EncryptionError):
    """Bytes from a peer were refused; ``reason`` is a stable code for events and counters."""

    reason = "malformed"


class MalformedEnvelope(RemoteEncryptionError):
    """Not an envelope this version understands, or larger than the bound."""

    reason = "malformed"


class TruncatedEnvelope(MalformedEnvelope):
    """Shorter than the smallest possible envelope (header and tag)."""

    reason = "truncated"


class UnknownEpoch(RemoteEncryptionError):
    """Sealed under an epoch this member holds no key for (before it joined, or after it left)."""

    reason = "unknown_epoch"

    def __init__(self, epoch: int) -> None:
        super().__init__(f"no key for epoch {epoch}")
        #: The envelope's epoch number.
        self.epoch = epoch


class AuthenticationFailed(RemoteEncryptionError):
    """The AEAD tag did not verify: wrong key, another channel or epoch, or tampering."""

    reason = "authentication"


class UnknownSigner(RemoteEncryptionError):
    """The signer index points outside the epoch's roster."""

    reason = "unknown_signer"


class ForgedSignature(RemoteEncryptionError):
    """The signature does not verify with the roster key of the claimed signer."""

    reason = "forged_signature"


class SenderMismatch(RemoteEncryptionError):
    """The sealed SDS message claims another ``sender_id`` than the member who signed it."""

    reason = "sender_mismatch"


class MalformedPlaintext(RemoteEncryptionError):
    """Correctly sealed and signed, but the content is not a valid SDS message."""

    reason = "malformed_plaintext"


class MalformedKeyPackage(RemoteEncryptionError):
    """Not a key package, one that does not open, or one over a bound."""

    reason = "malformed_key_package"


class KeyPackageNotForUs(RemoteEncryptionError):
    """A key package sealed to another member's key, or for another channel."""

    reason = "key_package_not_for_us"


class UntrustedKeyPackage(RemoteEncryptionError):
    """A key package from an untrusted issuer, with a bad signature, or changing a known epoch."""

    reason = "untrusted_key_package"
