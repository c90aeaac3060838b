"""Encrypted channels in the asyncio runtime over the in-memory network."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sdk.encryption import DecryptionFailed
from sdk.encryption._wire import channel_bytes
from sdk.encryption.envelope import seal
from sdk.runtime import Delivery, Node, ReliableChannel
from sdk.sds import LocalProtocolError
from sdk.sds.message import decode_message
from tests.encryption.helpers import Group, sds
from tests.runtime.helpers import FAST, Collector, eventually
from transports.base import (
    Envelope,
    PayloadTooLarge,
    QueueSubscription,
    message_hash,
    topic_for_channel,
)
from transports.faults import FaultConfig
from transports.memory import MemoryNetwork


def _senders(channel: ReliableChannel) -> set[str]:
    log = channel.core.log
    return {entry.sender_id for mid in log.ids() if (entry := log.get(mid)) is not None}


async def _spy(net: MemoryNetwork, channel: str, seen: list[bytes]) -> asyncio.Task[None]:
    sub = await net.transport("spy").subscribe(topic_for_channel(channel))

    async def run() -> None:
        async for envelope in sub:
            seen.append(envelope.payload)

    return asyncio.create_task(run())


async def test_three_participants_one_with_a_wrong_key() -> None:
    # Loss and duplication, so resends, sync messages and repair all run sealed.
    net = MemoryNetwork(FaultConfig(loss=0.2, duplication=0.1), seed=5)
    group = Group("room", ["alice", "bob"])
    stranger = Group("room", ["carol"])  # same channel, her own key: the wrong one
    wire: list[bytes] = []
    spy = await _spy(net, "room", wire)
    nodes = [Node(net.transport(n), n, config=FAST) for n in ("alice", "bob", "carol")]
    handles = [group.handle("alice"), group.handle("bob"), stranger.handle("carol")]
    channels = [
        await node.join("room", encryption=h) for node, h in zip(nodes, handles, strict=True)
    ]
    alice, bob, carol = (Collector(c) for c in channels)
    try:
        texts = [f"secret {i} from {who}".encode() for i in range(10) for who in ("a", "b")]
        for i, text in enumerate(texts):
            await channels[i % 2].send(text)
        await channels[2].send(b"carol speaks")
        assert await eventually(
            lambda: len(alice.delivered) == 10 and len(bob.delivered) == 10, timeout=30
        )
        assert {d.content for d in alice.delivered + bob.delivered} == set(texts)
        assert await eventually(
            lambda: (
                any(isinstance(e, DecryptionFailed) for e in carol.events)
                and channels[0].stats["decrypt_failed"] > 0
            )
        )
        # Carol: typed events only, nothing delivered or logged from the others.
        assert carol.delivered == []
        assert _senders(channels[2]) <= {"carol"}
        failures = [e for e in carol.events if isinstance(e, DecryptionFailed)]
        assert {f.reason for f in failures} == {"authentication"}
        assert channels[2].stats["decrypt_failed.authentication"] == len(failures)
        # Alice and bob refused carol's messages the same way and never logged them.
        for channel, collector in ((channels[0], alice), (channels[1], bob)):
            assert all(d.sender_id != "carol" for d in collector.delivered)
            assert "carol" not in _senders(channel)
        # The wire carried no plaintext and nothing SDS could decode.
        await asyncio.sleep(0)
        assert wire
        for payload in wire:
            assert not any(text in payload for text in [*texts, b"carol speaks"])
            with contextlib.suppress(Exception):
                decode_message(payload)
                raise AssertionError("an SDS message crossed the wire in clear")
    finally:
        for c in (alice, bob, carol):
            await c.stop()
        spy.cancel()
        for node in nodes:
            await node.close()


async def test_member_removed_by_rotation() -> None:
    net = MemoryNetwork()
    group = Group("room", ["alice", "bob", "carol"])
    names = ["alice", "bob", "carol"]
    nodes = [Node(net.transport(n), n, config=FAST) for n in names]
    channels = [
        await node.join("room", encryption=group.handle(n))
        for node, n in zip(nodes, names, strict=True)
    ]
    alice, bob, carol = (Collector(c) for c in channels)
    try:
        await channels[0].send(b"before")
        assert await eventually(lambda: len(bob.delivered) == 1 and len(carol.delivered) == 1)
        group.rotate(["alice", "bob"])  # carol leaves: new key, roster without her
        await channels[0].send(b"after")
        assert await eventually(lambda: [d.content for d in bob.delivered] == [b"before", b"after"])
        assert await eventually(
            lambda: any(
                isinstance(e, DecryptionFailed) and e.reason == "unknown_epoch"
                for e in carol.events
            )
        )
        assert [d.content for d in carol.delivered] == [b"before"]
    finally:
        for c in (alice, bob, carol):
            await c.stop()
        for node in nodes:
            await node.close()


async def test_without_encryption_the_wire_is_plain_sds() -> None:
    net = MemoryNetwork()
    wire: list[bytes] = []
    spy = await _spy(net, "room", wire)
    node = Node(net.transport("alice"), "alice", config=FAST)
    try:
        room = await node.join("room")
        await room.send(b"clear")
        assert await eventually(lambda: bool(wire))
        assert decode_message(wire[0]).content == b"clear"
        assert room.encryption is None
    finally:
        spy.cancel()
        await node.close()


async def test_a_failing_foreign_handle_is_an_event_not_a_crash() -> None:
    class Broken:
        def encrypt(self, clear_payload: bytes) -> bytes:
            return clear_payload

        def decrypt(self, encrypted_payload: bytes) -> bytes:
            raise RuntimeError("boom")

    net = MemoryNetwork()
    a = Node(net.transport("a"), "a", config=FAST)
    b = Node(net.transport("b"), "b", config=FAST)
    ca = await a.join("room")
    cb = await b.join("room", encryption=Broken())
    collector = Collector(cb)
    try:
        await ca.send(b"hi")
        assert await eventually(lambda: cb.stats["decrypt_failed.error"] >= 1)
        failure = next(e for e in collector.events if isinstance(e, DecryptionFailed))
        assert failure.error == "RuntimeError: boom"
        assert not any(isinstance(e, Delivery) for e in collector.events)
        await cb.send(b"still running")
    finally:
        await collector.stop()
        await a.close()
        await b.close()


async def test_send_refuses_what_would_not_fit_once_sealed() -> None:
    net = MemoryNetwork(max_payload_size=2_000)
    group = Group("room", ["alice"])
    node = Node(net.transport("alice"), "alice", config=FAST)
    try:
        room = await node.join("room", encryption=group.handle("alice"))
        # About 420 bytes of SDS fields (bloom filter, ids): 1,921 bytes unsealed, 2,040 sealed.
        with pytest.raises(PayloadTooLarge):
            await room.send(b"x" * 1_500)
        await room.send(b"x" * 1_300)  # fits with its 119 sealed bytes
        assert room.stats["publish_failed"] == 0
    finally:
        await node.close()


async def test_causal_history_hints_name_envelopes_that_crossed_the_wire() -> None:
    net = MemoryNetwork()
    group = Group("room", ["alice", "bob"])
    wire: list[bytes] = []
    spy = await _spy(net, "room", wire)
    nodes = [Node(net.transport(n), n, config=FAST) for n in ("alice", "bob")]
    alice = await nodes[0].join("room", encryption=group.handle("alice"))
    bob = await nodes[1].join("room", encryption=group.handle("bob"))
    collector = Collector(bob)
    try:
        # Sent in one turn: each message's history names the ones before it, before
        # any of them is published.
        await asyncio.gather(*(alice.send(f"m{i}".encode()) for i in range(6)))
        assert await eventually(lambda: len(collector.delivered) == 6)
        topic = topic_for_channel("room")
        hashes = {message_hash(topic, p) for p in wire}
        reader = group.handle("bob")
        referenced = [
            entry.retrieval_hint
            for p in wire
            for entry in decode_message(reader.decrypt(p)).causal_history
        ]
        assert referenced
        assert all(hint in hashes for hint in referenced)
    finally:
        await collector.stop()
        spy.cancel()
        for node in nodes:
            await node.close()


async def test_a_handle_for_another_channel_is_refused_at_join() -> None:
    node = Node(MemoryNetwork().transport("alice"), "alice", config=FAST)
    try:
        with pytest.raises(LocalProtocolError, match="for channel 'hall'"):
            await node.join("room", encryption=Group("hall", ["alice"]).handle("alice"))
        assert "room" not in node.channels
    finally:
        await node.close()


async def test_restart_with_a_database_keeps_the_channel_sealed(tmp_path: Path) -> None:
    net = MemoryNetwork()
    group = Group("room", ["alice", "bob"])
    bob = Node(net.transport("bob"), "bob", config=FAST)
    bob_room = await bob.join("room", encryption=group.handle("bob"))
    collector = Collector(bob_room)
    db = tmp_path / "alice.db"
    try:
        alice = Node(net.transport("alice"), "alice", config=FAST, db=db)
        room = await alice.join("room", encryption=group.handle("alice"))
        await room.send(b"before restart")
        assert await eventually(lambda: len(collector.delivered) == 1)
        await alice.close()
        # The app keeps its identity and key packages; a new handle after the restart.
        alice = Node(net.transport("alice2"), "alice", config=FAST, db=db)
        room = await alice.join("room", encryption=group.handle("alice"))
        await room.send(b"after restart")
        assert await eventually(lambda: len(collector.delivered) == 2)
        assert [d.content for d in collector.delivered] == [b"before restart", b"after restart"]
        assert bob_room.stats["decrypt_failed"] == 0
        assert [r.sender_id for r in room.history()] == ["alice", "alice"]
        await alice.close()
    finally:
        await collector.stop()
        await bob.close()


async def test_envelopes_queued_together_open_as_a_batch_in_arrival_order() -> None:
    # Thirty envelopes queued at once on bob's subscription: the reader opens them as
    # batches (signatures checked on a worker thread), and what comes out must be what
    # one-by-one opening gives: deliveries in arrival order, each bad envelope a
    # DecryptionFailed with its reason, in its place among the failures.
    group = Group("room", ["alice", "bob"])
    alice = group.handle("alice")
    topic = topic_for_channel("room")
    payloads: list[bytes] = []
    bad: dict[int, str] = {}
    for i in range(30):
        if i % 7 == 3:
            # A member's forged signature: sealed as bob (the seal opens), signed by alice.
            bob_index = group.epoch.index_of("bob")
            assert bob_index is not None
            forged = seal(
                channel_bytes("room"),
                group.epoch,
                bob_index,
                group.ids["alice"],
                sds("bob", f"m{i:02d}"),
                1,
            )
            payloads.append(forged)
            bad[i] = "forged_signature"
        elif i % 7 == 5:
            tampered = bytearray(alice.encrypt(sds("alice", f"m{i:02d}")))
            tampered[-1] ^= 1
            payloads.append(bytes(tampered))
            bad[i] = "authentication"
        elif i == 20:
            alice_index = group.epoch.index_of("alice")
            assert alice_index is not None
            # alice signing a message that claims bob's id (her handle would refuse to).
            payloads.append(
                seal(
                    channel_bytes("room"),
                    group.epoch,
                    alice_index,
                    group.ids["alice"],
                    sds("bob", "claims-bob"),
                    1,
                )
            )
            bad[i] = "sender_mismatch"
        else:
            payloads.append(alice.encrypt(sds("alice", f"m{i:02d}", content=f"text {i}".encode())))
    net = MemoryNetwork()
    node = Node(net.transport("bob"), "bob", config=FAST)
    channel = await node.join("room", encryption=group.handle("bob"))
    collector = Collector(channel)
    try:
        sub = channel._subscription
        assert isinstance(sub, QueueSubscription)
        for payload in payloads:  # no await between: all queued before the reader runs
            sub.deliver(Envelope(topic, payload, message_hash(topic, payload)))
        good = [i for i in range(30) if i not in bad]
        assert await eventually(
            lambda: (
                len(collector.delivered) == len(good)
                and channel.stats["decrypt_failed"] == len(bad)
            )
        )
        assert channel.counters["batches_opened"] >= 1
        assert [d.content for d in collector.delivered] == [f"text {i}".encode() for i in good]
        failures = [e for e in collector.events if isinstance(e, DecryptionFailed)]
        assert [(f.retrieval_hint, f.reason) for f in failures] == [
            (message_hash(topic, payloads[i]), reason) for i, reason in sorted(bad.items())
        ]
        assert channel.stats["decrypt_failed.forged_signature"] == 4
        assert _senders(channel) == {"alice"}  # nothing that failed was logged
    finally:
        await collector.stop()
        await node.close()


async def test_a_received_sealed_message_is_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The handle decodes what it opened (to check the sender id against the signer);
    # the core takes that decoding rather than decoding the bytes again, in a batch
    # (ten envelopes queued at once) and one by one (one envelope alone).
    import sdk.encryption.channel as handle_module
    import sdk.sds.channel as core_module

    decoded: Counter[bytes] = Counter()

    def counting(decode: Callable[..., Any]) -> Callable[..., Any]:
        def run(data: bytes, *args: Any) -> Any:
            decoded[bytes(data)] += 1
            return decode(data, *args)

        return run

    for module, name in (
        (handle_module, "decode_message"),
        (handle_module, "decode_archive_fields"),
        (core_module, "decode_message"),
    ):
        monkeypatch.setattr(module, name, counting(getattr(module, name)))
    group = Group("room", ["alice", "bob"])
    alice = group.handle("alice")
    topic = topic_for_channel("room")
    messages = [sds("alice", f"m{i:02d}", content=f"text {i}".encode()) for i in range(11)]
    net = MemoryNetwork()
    node = Node(net.transport("bob"), "bob", config=FAST)
    channel = await node.join("room", encryption=group.handle("bob"))
    collector = Collector(channel)
    try:
        sub = channel._subscription
        assert isinstance(sub, QueueSubscription)

        def deliver(message: bytes) -> None:
            payload = alice.encrypt(message)
            sub.deliver(Envelope(topic, payload, message_hash(topic, payload)))

        for message in messages[:10]:
            deliver(message)
        assert await eventually(lambda: len(collector.delivered) == 10)
        assert channel.counters["batches_opened"] >= 1
        deliver(messages[10])
        assert await eventually(lambda: len(collector.delivered) == 11)
        assert [decoded[m] for m in messages] == [1] * 11
    finally:
        await collector.stop()
        await node.close()


async def test_the_next_batch_goes_to_the_worker_before_one_goes_to_the_core() -> None:
    # The reader's pipeline (docs/encryption.md, "Costs"): envelopes that queued while
    # the worker opened batch A are handed to the worker as batch B before A is given
    # to the core, so the loop gives A to the core while the worker opens B; A's
    # messages still reach the core, and the application, before B's.
    import threading

    group = Group("room", ["alice", "bob"])
    alice = group.handle("alice")
    topic = topic_for_channel("room")
    payloads = [
        alice.encrypt(sds("alice", f"m{i:02d}", content=f"text {i}".encode())) for i in range(20)
    ]
    handle = group.handle("bob")
    order: list[str] = []
    release_a = threading.Event()
    real_open_batch = handle.open_batch

    def open_batch(batch_payloads: list[bytes]) -> Any:
        sealed = real_open_batch(batch_payloads)
        name = "A" if not order else "B"
        order.append(f"open {name}")
        real_check = sealed.check

        def check() -> None:
            if name == "A":
                release_a.wait(10)  # until B has queued
            real_check()

        sealed.check = check  # type: ignore[method-assign]
        return sealed

    handle.open_batch = open_batch  # type: ignore[method-assign]
    net = MemoryNetwork()
    node = Node(net.transport("bob"), "bob", config=FAST)
    channel = await node.join("room", encryption=handle)
    real_receive = channel.core.receive_message

    def receive_message(message: Any, *args: Any) -> Any:
        order.append(f"core {message.message_id}")
        return real_receive(message, *args)

    channel.core.receive_message = receive_message  # type: ignore[method-assign]
    collector = Collector(channel)
    try:
        sub = channel._subscription
        assert isinstance(sub, QueueSubscription)
        for payload in payloads[:10]:
            sub.deliver(Envelope(topic, payload, message_hash(topic, payload)))
        assert await eventually(lambda: order == ["open A"])
        for payload in payloads[10:]:
            sub.deliver(Envelope(topic, payload, message_hash(topic, payload)))
        release_a.set()
        assert await eventually(lambda: len(collector.delivered) == 20)
        assert order[:2] == ["open A", "open B"]
        ids = [decode_message(sds("alice", f"m{i:02d}")).message_id for i in range(20)]
        assert order[2:] == [f"core {mid}" for mid in ids]
        assert [d.content for d in collector.delivered] == [f"text {i}".encode() for i in range(20)]
        assert channel.counters["batches_opened"] == 2
    finally:
        release_a.set()
        await collector.stop()
        await node.close()
