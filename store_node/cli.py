"""The ``store-node`` command.

::

    store-node serve  --config FILE                 run the node until SIGTERM/SIGINT
    store-node check-config --config FILE           validate the file, print what it means
    store-node export --config FILE --out DIR       archive -> Parquet (docs/archive-export.md);
                                                    --keys FILE opens sealed messages
    store-node stats  --config FILE [--check]       archive summary as JSON (+ integrity check)
    store-node analytics ...                        Spark jobs (store_node.analytics.cli)
    store-node replicate --config FILE              only p2panda replication ([replication];
                                                    serve also runs it when configured), until
                                                    SIGTERM/SIGINT
    store-node sync PEER --config FILE              one replication session with PEER
    store-node collection PEER ROOT --config FILE   bring this store and PEER's collection
                                                    from ROOT up to date with each other
    store-node --version

Exit codes: 0 ok, 1 runtime failure (archive missing, locked or broken, a port
in use, the broker unreachable), 2 bad configuration or arguments. Every error
is one line on stderr starting ``store-node:``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.metadata
import json
import signal
import sys
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, replace
from typing import Any

from store_node.config import SECTIONS, NodeConfig, listeners, load_config
from store_node.errors import ConfigError, StoreNodeError
from transports.base import TransportError

#: The interpreter's thread switch interval in a ``store-node`` process that serves
#: (CPython's default is 5 ms). A catch-up keeps the store's worker thread in Python
#: (decoding, checking, building rows) for long stretches, and every other thread (the
#: event loop after each poll, an archive reader after each SQLite row it steps, the
#: metrics listener after each socket call) waits for the GIL up to one interval each
#: time it takes it back: a 100-row lookup waited tens of milliseconds for it.
#: Threads that do not contend for the GIL are not switched any more often.
SWITCH_INTERVAL_S = 0.0005


def version() -> str:
    """The installed distribution's version (``chorus-sds``)."""
    try:
        return importlib.metadata.version("chorus-sds")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="store-node", description="Chorus store node: archive SDS channels, serve them."
    )
    parser.add_argument("--version", action="version", version=f"store-node {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the store node")
    serve.add_argument("--config", required=True, help="TOML configuration file")
    check = sub.add_parser("check-config", help="validate a configuration file and exit")
    check.add_argument("--config", required=True, help="TOML configuration file")
    export = sub.add_parser("export", help="export the archive to Parquet")
    export.add_argument("--config", required=True)
    export.add_argument("--out", required=True, help="output folder (Hive layout)")
    export.add_argument(
        "--max-file-mb", type=int, default=128, help="roll to a new part file after this"
    )
    export.add_argument("--overwrite", action="store_true", help="replace an existing export")
    export.add_argument(
        "--keys",
        metavar="FILE",
        help="channel keys (JSON, docs/encryption.md): open sealed messages for the full report",
    )
    export.add_argument("--no-progress", action="store_true", help="no progress bar")
    stats = sub.add_parser("stats", help="print archive statistics as JSON")
    stats.add_argument("--config", required=True)
    stats.add_argument("--check", action="store_true", help="also run the integrity check")
    sub.add_parser("analytics", help="analytics jobs over an export (store_node.analytics)")
    replicate = sub.add_parser("replicate", help="serve p2panda replication ([replication])")
    replicate.add_argument("--config", required=True)
    sync = sub.add_parser("sync", help="catch up with another node (p2panda replication)")
    sync.add_argument("peer", help="HOST:PORT of the peer's replication listener")
    sync.add_argument("--config", required=True)
    sync.add_argument("--no-progress", action="store_true", help="no progress bar")
    collection = sub.add_parser(
        "collection", help="sync a collection with another node both ways (collection sync)"
    )
    collection.add_argument("peer", help="HOST:PORT of the peer's [collection] listener")
    collection.add_argument("root", help="the root document id of the collection")
    collection.add_argument("--config", required=True)
    collection.add_argument("--no-progress", action="store_true", help="no progress bar")
    collection.add_argument(
        "--pull-only", action="store_true", help="take PEER's changes, do not offer ours"
    )
    return parser


def _analytics(argv: Sequence[str]) -> int:
    try:
        module = importlib.import_module("store_node.analytics.cli")
    except ImportError as exc:
        print(
            "store-node analytics: the analytics module is not installed in this build "
            f"({exc}); install chorus-sds[analytics] from a release that includes it",
            file=sys.stderr,
        )
        return 2
    result = module.main(list(argv))
    return int(result or 0)


def _serves_something(config: NodeConfig) -> bool:
    """Whether a sync service gives a node without ingest channels work to do."""
    return (
        config.replication.enabled
        or config.collection.enabled
        or config.bamboo_p2p.enabled
        or config.store_sync.enabled
    )


def _share_the_gil() -> None:
    """Let the serving threads take the GIL back soon: see :data:`SWITCH_INTERVAL_S`."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def serve_config(config: NodeConfig) -> NodeConfig:
    """``config`` as ``store-node serve`` runs it: the document services in a supervised
    child (``[replication] process = "separate"``, :mod:`store_node.documents_process`)
    unless the file says ``process = "node"``. A :class:`store_node.node.StoreNode`
    built in-process (embedding, tests) keeps the parsed default, ``node``."""
    if "process" in config.replication.source:
        return config
    return replace(config, replication=replace(config.replication, process="separate"))


def _serve(config: NodeConfig) -> int:
    from store_node.log import configure_logging
    from store_node.node import StoreNode

    configure_logging(config.log.level)
    if not config.ingest.channels and not _serves_something(config):
        raise ConfigError("[ingest] channels is empty and no sync service is on: nothing to do")
    _share_the_gil()
    asyncio.run(StoreNode(serve_config(config)).run())
    return 0


def _check_config(config: NodeConfig) -> int:
    from store_node.service import exposure_warning

    summary: dict[str, Any] = {
        "ok": True,
        # Every section is checked, present in the file or not (absent: its defaults).
        "sections_checked": list(SECTIONS),
        # Each on its own port: load_config refuses two listeners on one.
        "listeners": listeners(config),
        "archive": {
            "backend": config.archive.backend,
            **(
                {"path": str(config.archive.path)}
                if config.archive.backend == "sqlite"
                else {"schema": config.archive.schema}
            ),
        },
        "channels": list(config.ingest.channels),
        "transport": config.transport.kind,
        # Names only: values may be secrets (password, tokens).
        "transport_options": sorted(config.transport.options),
        "grpc": {
            "listen": config.grpc.listen,
            "tls": config.grpc.tls,
            "mutual_tls": config.grpc.tls_client_ca_file is not None,
            "tokens": len(config.grpc.grants),
        },
        "metrics": config.metrics.listen or None,
        "warnings": [w for w in [exposure_warning(config.grpc, config.grpc.listen)] if w],
    }
    if config.collection.enabled:
        summary["collection"] = config.collection.listen
    if config.store_sync.enabled:
        summary["store_sync"] = {
            "listen": config.store_sync.listen or None,
            "peers": list(config.store_sync.peers),
        }
    if config.bamboo_p2p.enabled:
        summary["bamboo_p2p"] = {
            "listen": config.bamboo_p2p.listen,
            "path": str(config.bamboo_p2p.path),
            "documents": (
                None if config.bamboo_p2p.documents is None else str(config.bamboo_p2p.documents)
            ),
        }
    if config.replication.enabled:
        summary["replication"] = {
            "listen": config.replication.listen or None,
            "peers": list(config.replication.peers),
            "schemas": list(config.replication.schemas),
            "mode": config.replication.mode,
            "process": config.replication.process,
        }
    if not config.ingest.channels and not _serves_something(config):
        summary["warnings"].append(
            "[ingest] channels is empty and no sync service is on: serve would refuse to start"
        )
    print(json.dumps(summary, indent=2))
    return 0


def _require_archive(config: NodeConfig) -> None:
    """Readers must not create an archive: a typo in the path would export nothing, exit 0."""
    if config.archive.backend == "sqlite" and not config.archive.path.is_file():
        raise StoreNodeError(f"no archive at {config.archive.path}")


def _export(config: NodeConfig, ns: argparse.Namespace) -> int:
    from store_node.archive import open_archive
    from store_node.export import export_archive

    if ns.max_file_mb < 1:
        raise ConfigError(f"--max-file-mb must be at least 1, got {ns.max_file_mb}")
    readers = None
    if ns.keys:
        from sdk.encryption.keyfile import KeyFileError, load_key_rings
        from sdk.encryption.keyfile import readers as open_with

        try:
            readers = open_with(load_key_rings(ns.keys))
        except KeyFileError as exc:
            raise ConfigError(f"--keys: {exc}") from None
    _require_archive(config)
    with open_archive(config.archive, migrate=False) as archive:
        if archive.schema_version() == 0:
            raise StoreNodeError("the archive has no schema yet: run store-node serve first")
        summary = export_archive(
            archive,
            ns.out,
            max_file_bytes=ns.max_file_mb * 1024 * 1024,
            overwrite=ns.overwrite,
            progress=not ns.no_progress,
            readers=readers,
        )
    out = {"rows": summary.rows, "files": len(summary.files), "out": ns.out}
    if summary.sealed or summary.opened:
        out |= {"sealed": summary.sealed, "opened": summary.opened}
    print(json.dumps(out))
    return 0


def _stats(config: NodeConfig, check: bool) -> int:
    from store_node.archive import open_archive

    _require_archive(config)
    with open_archive(config.archive, migrate=False) as archive:
        if archive.schema_version() == 0:
            raise StoreNodeError("the archive has no schema yet: run store-node serve first")
        out = asdict(archive.stats())
        out["backend"] = archive.backend
        if check:
            problems = archive.check_integrity()
            out["integrity"] = problems or "ok"
    print(json.dumps(out, indent=2))
    return 1 if check and problems else 0


async def _until_signal(main: Awaitable[None]) -> None:
    """Run ``main`` until it ends or SIGTERM / SIGINT cancels it (its ``finally`` blocks
    then close what it opened, and the command exits 0)."""
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _replicate(config: NodeConfig) -> int:
    from store_node.log import configure_logging
    from store_node.node import listen_error
    from store_node.replication import ReplicationService

    configure_logging(config.log.level)
    if not config.replication.enabled:
        raise ConfigError("[replication] has neither listen nor peers: nothing to do")
    _share_the_gil()
    try:
        asyncio.run(_until_signal(ReplicationService(config.replication).run()))
    except OSError as exc:
        # Peers' failures are logged and retried inside: what reaches here is the bind.
        raise listen_error("replication", config.replication.listen, exc) from None
    return 0


def _sync(config: NodeConfig, ns: argparse.Namespace) -> int:
    from store_node.replication import sync_command

    return sync_command(config.replication, ns.peer, progress=not ns.no_progress)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``store-node`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "analytics":
        # Lazy: pyspark is heavy and optional; the rest of the CLI must work without it.
        return _analytics(args[1:])
    ns = _parser().parse_args(args)
    try:
        config = load_config(ns.config)
        if ns.command == "serve":
            return _serve(config)
        if ns.command == "check-config":
            return _check_config(config)
        if ns.command == "replicate":
            return _replicate(config)
        if ns.command == "sync":
            return _sync(config, ns)
        if ns.command == "collection":
            from store_node.collection import catch_up_command

            return catch_up_command(
                config.collection,
                ns.peer,
                ns.root,
                progress=not ns.no_progress,
                push=not ns.pull_only,
            )
        if ns.command == "export":
            return _export(config, ns)
        return _stats(config, ns.check)
    except ConfigError as exc:
        _error(exc)
        return 2
    except (StoreNodeError, TransportError) as exc:
        # TransportError: e.g. the broker refused the first connection.
        _error(exc)
        return 1


def _error(exc: Exception) -> None:
    """One line on stderr, whatever the message holds."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    print(f"store-node: {text[:1000]}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
