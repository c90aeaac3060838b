"""Reading one table of the config file: the one way every section is validated.

:class:`Section` hands out a table's keys typed and checked, removing each as it
is read, so :meth:`Section.done` can name whatever is left as unknown. Every
error is one line naming ``section.key``, what it must be and what it got; the
command line prints it after ``store-node:``. :mod:`store_node.config` reads its
own sections with it, and so do the sync sections (:mod:`store_node.listeners`,
``[replication]``, ``[collection]``, ``[bamboo_p2p]``, ``[store_sync]``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

from store_node.addresses import check_address, show
from store_node.errors import ConfigError
from transports.base import InvalidChannelId, validate_channel_id

T = TypeVar("T")

#: The default upper bound of :meth:`Section.integer` (a signed 64-bit integer).
MAX_INTEGER = 2**63 - 1


class Section:
    """Typed, consumed access to one TOML table; leftovers are unknown keys."""

    def __init__(self, name: str, raw: Any) -> None:
        if not isinstance(raw, dict):
            raise ConfigError(f"[{name}] must be a table, got {show(raw)}")
        #: The section's name in error messages (``grpc``, ``grpc.access[0]``).
        self.name = name
        #: The keys not read yet.
        self.raw = dict(raw)

    def take(self, key: str, kind: type[T], default: T) -> T:
        """``key`` if present (it must be a ``kind``; an int is a float), else ``default``."""
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise ConfigError(f"{self.name}.{key} must be {kind.__name__}, got {show(value)}")
        return value  # type: ignore[no-any-return]

    def integer(self, key: str, default: int, low: int = 1, high: int = MAX_INTEGER) -> int:
        """An integer in ``low..high``."""
        value = self.take(key, int, default)
        if not low <= value <= high:
            if low == 1 and high == MAX_INTEGER:
                raise ConfigError(f"{self.name}.{key} must be a positive integer, got {value}")
            raise ConfigError(f"{self.name}.{key} must be in {low}..{high}, got {value}")
        return value

    @overload
    def duration(
        self, key: str, default: float, *, positive: bool = ..., below: float = ..., zero: str = ...
    ) -> float: ...
    @overload
    def duration(
        self,
        key: str,
        default: float | None,
        *,
        positive: bool = ...,
        below: float = ...,
        zero: str = ...,
    ) -> float | None: ...
    def duration(
        self,
        key: str,
        default: float | None,
        *,
        positive: bool = False,
        below: float = math.inf,
        zero: str = "",
    ) -> float | None:
        """A finite, non-negative number under ``below`` (positive if asked); a ``None``
        default means off. ``zero`` says what 0 means, for the error message."""
        if key not in self.raw:
            return default
        value = self.take(key, float, 0.0)
        if not math.isfinite(value) or value < 0 or (positive and value == 0) or value >= below:
            need = "positive" if positive else "non-negative"
            bound = f" below {below:g}" if below != math.inf else ""
            note = f" ({zero})" if zero else ""
            raise ConfigError(
                f"{self.name}.{key} must be a finite {need} number{bound}{note}, got {value}"
            )
        return value

    @overload
    def path(self, key: str, base: Path, default: str) -> Path: ...
    @overload
    def path(self, key: str, base: Path, default: None) -> Path | None: ...
    def path(self, key: str, base: Path, default: str | None) -> Path | None:
        """A non-empty path, relative to ``base`` (the config file's folder)."""
        value = self.take(key, str, default)
        if value is None:
            return None
        if not value or "\x00" in value:
            raise ConfigError(f"{self.name}.{key} must be a non-empty path, got {show(value)}")
        return base / value

    def optional_path(self, key: str, base: Path) -> Path | None:
        """A path relative to ``base``; absent or ``""`` is ``None``."""
        value = self.take(key, str, "")
        if "\x00" in value:
            raise ConfigError(f"{self.name}.{key} must be a path, got {show(value)}")
        return base / value if value else None

    def choice(self, key: str, options: Sequence[str], default: str) -> str:
        """One of ``options``."""
        value = self.take(key, str, default)
        if value not in options:
            allowed = " or ".join(options)
            raise ConfigError(f"{self.name}.{key} must be {allowed}, got {show(value)}")
        return value

    def strings(self, key: str, what: str) -> tuple[str, ...]:
        """A list of non-empty strings (``what`` names one in the error message)."""
        value = self.take(key, list, [])
        if not all(isinstance(s, str) and s for s in value):
            raise ConfigError(f"{self.name}.{key} must be a list of {what}, got {show(value)}")
        return tuple(value)

    def address(self, key: str) -> str:
        """A ``HOST:PORT`` to listen on; absent or ``""`` is ``""`` (off)."""
        value = self.raw.pop(key, "")
        return check_address(value, f"{self.name}.{key}") if value != "" else ""

    def addresses(self, key: str) -> tuple[str, ...]:
        """A list of ``HOST:PORT``."""
        value = self.raw.pop(key, [])
        if not isinstance(value, list):
            raise ConfigError(f"{self.name}.{key} must be a list of HOST:PORT, got {show(value)}")
        return tuple(check_address(v, f"{self.name}.{key}") for v in value)

    def done(self) -> None:
        """Refuse the keys nobody read: a misspelled key is an error, not a default."""
        if self.raw:
            keys = ", ".join(show(k, 40).strip("'") for k in sorted(self.raw))
            raise ConfigError(f"unknown key(s) in [{self.name}]: {keys}")


def channel_ids(value: object, key: str) -> tuple[str, ...]:
    """A list of distinct channel ids (:func:`transports.base.validate_channel_id`)."""
    if not isinstance(value, list):
        raise ConfigError(f"{key} must be a list of channel ids, got {show(value)}")
    seen: list[str] = []
    for channel in value:
        try:
            validate_channel_id(channel)
        except InvalidChannelId as exc:
            raise ConfigError(f"{key}: {exc}") from None
        if channel in seen:
            raise ConfigError(f"{key} lists {show(channel)} twice")
        seen.append(channel)
    return tuple(seen)


__all__ = ["MAX_INTEGER", "Section", "channel_ids"]
