"""The private names of paho-mqtt the MQTT adapter relies on, in one place.

:mod:`transports.mqtt` drives paho's client without its network thread and
reads a flood's packets itself (see its module notes). For that it touches
paho internals no public API offers: the socket paho reads (``_sock``), the
packet paho is part-way through (``_in_packet``), its in-flight table
(``_out_messages``, retired by ``_do_on_publish``), the PUBACK it queues
(``_send_puback``), the time its keep-alive measures silence from
(``_last_bytes_received`` since paho 2.2, ``_last_msg_in`` before) and its
per-packet logger (``_easy_log``). Every such access is a function here, and
importing this module checks that each name exists with the shape we call it
with, so a paho release that moves one fails at import with
:class:`PahoIncompatible` naming the version and the name, not at the first
flood. Checked against paho-mqtt 2.1 and 2.2 (``tests/transports/test_paho_private.py``
runs without a broker).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import paho.mqtt as paho_package
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

__all__ = [
    "PAHO_VERSION",
    "FastPath",
    "PahoIncompatible",
    "check",
    "mark_received",
    "reading_packet",
    "set_log",
    "set_socket",
]

#: The installed paho-mqtt's version.
PAHO_VERSION: str = getattr(paho_package, "__version__", "unknown")

#: Methods we call, with the number of arguments we pass (after ``self``).
_METHODS = {"_do_on_publish": 3, "_send_puback": 1, "_easy_log": 2}
#: Attributes every client has after ``__init__``.
_ATTRIBUTES = ("_sock", "_in_packet", "_out_messages")
#: Where paho keeps the time of the last bytes read, newest release first.
_RECEIVED_AT = ("_last_bytes_received", "_last_msg_in")


class PahoIncompatible(ImportError):
    """The installed paho-mqtt lacks a private name :mod:`transports.mqtt` uses."""


def _fits(method: Callable[..., Any], args: int) -> bool:
    try:
        inspect.signature(method).bind(*range(args))
    except TypeError:
        return False
    return True


def check(client_class: type[paho.Client] = paho.Client, version: str = PAHO_VERSION) -> str:
    """Check every private name on a fresh client of ``client_class``; return the
    name of the received-at attribute. Raises :class:`PahoIncompatible`."""
    probe = client_class(CallbackAPIVersion.VERSION2)
    missing = [
        f"Client.{name}()"
        for name, args in _METHODS.items()
        if not callable(getattr(probe, name, None)) or not _fits(getattr(probe, name), args)
    ]
    missing += [f"Client.{name}" for name in _ATTRIBUTES if not hasattr(probe, name)]
    if not isinstance(getattr(probe, "_in_packet", None), dict) or (
        "command" not in probe._in_packet
    ):
        missing.append('Client._in_packet["command"]')
    received_at = next((name for name in _RECEIVED_AT if hasattr(probe, name)), None)
    if received_at is None:
        missing.append("Client._last_bytes_received (or _last_msg_in)")
    if missing:
        raise PahoIncompatible(
            f"transports.mqtt needs paho-mqtt 2.1 or 2.2; paho-mqtt {version} lacks "
            f"{', '.join(missing)}"
        )
    assert received_at is not None
    return received_at


_RECEIVED_AT_NAME = check()

_PUBACK_SUCCESS = ReasonCode(PacketTypes.PUBACK)
_NO_PROPERTIES = Properties(PacketTypes.PUBACK)  # type: ignore[no-untyped-call]


def set_log(client: paho.Client, easy_log: Callable[..., None]) -> None:
    """Route paho's per-packet log calls to ``easy_log(level, fmt, *args)``."""
    client._easy_log = easy_log  # type: ignore[method-assign]


def set_socket(client: paho.Client, sock: Any) -> None:
    """Make paho read and write ``sock`` (a socket-like wrapper of its own socket)."""
    client._sock = sock


def reading_packet(client: paho.Client) -> bool:
    """Whether paho has read part of a packet and must read the rest itself."""
    return bool(client._in_packet["command"])


def mark_received(client: paho.Client, now: float) -> None:
    """Tell paho's keep-alive that bytes arrived at ``now`` (as its own reads do)."""
    setattr(client, _RECEIVED_AT_NAME, now)


class FastPath:
    """The two private calls a flood makes per packet, looked up once per client:
    a PUBACK that retires a publish, and the PUBACK we owe for a delivery."""

    __slots__ = ("_do_on_publish", "_out_messages", "send_puback")

    def __init__(self, client: paho.Client) -> None:
        # paho creates both once per client (reinitialise() would replace them; the
        # adapter never calls it).
        self._out_messages = client._out_messages
        self._do_on_publish = client._do_on_publish
        #: ``send_puback(mid)``: queue the PUBACK we owe through paho's write path.
        self.send_puback: Callable[[int], object] = client._send_puback

    def retire_publish(self, mid: int) -> None:
        """A plain PUBACK for ``mid``: retire it from paho's in-flight table (and fire
        ``on_publish``) as paho's own PUBACK handling does; an unknown ``mid`` is ignored."""
        if mid in self._out_messages:
            self._do_on_publish(mid, _PUBACK_SUCCESS, _NO_PROPERTIES)
