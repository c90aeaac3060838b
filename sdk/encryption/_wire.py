"""Pieces shared by the envelope and the key package: big-endian integers, the channel
binding, and ed25519 signing (checks are libsodium's answer as the document layer
asks it: :func:`sdk.documents.verifier.libsodium_accepts`)."""

from __future__ import annotations

import struct

from nacl._sodium import ffi, lib

from sdk.encryption.errors import EncryptionUsageError

U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
#: Size of an ed25519 signature.
SIGNATURE_SIZE = 64
#: Size of every public key and symmetric key here.
KEY_SIZE = 32


def channel_bytes(channel_id: str) -> bytes:
    """``u16 len || channel_id`` (UTF-8): how both formats bind the channel."""
    raw = channel_id.encode()
    if not raw or len(raw) > 0xFFFF:
        raise EncryptionUsageError("channel_id must be 1..65535 bytes of UTF-8")
    return U16.pack(len(raw)) + raw


def sign(secret_key: bytes, message: bytes) -> bytes:
    """The detached ed25519 signature of ``message`` (``secret_key``: libsodium's 64 bytes).

    libsodium's ``crypto_sign`` (the call PyNaCl's binding makes) without the binding's
    argument checks and length pointer: ``secret_key`` comes from
    :class:`~sdk.encryption.keys.Identity`, which holds 64 bytes. The signature is the
    first 64 bytes of the signed message, only those are copied out."""
    out = ffi.new("unsigned char[]", len(message) + SIGNATURE_SIZE)
    if lib.crypto_sign(out, ffi.NULL, message, len(message), secret_key):
        raise RuntimeError("libsodium crypto_sign failed")
    signature: bytes = ffi.buffer(out, SIGNATURE_SIZE)[:]
    return signature


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is ``public_key``'s ed25519 signature of ``message``."""
    return accepts(public_key, message + signature, signature)


def accepts(public_key: bytes, signed_and_signature: bytes, signature: bytes) -> bool:
    """Whether libsodium accepts ``signature`` over ``signed_and_signature[:-64]`` by
    ``public_key``: the one rule, :func:`sdk.documents.verifier.libsodium_accepts`
    (imported on first use: the store node reads envelope headers without it)."""
    from sdk.documents.verifier import libsodium_accepts

    return libsodium_accepts(public_key, signed_and_signature, signature)


#: Bytes of the XChaCha20-Poly1305 tag.
TAG_SIZE = 16


def aead_seal(message: bytes, ad: bytes, nonce: bytes, key: bytes) -> bytes:
    """XChaCha20-Poly1305-IETF of ``message`` (``crypto_aead_xchacha20poly1305_ietf_encrypt``).

    The libsodium call PyNaCl's binding makes, without its per-call argument checks (a
    third of an envelope's cost at 300 bytes): callers pass a 24-byte nonce and a
    32-byte key, which :class:`~sdk.encryption.keys.Epoch` guarantees."""
    out = ffi.new("unsigned char[]", len(message) + TAG_SIZE)
    lib.crypto_aead_xchacha20poly1305_ietf_encrypt(
        out, ffi.NULL, message, len(message), ad, len(ad), ffi.NULL, nonce, key
    )
    sealed: bytes = ffi.buffer(out)[:]
    return sealed


def aead_open(ciphertext: bytes, ad: bytes, nonce: bytes, key: bytes) -> bytes | None:
    """The plaintext of ``ciphertext`` (``crypto_aead_xchacha20poly1305_ietf_decrypt``), or
    ``None`` when the tag does not verify; ``ciphertext`` has at least :data:`TAG_SIZE`
    bytes, ``nonce`` 24 and ``key`` 32 (as for :func:`aead_seal`)."""
    out = ffi.new("unsigned char[]", max(1, len(ciphertext) - TAG_SIZE))
    if lib.crypto_aead_xchacha20poly1305_ietf_decrypt(
        out, ffi.NULL, ffi.NULL, ciphertext, len(ciphertext), ad, len(ad), nonce, key
    ):
        return None
    opened: bytes = ffi.buffer(out, len(ciphertext) - TAG_SIZE)[:]
    return opened
