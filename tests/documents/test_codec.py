"""VarU64, the operation CBOR subset, and operations with every field type."""

from __future__ import annotations

import math

import cbor2
import pytest

from sdk.documents import (
    Action,
    CBORError,
    HashError,
    Operation,
    OperationFormatError,
    PinnedRelation,
    PinnedRelationList,
    Relation,
    RelationList,
    SizeLimitExceeded,
    UsageError,
    VarU64Error,
    cbor,
    decode_operation,
    decode_varu64,
    encode_operation,
    encode_varu64,
)
from sdk.documents.limits import MAX_VALUE_SIZE

from .helpers import TODO_SCHEMA, todo_fields

H1 = "0020" + "aa" * 32
H2 = "0020" + "bb" * 32
H3 = "0020" + "cc" * 32


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (247, "f7"),
        (248, "f8f8"),
        (255, "f8ff"),
        (256, "f90100"),
        (65535, "f9ffff"),
        (65536, "fa010000"),
        ((1 << 64) - 1, "ffffffffffffffffff"),
    ],
)
def test_varu64_canonical(value: int, encoded: str) -> None:
    assert encode_varu64(value).hex() == encoded
    assert decode_varu64(bytes.fromhex(encoded)) == (value, len(encoded) // 2)


@pytest.mark.parametrize(
    "bad", ["", "f8", "f800", "f8f7", "f900ff", "fa00ffff", "ff00000000000000ff"]
)
def test_varu64_rejects_truncated_and_non_canonical(bad: str) -> None:
    with pytest.raises(VarU64Error):
        decode_varu64(bytes.fromhex(bad))


def test_map_keys_plain_string_order_unlike_cbor2_canonical() -> None:
    value = {"name": "chess", "description": "for playing chess", "zz": 1, "a": 2}
    ours = cbor.encode(value)
    assert list(cbor2.loads(ours)) == ["a", "description", "name", "zz"]
    assert ours != cbor2.dumps(value, canonical=True)  # length-first order
    assert cbor2.loads(ours) == value


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0.0, "f90000"),
        (-0.0, "f98000"),
        (1.5, "f93e00"),
        (65504.0, "f97bff"),
        (100000.0, "fa47c35000"),
        (1.1, "fb3ff199999999999a"),
        (math.inf, "f97c00"),
        (-math.inf, "f9fc00"),
        (math.nan, "f97e00"),
        (5.960464477539063e-08, "f90001"),
    ],
)
def test_float_shortest_lossless_width(value: float, encoded: str) -> None:
    assert cbor.encode(value).hex() == encoded
    back = cbor.decode(bytes.fromhex(encoded))
    assert isinstance(back, float)
    assert (math.isnan(back) and math.isnan(value)) or (
        back == value and math.copysign(1, back) == math.copysign(1, value)
    )


@pytest.mark.parametrize(
    "bad",
    [
        "fa3fc00000",  # 1.5 as f32: not the shortest width
        "fb3ff8000000000000",  # 1.5 as f64
        "f97e01",  # NaN with a payload
        "1817",  # 23 with a one-byte argument
        "190017",  # 23 in two bytes
        "a2616101616101",  # duplicate key
        "a2616201616101",  # keys out of order
        "a1016161",  # integer key
        "9f01ff",  # indefinite array
        "5f41ff",  # indefinite byte string
        "c101",  # tag
        "f6",  # null
        "f7",  # undefined
        "e0",  # simple value 0
        "62c328",  # invalid UTF-8
        "83010203",  # trailing byte after 3-item array? no: extra item
        "8301",  # truncated
        "9bffffffffffffffff",  # absurd array length
        "",
    ],
)
def test_cbor_rejects_outside_subset(bad: str) -> None:
    data = bytes.fromhex(bad)
    if bad == "83010203":
        data = bytes.fromhex("820102") + b"\x03"
    with pytest.raises(CBORError):
        cbor.decode(data)


def test_cbor_depth_bounded() -> None:
    with pytest.raises(SizeLimitExceeded):
        cbor.decode(b"\x81" * 10 + b"\x01")


def test_every_field_type_round_trips_through_bytes() -> None:
    schema = TODO_SCHEMA
    fields = {
        "title": "groceries ✓",
        "done": True,
        "priority": -(1 << 63),
        "weight": 2.5,
        "note": b"\x00\x01",
    }
    operation = Operation(
        Action.CREATE, schema.id, None, schema.resolve_fields(fields, complete=True)
    )
    data = encode_operation(operation)
    back = schema.resolve(decode_operation(data))
    assert back == operation
    assert encode_operation(back) == data


def test_relations_encode_hashes_as_byte_strings() -> None:
    fields = {
        "r": Relation(H1),
        "rl": RelationList((H2, H1)),
        "p": PinnedRelation((H1, H2)),
        "pl": PinnedRelationList(((H1,), (H2, H3))),
    }
    operation = Operation(Action.UPDATE, "things_" + H3, (H1, H2), fields)
    data = encode_operation(operation)
    decoded = cbor2.loads(data)
    assert decoded[:3] == [1, 1, "things_" + H3]
    assert decoded[3] == [bytes.fromhex(H1), bytes.fromhex(H2)]
    assert decoded[4]["r"] == bytes.fromhex(H1)
    assert decoded[4]["rl"] == [bytes.fromhex(H2), bytes.fromhex(H1)]
    assert decoded[4]["pl"] == [[bytes.fromhex(H1)], [bytes.fromhex(H2), bytes.fromhex(H3)]]
    plain = decode_operation(data)
    assert plain.fields is not None and plain.fields["r"] == bytes.fromhex(H1)
    assert encode_operation(plain) == data


def test_delete_shape() -> None:
    operation = Operation(Action.DELETE, TODO_SCHEMA.id, (H1,))
    data = encode_operation(operation)
    assert cbor2.loads(data) == [1, 2, TODO_SCHEMA.id, [bytes.fromhex(H1)]]
    assert decode_operation(data) == operation


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ([2, 0, TODO_SCHEMA.id, {"a": 1}], OperationFormatError),  # version
        ([1, 3, TODO_SCHEMA.id, {"a": 1}], OperationFormatError),  # action
        ([1, 0, TODO_SCHEMA.id], OperationFormatError),  # too short
        ([1, 0, TODO_SCHEMA.id, [bytes.fromhex(H1)], {"a": 1}], OperationFormatError),
        ([1, 1, TODO_SCHEMA.id, {"a": 1}], OperationFormatError),  # UPDATE without previous
        ([1, 2, TODO_SCHEMA.id, []], OperationFormatError),  # empty previous
        (
            [1, 1, TODO_SCHEMA.id, [bytes.fromhex(H2), bytes.fromhex(H1)], {"a": 1}],
            OperationFormatError,
        ),  # previous not sorted
        ([1, 2, TODO_SCHEMA.id, [b"\x01\x20" + b"\x00" * 32]], HashError),
        ([1, 0, "no schema", {"a": 1}], OperationFormatError),
        ([1, 0, TODO_SCHEMA.id, {}], OperationFormatError),  # CREATE without fields
        ([1, 0, TODO_SCHEMA.id, {"1bad": 1}], OperationFormatError),  # field name
        ([1, 0, TODO_SCHEMA.id, {"a": [1, 2]}], OperationFormatError),  # list of ints
        ([1, 0, TODO_SCHEMA.id, {"a": 1 << 63}], SizeLimitExceeded),  # beyond i64
        ([1, 0, TODO_SCHEMA.id, {"a": "x" * (MAX_VALUE_SIZE + 1)}], SizeLimitExceeded),
    ],
)
def test_operation_shape_rules(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_operation(cbor.encode(value))  # type: ignore[arg-type]


def test_bad_relation_hash_in_local_value() -> None:
    with pytest.raises(HashError):
        Relation("0020" + "zz" * 32)


def test_is_create_reads_the_action_from_the_header() -> None:
    from sdk.documents import Action, DocumentStore, KeyPair, Operation, encode_operation
    from sdk.documents.operation import is_create

    op_id = "0020" + "ab" * 32
    create = Operation(Action.CREATE, TODO_SCHEMA.id, None, {"title": "a", "done": False})
    update = Operation(Action.UPDATE, TODO_SCHEMA.id, (op_id,), {"done": True})
    delete = Operation(Action.DELETE, TODO_SCHEMA.id, (op_id,), None)
    assert is_create(encode_operation(create))
    assert not is_create(encode_operation(update)) and not is_create(encode_operation(delete))
    store = DocumentStore()
    store.add_schema(TODO_SCHEMA)
    published = store.create(KeyPair.generate(), TODO_SCHEMA.id, todo_fields("b"))
    assert is_create(published.operation)


def test_verify_signatures_in_parallel_agrees_with_one_by_one() -> None:
    from sdk.documents import KeyPair, sign_entry
    from sdk.documents.bamboo import PARALLEL_VERIFY_MIN, decode_entry, verify_signatures

    key = KeyPair.generate()
    entries = []
    for n in range(PARALLEL_VERIFY_MIN * 2):
        encoded = sign_entry(key, n, 1, b"\xa0" * (n + 1), None, None).encoded
        if n % 7 == 3:
            encoded = encoded[:-1] + bytes([encoded[-1] ^ 1])
        entries.append(decode_entry(encoded))
    expected = [entry.signature_valid() for entry in entries]
    assert expected.count(False) == len(range(3, len(entries), 7))
    assert verify_signatures(entries) == expected
    assert verify_signatures(entries[:3]) == expected[:3]


def test_with_fields_keeps_the_field_names_and_skips_no_rule() -> None:
    from sdk.documents.operation import with_fields

    schema_id = "todo_0020" + "11" * 32
    operation = decode_operation(
        encode_operation(Operation(Action.CREATE, schema_id, None, {"title": "a", "done": False}))
    )
    typed = with_fields(operation, {"title": "b", "done": True})
    assert typed == Operation(Action.CREATE, schema_id, None, {"title": "b", "done": True})
    with pytest.raises(UsageError):
        with_fields(operation, {"title": "b"})


def test_a_bad_schema_id_is_refused_every_time() -> None:
    """Valid schema ids are remembered; an invalid one is not, so it fails again."""
    from sdk.documents.operation import check_schema_id

    good = "todo_0020" + "11" * 32
    assert check_schema_id(good) == good == check_schema_id(good)
    for _ in range(2):
        with pytest.raises(HashError):
            check_schema_id("todo_0020" + "11" * 31)
        with pytest.raises(OperationFormatError):
            check_schema_id("not a schema")


@pytest.mark.parametrize(
    "data",
    [
        b"\x82\x01\x58\x01a",  # a byte string's length 1 in the one-byte form
        b"\x82\x01\x78\x05abc",  # text runs past the end
        b"\x82\x01\x43ab",  # bytes run past the end
        b"\x82\x01\x62\xff\xfe",  # text is not UTF-8
        b"\x82\x01\x18\x05",  # integer 5 in the one-byte form
        b"\x82\x01",  # an item missing
        b"\x82\xf6\x01",  # null
    ],
)
def test_array_items_are_decoded_as_strictly_as_top_level_ones(data: bytes) -> None:
    with pytest.raises(CBORError):
        cbor.decode(data)


def test_array_items_of_every_short_form() -> None:
    values = [0, 23, 24, 255, True, False, b"", b"x" * 23, b"x" * 24, b"y" * 255, b"z" * 256,
              "", "t" * 23, "t" * 24, "é" * 100, "u" * 300, [1, [b"a"]], {"a": 1}, -1, 1.5]  # fmt: skip
    assert cbor.decode(cbor.encode(values)) == values
    assert cbor.decode(cbor2.dumps(values, canonical=True)) == values


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xa2\x61b\x01\x61a\x02", "duplicated or out of order"),  # keys out of order
        (b"\xa2\x61a\x01\x61a\x02", "duplicated or out of order"),  # a key twice
        (b"\xa1\x01\x02", "map keys must be text strings"),
        (b"\xa1\x41a\x02", "map keys must be text strings"),
        (b"\xa1\x62\xff\xfe\x01", "not valid UTF-8"),  # a short key that is not UTF-8
        (b"\xa1\x63ab", "runs past the end"),  # a short key past the end
        (b"\xa1\x78\x02ab\x01", "shortest form"),  # a key's length in the one-byte form
        (b"\xa1\x61a", "data ends before a data item"),  # the value missing
        (b"\xa1\x61a\x18\x05", "shortest form"),  # a value 5 in the one-byte form
        (b"\xa1\x61a\xf6", "not used in operations"),  # null
    ],
)
def test_map_items_are_decoded_as_strictly_as_top_level_ones(data: bytes, message: str) -> None:
    with pytest.raises(CBORError, match=message):
        cbor.decode(data)


def test_map_items_of_every_short_form() -> None:
    values = [0, 23, 24, True, False, b"x" * 23, "t" * 24, "é" * 30, [1, [b"a"]], -1, 1.5]
    mapping = {f"k{i:02d}" + "x" * (i * 3): v for i, v in enumerate(values)}
    mapping["k" + "y" * 30] = {"": 1, "a": False}
    assert cbor.decode(cbor.encode(mapping)) == mapping


def test_array_items_encode_by_value_not_by_type_shortcut() -> None:
    """Booleans are not the integers 0 and 1; int enums and bytearrays write their values."""
    from sdk.documents.operation import Action

    values = [True, False, 1, Action.UPDATE, 24, -1]
    assert cbor.encode(values).hex() == "86f5f40101181820"
    assert cbor.encode((bytearray(b"ab"), b"", 2**64 - 1)).hex() == ("83426162401bffffffffffffffff")
