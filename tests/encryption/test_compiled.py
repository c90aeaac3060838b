"""The compiled envelope calls (``_ed25519_batch.seal`` / ``open_sealed``) against the
pure-Python path they replace: the same envelopes, answers and typed errors, with the
extension present and missing (``docs/encryption.md``, "Costs")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sdk.documents import verifier
from sdk.encryption import ChannelEncryption, Epoch, Identity, RemoteEncryptionError, new_epoch
from sdk.encryption._wire import U16, aead_seal, channel_bytes
from sdk.encryption.envelope import (
    _AD_DOMAIN,
    HEADER_SIZE,
    read_header,
    reseal,
    seal,
    seal_record,
    unseal,
)
from tests.encryption.helpers import Group, sds

COMPILED = verifier.sealed_envelope_calls() is not None
needs_compiled = pytest.mark.skipif(
    not COMPILED, reason="the compiled loop is missing or switched off"
)


@pytest.fixture(params=["compiled", "python"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Handles made in this test use the compiled calls, or run as if the extension
    were missing (the module absent: ``verifier`` falls back to PyNaCl)."""
    if request.param == "compiled" and not COMPILED:
        pytest.skip("the compiled loop is missing or switched off")
    if request.param == "python":
        monkeypatch.setattr(verifier, "_ed25519_batch", None)
        monkeypatch.setattr(verifier, "_sealed_calls", None)
        verifier.configure()
        assert verifier.sealed_envelope_calls() is None
    yield request.param
    monkeypatch.undo()
    verifier.configure()


def _inner_sealed(epoch: Epoch, inner: bytes, binding: bytes) -> bytes:
    """An envelope under ``epoch`` whose sealed plaintext is ``inner`` as given."""
    header = bytes([1]) + epoch.number.to_bytes(4, "big") + bytes(8) + bytes(range(24))
    return header + aead_seal(inner, _AD_DOMAIN + binding + header, header[13:], epoch.key)


def _hostile(group: Group) -> list[bytes]:
    """Every way an envelope fails to open, with good ones around and a replayed copy."""
    alice = group.handle("alice")
    binding = channel_bytes("room")
    bob_index = group.epoch.index_of("bob")
    assert bob_index is not None
    good = [alice.encrypt(sds("alice", f"m{i}")) for i in range(4)]
    forged = seal(binding, group.epoch, bob_index, group.ids["alice"], sds("bob", "f"), 1)
    other_key = new_epoch(group.epoch.number, {"alice": group.ids["alice"].signing_public})
    wrong_key = seal(binding, other_key, 0, group.ids["alice"], sds("alice", "k"), 1)
    unknown_epoch = bytearray(good[0])
    unknown_epoch[1:5] = (99).to_bytes(4, "big")
    mismatch = seal(
        binding,
        group.epoch,
        group.epoch.index_of("alice") or 0,
        group.ids["alice"],
        sds("bob", "s"),
        1,
    )
    not_sds = seal(binding, group.epoch, 0, group.ids["alice"], b"\xff\xff not sds", 1)
    no_room = _inner_sealed(group.epoch, b"\x00" * 65, binding)
    unknown_signer = _inner_sealed(group.epoch, U16.pack(7) + bytes(64) + b"x", binding)
    flipped = bytearray(good[1])
    flipped[-1] ^= 1
    return [
        good[0],
        b"\x01short",
        forged,
        wrong_key,
        bytes(unknown_epoch),
        good[1][:-1],
        mismatch,
        not_sds,
        no_room,
        unknown_signer,
        bytes(flipped),
        good[2],
        good[2],  # replayed
        good[3] + b"\x00",
        b"\x02" + good[3][1:],
        good[3],
    ]


def _outcome(handle: ChannelEncryption, payload: bytes) -> object:
    try:
        return handle.decrypt(payload)
    except RemoteEncryptionError as exc:
        return type(exc), exc.reason, str(exc)


def _batch(handle: ChannelEncryption, payloads: list[bytes], checked: bool) -> list[object]:
    batch = handle.open_batch(payloads)
    if checked:
        batch.check()
    return [r if isinstance(r, bytes) else (type(r), r.reason, str(r)) for r in batch.results()]


# What the pure-Python path says about _hostile()'s payloads, in order (the reasons:
# the typed events the runtime emits for them).
EXPECTED_REASONS = [
    None,
    "truncated",
    "forged_signature",
    "authentication",
    "unknown_epoch",
    "authentication",
    "sender_mismatch",
    "malformed_plaintext",
    "forged_signature",
    "unknown_signer",
    "authentication",
    None,
    None,
    "authentication",
    "malformed",
    None,
]


@pytest.mark.parametrize("checked", [True, False])
def test_batch_and_decrypt_give_the_same_answers_and_errors(mode: str, checked: bool) -> None:
    group = Group("room", ["alice", "bob"])
    payloads = _hostile(group)
    one_by_one = [_outcome(group.handle("bob"), p) for p in payloads]
    assert [o[1] if isinstance(o, tuple) else None for o in one_by_one] == EXPECTED_REASONS
    assert _batch(group.handle("bob"), payloads, checked) == one_by_one


def test_compiled_and_python_paths_agree_to_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    if not COMPILED:
        pytest.skip("the compiled loop is missing or switched off")
    group = Group("room", ["alice", "bob"])
    payloads = _hostile(group)
    compiled = _batch(group.handle("bob"), payloads, True)
    compiled_one = [_outcome(group.handle("bob"), p) for p in payloads]
    monkeypatch.setattr(verifier, "_ed25519_batch", None)
    monkeypatch.setattr(verifier, "_sealed_calls", None)
    verifier.configure()
    try:
        assert _batch(group.handle("bob"), payloads, True) == compiled
        assert [_outcome(group.handle("bob"), p) for p in payloads] == compiled_one
    finally:
        monkeypatch.undo()
        verifier.configure()


def test_a_sealed_envelope_has_the_format_either_way(mode: str) -> None:
    # Rebuilt in Python from its seal record (the same header and signature, the AEAD
    # again), an envelope comes back byte for byte: the compiled sealer writes the
    # documented format. Its signature is the sender's, over the documented bytes.
    group = Group("room", ["alice", "bob"])
    bob, binding = group.handle("bob"), channel_bytes("room")  # signer 1: its byte order shows
    message = sds("bob", "m1", content=b"x" * 300)
    envelope = bob.encrypt(message)
    header = read_header(envelope, 10_000)
    assert header.epoch == group.epoch.number and len(envelope) == len(message) + 119
    unsealed = unseal(binding, group.epoch, envelope)
    assert unsealed.sds == message and unsealed.sender_id == "bob"
    assert verifier.libsodium_accepts(
        group.ids["bob"].signing_public, unsealed.signed_and_signature, unsealed.signature
    )
    record = seal_record(envelope, unsealed.signer_and_signature)
    assert reseal(binding, group.epoch, record, message) == envelope
    assert group.handle("alice").decrypt(envelope) == message
    # Two seals of the same bytes get two fresh nonces.
    again = ChannelEncryption(group.rings["bob"], "bob", group.ids["bob"], cache_size=0)
    other = again.encrypt(message)
    assert other[:5] == envelope[:5] and other[13:HEADER_SIZE] != envelope[13:HEADER_SIZE]


@needs_compiled
def test_the_compiled_sealer_signs_as_pynacl_does() -> None:
    calls = verifier.sealed_envelope_calls()
    assert calls is not None
    sealer = calls[0]
    identity = Identity.generate()
    epoch = new_epoch(3, {"a": identity.signing_public})
    binding = channel_bytes("room")
    envelope = seal(binding, epoch, 0, identity, b"sds bytes", 1234, sealer)
    unsealed = unseal(binding, epoch, envelope)
    # ed25519 is deterministic: the signature PyNaCl's binding gives for the same bytes.
    assert unsealed.signature == identity.sign(unsealed.signed_and_signature[:-64])
    assert read_header(envelope, 1_000)[:3] == (1, 3, 1234)


@needs_compiled
def test_with_the_compiled_loop_the_batch_opens_no_seal_in_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The loop reads headers only; the seals open in check()'s one native call (a
    # worker thread's), not through the Python AEAD binding.
    import sdk.encryption.envelope as envelope_module

    group = Group("room", ["alice", "bob"])
    payloads = [group.handle("alice").encrypt(sds("alice", f"m{i}")) for i in range(5)]
    bob = group.handle("bob")

    def no_python_open(*args: object) -> None:
        raise AssertionError("a seal was opened in Python")

    monkeypatch.setattr(envelope_module, "unseal", no_python_open)
    monkeypatch.setattr(envelope_module, "aead_open", no_python_open)
    batch = bob.open_batch(payloads)
    batch.check()
    assert batch.results() == [sds("alice", f"m{i}") for i in range(5)]
    assert bob.decrypt(payloads[0]) == sds("alice", "m0")
