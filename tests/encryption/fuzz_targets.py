"""Fuzz targets of the encryption decoders (registered in ``tests/fuzz/targets.py``).

Keys come from fixed seeds, so seeds and failures replay. The envelope target
opens with a member's handle (``ChannelEncryption.decrypt``: header, seal,
signature, SDS sender check); the key-package target with a member's ring
(``KeyRing.accept``). Both may raise only ``RemoteEncryptionError``.
"""

from __future__ import annotations

from sdk.encryption import ChannelEncryption, Epoch, Identity, KeyRing, seal_key_package
from sdk.sds.message import HistoryEntry, Message, encode_message

_ISSUER = Identity(bytes(range(32)), bytes(range(1, 33)))
_MEMBER = Identity(bytes(range(2, 34)), bytes(range(3, 35)))
_EPOCHS = tuple(
    Epoch(
        n,
        bytes([n + 7]) * 32,
        (("alice", _ISSUER.signing_public), ("bob", _MEMBER.signing_public)),
    )
    for n in (0, 1)
)


def _ring() -> KeyRing:
    ring = KeyRing("room", {_ISSUER.signing_public})
    for epoch in _EPOCHS:
        ring.add(epoch)
    return ring


_READER = ChannelEncryption(_ring(), "bob", _MEMBER, cache_size=0)


def envelope_seeds() -> tuple[bytes, ...]:
    """Envelopes of both epochs from both members: content, sync and ephemeral messages."""
    history = (HistoryEntry("id0", b"\x01" * 32, "alice"),)
    seeds = []
    for epoch in _EPOCHS:
        ring = KeyRing("room")
        ring.add(epoch)
        for sender, identity in (("alice", _ISSUER), ("bob", _MEMBER)):
            handle = ChannelEncryption(ring, sender, identity, clock=lambda: 1_700_000_000_000)
            for message in (
                Message(sender, "m1", "room", 5, history, b"\x01" * 16, b"hello"),
                Message(sender, "m2", "room", 6, history),
                Message(sender, "m3", "room", None, content=b"typing"),
            ):
                seeds.append(handle.encrypt(encode_message(message)))
    return tuple(seeds)


def key_package_seeds() -> tuple[bytes, ...]:
    """Key packages of both epochs sealed to the member."""
    return tuple(seal_key_package("room", e, _ISSUER, _MEMBER.box_public) for e in _EPOCHS)


def open_envelope(data: bytes) -> object:
    """Open one envelope as the member."""
    return _READER.decrypt(data)


def accept_key_package(data: bytes) -> object:
    """Accept one key package into a fresh ring of the member."""
    return KeyRing("room", {_ISSUER.signing_public}).accept(data, _MEMBER)
