"""The field-codec engine shared by the wire formats (sdk/sync/fields.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sdk.sync import fields
from sdk.sync.errors import LimitExceeded, LocalProtocolError, MalformedMessage


@dataclass(frozen=True)
class _Pair:
    key: bytes
    flag: bool = False
    count: int = 0


@dataclass(frozen=True)
class _Limits:
    max_items: int = 3


_KEY = fields.fixed(2, "a key")
# Tag 1 writes the class's fields in another order than the class declares them.
_PAIR = fields.tagged(
    "pair",
    {
        0: fields.body(_Pair, _KEY),
        1: fields.body(_Pair, count=fields.uleb("a count"), flag=fields.flag("flag"), key=_KEY),
    },
    lambda p: 1 if p.flag or p.count else None,
)
_PAIRS = fields.listed(_PAIR, "pairs", "max_items", 3)


def _decode(field: fields.Field, data: bytes) -> object:
    r = fields.FieldReader(data, limits=_Limits())
    value = field[1](r)
    assert not r.left
    return value


def test_a_tagged_struct_writes_its_fields_in_the_table_order() -> None:
    value = (_Pair(b"ab"), _Pair(b"cd", True, 300))
    data = fields.encode(_PAIRS, value)
    assert data == b"\x02" + b"\x00ab" + b"\x01\xac\x02\x01cd"
    assert _decode(_PAIRS, data) == value


def test_the_engine_refuses_what_it_cannot_read_or_write() -> None:
    with pytest.raises(MalformedMessage, match="unknown pair 2"):
        _decode(_PAIR, b"\x02ab")
    with pytest.raises(MalformedMessage, match="not 0 or 1"):
        _decode(_PAIR, b"\x01\x00\x02ab")
    with pytest.raises(MalformedMessage, match="truncated a key"):
        _decode(_PAIR, b"\x00a")
    with pytest.raises(LimitExceeded):
        _decode(_PAIRS, b"\x04")
    with pytest.raises(MalformedMessage, match="cannot fit"):
        _decode(_PAIRS, b"\x02\x00ab")
    with pytest.raises(MalformedMessage, match="without a pair"):
        _decode(fields.to_end(_PAIR, "a pair"), b"")
    with pytest.raises(LocalProtocolError, match="a key is 2 bytes"):
        fields.encode(_PAIR, _Pair(b"abc"))
    # An integer that does not fit its bytes is the caller's error (a ValueError), as
    # every other field's: store sync's Hello with a version above 255.
    for value in (256, -1):
        with pytest.raises(LocalProtocolError, match="version"):
            fields.integer(1, "version")[0](bytearray(), value)
