"""A terminal group chat on the reliable-channel runtime.

Two terminals against Mosquitto::

    python examples/chat.py --name alice --db alice.db --broker mqtt://127.0.0.1:1883
    python examples/chat.py --name bob   --db bob.db   --broker mqtt://127.0.0.1:1883

No broker installed? The first terminal hosts the embedded one (amqtt, 127.0.0.1)::

    python examples/chat.py --name alice --db alice.db --serve-broker 1884
    python examples/chat.py --name bob   --db bob.db   --broker mqtt://127.0.0.1:1884

Type a line and press Enter to send it; ``/status`` says in words whether you
are in sync and what is pending, ``/quit`` (or Ctrl-D) leaves. Lines from others appear in causal
order; a ``✓`` follows once a peer acknowledged one of yours. With ``--db``
the conversation survives restarts: the last lines are shown again, nothing
sent is lost and nothing is shown twice. With ``--store HOST:PORT`` (a store
node's gRPC address) a restarted chat first catches up on what it missed, and
keeps trying while the store is down; ``/status`` says where that stands. The
store node must archive the channel: ``examples/store_node.toml`` archives
``lobby``, the channel joined by default::

    store-node serve --config examples/store_node.toml
    python examples/chat.py --name bob --db bob.db --store 127.0.0.1:50051
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

if not __package__:
    # Run as a file (`python examples/chat.py`, from any folder): this
    # checkout's packages come first. (`python -m examples.chat` works only in the
    # checkout's root: elsewhere `examples` is py-libp2p's package of that name.)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdk.runtime import (
    CatchUpCompleted,
    CatchUpState,
    ChannelNotArchived,
    Delivery,
    MessageLost,
    Node,
    NodeFailed,
    PublishFailed,
    ReliableChannel,
    SendHandle,
    StoreRetrievalFailed,
    StoreUnreachable,
    SubscriptionEnded,
    SyncState,
    SyncStatus,
    SyncStatusChanged,
)
from sdk.runtime.persistence import Persistence
from sdk.sds import COMPACT, ChannelConfig, RepairConfig, decode_message
from transports.base import Transport

#: Every participant of a channel must use the same bloom profile.
CHAT_CONFIG = ChannelConfig(
    bloom=COMPACT,
    causal_history_size=3,
    resend_interval_ms=5_000,
    possibly_acked_resend_interval_ms=15_000,
    sync_interval_ms=10_000,
    retrieval_interval_ms=5_000,
    repair=RepairConfig(t_min_ms=10_000, t_max_ms=60_000),
)


def _display(sender_id: str) -> str:
    # Participant ids are "<name>-<random suffix>": show the name.
    return sender_id.rsplit("-", 1)[0]


def _participant_id(name: str, db: str | None) -> str:
    if db is None:
        return f"{name}-{uuid.uuid4().hex[:8]}"
    persistence = Persistence(db)
    try:
        saved = persistence.participant_id()
    finally:
        persistence.close()
    if saved is not None:
        if _display(saved) != name:
            sys.exit(f"{db} belongs to {_display(saved)!r}; use another --db for {name!r}")
        return saved
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def _connect(url: str) -> Transport:
    from transports.mqtt import MqttTransport

    # 3.1.1 works with both Mosquitto and the embedded amqtt broker.
    transport = MqttTransport.from_url(url, protocol="3.1.1")
    await transport.connect()
    return transport


def _print_history(room: ReliableChannel, me: str, lines: int) -> int:
    """Show the last ``lines`` messages; return the last seq shown."""
    records = room.history()
    for record in records[-lines:]:
        text = ""
        if record.data is not None:
            text = (decode_message(record.data).content or b"").decode(errors="replace")
        who = "you" if record.sender_id == me else _display(record.sender_id)
        print(f"  [{who}] {text}")
    return records[-1].seq if records else 0


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _clock(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000))


def _ago(ms: int, now_ms: int) -> str:
    seconds = max(0, now_ms - ms) // 1000
    if seconds < 120:
        return _plural(seconds, "second")
    if seconds < 7200:
        return _plural(seconds // 60, "minute")
    return _plural(seconds // 3600, "hour")


def _window(status: SyncStatus, now_ms: int) -> str:
    if status.owed_from is None:
        return ""
    return f"what was sent since {_clock(status.owed_from)} ({_ago(status.owed_from, now_ms)} ago)"


def describe_status(
    status: SyncStatus, stats: Mapping[str, int], pending: int, now_ms: int | None = None
) -> str:
    """``/status`` in words: in sync or catching up (and why not, when the store cannot
    answer), what arrived, what is missing or lost, and how many of our messages wait
    for an acknowledgement."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    window = _window(status, now_ms)
    if status.catch_up is CatchUpState.NOT_ARCHIVED:
        head = (
            "not in sync: the store node does not archive this channel, so what was "
            "sent while you were away cannot be fetched (add the channel to the store "
            "node's [ingest] channels)"
        )
    elif status.catch_up is CatchUpState.STORE_UNREACHABLE:
        since = status.store_down_since
        down = f" since {_clock(since)}" if since is not None else ""
        head = (
            f"not in sync: the store node is unreachable{down}; "
            f"still to fetch: {window or 'a missed window'}; retrying"
        )
    elif status.catch_up is CatchUpState.CATCHING_UP:
        head = f"catching up from the store: {window or 'a missed window'}"
        if status.pages:
            head += f", {_plural(status.pages, 'page')} received so far"
    elif status.state is SyncState.SYNCED:
        head = "in sync"
    else:
        head = f"catching up: {_plural(status.missing, 'message')} missing, being fetched"
    parts = [head]
    if status.missing and status.catch_up is not CatchUpState.IDLE:
        parts.append(f"{_plural(status.missing, 'message')} known missing")
    parts.append(f"{_plural(status.received, 'message')} received from others")
    if status.lost:
        parts.append(f"{_plural(status.lost, 'message')} lost for good")
    parts.append(
        f"{_plural(pending, 'message')} of yours awaiting acknowledgement"
        if pending
        else "everything you sent is acknowledged"
    )
    fetched = stats.get("store_retrieved", 0) + stats.get("catch_up_retrieved", 0)
    if fetched:
        parts.append(f"{_plural(fetched, 'message')} fetched from the store")
    if stats.get("publish_failed", 0):
        parts.append(f"{_plural(stats['publish_failed'], 'publish')} failed (retried)")
    return "; ".join(parts)


async def _confirm(handle: SendHandle, text: str) -> None:
    try:
        await handle.acknowledged()
    except Exception as exc:  # expired or failed: tell the user, don't crash the chat
        print(f"  ! not acknowledged: {text[:40]!r} ({exc})")
        return
    print(f"  ✓ {text[:40]}")


async def chat(ns: argparse.Namespace) -> int:
    """Run the chat until /quit or end of input."""
    me = _participant_id(ns.name, ns.db)
    transport = await _connect(ns.broker)
    store = None
    if ns.store:
        from sdk.store.grpc import GrpcStoreClient

        store = GrpcStoreClient(ns.store)
    async with Node(transport, me, db=ns.db, store=store, config=CHAT_CONFIG) as node:
        room = await node.join(ns.channel)
        print(f"joined #{ns.channel} as {ns.name} ({me}); /quit to leave, /status for details")
        after = _print_history(room, me, 20) if ns.db else None

        shown: list[object] = [room.sync_status.state, room.sync_status.catch_up]
        failing = [False]

        async def show() -> None:
            async for event in room.events(after_seq=after):
                if isinstance(event, Delivery):
                    print(f"[{_display(event.sender_id)}] {event.content.decode(errors='replace')}")
                elif isinstance(event, SyncStatusChanged):
                    s = event.status
                    if s.state is not shown[0] or s.catch_up is not shown[1]:
                        shown[0], shown[1] = s.state, s.catch_up
                        print(f"  -- {describe_status(s, room.stats, len(room.core.outgoing))}")
                elif isinstance(event, MessageLost):
                    print(f"  -- a message was lost for good ({event.message_id[:12]}...)")
                elif isinstance(event, PublishFailed):
                    print(f"  -- publish failed ({event.error}); will retry")
                elif isinstance(event, StoreUnreachable):
                    # The status line (above) says it; the detail is for the curious.
                    print(f"  -- the store node did not answer: {event.error}")
                elif isinstance(event, ChannelNotArchived):
                    print(
                        f"  -- the store node does not archive #{ns.channel}: missed messages "
                        "cannot be fetched from it"
                    )
                elif isinstance(event, CatchUpCompleted):
                    failing[0] = False
                    if event.retrieved:
                        print(f"  -- fetched {_plural(event.retrieved, 'message')} from the store")
                elif isinstance(event, StoreRetrievalFailed):
                    # Retried by the runtime: said once until the store answers again
                    # (a catch-up window's failures are StoreUnreachable's).
                    if event.message_ids and not failing[0]:
                        failing[0] = True
                        print(f"  -- the store node did not answer ({event.error}); will retry")
                elif isinstance(event, SubscriptionEnded):
                    print(f"  -- no longer receiving from the broker ({event.error})")
                elif isinstance(event, NodeFailed):
                    print(f"  -- the chat stopped: {event.error}; restart it")

        viewer = asyncio.create_task(show())
        confirmations: set[asyncio.Task[None]] = set()
        try:
            while True:
                line = await asyncio.to_thread(sys.stdin.readline)
                if not line or line.strip() == "/quit":
                    break
                text = line.rstrip("\n")
                if text == "/status":
                    pending = len(room.core.outgoing)
                    print(f"  {describe_status(room.sync_status, room.stats, pending)}")
                    continue
                if not text:
                    continue
                handle = await room.send(text.encode())
                task = asyncio.create_task(_confirm(handle, text))
                confirmations.add(task)
                task.add_done_callback(confirmations.discard)
        finally:
            viewer.cancel()
            for task in confirmations:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await viewer
    await transport.close()
    if store is not None:
        await store.close()
    return 0


async def _serve_and_chat(ns: argparse.Namespace) -> int:
    from transports.embedded_broker import embedded_broker

    async with embedded_broker(port=ns.serve_broker) as url:
        print(f"embedded broker listening at {url}")
        ns.broker = url
        return await chat(ns)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and chat."""
    parser = argparse.ArgumentParser(description="Terminal group chat over SDS.")
    parser.add_argument("--name", required=True, help="your display name")
    parser.add_argument("--channel", default="lobby", help="channel to join (default: lobby)")
    parser.add_argument("--db", help="SQLite file keeping the chat across restarts")
    parser.add_argument(
        "--broker", default="mqtt://127.0.0.1:1883", help="MQTT broker URL (default: local)"
    )
    parser.add_argument("--store", help="a store node's gRPC address (HOST:PORT) to catch up from")
    parser.add_argument(
        "--serve-broker",
        type=int,
        metavar="PORT",
        help="host the embedded MQTT broker on 127.0.0.1:PORT and chat through it",
    )
    ns = parser.parse_args(argv)
    runner = _serve_and_chat(ns) if ns.serve_broker else chat(ns)
    try:
        return asyncio.run(runner)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
