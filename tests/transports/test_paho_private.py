"""paho-mqtt's private names (transports/paho_private.py) are checked at import;
no broker needed."""

from __future__ import annotations

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from transports import paho_private
from transports.paho_private import PahoIncompatible, check


def test_the_installed_paho_has_every_name() -> None:
    assert check() in ("_last_bytes_received", "_last_msg_in")


@pytest.mark.parametrize("name", ["_do_on_publish", "_send_puback", "_easy_log"])
def test_a_release_without_a_method_fails_naming_it_and_the_version(name: str) -> None:
    class Moved(paho.Client):
        pass

    setattr(Moved, name, None)
    with pytest.raises(PahoIncompatible, match=rf"paho-mqtt 9\.9 lacks Client\.{name}\(\)"):
        check(Moved, "9.9")


def test_a_changed_signature_or_a_missing_attribute_fails() -> None:
    class Changed(paho.Client):
        def _send_puback(self) -> None:  # type: ignore[override]
            pass

        def __init__(self, *args: object) -> None:
            super().__init__(*args)  # type: ignore[arg-type]
            del self._out_messages
            del self._last_bytes_received

    with pytest.raises(PahoIncompatible) as info:
        check(Changed, "9.9")
    message = str(info.value)
    assert "Client._send_puback()" in message and "Client._out_messages" in message
    assert "_last_bytes_received (or _last_msg_in)" in message


def test_the_accessors_on_a_client_that_never_connected() -> None:
    client = paho.Client(CallbackAPIVersion.VERSION2)
    published: list[int] = []
    client.on_publish = lambda _c, _u, mid, _rc, _p: published.append(mid)
    fast = paho_private.FastPath(client)
    assert not paho_private.reading_packet(client)
    fast.retire_publish(7)  # not in flight: nothing happens
    assert published == []
    client._out_messages[7] = paho.MQTTMessage(7)
    fast.retire_publish(7)
    assert published == [7] and 7 not in client._out_messages
    paho_private.mark_received(client, 123.0)
    assert getattr(client, check()) == 123.0
