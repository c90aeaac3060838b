"""The one channel-id rule every boundary applies (transports.base.validate_channel_id)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transports import MAX_CHANNEL_ID_BYTES, InvalidChannelId, validate_channel_id


@pytest.mark.parametrize("good", ["room", "a/b", "日本語の部屋", "x" * MAX_CHANNEL_ID_BYTES])
def test_valid_ids_pass(good: str) -> None:
    assert validate_channel_id(good) == good


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("", "empty"),
        ("a/+", "wildcard"),
        ("a/#", "wildcard"),
        ("a\x00b", "U+0000"),
        ("a\nb", "U+000A"),
        ("a\x85b", "U+0085"),
        ("\ud800", "surrogate"),
        ("x" * (MAX_CHANNEL_ID_BYTES + 1), "over"),
        ("語" * 86, "over"),  # 258 bytes in UTF-8
        (b"room", "string"),
        (None, "string"),
    ],
)
def test_invalid_ids_raise_typed_error(bad: object, why: str) -> None:
    with pytest.raises(InvalidChannelId, match=re.escape(why)):
        validate_channel_id(bad)
    assert issubclass(InvalidChannelId, ValueError)


@given(st.text(max_size=300))
def test_any_text_is_accepted_or_rejected_with_the_typed_error(text: str) -> None:
    try:
        validate_channel_id(text)
    except InvalidChannelId:
        return
    encoded = text.encode()
    assert 0 < len(encoded) <= MAX_CHANNEL_ID_BYTES
    assert "\x00" not in text and "+" not in text and "#" not in text
