"""sdk/sds/records.py: the faster constructor keeps every dataclass behaviour."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle

import pytest

from sdk.runtime.events import Delivery
from sdk.sds.channel import Datagram
from sdk.sds.events import MessageDelivered, MessageRejected
from sdk.sds.journal import Logged
from sdk.sds.message import MessageKind
from sdk.sds.records import fast_init


def test_records_keep_their_dataclass_behaviour() -> None:
    a = Logged("m", 1, "s", None, b"d", ("r",), True)
    b = Logged(
        message_id="m",
        lamport_timestamp=1,
        sender_id="s",
        retrieval_hint=None,
        data=b"d",
        references=("r",),
        own=True,
    )
    assert a == b and hash(a) == hash(b)
    assert a.logged_at is None  # the default
    assert repr(a) == "Logged(message_id='m', lamport_timestamp=1, sender_id='s', " + (
        "retrieval_hint=None, data=b'd', references=('r',), own=True, logged_at=None)"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.own = False  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(a)) == a == copy.copy(a)
    assert dataclasses.replace(a, own=False).own is False
    assert list(inspect.signature(Logged).parameters) == [
        f.name for f in dataclasses.fields(Logged)
    ]
    with pytest.raises(TypeError):
        Logged("m", 1)  # type: ignore[call-arg]
    d = Datagram("c", b"x", "m", MessageKind.CONTENT)
    assert (d.channel_id, d.data, d.message_id, d.kind) == ("c", b"x", "m", MessageKind.CONTENT)
    assert MessageRejected("c", None, "x").sender_id is None  # type: ignore[arg-type]


def test_inherited_fields_are_set_through_the_base_slots() -> None:
    delivery = Delivery("c", "m", "s", 3, b"hi", None, 7)
    assert isinstance(delivery, MessageDelivered)
    assert (delivery.channel_id, delivery.lamport_timestamp, delivery.seq) == ("c", 3, 7)
    assert Delivery("c", "m", "s", 3, b"hi").seq == 0
    assert delivery != MessageDelivered("c", "m", "s", 3, b"hi")


def test_unsupported_dataclasses_are_refused() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class WithFactory:
        items: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        x: int

    for cls in (WithFactory, NotFrozen, int):
        with pytest.raises(TypeError):
            fast_init(cls)
