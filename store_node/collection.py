"""The store node serving collection sync (Beelay snapshots, per-document pulls, listen).

``[collection]`` in the node's TOML file::

    [collection]
    listen = "127.0.0.1:2024"          # serve collection sync here ("" = do not serve)
    path = "documents.db"              # the document store (SQLite)
    schema_file = "schemas.json"       # application schemas: [{name, view_id, description, fields}]
    max_snapshot_documents = 100000    # larger collections are refused (SnapshotTooLarge)
    max_listeners = 1024               # snapshots listened to at once
    max_pending_notifications = 1000   # a listener this far behind is disconnected
    max_connections = 256              # more at once are closed on accept
    # and the other listener options every section shares (timeouts, TLS, peer
    # authentication): store_node.listeners

``store-node serve`` starts it next to the archive when ``listen`` is set, and
stops it on shutdown; ``store-node collection PEER ROOT --config FILE``
brings this node's document store and PEER's collection from ROOT up to date
with each other (``--pull-only``: only this side), with a progress bar. Any
client uses :func:`sdk.sync.collection.connect_collection`.

The store is opened by this service: if the same file is also replicated
(``[replication]``), serve both from one process and pass the one store
(:class:`CollectionNodeService` takes it), since a document store caches
documents and does not see what another connection writes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from store_node.addresses import check_address
from store_node.errors import ConfigError
from store_node.listeners import ListenerConfig, parse_listener
from store_node.replication import ReplicationConfig, open_store
from store_node.sections import Section

if TYPE_CHECKING:
    from sdk.sync.collection import CollectionService, CollectionSnapshot
    from sdk.sync.store import SyncStore
    from transports.guarded import GuardedListener


@dataclass(frozen=True, slots=True)
class CollectionNodeConfig:
    """``[collection]``: see the module docstring."""

    listen: str = ""
    path: Path = Path("documents.db")
    schema_file: Path | None = None
    max_snapshot_documents: int = 100_000
    max_listeners: int = 1024
    max_pending_notifications: int = 1000
    #: Connection cap, timeouts, TLS and peer authentication (:mod:`store_node.listeners`).
    listener: ListenerConfig = field(default_factory=ListenerConfig)
    #: The table as written and the folder its relative paths start from: what a
    #: documents process parses again (:mod:`store_node.documents_process`).
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    base: Path = field(default=Path("."), compare=False, repr=False)

    @property
    def enabled(self) -> bool:
        """Whether the node serves collection sync."""
        return bool(self.listen)


_DEFAULTS = CollectionNodeConfig()


def parse_collection(raw: object, base: Path) -> CollectionNodeConfig:
    """Validate the ``[collection]`` table (``{}`` when absent)."""
    section = Section("collection", raw)
    config = CollectionNodeConfig(
        source=dict(section.raw),  # first: the keys below are taken out of it
        base=base,
        listener=parse_listener(section, base),
        listen=section.address("listen"),
        path=section.path("path", base, "documents.db"),
        schema_file=section.path("schema_file", base, None),
        max_snapshot_documents=section.integer(
            "max_snapshot_documents", _DEFAULTS.max_snapshot_documents
        ),
        max_listeners=section.integer("max_listeners", _DEFAULTS.max_listeners),
        max_pending_notifications=section.integer(
            "max_pending_notifications", _DEFAULTS.max_pending_notifications
        ),
    )
    section.done()
    return config


def open_collection_store(config: CollectionNodeConfig) -> SyncStore:
    """The document store, with the configured application schemas registered."""
    try:
        return open_store(ReplicationConfig(path=config.path, schema_file=config.schema_file))
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("replication.", "collection.", 1)) from None


class CollectionNodeService:
    """The node's collection-sync listener over its document store."""

    def __init__(self, config: CollectionNodeConfig, store: SyncStore | None = None) -> None:
        self.config = config
        self._owns_store = store is None
        self.store = store if store is not None else open_collection_store(config)
        self.service: CollectionService = self._service()

    def _service(self) -> CollectionService:
        from sdk.sync.collection import CollectionConfig, CollectionService

        limits = CollectionConfig(
            max_snapshot_documents=self.config.max_snapshot_documents,
            max_listeners=self.config.max_listeners,
            max_pending_notifications=self.config.max_pending_notifications,
        )
        listener = self.config.listener
        return CollectionService(
            self.store,
            limits,
            max_connections=listener.limits.max_connections,
            listener=listener.limits,
            tls=listener.tls,
        )

    @property
    def listener(self) -> GuardedListener | None:
        """The guarded TCP listener once :meth:`start` ran (its counters feed the metrics)."""
        return self.service.listener

    async def start(self) -> int:
        """Listen on ``config.listen``; return the bound port."""
        host, _, port = self.config.listen.rpartition(":")
        return await self.service.start(host, int(port))

    async def close(self) -> None:
        """Close every connection and the store (if this service opened it)."""
        await self.service.close()
        if self._owns_store:
            self.store.close()


def catch_up_command(
    config: CollectionNodeConfig,
    peer: str,
    root: str,
    *,
    progress: bool = True,
    push: bool = True,
) -> int:
    """``store-node collection PEER ROOT``: bring this store and PEER's collection from
    ROOT up to date with each other, with a progress bar on stderr and a JSON line on
    stdout (exit 0; 1 when the sync fails).

    With ``push`` (the default) this side serves its store on the connection, so a
    peer that pulls back (a store node does) first takes this side's newer operations,
    then answers; everything PEER lacks and this side has is pushed, and PEER's
    snapshot shows only what this side lacks, which is then pulled. The JSON says
    ``operations_pulled`` (stored here) and ``operations_pushed`` (operations PEER
    fetched from here); when nothing could be pushed (``push`` off, or a peer that
    does not pull back) ``not_pushed`` says so in words, and so does a line on stderr.
    """
    import sys

    from tqdm import tqdm

    from sdk.sync.collection import CollectionError, connect_collection

    check_address(peer, "PEER")
    store = open_collection_store(config)
    bar = tqdm(unit=" documents", disable=not progress, file=sys.stderr, desc="snapshot")

    def on_progress(done: int, total: int) -> None:
        bar.set_description("pulling")
        bar.total = total
        bar.n = done
        bar.refresh()

    async def run() -> tuple[CollectionSnapshot, int, bool]:
        host, _, port = peer.rpartition(":")
        tls = config.listener.peer_context()
        async with await connect_collection(
            store, host, int(port), serve=push, ssl=tls
        ) as connection:
            snapshot = await connection.snapshot(root, on_progress=on_progress)
            server = connection.server
            pushed = 0 if server is None else server.operations_served
            # The peer asked for this side's snapshot: it pulled back what it lacked.
            return snapshot, pushed, connection.stats.requests_served > 0

    try:
        snapshot, pushed, peer_pulled = asyncio.run(run())
    except (OSError, CollectionError) as exc:
        bar.close()
        print(f"store-node: collection sync with {peer} failed: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    bar.close()
    found = snapshot.out_of_sync
    summary: dict[str, object] = {
        "peer": peer,
        "documents": len(found.snapshot_keys),
        "changed": len(found.changed),
        "missing": len(found.missing),
        "only_local": len(found.only_local),
        "round_trips": snapshot.round_trips,
        "operations_pulled": snapshot.operations_applied,
        "operations_pushed": pushed,
        # The name before pushing existed; the same number as operations_pulled.
        "operations_applied": snapshot.operations_applied,
    }
    if not push or not peer_pulled:
        ahead = len(found.changed) + len(found.only_local)
        why = (
            "--pull-only"
            if not push
            else "the peer did not ask for this side's changes (a store node asks only for "
            "a collection whose root it holds)"
        )
        summary["not_pushed"] = (
            f"{why}: nothing was pushed; {ahead} document(s) changed here or only here "
            "may hold operations the peer lacks"
        )
        print(f"store-node: {summary['not_pushed']}", file=sys.stderr)
    print(json.dumps(summary))
    return 0


__all__ = [
    "CollectionNodeConfig",
    "CollectionNodeService",
    "catch_up_command",
    "open_collection_store",
    "parse_collection",
]
