"""The MQTT transport against real Mosquitto brokers (integration)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho_client
import pytest

from sdk.testing.waiting import eventually, idle
from tests.conftest import skip_or_fail
from tests.transports.conftest import PrivateMosquitto, free_port
from transports.base import PayloadTooLarge, Subscription, TransportClosed, TransportError
from transports.mqtt import MqttTransport

pytestmark = pytest.mark.integration

PROTOCOLS: list[object] = [5, "3.1.1"]


def unique_topic(name: str) -> str:
    """A topic no other test run shares (the machine's broker is shared)."""
    return f"chorus/test/{os.getpid()}/{name}/{id(object())}"


async def take(sub: Subscription, n: int, timeout: float = 10.0) -> list[bytes]:
    """The next ``n`` payloads on ``sub``."""
    out: list[bytes] = []
    async with asyncio.timeout(timeout):
        async for env in sub:
            out.append(env.payload)
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_publish_subscribe_roundtrip(mosquitto: tuple[str, int], protocol: object) -> None:
    host, port = mosquitto
    topic = unique_topic("roundtrip")
    async with (
        MqttTransport(host, port, protocol=protocol) as a,  # type: ignore[arg-type]
        MqttTransport(host, port, protocol=protocol) as b,  # type: ignore[arg-type]
    ):
        sub_b = await b.subscribe(topic)
        sub_a = await a.subscribe(topic)
        hints = [await a.publish(topic, f"m{i}".encode()) for i in range(200)]
        await a.flush()
        assert a.stats.acknowledged == 200
        got = await take(sub_b, 200)
        assert got == [f"m{i}".encode() for i in range(200)], "one publisher: order kept"
        # The sender hears itself, with the same retrieval hint.
        env = await anext(sub_a)
        assert env.retrieval_hint == hints[0]


async def test_garbage_passes_through_untouched(mosquitto: tuple[str, int]) -> None:
    host, port = mosquitto
    topic = unique_topic("garbage")
    blobs = [b"", b"\x00", b"\xff" * 1000, bytes(range(256)), b"\x0a\x05not-a-proto"]
    async with MqttTransport(host, port) as a, MqttTransport(host, port) as b:
        sub = await b.subscribe(topic)
        for blob in blobs:
            await a.publish(topic, blob)
        assert await take(sub, len(blobs)) == blobs


async def test_wildcard_subscription_and_qos0(mosquitto: tuple[str, int]) -> None:
    host, port = mosquitto
    base = unique_topic("wild")
    async with MqttTransport(host, port) as a, MqttTransport(host, port, qos=0) as b:
        sub = await b.subscribe(base + "/#")
        await a.publish(base + "/x", b"1", qos=0)
        await a.publish(base + "/y/z", b"2")
        envs = [await anext(sub) for _ in range(2)]
        assert sorted((e.topic, e.payload) for e in envs) == [
            (base + "/x", b"1"),
            (base + "/y/z", b"2"),
        ]


async def test_payload_limit_configured(mosquitto: tuple[str, int]) -> None:
    host, port = mosquitto
    async with MqttTransport(host, port, max_payload_size=1000) as a:
        assert a.max_payload_size == 1000
        with pytest.raises(PayloadTooLarge) as err:
            await a.publish(unique_topic("big"), b"x" * 1001)
        assert (err.value.size, err.value.limit) == (1001, 1000)
        assert a.stats.published == 0
        await a.publish(unique_topic("big"), b"x" * 1000)


async def test_payload_limit_announced_by_mqtt5_broker(
    private_mosquitto: Callable[..., PrivateMosquitto],
) -> None:
    broker = private_mosquitto("max_packet_size 4096")
    topic = "chorus/test/announced"
    async with MqttTransport("127.0.0.1", broker.port) as a:
        assert a.max_payload_size is not None and a.max_payload_size < 4096
        sub = await a.subscribe(topic)
        with pytest.raises(PayloadTooLarge):
            await a.publish(topic, b"x" * 4090)
        await a.publish(topic, b"y" * 3000)
        assert await take(sub, 1) == [b"y" * 3000]
        assert a.connected


async def test_reconnect_and_resubscribe_after_broker_restart(
    private_mosquitto: Callable[..., PrivateMosquitto],
) -> None:
    broker = private_mosquitto()
    topic = "chorus/test/restart"
    kwargs = {"reconnect_min": 0.05, "reconnect_max": 0.5}
    async with (
        MqttTransport("127.0.0.1", broker.port, **kwargs) as a,  # type: ignore[arg-type]
        MqttTransport("127.0.0.1", broker.port, protocol="3.1.1", **kwargs) as b,  # type: ignore[arg-type]
    ):
        sub = await b.subscribe(topic)
        await a.publish(topic, b"before")
        assert await take(sub, 1) == [b"before"]

        broker.kill()
        for _ in range(100):
            if not (a.connected or b.connected):
                break
            await asyncio.sleep(0.02)
        assert not a.connected and not b.connected
        # Publishing during the outage waits for the reconnection.
        during = asyncio.create_task(a.publish(topic, b"during"))
        await idle()  # a publish that did not wait would be done by now
        assert not during.done()

        broker.start()
        await asyncio.wait_for(during, 10)
        await asyncio.wait_for(b.wait_ready(), 10)
        await a.publish(topic, b"after")
        # Clean sessions: the broker forgot b's subscription; it must have
        # re-subscribed by itself. "during" was sent after the reconnect, but
        # may race b's re-subscription, so only "after" is certain.
        got = await take(sub, 1)
        if got == [b"during"]:
            got = await take(sub, 1)
        assert got == [b"after"]
        assert a.stats.connection_losses == 1 and b.stats.connection_losses == 1
        assert a.stats.connects == 2 and b.stats.connects == 2


async def test_unacked_messages_resent_after_reconnect(
    private_mosquitto: Callable[..., PrivateMosquitto],
) -> None:
    broker = private_mosquitto()
    topic = "chorus/test/resend"
    async with (
        MqttTransport("127.0.0.1", broker.port, reconnect_min=0.05, reconnect_max=0.5) as a,
        MqttTransport("127.0.0.1", broker.port, reconnect_min=0.05, reconnect_max=0.5) as b,
    ):
        sub = await b.subscribe(topic)
        for i in range(50):
            await a.publish(topic, bytes([i]))
        await a.flush()
        await take(sub, 50)
        broker.kill()
        broker.start()
        await asyncio.wait_for(a.flush(), 10)
        await asyncio.wait_for(b.wait_ready(), 10)
        await a.publish(topic, b"x")
        assert (await take(sub, 1))[-1] == b"x"


async def test_first_connect_failure_is_loud() -> None:
    port = free_port()
    t = MqttTransport("127.0.0.1", port)
    with pytest.raises(TransportError, match="cannot reach MQTT broker"):
        await t.connect()
    await t.close()
    with pytest.raises(TransportClosed):
        await t.publish("chorus/x", b"x")


async def test_use_before_connect_and_after_close(mosquitto: tuple[str, int]) -> None:
    host, port = mosquitto
    t = MqttTransport(host, port)
    with pytest.raises(TransportError, match="connect"):
        await t.publish("chorus/x", b"x")
    await t.connect()
    sub = await t.subscribe(unique_topic("closing"))
    await t.close()
    assert [e async for e in sub] == []
    with pytest.raises(TransportClosed):
        await t.subscribe("chorus/x")
    await t.close()


def test_from_url() -> None:
    t = MqttTransport.from_url("mqtts://alice:s%40cret@broker.example:8884", protocol="3.1.1")
    assert (t.host, t.port) == ("broker.example", 8884)
    assert t._client.username == "alice" and t._client.password == "s@cret"
    assert MqttTransport.from_url("mqtt://localhost").port == 1883
    assert not MqttTransport.from_url("mqtt://localhost?protocol=3.1.1")._v5
    with pytest.raises(ValueError, match="protocol"):
        MqttTransport.from_url("mqtt://localhost?qos=2")
    assert MqttTransport.from_url("mqtts://localhost").port == 8883
    with pytest.raises(ValueError):
        MqttTransport.from_url("http://localhost")
    with pytest.raises(ValueError, match="client_id"):
        MqttTransport(persistent_session=True)


def make_tls_material(directory: Path) -> Path:
    """A throw-away CA and a server certificate for 127.0.0.1; returns the CA file."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
    )
    openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    )
    for f in directory.iterdir():
        f.chmod(0o644)  # the broker drops root privileges before reading them
    return directory / "ca.crt"


async def test_tls_and_password(
    private_mosquitto: Callable[..., PrivateMosquitto], request: pytest.FixtureRequest
) -> None:
    if shutil.which("openssl") is None or shutil.which("mosquitto_passwd") is None:
        skip_or_fail("openssl and mosquitto_passwd are needed for the TLS test")
    # Mosquitto started as root reads these after dropping to its own user, and
    # pytest's tmp_path sits under a 0700 directory: use a world-readable one.
    material = Path(tempfile.mkdtemp(prefix="chorus-tls-"))
    material.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(material, ignore_errors=True))
    ca = make_tls_material(material)
    passwords = material / "passwords"
    subprocess.run(
        ["mosquitto_passwd", "-b", "-c", str(passwords), "alice", "s3cret"],
        check=True,
        capture_output=True,
    )
    passwords.chmod(0o644)
    broker = private_mosquitto(
        f"cafile {ca}\ncertfile {material / 'server.crt'}\nkeyfile {material / 'server.key'}\n"
        f"password_file {passwords}\n",
        anonymous=False,
    )
    context = ssl.create_default_context(cafile=str(ca))

    wrong = MqttTransport("127.0.0.1", broker.port, tls=context, username="alice", password="x")
    with pytest.raises(TransportError, match="refused"):
        await wrong.connect()
    await wrong.close()

    untrusted = MqttTransport("127.0.0.1", broker.port, tls=ssl.create_default_context())
    with pytest.raises(TransportError, match="cannot reach"):
        await untrusted.connect()
    await untrusted.close()

    url = f"mqtts://alice:s3cret@127.0.0.1:{broker.port}"
    async with MqttTransport.from_url(url, tls=context, protocol="3.1.1") as t:
        sub = await t.subscribe("chorus/test/tls")
        await t.publish("chorus/test/tls", b"over tls")
        assert await take(sub, 1) == [b"over tls"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_persistent_session_keeps_messages_while_away(
    mosquitto: tuple[str, int], protocol: object
) -> None:
    host, port = mosquitto
    topic = unique_topic("persistent")
    client_id = f"chorus-test-{os.getpid()}-{id(object())}"
    kwargs: dict[str, object] = {
        "client_id": client_id,
        "persistent_session": True,
        "protocol": protocol,
    }
    first = MqttTransport(host, port, **kwargs)  # type: ignore[arg-type]
    await first.connect()
    await first.subscribe(topic)
    await first.close()
    async with MqttTransport(host, port) as sender:
        for i in range(5):
            await sender.publish(topic, bytes([i]))
        await sender.flush()
    # A new process would do exactly this: connect with the same client id, then subscribe.
    async with MqttTransport(host, port, **kwargs) as again:  # type: ignore[arg-type]
        # The broker delivers the queue right after CONNACK, before any subscribe().
        assert await eventually(lambda: again.stats.received >= 5)
        sub = await again.subscribe(topic)
        assert await take(sub, 5) == [bytes([i]) for i in range(5)]
    # Leave no session behind on the shared broker.
    async with MqttTransport(host, port, client_id=client_id, protocol=protocol) as cleanup:  # type: ignore[arg-type]
        assert cleanup.connected


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_concurrent_publishers_share_the_window(
    mosquitto: tuple[str, int], protocol: object
) -> None:
    host, port = mosquitto
    topic = unique_topic("concurrent")
    async with (
        MqttTransport(host, port, protocol=protocol, max_inflight=8) as a,  # type: ignore[arg-type]
        MqttTransport(host, port, protocol=protocol) as b,  # type: ignore[arg-type]
    ):
        sub = await b.subscribe(topic)
        payloads = [i.to_bytes(2, "big") for i in range(500)]
        held: list[int] = []

        async def publish(payload: bytes) -> None:
            await a.publish(topic, payload)
            # paho's own in-flight limit is off: the window alone bounds what it holds.
            held.append(len(a._client._out_messages))

        await asyncio.gather(*(publish(p) for p in payloads))
        assert len(a._unacked) <= 8 and max(held) <= 8
        assert a._client._max_inflight_messages == 0
        await a.flush()
        assert sorted(await take(sub, 500)) == payloads
        assert a.stats.acknowledged == 500


async def test_paho_packet_logs_only_when_debug_is_on(
    mosquitto: tuple[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    """paho's per-packet DEBUG lines are skipped unless the adapter's logger wants them;
    its warnings and errors reach the logger either way."""
    host, port = mosquitto
    topic = unique_topic("paho-log")
    async with MqttTransport(host, port) as t:
        caplog.set_level(logging.INFO, logger="transports.mqtt")
        await t.publish(topic, b"quiet")
        await t.flush()
        assert not [r for r in caplog.records if "PUBLISH" in r.getMessage()]
        caplog.set_level(logging.DEBUG, logger="transports.mqtt")
        await t.publish(topic, b"loud")
        await t.flush()
        assert [r for r in caplog.records if "Sending PUBLISH" in r.getMessage()]
        caplog.clear()
        t._client._easy_log(paho_client.MQTT_LOG_ERR, "failed to receive on socket: %s", "x")
        assert [r.levelno for r in caplog.records] == [logging.ERROR]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_plain_publishes_and_pubacks_skip_pahos_per_message_path(
    mosquitto: tuple[str, int], protocol: object
) -> None:
    """A flood's packets (QoS 1 PUBLISH without properties, plain PUBACK) are parsed
    by the adapter; paho keeps every other packet and its session state."""
    host, port = mosquitto
    topic = unique_topic("fast-path")
    async with (
        MqttTransport(host, port, protocol=protocol) as a,  # type: ignore[arg-type]
        MqttTransport(host, port, protocol=protocol) as b,  # type: ignore[arg-type]
    ):
        handled: list[int] = []
        for client in (a._client, b._client):
            client._packet_handle = lambda c=client, slow=client._packet_handle: (
                handled.append(c._in_packet["command"] & 0xF0) or slow()
            )
        sub = await b.subscribe(topic)
        for i in range(50):
            await a.publish(topic, f"m{i}".encode())
        await a.flush()  # every PUBACK handled: paho's in-flight table is empty
        assert not a._client._out_messages
        assert await take(sub, 50) == [f"m{i}".encode() for i in range(50)]
        assert 0x30 not in handled and 0x40 not in handled
        assert 0x90 in handled  # the SUBACK went through paho


def test_publishes_with_mqtt5_properties_are_left_to_paho() -> None:
    t = MqttTransport(protocol=5)
    body = b"\x00\x01t" + b"\x00\x07" + b"\x02\x01\x01" + b"payload"  # payload format
    assert t._fast_packet(0x32, body) is False
    assert t._fast_packet(0x34, b"\x00\x01t\x00\x07\x00x") is False  # QoS 2
    assert t._fast_packet(0x40, b"\x00\x07\x10\x00") is False  # PUBACK with a reason


async def test_a_failing_delivery_is_logged_and_reading_goes_on(
    mosquitto: tuple[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    host, port = mosquitto
    topic = unique_topic("failing-delivery")
    async with MqttTransport(host, port) as a, MqttTransport(host, port) as b:
        sub = await b.subscribe(topic)
        deliver = b._deliver
        failures = [True]

        def flaky(*args: object) -> None:
            if failures and failures.pop():
                raise RuntimeError("bug")
            deliver(*args)  # type: ignore[arg-type]

        b._deliver = flaky  # type: ignore[method-assign]
        for i in range(3):
            await a.publish(topic, f"m{i}".encode())
        assert await take(sub, 2) == [b"m1", b"m2"]
        assert "MQTT message handling failed" in caplog.text
