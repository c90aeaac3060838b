"""The store node serving Bamboo point-to-point (``specs/bamboo-point-2-point.md``).

``[bamboo_p2p]`` in the node's TOML file::

    [bamboo_p2p]
    listen = "127.0.0.1:2025"   # serve here ("" or no section: do not serve)
    path = "bamboo.db"          # the SQLite log store (tables bamboo_*; may share a file)
    documents = ""              # a document store to serve ("": only the log store)
    schema_file = ""            # application schemas for it (as [replication]'s)
    initial_credit = 16         # proposals each client may have open at once
    stall_timeout_s = 30.0      # give up finite requests that make no progress this long
    compression_window = 0      # LZFoo window in bytes (0: never compress)
    # and the listener options every section shares (connection cap, timeouts,
    # TLS, peer authentication): store_node.listeners

With ``documents``, the node serves the Bamboo logs of the p2panda documents in
that document store (:class:`~sdk.sync.bamboo_p2p.document_store.DocumentLogStore`),
and what clients send is ingested into it through its normal validation; the log
store at ``path`` keeps what the document store does not take (sparse ranges,
entries without payloads, payloads that are not operations). When ``documents`` is
the ``[replication]`` (or ``[collection]``) path, the node uses that service's store:
one document store per file, so each sees what the other writes.

``store-node serve`` starts it with the rest of the node and stops it on
shutdown: the listener closes first, open connections are cancelled, then the
store commits and closes. Clients replicate ranges of the logs it holds with
:func:`sdk.sync.bamboo_p2p.driver.replicate_range` (or ``python -m
sdk.sync.bamboo_p2p replicate``); what a client proposes to send, the node
verifies and keeps.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from store_node.errors import ConfigError
from store_node.listeners import ListenerConfig, parse_listener
from store_node.sections import Section

if TYPE_CHECKING:
    from sdk.documents import DocumentStore
    from sdk.sync.bamboo_p2p import LogStore, SqliteLogStore
    from sdk.sync.bamboo_p2p.document_store import DocumentLogStore
    from transports.guarded import GuardedListener, GuardedStream

log = logging.getLogger("store_node.bamboo_p2p")


@dataclass(frozen=True, slots=True)
class BambooP2PConfig:
    """``[bamboo_p2p]``: see the module docstring."""

    listen: str = ""
    path: Path = Path("bamboo.db")
    initial_credit: int = 16
    stall_timeout_s: float = 30.0
    documents: Path | None = None
    schema_file: Path | None = None
    compression_window: int = 0
    #: Connection cap, timeouts, TLS and peer authentication (:mod:`store_node.listeners`).
    listener: ListenerConfig = field(default_factory=ListenerConfig)
    #: The table as written and the folder its relative paths start from: what a
    #: documents process parses again (:mod:`store_node.documents_process`).
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    base: Path = field(default=Path("."), compare=False, repr=False)

    @property
    def enabled(self) -> bool:
        """Whether the node serves Bamboo point-to-point."""
        return bool(self.listen)


def parse_bamboo_p2p(raw: object, base: Path) -> BambooP2PConfig:
    """Validate the ``[bamboo_p2p]`` table (``{}`` when absent)."""
    section = Section("bamboo_p2p", raw)
    config = BambooP2PConfig(
        source=dict(section.raw),  # first: the keys below are taken out of it
        base=base,
        listener=parse_listener(section, base),
        listen=section.address("listen"),
        path=section.path("path", base, "bamboo.db"),
        initial_credit=section.integer("initial_credit", 16, 1, 1_000_000),
        stall_timeout_s=section.duration("stall_timeout_s", 30.0, positive=True),
        documents=section.optional_path("documents", base),
        schema_file=section.optional_path("schema_file", base),
        compression_window=section.integer("compression_window", 0, 0, 1 << 24),
    )
    section.done()
    if config.schema_file is not None and config.documents is None:
        raise ConfigError("bamboo_p2p.schema_file needs bamboo_p2p.documents")
    if config.enabled:
        for key, folder in (("path", config.path), ("documents", config.documents)):
            if folder is not None and not folder.parent.is_dir():
                raise ConfigError(f"bamboo_p2p.{key}: folder {folder.parent} does not exist")
    return config


class BambooP2PService:
    """Serves the log store over TCP, one reactive endpoint per connection.

    ``documents``: the node's document store at ``config.documents`` when another
    service already opened it (else this service opens and closes its own)."""

    def __init__(self, config: BambooP2PConfig, documents: DocumentStore | None = None) -> None:
        self.config = config
        self.store: LogStore | None = None
        self._log_store: SqliteLogStore | None = None
        self._adapter: DocumentLogStore | None = None
        self._documents = documents
        self._owns_documents = False
        self.port = 0
        #: The guarded listener once :meth:`start` ran (its counters feed the metrics).
        self.listener: GuardedListener | None = None

    async def start(self) -> int:
        """Open the store and listen; return the bound port."""
        from sdk.sync.bamboo_p2p import EndpointConfig, SqliteLogStore
        from sdk.sync.bamboo_p2p.document_store import DocumentLogStore
        from sdk.sync.bamboo_p2p.driver import serve_bamboo
        from sdk.sync.bamboo_p2p.framing import ChannelFrameMeter
        from transports.guarded import GuardedListener

        log_store = self._log_store = SqliteLogStore(str(self.config.path))
        store: LogStore = log_store
        if self.config.documents is not None:
            if self._documents is None:
                from store_node.replication import ReplicationConfig, open_store

                try:
                    self._documents = open_store(
                        ReplicationConfig(
                            path=self.config.documents, schema_file=self.config.schema_file
                        )
                    )
                except ConfigError as exc:
                    log_store.close()
                    raise ConfigError(str(exc).replace("replication.", "bamboo_p2p.", 1)) from None
                self._owns_documents = True
            store = self._adapter = DocumentLogStore(self._documents, log_store)
        self.store = store
        endpoint_config = EndpointConfig(
            initial_credit=self.config.initial_credit,
            compression_window=self.config.compression_window,
        )
        stall = self.config.stall_timeout_s

        async def handle(stream: GuardedStream) -> None:
            connection = await serve_bamboo(store, stream, endpoint_config, stall_timeout=stall)
            extra: dict[str, object] = {
                "peer": stream.peer,
                "bytes_sent": connection.stats.bytes_sent,
                "entries_sent": connection.stats.entries_sent,
                "entries_received": connection.stats.entries_received,
            }
            if connection.error is not None:
                extra["error"] = repr(connection.error)
                log.warning("bamboo_p2p peer cut off", extra=extra)
            else:
                log.info("bamboo_p2p peer done", extra=extra)

        host, _, port = self.config.listen.rpartition(":")
        listener = self.config.listener
        self.listener = GuardedListener(
            "bamboo_p2p", handle, listener.limits, tls=listener.tls, meter=ChannelFrameMeter
        )
        self.port = await self.listener.start(host, int(port))
        log.info("bamboo_p2p listening", extra={"port": self.port})
        return self.port

    async def close(self) -> None:
        """Stop listening, end open connections, commit and close the store."""
        if self.listener is not None:
            await self.listener.close()
        if self._adapter is not None:
            self._adapter.close()  # flush, stop listening to the document store
            self._adapter = None
        self.store = None
        if self._log_store is not None:
            self._log_store.close()
            self._log_store = None
        if self._documents is not None and self._owns_documents:
            self._documents.close()
        self._documents = None


__all__ = ["BambooP2PConfig", "BambooP2PService", "parse_bamboo_p2p"]
