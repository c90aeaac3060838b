"""Addresses in the store node's configuration: one rule for ``HOST:PORT``.

Every section that listens or names peers (``[grpc]``, ``[metrics]``,
``[replication]``, ``[collection]``, ``[bamboo_p2p]``, ``[store_sync]``) and the
CLI's ``PEER`` arguments check addresses here, so they accept and refuse the same
strings with the same one-line :class:`~store_node.errors.ConfigError`.
"""

from __future__ import annotations

import ipaddress

from store_node.errors import ConfigError


def show(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for one-line error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_listen(value: str, key: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``) -> host, port in 0..65535; else ConfigError."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isascii() or not port.isdigit():
        raise ConfigError(f"{key} must be HOST:PORT, got {show(value)}")
    number = int(port)
    # 0 asks the OS for a free port: tests and the demo run nodes side by side that way.
    if not 0 <= number <= 65535:
        raise ConfigError(f"{key} port must be 1..65535 (or 0: any free port), got {number}")
    if any(c.isspace() or c in "/\x00[]" for c in host) or len(host) > 253:
        raise ConfigError(f"{key} host is not a host name or address: {show(host)}")
    return host, number


def check_address(value: object, key: str) -> str:
    """``value`` if it is a ``HOST:PORT`` string (see :func:`parse_listen`); else ConfigError."""
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be HOST:PORT, got {show(value)}")
    parse_listen(value, key)
    return value


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["check_address", "is_loopback", "parse_listen", "show"]
