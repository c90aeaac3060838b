"""Message fields as data: one engine that writes and reads the formats made of fields.

A :data:`Field` is a writer and a reader of one value. The field kinds below
(fixed bytes, integers, LEB128 varints, flags, options, length-prefixed bytes and
text, counted lists, dataclasses, tagged choices) compose into a whole message,
so a format is its table of fields: collection sync's Beelay messages
(:mod:`sdk.sync.collection.messages`) and store sync's range messages
(:mod:`store_node.store_sync.wire`) are. Bounds a decode call sets (Beelay's
:class:`~sdk.sync.collection.messages.MessageLimits`) are the reader's ``limits``;
a list or a length names the attribute that bounds it.

Malformed input raises the reader's ``malformed`` error naming what was being
read; a value that cannot be written raises ``usage`` (a :class:`ValueError`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any, TypeAlias

from sdk.sds.varint import VarintError, read_canonical_uvarint, read_uvarint, write_uvarint
from sdk.sync.errors import LimitExceeded, LocalProtocolError, MalformedMessage


class FieldReader:
    """Reads the fields of one frame's message in order, with the protocol's ``malformed``
    error and its decode call's ``limits`` (module docstring)."""

    __slots__ = ("data", "limits", "malformed", "pos")

    def __init__(
        self, data: bytes, malformed: type[Exception] = MalformedMessage, limits: Any = None
    ) -> None:
        self.data, self.pos, self.malformed, self.limits = data, 0, malformed, limits

    @property
    def left(self) -> int:
        """Bytes not read yet."""
        return len(self.data) - self.pos

    def take(self, size: int, what: str) -> bytes:
        """The next ``size`` bytes."""
        if size > len(self.data) - self.pos:
            raise self.malformed(f"truncated {what}")
        self.pos += size
        return self.data[self.pos - size : self.pos]

    def byte(self, what: str) -> int:
        """The next byte."""
        return self.take(1, what)[0]

    def uvarint(self, what: str, *, max_bytes: int = 10, canonical: bool = False) -> int:
        """The next unsigned LEB128 varint of at most ``max_bytes``; with ``canonical``,
        in its shortest form and at most 64 bits (:func:`read_canonical_uvarint`)."""
        try:
            if canonical:
                value, self.pos = read_canonical_uvarint(self.data, self.pos)
            else:
                value, self.pos = read_uvarint(self.data, self.pos, max_bytes)
        except VarintError as exc:
            if exc.truncated:
                raise self.malformed(f"truncated {what}") from None
            raise self.malformed(f"{what}: varint {exc.reason}") from None
        return value

    def count(self, what: str, limit: str, min_item_size: int = 1) -> int:
        """A count or a length (canonical LEB128): over ``limits.<limit>`` is
        :class:`LimitExceeded`, beyond the bytes left (at ``min_item_size`` each)
        malformed."""
        n = self.uvarint(what, canonical=True)
        bound = getattr(self.limits, limit)
        if n > bound:
            raise LimitExceeded(f"{n} {what}, over the limit of {bound}")
        if n * min_item_size > self.left:
            raise self.malformed(f"{n} {what} cannot fit in the rest of the message")
        return n


Field: TypeAlias = tuple[Callable[[bytearray, Any], None], Callable[[FieldReader], Any]]


def _write_uleb(out: bytearray, value: int, usage: type[Exception] = LocalProtocolError) -> None:
    """Append ``value`` as an unsigned LEB128 of at most 64 bits."""
    if not 0 <= value <= 0xFFFFFFFFFFFFFFFF:
        raise usage(f"{value} does not fit an unsigned 64-bit LEB128")
    write_uvarint(out, value)


def fixed(size: int, what: str, usage: type[Exception] = LocalProtocolError) -> Field:
    """Bytes of exactly ``size``."""

    def write(out: bytearray, data: bytes) -> None:
        if len(data) != size:
            raise usage(f"{what} is {size} bytes, got {len(data)}")
        out += data

    return write, lambda r: r.take(size, what)


def integer(size: int, what: str, usage: type[Exception] = LocalProtocolError) -> Field:
    """An unsigned integer in ``size`` bytes, big-endian."""

    def write(out: bytearray, value: int) -> None:
        try:
            out += value.to_bytes(size, "big")
        except OverflowError as exc:  # negative, or too large for ``size`` bytes
            raise usage(f"{what} {value} does not fit {size} unsigned bytes") from exc

    return write, lambda r: int.from_bytes(r.take(size, what), "big")


def uleb(what: str, usage: type[Exception] = LocalProtocolError) -> Field:
    """An unsigned LEB128 in its shortest form, at most 64 bits."""
    return partial(_write_uleb, usage=usage), lambda r: r.uvarint(what, canonical=True)


def _read_flag(r: FieldReader, what: str) -> bool:
    """The next byte, which must be 0 or 1.

    Beelay's ``parse::maybe`` takes any non-zero byte as "present"; only 0 and 1 are
    accepted here so each message has exactly one encoding (docs/collection-sync.md).
    """
    flag = r.byte(what)
    if flag > 1:
        raise r.malformed(f"{what} is {flag}, not 0 or 1")
    return flag == 1


def flag(what: str) -> Field:
    """A boolean as one byte, 0 or 1."""
    return lambda out, value: out.append(bool(value)), lambda r: _read_flag(r, what)


def option(item: Field) -> Field:
    """``None`` as a 0 byte; a value as a 1 byte and the value."""

    def write(out: bytearray, value: Any) -> None:
        out.append(value is not None)
        if value is not None:
            item[0](out, value)

    return write, lambda r: item[1](r) if _read_flag(r, "an option") else None


def prefixed(what: str, limit: str | None = None) -> Field:
    """Bytes after their length (canonical LEB128), at most ``limits.<limit>`` long."""

    def write(out: bytearray, data: bytes) -> None:
        _write_uleb(out, len(data))
        out += data

    def read(r: FieldReader) -> bytes:
        n = r.uvarint(what, canonical=True) if limit is None else r.count(what, limit)
        return r.take(n, what)

    return write, read


def text(what: str, limit: str) -> Field:
    """UTF-8 text after its length in bytes, at most ``limits.<limit>`` of them."""

    def read(r: FieldReader) -> str:
        try:
            return r.take(r.count(what, limit, 0), what).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise r.malformed(f"{what} is not UTF-8") from exc

    write_bytes = prefixed(what)[0]
    return lambda out, value: write_bytes(out, value.encode("utf-8")), read


def listed(item: Field, what: str, limit: str, min_item_size: int) -> Field:
    """A count, then that many items (at most ``limits.<limit>``, each at least
    ``min_item_size`` bytes), as a tuple."""

    write_items = to_end(item, what)[0]

    def write(out: bytearray, values: tuple[Any, ...]) -> None:
        _write_uleb(out, len(values))
        write_items(out, values)

    def read(r: FieldReader) -> tuple[Any, ...]:
        return tuple(item[1](r) for _ in range(r.count(what, limit, min_item_size)))

    return write, read


def to_end(item: Field, what: str) -> Field:
    """Items to the end of the message, at least one, as a tuple."""

    def write(out: bytearray, values: tuple[Any, ...]) -> None:
        for value in values:
            item[0](out, value)

    def read(r: FieldReader) -> tuple[Any, ...]:
        if not r.left:
            raise r.malformed(f"a message without {what}")
        items = []
        while r.left:
            items.append(item[1](r))
        return tuple(items)

    return write, read


def struct(cls: type, *parts: Field, **named: Field) -> Field:
    """A dataclass as its fields: ``parts`` are its first fields in order; ``named``
    are fields by name, in the order written (when the wire order is not the class's)."""
    names = [f.name for f in dataclasses.fields(cls)][: len(parts)] + list(named)
    fields = list(zip(names, (*parts, *named.values()), strict=True))

    def write(out: bytearray, value: Any) -> None:
        for name, (write_part, _) in fields:
            write_part(out, getattr(value, name))

    if named:
        return write, lambda r: cls(**{name: read(r) for name, (_, read) in fields})
    readers = [read for _, (_, read) in fields]
    return write, lambda r: cls(*[read(r) for read in readers])


def tagged(
    what: str,
    variants: dict[int, tuple[type, Field]],
    tag_of: Callable[[Any], int | None] = lambda value: None,
) -> Field:
    """One of ``variants`` (tag -> class and field): its tag byte, then its field's bytes.
    A class under two tags is written with ``tag_of(value)`` when that is not ``None``."""
    tags = {cls: tag for tag, (cls, _) in reversed(variants.items())}

    def write(out: bytearray, value: Any) -> None:
        tag = tag_of(value)
        if tag is None:
            tag = tags[type(value)]
        out.append(tag)
        variants[tag][1][0](out, value)

    def read(r: FieldReader) -> Any:
        tag = r.byte(what)
        if tag not in variants:
            raise r.malformed(f"unknown {what} {tag}")
        return variants[tag][1][1](r)

    return write, read


def body(cls: type, *parts: Field, **named: Field) -> tuple[type, Field]:
    """A variant of :func:`tagged`: ``cls`` and its :func:`struct`."""
    return cls, struct(cls, *parts, **named)


def encode(field: Field, value: Any) -> bytes:
    """The bytes of ``value`` as ``field``."""
    out = bytearray()
    field[0](out, value)
    return bytes(out)


__all__ = [
    "Field",
    "FieldReader",
    "body",
    "encode",
    "fixed",
    "flag",
    "integer",
    "listed",
    "option",
    "prefixed",
    "struct",
    "tagged",
    "text",
    "to_end",
    "uleb",
]
