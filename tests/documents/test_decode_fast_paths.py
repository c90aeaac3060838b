"""The receive path's fast decoders give exactly what the general ones give.

``decode_operation`` reads the common CREATE and UPDATE straight from their bytes
(``operation._decode_common``) and leaves everything else to the CBOR decoder
(``operation._decode_general``); ``decode_entry`` reads its layout inline. For
valid and mutated inputs the answer must be the general decoder's: the same
value (compared by ``repr``, which tells ``True`` from ``1`` and ``bytes`` from
``str``) or the same error type and message.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk.documents import KeyPair, cbor
from sdk.documents.bamboo import (
    AUTHOR_SIZE,
    MAX_LOG_INTEGER,
    SIGNATURE_SIZE,
    Entry,
    decode_entry,
    encode_unsigned,
    links_expected,
    sign_entry,
)
from sdk.documents.errors import (
    CBORError,
    EntryFormatError,
    OperationFormatError,
    SequenceError,
    SizeLimitExceeded,
)
from sdk.documents.hashing import decode_hash, yasmf_hash
from sdk.documents.limits import MAX_ENTRY_SIZE, MAX_OPERATION_SIZE, MAX_VALUE_SIZE
from sdk.documents.operation import (
    Action,
    Operation,
    _decode_common,
    _decode_general,
    decode_operation,
    encode_operation,
)
from sdk.documents.varu64 import decode_varu64, encode_varu64

from .helpers import TODO_SCHEMA

KEY = KeyPair.from_private_key(b"\x07" * 32)
HASHES = sorted(yasmf_hash(bytes([i])) for i in range(6))
IDS = [h.hex() for h in HASHES]
SCHEMA = TODO_SCHEMA.id
#: A schema id over a view of five operations: longer than 255 bytes (2-byte length).
LONG_SCHEMA = "things_" + "_".join(IDS[:5])


def outcome(decoder, data: bytes) -> tuple[object, ...]:
    """What ``decoder`` makes of ``data``: its value's repr, or its error's type and text."""
    try:
        return ("ok", repr(decoder(data)))
    except Exception as exc:
        return ("error", type(exc), str(exc))


def mutate(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few bytes flipped, inserted, removed or cut off."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(0, len(out) - 1)))
        if kind == "flip" and out:
            out[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and out:
            out[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            out.insert(pos, draw(st.integers(0, 255)))
        elif kind == "delete" and out:
            del out[pos]
        elif kind == "truncate":
            del out[pos:]
    return bytes(out)


# -- operations -------------------------------------------------------------------------

field_values = st.one_of(
    st.booleans(),
    st.integers(0, 30),
    st.integers(-(2**64), 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    st.text(min_size=20, max_size=300),
    st.binary(max_size=40),
    st.binary(min_size=250, max_size=300),
    st.sampled_from(HASHES),
    st.lists(st.sampled_from(HASHES), max_size=4),
    st.lists(st.lists(st.sampled_from(HASHES), max_size=3), max_size=3),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2),
)
field_names = st.one_of(
    st.sampled_from(["title", "done", "a", "b_2", "Zz", "x" * 23, "y" * 24, "n" * 64, "n" * 65]),
    st.text(max_size=30),
)
schema_ids = st.one_of(
    st.sampled_from([SCHEMA, LONG_SCHEMA, "blob_v1", "schema_definition_v1", "x", ""]),
    st.text(max_size=80),
    st.binary(max_size=8),
)
previous_lists = st.one_of(
    st.lists(st.sampled_from(HASHES), min_size=1, max_size=4, unique=True).map(sorted),
    st.lists(st.sampled_from(HASHES), max_size=4),
    st.lists(st.binary(min_size=34, max_size=34), max_size=2),
    st.integers(0, 3),
)


@st.composite
def operation_arrays(draw: st.DrawFn) -> bytes:
    """CBOR arrays shaped like operations, mostly valid, some not (canonical bytes)."""
    array: list[cbor.CBORValue] = [
        draw(st.sampled_from([1, 1, 1, 1, 0, 2, True, 1.5])),
        draw(st.sampled_from([0, 0, 1, 1, 2, 3, False])),
        draw(schema_ids),
    ]
    action = array[1]
    # Previous: mostly for UPDATE and DELETE, sometimes (wrongly) for CREATE.
    if draw(st.integers(0, 9)) > (8 if action == 0 else 0):
        array.append(draw(previous_lists))
    if action != 2 or draw(st.integers(0, 9)) == 0:
        array.append(draw(st.dictionaries(field_names, field_values, max_size=6)))
    if draw(st.integers(0, 19)) == 0:
        array.append(0)
    return cbor.encode(array)


@st.composite
def valid_operations(draw: st.DrawFn) -> bytes:
    """Encoded operations that decode, CREATE and UPDATE of every field kind."""
    action = draw(st.sampled_from([Action.CREATE, Action.UPDATE]))
    values = st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False),
        st.text(max_size=300),
        st.binary(max_size=300),
    )
    names = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,63}", fullmatch=True)
    fields = draw(st.dictionaries(names, values, min_size=1, max_size=30))
    previous = None
    if action is Action.UPDATE:
        previous = tuple(sorted(draw(st.sets(st.sampled_from(IDS), min_size=1, max_size=5))))
    schema = draw(st.sampled_from([SCHEMA, LONG_SCHEMA, "blob_v1"]))
    return encode_operation(Operation(action, schema, previous, fields))


def same_as_general(data: bytes) -> None:
    expected = outcome(_decode_general, data)
    assert outcome(decode_operation, data) == expected
    fast = _decode_common(data)
    if fast is not None:
        # The fast path answers only for what the general decoder accepts.
        assert expected == ("ok", repr(fast))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_operations())
def test_valid_operations_take_the_fast_path_and_equal_the_general_decoder(data: bytes) -> None:
    fast = _decode_common(data)
    assert fast is not None
    general = _decode_general(data)
    assert repr(fast) == repr(general) and fast == general
    assert encode_operation(fast) == data


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operation_arrays())
def test_operation_shaped_arrays_decode_as_the_general_decoder_does(data: bytes) -> None:
    same_as_general(data)


@st.composite
def mutated_operations(draw: st.DrawFn) -> bytes:
    return mutate(draw, draw(st.one_of(valid_operations(), operation_arrays())))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_operations())
def test_mutated_operations_decode_as_the_general_decoder_does(data: bytes) -> None:
    same_as_general(data)


def _op(action: Action, fields: dict, previous: tuple[str, ...] | None = None) -> bytes:
    return encode_operation(Operation(action, SCHEMA, previous, fields))


CREATE = _op(Action.CREATE, {"done": False, "title": "item 1"})


@pytest.mark.parametrize(
    ("data", "fast"),
    [
        # Each branch of the fast path, taken.
        (CREATE, True),
        (_op(Action.UPDATE, {"done": True}, (IDS[0],)), True),
        (_op(Action.UPDATE, {"done": True}, tuple(IDS[:3])), True),
        (encode_operation(Operation(Action.CREATE, LONG_SCHEMA, None, {"a": 1})), True),
        (encode_operation(Operation(Action.CREATE, "blob_v1", None, {"a": 1})), True),
        (_op(Action.CREATE, {f"f{i:02}": i for i in range(30)}), True),  # map count 0xb8
        (_op(Action.CREATE, {"n" * 64: "x" * 23}), True),  # name with a 1-byte length
        (_op(Action.CREATE, {"t": "x" * 24, "u": "é", "v": 24, "w": -5}), True),
        (_op(Action.CREATE, {"f": 0.5, "b": b"\x00" * 40, "i": 2**63 - 1}), True),
        (_op(Action.CREATE, {"r": HASHES[0], "l": (HASHES[0], HASHES[1])}), True),
        (_op(Action.CREATE, {"p": ((HASHES[0],), (HASHES[1], HASHES[2]))}), True),
        # Left to the general decoder: DELETE, and what is not in the usual forms.
        (encode_operation(Operation(Action.DELETE, SCHEMA, (IDS[0],))), False),
        (b"\x84\x01\x00\x78\x05hello\xa1\x61a\x01", False),  # schema id length not shortest
        (b"\x84\x01\x00\x79\x00\x05hello\xa1\x61a\x01", False),
        (CREATE[:-1], False),
        (CREATE + b"\x00", False),
        (bytearray(CREATE), False),
    ],
)
def test_fast_path_branches(data: bytes, fast: bool) -> None:
    assert (_decode_common(data) is not None) is fast
    same_as_general(data)


def _create(schema: str, fields_cbor: bytes) -> bytes:
    raw = schema.encode()
    return b"\x84\x01\x00" + cbor.encode(schema)[: -len(raw)] + raw + fields_cbor


@pytest.mark.parametrize(
    "fields_cbor",
    [
        b"\xa0",  # no field
        b"\xb8\x02\x61a\x01\x61b\x01",  # map count not in its shortest form
        b"\xa2\x61b\x01\x61a\x01",  # keys out of order
        b"\xa2\x61a\x01\x61a\x02",  # duplicate key
        b"\xa1\x60\x01",  # empty field name
        b"\xa1\x611\x01",  # name not allowed
        b"\xa1\x78\x03abc\x01",  # name length not shortest
        b"\xa1\x61\xff\x01",  # name not UTF-8
        b"\xa1\x61a\x62\xff\xfe",  # text value not UTF-8
        b"\xa1\x61a\x18\x05",  # integer not shortest
        b"\xa1\x61a\x1b\x80\x00\x00\x00\x00\x00\x00\x00",  # beyond i64
        b"\xa1\x61a\xf6",  # null
        b"\xa1\x61a\xa0",  # a map as a value
        b"\xa1\x61a\x81\x01",  # a list of integers
        b"\xa1\x61a",  # value missing
        b"\xa1\x61a\x65abc",  # text runs past the end
        b"\xa2\x61a\x01",  # second field missing
    ],
)
def test_fields_the_fast_path_leaves_to_the_general_decoder(fields_cbor: bytes) -> None:
    data = _create(SCHEMA, fields_cbor)
    assert _decode_common(data) is None
    same_as_general(data)


@pytest.mark.parametrize(
    "previous_cbor",
    [
        b"\x80",  # empty
        b"\x82" + cbor.encode(HASHES[1]) + cbor.encode(HASHES[0]),  # unsorted
        b"\x82" + cbor.encode(HASHES[0]) * 2,  # duplicate
        b"\x81" + cbor.encode(b"\x01" + HASHES[0][1:]),  # not YASMF
        b"\x81" + cbor.encode(HASHES[0][:-1]),  # short
        b"\x81" + cbor.encode(HASHES[0].hex()),  # text
    ],
)
def test_previous_the_fast_path_leaves_to_the_general_decoder(previous_cbor: bytes) -> None:
    schema = cbor.encode(SCHEMA)
    data = b"\x85\x01\x01" + schema + previous_cbor + b"\xa1\x61a\x01"
    assert _decode_common(data) is None
    same_as_general(data)


def test_oversized_values_and_operations_keep_their_errors() -> None:
    big = _create(SCHEMA, b"\xa1\x61a" + cbor.encode("x" * (MAX_VALUE_SIZE + 1)))
    assert _decode_common(big) is None
    with pytest.raises(SizeLimitExceeded):
        decode_operation(big)
    same_as_general(big)
    huge = _create(SCHEMA, b"\xa1\x61a" + cbor.encode(b"x" * MAX_OPERATION_SIZE))
    with pytest.raises(SizeLimitExceeded, match="operation of"):
        decode_operation(huge)


def test_a_fast_decoded_operation_is_an_ordinary_operation() -> None:
    op = _decode_common(_op(Action.UPDATE, {"done": True, "title": "x"}, (IDS[0], IDS[1])))
    assert op == Operation(Action.UPDATE, SCHEMA, (IDS[0], IDS[1]), {"done": True, "title": "x"})
    assert op is not None and op.action is Action.UPDATE and op.version == 1
    assert hash(op.previous) == hash((IDS[0], IDS[1]))
    with pytest.raises(AttributeError):
        op.schema_id = "x"  # type: ignore[misc]
    value = _decode_common(_op(Action.CREATE, {"w": math.inf}))
    assert value is not None and value.fields == {"w": math.inf}


# -- entries ----------------------------------------------------------------------------


def reference_decode_entry(data: bytes) -> Entry:
    """decode_entry as it was written before its inline reads: the layout rule, step by step."""
    data = bytes(data)
    if len(data) > MAX_ENTRY_SIZE:
        raise SizeLimitExceeded(f"entry of {len(data)} bytes, limit {MAX_ENTRY_SIZE}")
    if not data:
        raise EntryFormatError("empty entry")
    if data[0] != 0:
        raise EntryFormatError(f"entry tag {data[0]}, only 0 is allowed")
    pos = 1 + AUTHOR_SIZE
    size = len(data)
    if pos > size:
        raise EntryFormatError("data ends inside the author key")
    author = data[1:pos]
    log_id, pos = decode_varu64(data, pos)
    seq_num, pos = decode_varu64(data, pos)
    if seq_num < 1:
        raise SequenceError("sequence number 0; logs start at 1")
    if seq_num > MAX_LOG_INTEGER or log_id > MAX_LOG_INTEGER:
        raise SequenceError(f"log ids and sequence numbers stop at {MAX_LOG_INTEGER}")
    has_lipmaa, has_backlink = links_expected(seq_num)
    lipmaa_link = backlink = None
    if has_lipmaa:
        lipmaa_link, pos = decode_hash(data, pos)
    if has_backlink:
        backlink, pos = decode_hash(data, pos)
    payload_size, pos = decode_varu64(data, pos)
    if payload_size > MAX_OPERATION_SIZE:
        raise SizeLimitExceeded(f"payload of {payload_size} bytes, limit {MAX_OPERATION_SIZE}")
    payload_hash, pos = decode_hash(data, pos)
    end = pos + SIGNATURE_SIZE
    if end > size:
        raise EntryFormatError("data ends inside the signature")
    if end != size:
        raise EntryFormatError(f"{size - end} trailing bytes after the signature")
    return Entry(
        author=author,
        log_id=log_id,
        seq_num=seq_num,
        backlink=backlink,
        lipmaa_link=lipmaa_link,
        payload_size=payload_size,
        payload_hash=payload_hash,
        signature=data[pos:end],
        encoded=data,
        hash=yasmf_hash(data),
    )


@st.composite
def entries(draw: st.DrawFn) -> bytes:
    """Encoded entries: signed, or unsigned layouts with any numbers and a junk signature."""
    log_id = draw(st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)))
    seq_num = draw(st.one_of(st.integers(1, 300), st.integers(0, 2**64 - 1)))
    payload_size = draw(st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)))
    has_lipmaa, has_backlink = links_expected(max(seq_num, 1))
    link = draw(st.sampled_from(HASHES))
    if draw(st.booleans()) and log_id <= MAX_LOG_INTEGER and 1 <= seq_num <= MAX_LOG_INTEGER:
        payload = b"p" * draw(st.integers(0, 300))
        return sign_entry(
            KEY,
            log_id,
            seq_num,
            payload,
            link if has_backlink else None,
            link if has_lipmaa else None,
        ).encoded
    parts = [b"\x00", KEY.public_key, encode_varu64(log_id), encode_varu64(seq_num)]
    parts += [link] * (has_lipmaa + has_backlink)
    parts += [encode_varu64(payload_size), HASHES[0], b"s" * SIGNATURE_SIZE]
    return b"".join(parts)


def same_entry(data: bytes) -> None:
    assert outcome(decode_entry, data) == outcome(reference_decode_entry, data)
    try:
        expected = reference_decode_entry(data)
    except Exception:
        return
    assert decode_entry(data) == expected


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries())
def test_entries_decode_as_the_layout_rule_says(data: bytes) -> None:
    same_entry(data)


@st.composite
def mutated_entries(draw: st.DrawFn) -> bytes:
    return mutate(draw, draw(entries()))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_entries())
def test_mutated_entries_decode_as_the_layout_rule_says(data: bytes) -> None:
    same_entry(data)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x01",
        b"\x00" * 20,
        b"\x00" + b"k" * 32,
        b"\x00" + b"k" * 32 + b"\x01",
        b"\x00" + b"k" * 32 + b"\x01\x00",  # seq 0
        b"\x00" + b"k" * 32 + b"\xff" + b"\xff" * 8 + b"\x01",  # log id beyond i64
        b"\x00" + b"k" * 32 + b"\x01\x01",  # no payload size
        b"\x00" + b"k" * 32 + b"\x01\x01\x05",  # no payload hash
        b"\x00" + b"k" * 32 + b"\x01\x01\x05" + b"\x00\x21" + b"h" * 32,  # not YASMF
        b"\x00" + b"k" * 32 + b"\x01\x01\xf8\x05" + HASHES[0],  # size not shortest
        b"\x00" + b"k" * 32 + b"\x01\x02" + HASHES[0][:-1],  # backlink cut short
        b"\x00" + b"k" * 32 + b"\x01\x01\x05" + HASHES[0] + b"s" * 63,
        b"\x00" + b"k" * 32 + b"\x01\x01\x05" + HASHES[0] + b"s" * 65,
        bytearray(b"\x00" + b"k" * 32 + b"\x01\x01\x05" + HASHES[0] + b"s" * 64),
        b"\x00" + b"k" * 32 + b"\x01\x01\xfa\x05\x00\x00" + HASHES[0] + b"s" * 64,  # too large
    ],
)
def test_entry_layout_errors(data: bytes) -> None:
    same_entry(data)


def test_a_decoded_entry_is_an_ordinary_entry() -> None:
    signed = sign_entry(KEY, 3, 4, b"payload", HASHES[0], HASHES[1])
    entry = decode_entry(signed.encoded)
    assert entry == signed and repr(entry) == repr(signed) and hash(entry) == hash(signed)
    assert entry.signature_valid()
    with pytest.raises(AttributeError):
        entry.seq_num = 1  # type: ignore[misc]
    unsigned = encode_unsigned(KEY.public_key, 3, 4, HASHES[0], HASHES[1], 7, yasmf_hash(b"p"))
    assert decode_entry(unsigned + b"s" * 64).payload_size == 7


def test_names_and_schema_ids_read_once_are_remembered_within_a_bound() -> None:
    from sdk.documents import operation

    data = _op(Action.CREATE, {"remembered": 1})
    assert decode_operation(data).fields == {"remembered": 1}
    assert operation._FIELD_NAMES[b"remembered"] == "remembered"
    assert operation._SCHEMA_IDS[SCHEMA.encode()] == SCHEMA
    # A bad name is never remembered: it is refused every time.
    bad = _create(SCHEMA, b"\xa1\x611\x01")
    for _ in range(2):
        with pytest.raises(OperationFormatError):
            decode_operation(bad)
        assert b"1" not in operation._FIELD_NAMES
    # Remembered names keep their order rule.
    with pytest.raises(CBORError):
        decode_operation(_create(SCHEMA, b"\xa2\x6aremembered\x01\x61a\x01"))
    for i in range(operation._REMEMBER + 10):
        decode_operation(_op(Action.CREATE, {f"f{i}": 1}))
        assert len(operation._FIELD_NAMES) <= operation._REMEMBER
