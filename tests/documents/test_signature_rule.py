"""The entry signature rule against a model of the reference's rule.

p2panda-rs 0.8.1 verifies entry signatures with ed25519-dalek 1.0.1's
``Verifier::verify`` (see the docstring of ``sdk.documents.bamboo``). The model
below is that rule written out with Python integers (slow, exact): the public key
must decode to a curve point (a y of p or more is taken mod p, x = 0 with the sign
bit set is allowed), S must be below the group order L, and [S]B - [k]A, encoded,
must equal the signature's R bytes (no cofactor). The edge cases are built here
from that arithmetic.

``signature_ok`` must give the model's answer on every case. libsodium alone
refuses small-order public keys and small-order R, which the model accepts
(``STRICTER``); ``signature_ok`` asks OpenSSL again when libsodium refuses.
"""

from __future__ import annotations

import hashlib
import random

import pytest
from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError

from sdk.documents import KeyPair, sign_entry
from sdk.documents.bamboo import (
    PARALLEL_VERIFY_MIN,
    VERIFY_CHUNK,
    decode_entry,
    signature_ok,
    start_verifying,
)

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, P - 2, P) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)
IDENTITY = (0, 1, 1, 0)

Point = tuple[int, int, int, int]


def add(a: Point, b: Point) -> Point:
    """Extended twisted Edwards addition (a = -1)."""
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    e1 = (y1 - x1) * (y2 - x2) % P
    e2 = (y1 + x1) * (y2 + x2) % P
    c = 2 * D * t1 * t2 % P
    dd = 2 * z1 * z2 % P
    e, f, g, h = e2 - e1, dd - c, dd + c, e2 + e1
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def mul(k: int, point: Point) -> Point:
    out = IDENTITY
    while k:
        if k & 1:
            out = add(out, point)
        point = add(point, point)
        k >>= 1
    return out


def neg(point: Point) -> Point:
    x, y, z, t = point
    return (-x % P, y, z, -t % P)


def compress(point: Point) -> bytes:
    x, y, z, _ = point
    zi = pow(z, P - 2, P)
    x, y = x * zi % P, y * zi % P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def decompress(data: bytes) -> Point | None:
    """As curve25519-dalek 3 decompresses: y mod p, the sign bit applied even to x = 0."""
    n = int.from_bytes(data, "little")
    y = (n & ((1 << 255) - 1)) % P
    u, v = (y * y - 1) % P, (D * y * y + 1) % P
    x2 = u * pow(v, P - 2, P) % P
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P:
        x = x * SQRT_M1 % P
    if (x * x - x2) % P:
        return None
    if x & 1:
        x = P - x
    if n >> 255:
        x = (P - x) % P
    return (x, y, 1, x * y % P)


BASE = decompress((4 * pow(5, P - 2, P) % P).to_bytes(32, "little"))
assert BASE is not None


def challenge(r: bytes, a: bytes, message: bytes) -> int:
    return int.from_bytes(hashlib.sha512(r + a + message).digest(), "little") % L


def reference_verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """ed25519-dalek 1.0.1 ``PublicKey::from_bytes`` then ``Verifier::verify``."""
    point = decompress(public_key)
    if point is None or len(signature) != 64:
        return False
    s = int.from_bytes(signature[32:], "little")
    if s >= L:
        return False
    k = challenge(signature[:32], public_key, message)
    return compress(add(mul(s, BASE), neg(mul(k, point)))) == signature[:32]


def _torsion() -> tuple[Point, list[Point]]:
    """A point of order 8 and the whole small-order subgroup."""
    y = 2
    while True:
        q = decompress(y.to_bytes(32, "little"))
        y += 1
        if q is None:
            continue
        t = mul(L, q)
        if compress(mul(4, t)) != compress(IDENTITY):
            return t, [mul(i, t) for i in range(8)]


T8, SMALL = _torsion()
RNG = random.Random(1215)
MESSAGE = b"an entry's signed bytes"


def scalar() -> int:
    return RNG.randrange(1, L)


def honest(a: int, public_key: bytes, message: bytes, r_point_offset: Point = IDENTITY) -> bytes:
    r = scalar()
    r_bytes = compress(add(mul(r, BASE), r_point_offset))
    s = (r + challenge(r_bytes, public_key, message) * a) % L
    return r_bytes + s.to_bytes(32, "little")


def forged_for_small_order_key(public_key: bytes, message: bytes) -> bytes:
    """A signature the cofactorless equation accepts for a small-order key A.

    [k]A depends only on k mod 8, so R = [r]B + T passes when T = -[k]A; try
    offsets and fresh r until the challenge fits.
    """
    point = decompress(public_key)
    assert point is not None
    for _ in range(64):
        r = scalar()
        for t in SMALL:
            r_bytes = compress(add(mul(r, BASE), t))
            k = challenge(r_bytes, public_key, message)
            if compress(add(mul(r, BASE), neg(mul(k, point)))) == r_bytes:
                return r_bytes + r.to_bytes(32, "little")
    raise AssertionError("no fitting signature found")


def edge_cases() -> list[tuple[str, bytes, bytes, bytes]]:
    a = scalar()
    key = compress(mul(a, BASE))
    good = honest(a, key, MESSAGE)
    s = int.from_bytes(good[32:], "little")
    cases = [
        ("valid", key, MESSAGE, good),
        ("other message", key, MESSAGE + b"!", good),
        ("S + L (non-canonical S)", key, MESSAGE, good[:32] + (s + L).to_bytes(32, "little")),
        ("S = L", key, MESSAGE, good[:32] + L.to_bytes(32, "little")),
        ("S high bits set", key, MESSAGE, good[:32] + (s | 7 << 253).to_bytes(32, "little")),
        ("R flipped bit", key, MESSAGE, bytes([good[0] ^ 4]) + good[1:]),
    ]
    small_keys = [
        ("A identity", (1).to_bytes(32, "little")),
        ("A identity, non-canonical y = p + 1", (P + 1).to_bytes(32, "little")),
        ("A identity, sign bit set", (1 | 1 << 255).to_bytes(32, "little")),
        ("A of order 2", (P - 1).to_bytes(32, "little")),
        ("A of order 4, non-canonical y = p", P.to_bytes(32, "little")),
        ("A of order 8", compress(T8)),
    ]
    for name, small in small_keys:
        cases.append((name, small, MESSAGE, forged_for_small_order_key(small, MESSAGE)))
    for name, r_bytes in [
        ("R identity", (1).to_bytes(32, "little")),
        ("R identity, non-canonical y = p + 1", (P + 1).to_bytes(32, "little")),
        ("R identity, sign bit set", (1 | 1 << 255).to_bytes(32, "little")),
    ]:
        # [S]B - [k]A = identity for S = k * a.
        k = challenge(r_bytes, key, MESSAGE)
        cases.append((name, key, MESSAGE, r_bytes + (k * a % L).to_bytes(32, "little")))
    # A with a torsion component: an honest-style signature passes the
    # cofactorless equation iff [k]T8 vanishes, i.e. k = 0 mod 8.
    mixed = compress(add(mul(a, BASE), T8))
    found: dict[bool, tuple[bytes, bytes]] = {}
    i = 0
    while len(found) < 2:
        message = b"mixed %d" % i
        i += 1
        signature = honest(a, mixed, message)
        found.setdefault(challenge(signature[:32], mixed, message) % 8 == 0, (message, signature))
    cases.append(("A mixed order, k = 0 mod 8", mixed, *found[True]))
    cases.append(("A mixed order, k != 0 mod 8", mixed, *found[False]))
    cases.append(("R with a torsion component", key, MESSAGE, honest(a, key, MESSAGE, T8)))
    not_on_curve = next(
        y.to_bytes(32, "little")
        for y in range(2, 100)
        if decompress(y.to_bytes(32, "little")) is None
    )
    cases.append(("A not on the curve", not_on_curve, MESSAGE, good))
    for y in range(2, 19):
        noncanonical = (P + y).to_bytes(32, "little")
        on_curve = decompress(noncanonical) is not None
        cases.append(
            (f"A non-canonical y = p + {y}, on curve {on_curve}", noncanonical, MESSAGE, good)
        )
    return cases


CASES = edge_cases()
#: Where libsodium is stricter than the reference: small-order A or small-order R.
STRICTER = {
    "A identity",
    "A identity, non-canonical y = p + 1",
    "A identity, sign bit set",
    "A of order 2",
    "A of order 4, non-canonical y = p",
    "A of order 8",
    "R identity",
}


@pytest.mark.parametrize(
    ("name", "public_key", "message", "signature"), CASES, ids=[c[0] for c in CASES]
)
def test_rule_matches_the_reference_model(
    name: str, public_key: bytes, message: bytes, signature: bytes
) -> None:
    assert signature_ok(public_key, message, signature) == reference_verify(
        public_key, message, signature
    )


@pytest.mark.parametrize(
    ("name", "public_key", "message", "signature"), CASES, ids=[c[0] for c in CASES]
)
def test_libsodium_alone_is_stricter_only_on_small_order(
    name: str, public_key: bytes, message: bytes, signature: bytes
) -> None:
    """Why the second check exists: libsodium never accepts what the reference refuses."""
    try:
        crypto_sign_open(signature + message, public_key)
        libsodium = True
    except (BadSignatureError, ValueError):
        libsodium = False
    expected = reference_verify(public_key, message, signature)
    if name in STRICTER:
        assert expected and not libsodium
    else:
        assert libsodium == expected


def test_the_cases_cover_both_answers() -> None:
    answers = {name: reference_verify(pk, m, sig) for name, pk, m, sig in CASES}
    assert answers["valid"] and answers["A mixed order, k = 0 mod 8"]
    assert not answers["A mixed order, k != 0 mod 8"]
    assert not answers["R with a torsion component"]
    assert not answers["S + L (non-canonical S)"]
    assert not answers["R identity, non-canonical y = p + 1"]
    assert all(answers[name] for name in STRICTER)


def test_real_entries_and_tampered_ones_agree_with_the_model() -> None:
    key = KeyPair.generate()
    for n in range(6):
        entry = sign_entry(key, n, 1, b"payload %d" % n)
        signed, signature = entry.encoded[:-64], entry.signature
        assert signature_ok(entry.author, signed, signature)
        assert reference_verify(entry.author, signed, signature)
        bit = RNG.randrange(len(entry.encoded) * 8)
        tampered = bytearray(entry.encoded)
        tampered[bit // 8] ^= 1 << (bit % 8)
        t_author, t_signed, t_sig = (
            bytes(tampered[1:33]),
            bytes(tampered[:-64]),
            bytes(tampered[-64:]),
        )
        assert not signature_ok(t_author, t_signed, t_sig)
        assert not reference_verify(t_author, t_signed, t_sig)


def test_wrong_lengths_are_refused() -> None:
    entry = sign_entry(KeyPair.generate(), 0, 1, b"x")
    signed = entry.encoded[:-64]
    assert not signature_ok(entry.author[:31], signed, entry.signature)
    assert not signature_ok(entry.author, signed, entry.signature[:63])
    assert not signature_ok(entry.author + b"\x00", signed, entry.signature)


def test_pipelined_checks_agree_with_one_by_one() -> None:
    key = KeyPair.generate()
    entries = []
    for n in range(PARALLEL_VERIFY_MIN + 3 * VERIFY_CHUNK + 5):
        encoded = sign_entry(key, n, 1, b"%d" % n).encoded
        if n % 5 == 2:
            encoded = encoded[:-1] + bytes([encoded[-1] ^ 0x10])
        entries.append(decode_entry(encoded))
    expected = [entry.signature_valid() for entry in entries]
    checks = start_verifying(entries)
    # Read out of order, twice: each answer is the one-by-one answer.
    order = list(range(len(entries)))
    RNG.shuffle(order)
    assert [checks.valid(i) for i in order] == [expected[i] for i in order]
    assert checks.all() == expected
    small = start_verifying(entries[:3])
    assert small.all() == expected[:3]
    abandoned = start_verifying(entries)
    abandoned.cancel()  # stops what has not started; nothing to read afterwards
