"""Members' key pairs and epochs: who is in the channel, under which key.

An :class:`Identity` is one member's private keys (ed25519 to sign, X25519 to
receive key packages). An :class:`Epoch` is a channel key with its number and
roster, the members of that epoch as ``(sender_id, ed25519 public key)``: the
roster both grants membership and binds each ``sender_id`` to the one key that
may sign for it (``docs/encryption.md``, "Keys").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nacl.bindings import (
    crypto_box_seed_keypair,
    crypto_sign_seed_keypair,
)
from nacl.utils import random as random_bytes

from sdk.encryption._wire import KEY_SIZE, sign
from sdk.encryption.errors import EncryptionUsageError

#: Most members an epoch's roster may list (the signer index is a u16; this bounds
#: what a key package makes a member hold).
MAX_ROSTER = 4_096
#: Longest sender id in a roster, in UTF-8 bytes (its length is one byte on the wire).
MAX_SENDER_ID = 255
#: Largest epoch number (u32 on the wire).
MAX_EPOCH = 0xFFFF_FFFF


class Identity:
    """One member's private keys: ed25519 for signing, X25519 for key packages.

    Persist it with :meth:`to_bytes` (64 secret bytes: keep them as secret as a
    password) and restore it with :meth:`from_bytes`.
    """

    __slots__ = ("_box_secret", "_seed", "_signing_secret", "box_public", "signing_public")

    def __init__(self, signing_seed: bytes, box_seed: bytes) -> None:
        if len(signing_seed) != KEY_SIZE or len(box_seed) != KEY_SIZE:
            raise EncryptionUsageError("an identity is two 32-byte seeds")
        self._seed = bytes(signing_seed) + bytes(box_seed)
        public, self._signing_secret = crypto_sign_seed_keypair(bytes(signing_seed))
        box_public, self._box_secret = crypto_box_seed_keypair(bytes(box_seed))
        #: The ed25519 public key: what rosters list for this member.
        self.signing_public: bytes = public
        #: The X25519 public key: what key packages are sealed to.
        self.box_public: bytes = box_public

    @classmethod
    def generate(cls) -> Identity:
        """A new identity from the system's randomness."""
        return cls(random_bytes(KEY_SIZE), random_bytes(KEY_SIZE))

    @classmethod
    def from_bytes(cls, data: bytes) -> Identity:
        """The identity :meth:`to_bytes` saved."""
        if len(data) != 2 * KEY_SIZE:
            raise EncryptionUsageError("a saved identity is 64 bytes")
        return cls(data[:KEY_SIZE], data[KEY_SIZE:])

    def to_bytes(self) -> bytes:
        """The two secret seeds (64 bytes)."""
        return self._seed

    def sign(self, message: bytes) -> bytes:
        """This member's ed25519 signature of ``message`` (64 bytes)."""
        return sign(self._signing_secret, message)

    @property
    def signing_secret(self) -> bytes:
        """libsodium's 64-byte ed25519 secret key (what the compiled sealer signs with:
        :func:`sdk.encryption.envelope.seal`)."""
        return self._signing_secret

    @property
    def box_secret(self) -> bytes:
        """The X25519 secret key (for opening key packages)."""
        return self._box_secret

    def __repr__(self) -> str:
        return f"Identity(signing_public={self.signing_public.hex()[:16]}...)"


@dataclass(frozen=True, slots=True)
class Epoch:
    """One generation of a channel's key: its ``number``, the 32-byte ``key`` and the
    ``roster`` of members as ``(sender_id, ed25519 public key)`` in signer-index order."""

    number: int
    key: bytes = field(repr=False)
    roster: tuple[tuple[str, bytes], ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        check_epoch_fields(self.number, self.key, self.roster)
        object.__setattr__(self, "_index", {sid: i for i, (sid, _) in enumerate(self.roster)})

    def index_of(self, sender_id: str) -> int | None:
        """The member's signer index in this epoch, ``None`` if it is not a member."""
        return self._index.get(sender_id)

    def members(self) -> dict[str, bytes]:
        """The roster as ``{sender_id: ed25519 public key}``."""
        return dict(self.roster)


def check_epoch_fields(number: int, key: bytes, roster: tuple[tuple[str, bytes], ...]) -> None:
    """Raise :class:`EncryptionUsageError` unless these make a valid :class:`Epoch`."""
    if not 0 <= number <= MAX_EPOCH:
        raise EncryptionUsageError(f"epoch number must be 0..{MAX_EPOCH}")
    if len(key) != KEY_SIZE:
        raise EncryptionUsageError("an epoch key is 32 bytes")
    if not 1 <= len(roster) <= MAX_ROSTER:
        raise EncryptionUsageError(f"a roster lists 1..{MAX_ROSTER} members")
    seen: set[str] = set()
    for sender_id, public in roster:
        if not 1 <= len(sender_id.encode()) <= MAX_SENDER_ID:
            raise EncryptionUsageError(f"sender ids are 1..{MAX_SENDER_ID} bytes of UTF-8")
        if len(public) != KEY_SIZE:
            raise EncryptionUsageError(f"{sender_id!r}: an ed25519 public key is 32 bytes")
        if sender_id in seen:
            raise EncryptionUsageError(f"{sender_id!r} is in the roster twice")
        seen.add(sender_id)


def new_epoch(number: int, members: Mapping[str, bytes]) -> Epoch:
    """A fresh epoch: a random key and ``members`` (``{sender_id: ed25519 public key}``)
    as its roster, sorted by sender id."""
    return Epoch(number, random_bytes(KEY_SIZE), tuple(sorted(members.items())))
