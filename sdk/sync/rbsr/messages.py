"""The range messages of a reconciliation round (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True, slots=True)
class EmptySet:
    """My set is empty (opens a session); with ``can_respond`` send me all of yours."""

    can_respond: bool


@dataclass(frozen=True, slots=True)
class LowerBound:
    """The next range starts at ``bound``."""

    bound: bytes


@dataclass(frozen=True, slots=True)
class Payload:
    """One of my keys of the current range; the last carries ``upper_bound`` (``None`` on
    the others) and, with ``can_respond``, asks for the symmetric difference in answer."""

    key: bytes
    can_respond: bool = False
    upper_bound: bytes | None = None


@dataclass(frozen=True, slots=True)
class EmptyPayload:
    """I hold no key in ``[lower, upper_bound)``: send me yours."""

    upper_bound: bytes


@dataclass(frozen=True, slots=True)
class Done:
    """``[lower, upper_bound)`` is reconciled."""

    upper_bound: bytes


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """The fingerprint of my keys in ``[lower, upper_bound)``."""

    fingerprint: bytes
    upper_bound: bytes


@dataclass(frozen=True, slots=True)
class Terminal:
    """The end of a round."""


RangeMessage: TypeAlias = (
    "EmptySet | LowerBound | Payload | EmptyPayload | Done | Fingerprint | Terminal"
)


__all__ = [
    "Done",
    "EmptyPayload",
    "EmptySet",
    "Fingerprint",
    "LowerBound",
    "Payload",
    "RangeMessage",
    "Terminal",
]
