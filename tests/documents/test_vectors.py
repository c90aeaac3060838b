"""The shared byte-exact vectors, reproduced and checked verbatim."""

from __future__ import annotations

from typing import Any

import pytest

from sdk.documents import (
    Action,
    KeyPair,
    decode_entry,
    decode_operation,
    encode_operation,
    hash_id,
    lipmaa,
    sign_entry,
    yasmf_hash,
)
from sdk.documents.bamboo import SIGNATURE_SIZE

from .helpers import load_vector

P2PANDA = load_vector("p2panda-operation-entry.json")
BAMBOO = load_vector("bamboo-ed25519-yasmf.json")


def test_key_pair_matches_vector() -> None:
    key = KeyPair.from_private_key(bytes.fromhex(P2PANDA["private_key"]))
    assert key.author == P2PANDA["public_key"]


def test_operation_decodes_to_vector_and_reencodes_byte_for_byte() -> None:
    data = bytes.fromhex(P2PANDA["operation"]["cbor_hex"])
    operation = decode_operation(data)
    version, action, schema_id, fields = P2PANDA["operation"]["decoded"]
    assert operation.version == version
    assert operation.action is Action(action)
    assert operation.schema_id == schema_id
    assert dict(operation.fields or {}) == fields
    assert encode_operation(operation) == data


def test_entry_signed_byte_for_byte() -> None:
    key = KeyPair.from_private_key(bytes.fromhex(P2PANDA["private_key"]))
    payload = bytes.fromhex(P2PANDA["operation"]["cbor_hex"])
    expected = P2PANDA["entry"]
    entry = sign_entry(key, expected["log_id"], expected["seq_num"], payload)
    assert entry.encoded.hex() == expected["encoded_hex"]
    assert entry.payload_size == expected["payload_size"] == len(payload)
    assert entry.payload_hash.hex() == expected["payload_hash"]
    assert entry.signature.hex() == expected["signature"]
    assert entry.id == P2PANDA["operation_id"]


def test_entry_decodes_and_verifies() -> None:
    entry = decode_entry(bytes.fromhex(P2PANDA["entry"]["encoded_hex"]))
    entry.verify_signature()
    entry.verify_payload(bytes.fromhex(P2PANDA["operation"]["cbor_hex"]))
    assert entry.author.hex() == P2PANDA["public_key"]
    assert (entry.log_id, entry.seq_num) == (0, 1)
    assert entry.backlink is None and entry.lipmaa_link is None
    assert entry.id == P2PANDA["operation_id"]


def test_yasmf_hashes_from_notes() -> None:
    assert hash_id(bytes([1, 2, 3])) == (
        "0020b177ec1bf26dfb3b7010d473e6d44713b29b765b99c6e60ecbfae742de496543"
    )
    schema_hash = P2PANDA["operation"]["decoded"][2].removeprefix("venue_")
    assert hash_id(bytes([3, 2, 1])) == schema_hash
    assert yasmf_hash(b"")[:2] == b"\x00\x20"


def _check_bamboo_entry(case: dict[str, Any], key: KeyPair) -> None:
    data = bytes.fromhex(case["encoded"])
    entry = decode_entry(data)
    entry.verify_signature()
    decoded = case["decoded"]
    assert entry.author.hex() == decoded["author"]
    assert entry.log_id == decoded["logId"]
    assert entry.seq_num == decoded["seqNum"]
    assert entry.payload_size == decoded["payloadSize"]
    assert entry.payload_hash.hex() == "0020" + decoded["payloadHash"]["Blake3"]
    assert entry.signature.hex() == decoded["sig"]
    for attr, key_name in (("backlink", "backlink"), ("lipmaa_link", "lipmaaLink")):
        link = getattr(entry, attr)
        want = decoded[key_name]
        assert (link.hex() if link else None) == ("0020" + want["Blake3"] if want else None)
    # ed25519 is deterministic: re-signing the unsigned bytes gives the same signature.
    assert key.sign(data[:-SIGNATURE_SIZE]) == entry.signature
    if "payload" in case:
        payload = bytes.fromhex(case["payload"])
        entry.verify_payload(payload)
        resigned = sign_entry(
            key, entry.log_id, entry.seq_num, payload, entry.backlink, entry.lipmaa_link
        )
        assert resigned.encoded == data


@pytest.mark.parametrize("name", ["fiveValidEntries", "valid_partial_replicated_seq_100"])
def test_bamboo_logs(name: str) -> None:
    log = BAMBOO[name]
    key = KeyPair.from_private_key(bytes.fromhex(log["author"]["secret"]))
    assert key.author == log["author"]["public"]
    by_seq: dict[int, bytes] = {}
    for case in log["entries"]:
        _check_bamboo_entry(case, key)
        entry = decode_entry(bytes.fromhex(case["encoded"]))
        by_seq[entry.seq_num] = entry.hash
    # Every link present in the vector points at the entry lipmaa / backlink names.
    for case in log["entries"]:
        entry = decode_entry(bytes.fromhex(case["encoded"]))
        if entry.backlink is not None and entry.seq_num - 1 in by_seq:
            assert entry.backlink == by_seq[entry.seq_num - 1]
        if entry.lipmaa_link is not None and lipmaa(entry.seq_num) in by_seq:
            assert entry.lipmaa_link == by_seq[lipmaa(entry.seq_num)]


def test_valid_first_entry() -> None:
    case = BAMBOO["validFirstEntry"]
    key = KeyPair.from_private_key(bytes.fromhex(case["author"]["secret"]))
    _check_bamboo_entry(case, key)


def test_lipmaa_function_known_values() -> None:
    # Bamboo: numbers (3^k - 1)/2 link back to the previous one; others within their block.
    assert [lipmaa(n) for n in (2, 3, 4, 5, 8, 12, 13, 14, 40, 41, 121)] == [
        1,
        2,
        1,
        4,
        4,
        8,
        4,
        13,
        13,
        40,
        40,
    ]
