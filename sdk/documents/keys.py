"""Author key pairs: ed25519, as Bamboo and p2panda use them."""

from __future__ import annotations

from dataclasses import dataclass, field

from nacl.signing import SigningKey

from sdk.documents.errors import UsageError


@dataclass(frozen=True, slots=True)
class KeyPair:
    """An author's ed25519 key pair. The public key names the author's logs.

    Keep ``private_key`` secret and stable: a second device with the same key
    would fork the author's logs, which peers reject.
    """

    signing_key: SigningKey = field(repr=False)

    @classmethod
    def generate(cls) -> KeyPair:
        """A fresh random key pair."""
        return cls(SigningKey.generate())

    @classmethod
    def from_private_key(cls, private_key: bytes) -> KeyPair:
        """The key pair of a 32-byte ed25519 private key (seed)."""
        if len(private_key) != 32:
            raise UsageError("an ed25519 private key is 32 bytes")
        return cls(SigningKey(bytes(private_key)))

    @property
    def private_key(self) -> bytes:
        """The 32-byte private key (seed)."""
        return bytes(self.signing_key)

    @property
    def public_key(self) -> bytes:
        """The 32-byte public key."""
        return bytes(self.signing_key.verify_key)

    @property
    def author(self) -> str:
        """The public key as lowercase hex, the author id used across the API."""
        return self.public_key.hex()

    def sign(self, message: bytes) -> bytes:
        """The 64-byte ed25519 signature of ``message``."""
        return bytes(self.signing_key.sign(message).signature)


__all__ = ["KeyPair"]
