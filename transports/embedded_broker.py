"""An in-process MQTT broker (amqtt) for the zero-set-up demo and tests.

``async with embedded_broker() as url:`` starts amqtt on the running event
loop, listening on 127.0.0.1 only, on a port the OS picks (``port=0``), and
yields ``mqtt://127.0.0.1:<port>?protocol=3.1.1`` for
:meth:`MqttTransport.from_url <transports.mqtt.MqttTransport.from_url>`: the
query selects MQTT 3.1.1, because amqtt does not speak MQTT 5 (it ignores an
MQTT 5 CONNECT).

amqtt is fine for a demo and for tests; it is a pure-Python broker sharing
the application's event loop, so for anything with real traffic use
Mosquitto (see ``docs/transports.md``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["embedded_broker"]


@contextlib.asynccontextmanager
async def embedded_broker(host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Run an amqtt broker for the duration of the block; yields its ``mqtt://`` URL.

    The URL carries ``?protocol=3.1.1``, which :meth:`MqttTransport.from_url`
    understands; other clients need the host and port only.
    """
    # Imported here so that importing transports never loads amqtt.
    from amqtt.broker import Broker

    config: dict[str, Any] = {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        # Anonymous access only; amqtt's default packet/event logger plugins
        # would log every message, and its $SYS plugin publishes stats nobody reads.
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }
    # amqtt logs each connection at INFO; keep the demo's terminal readable.
    logging.getLogger("amqtt").setLevel(logging.WARNING)
    broker = Broker(config)
    await broker.start()
    try:
        server = broker._servers["default"].instance
        bound_port = server.sockets[0].getsockname()[1]
        yield f"mqtt://{host}:{bound_port}?protocol=3.1.1"
    finally:
        await broker.shutdown()
