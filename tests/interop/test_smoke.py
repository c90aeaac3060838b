from __future__ import annotations

from .mixnet import MixedNetwork


def test_one_message_each_way(net: MixedNetwork) -> None:
    c = net.chorus("chorus1")
    j = net.js("js1")
    a = c.send(b"from chorus")
    net.advance(1000)
    b = j.send(b"from js")
    net.advance(1000)
    print(net.logs(), c.record, j.record)
    assert net.logs()["chorus1"] == net.logs()["js1"] == [a, b]
