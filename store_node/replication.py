"""The store node serving p2panda replication, and syncing with other store nodes.

``[replication]`` in the node's TOML file::

    [replication]
    listen = "127.0.0.1:2022"     # serve replication here ("" = do not serve)
    path = "documents.db"         # the document store (SQLite), indexes inside
    schemas = ["todo_0020..."]    # what we announce and serve
    schema_file = "schemas.json"  # application schemas: [{name, view_id, description, fields}]
    peers = ["127.0.0.1:2023"]    # other nodes to sync with, on start and every interval_s
    interval_s = 60.0
    mode = "set-reconciliation"   # or "log-height" (aquadoggo peers)
    process = "separate"          # store-node serve's default: replication, [collection]
                                  # and [bamboo_p2p] in a supervised child; or "node"
    # and the listener options every section shares (connection cap, timeouts,
    # TLS, peer authentication): store_node.listeners


``store-node serve --config FILE`` runs the service beside ingest and gRPC
whenever the section has ``listen`` or ``peers`` (:class:`store_node.node.StoreNode`
starts it and stops it on shutdown); ``store-node replicate --config FILE`` runs
the service alone, for a node that archives no SDS channels or has no
``[archive]`` to open; ``store-node sync PEER --config FILE`` runs one session
against PEER with a progress bar. Any client can catch up from the node with
:func:`sdk.sync.sync`.

With ``process = "separate"`` (what ``store-node serve`` does unless the file says
``process = "node"``; :func:`store_node.cli.serve_config`), ``store-node serve`` runs
the service, with ``[collection]`` and ``[bamboo_p2p]``, in a child process it
supervises (:mod:`store_node.documents_process`) instead of on its own event loop,
so a catch-up's store work does not hold the interpreter lock the node's lookups and
probes need. Parsed without the key (a :class:`store_node.node.StoreNode` built
in-process), ``process`` is ``node``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from store_node.addresses import check_address
from store_node.errors import ConfigError
from store_node.listeners import ListenerConfig, parse_listener
from store_node.sections import Section

if TYPE_CHECKING:
    from sdk.sync.events import SessionDone, SyncEvent
    from sdk.sync.store import SyncStore
    from transports.guarded import GuardedListener, GuardedStream

log = logging.getLogger("store_node.replication")


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    """``[replication]``: see the module docstring."""

    listen: str = ""
    path: Path = Path("documents.db")
    schemas: tuple[str, ...] = ()
    schema_file: Path | None = None
    peers: tuple[str, ...] = ()
    interval_s: float = 60.0
    mode: str = "set-reconciliation"
    #: ``node`` (on the node's event loop) or ``separate`` (a supervised child process);
    #: ``store-node serve`` makes an absent key ``separate`` (:func:`store_node.cli.serve_config`).
    process: str = "node"
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: The table as written and the folder its relative paths start from: what a child
    #: process parses again (:mod:`store_node.documents_process`).
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    base: Path = field(default=Path("."), compare=False, repr=False)
    #: Connection cap, timeouts, TLS and peer authentication (:mod:`store_node.listeners`).
    listener: ListenerConfig = field(default_factory=ListenerConfig)

    @property
    def enabled(self) -> bool:
        """Whether the section asks for anything (serving or peers)."""
        return bool(self.listen or self.peers)


def parse_replication(raw: object, base: Path) -> ReplicationConfig:
    """Validate the ``[replication]`` table (``{}`` when absent)."""
    section = Section("replication", raw)
    source = dict(section.raw)
    config = ReplicationConfig(
        listener=parse_listener(section, base),
        listen=section.address("listen"),
        peers=section.addresses("peers"),
        schemas=section.strings("schemas", "schema ids"),
        interval_s=section.duration("interval_s", 60.0, positive=True),
        mode=section.choice("mode", ("set-reconciliation", "log-height"), "set-reconciliation"),
        path=section.path("path", base, "documents.db"),
        schema_file=section.path("schema_file", base, None),
        process=section.choice("process", ("node", "separate"), "node"),
        source=source,
        base=base,
    )
    section.done()
    if config.enabled and not config.schemas:
        raise ConfigError("replication.schemas is empty: nothing to replicate")
    return config


def open_store(config: ReplicationConfig) -> SyncStore:
    """The node's document store, with the configured application schemas registered."""
    from sdk.documents import application_schemas
    from sdk.sync.store import SyncStore

    store = SyncStore(str(config.path))
    if config.schema_file is not None:
        try:
            for schema in application_schemas(config.schema_file):
                store.add_schema(schema)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            store.close()
            raise ConfigError(f"replication.schema_file {config.schema_file}: {exc}") from exc
    return store


class ReplicationService:
    """Serves replication over TCP and syncs with the configured peers."""

    def __init__(self, config: ReplicationConfig, store: SyncStore | None = None) -> None:
        self.config = config
        self.store = store if store is not None else open_store(config)
        self.port = 0
        #: The guarded listener once :meth:`start` served (its counters feed the metrics).
        self.listener: GuardedListener | None = None
        self._closed = False

    def _mode(self) -> Any:
        from sdk.sync.messages import Mode

        return Mode.LOG_HEIGHT if self.config.mode == "log-height" else Mode.SET_RECONCILIATION

    async def start(self) -> int:
        """Start serving (if ``listen`` is set); return the bound port (0 if not serving)."""
        from sdk.sync.driver import serve_stream
        from sdk.sync.framing import FrameMeter
        from transports.guarded import GuardedListener
        from transports.stream import StreamClosed

        if not self.config.listen:
            return 0
        host, _, port = self.config.listen.rpartition(":")

        async def handle(stream: GuardedStream) -> None:
            try:
                stats = await serve_stream(self.store, stream, self.config.schemas)
                log.info(
                    "replication peer done",
                    extra={"peer": stream.peer, "bytes_sent": stats.bytes_sent},
                )
            except StreamClosed:
                raise  # cut off or gone: the listener logs and counts it
            except Exception as exc:
                # Not a protocol error (those end the session inside serve_stream):
                # a bug or a broken store; say so instead of dropping the connection mutely.
                log.error(
                    "replication connection failed",
                    extra={"peer": stream.peer, "error": repr(exc)},
                )

        listener = self.config.listener
        self.listener = GuardedListener(
            "replication", handle, listener.limits, tls=listener.tls, meter=FrameMeter
        )
        self.port = await self.listener.start(host, int(port))
        log.info("replication listening", extra={"port": self.port})
        return self.port

    async def sync_with(
        self, peer: str, on_event: Callable[[SyncEvent], None] | None = None
    ) -> SessionDone:
        """One session with ``peer`` (HOST:PORT) over the configured schemas."""
        from sdk.sync.driver import sync
        from transports.stream import connect_tcp

        host, _, port = peer.rpartition(":")
        stream = await connect_tcp(host, int(port), ssl=self.config.listener.peer_context())
        return await sync(
            self.store, stream, self.config.schemas, mode=self._mode(), on_event=on_event
        )

    @property
    def serving(self) -> bool:
        """Whether the listener is open (False before :meth:`start` and after :meth:`close`)."""
        return self.listener is not None and self.listener.serving

    async def run(self) -> None:
        """Serve and sync with every peer each ``interval_s`` until cancelled."""
        await self.start()
        try:
            await self.sync_peers_forever()
            # No peers: serve until cancelled.
            await asyncio.get_running_loop().create_future()
        finally:
            await self.close()

    async def sync_peers_forever(self) -> None:
        """Sync with every configured peer, then again every ``interval_s``, until cancelled.

        A peer that cannot be reached or breaks the protocol is logged and tried again
        at the next interval; the others are not held up by it. Returns at once when
        there are no peers.
        """
        from sdk.sync.errors import SyncError

        if not self.config.peers:
            return
        while True:
            for peer in self.config.peers:
                try:
                    done = await self.sync_with(peer)
                    log.info(
                        "replicated",
                        extra={
                            "peer": peer,
                            "received": done.entries_received,
                            "sent": done.entries_sent,
                        },
                    )
                except (OSError, SyncError) as exc:
                    log.warning("replication failed", extra={"peer": peer, "error": str(exc)})
            await asyncio.sleep(self.config.interval_s)

    async def close(self) -> None:
        """Stop serving, end the open sessions, close the store; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.listener is not None:
            await self.listener.close(connection_timeout=5)
        self.store.close()


def sync_command(config: ReplicationConfig, peer: str, *, progress: bool = True) -> int:
    """``store-node sync PEER``: one session, a progress bar on stderr, a JSON line on stdout."""
    import sys

    from tqdm import tqdm

    from sdk.sync.errors import SyncError
    from sdk.sync.events import Progress

    if not config.schemas:
        raise ConfigError("replication.schemas is empty: nothing to replicate")
    check_address(peer, "PEER")
    service = ReplicationService(config)
    bar = tqdm(unit=" entries", disable=not progress, file=sys.stderr, desc="connecting")

    def on_event(event: SyncEvent) -> None:
        if isinstance(event, Progress):
            bar.set_description(event.phase.value)
            bar.set_postfix(received=event.entries_received, sent=event.entries_sent)
            bar.n = event.entries_received + event.entries_sent
            bar.refresh()

    async def run() -> SessionDone:
        try:
            return await service.sync_with(peer, on_event)
        finally:
            await service.close()

    try:
        done = asyncio.run(run())
    except (OSError, SyncError) as exc:
        bar.close()
        print(f"store-node: sync with {peer} failed: {exc}", file=sys.stderr)
        return 1
    bar.close()
    print(json.dumps({"peer": peer, "received": done.entries_received, "sent": done.entries_sent}))
    return 0


__all__ = [
    "ReplicationConfig",
    "ReplicationService",
    "open_store",
    "parse_replication",
    "sync_command",
]
