"""The ``store-node`` command.

::

    store-node serve  --config FILE                 run the node until SIGTERM/SIGINT
    store-node export --config FILE --out DIR       archive -> Parquet (docs/archive-export.md)
    store-node stats  --config FILE [--check]       archive summary as JSON (+ integrity check)
    store-node analytics ...                        Spark jobs (store_node.analytics.cli)
    store-node replicate --config FILE              serve p2panda replication ([replication])
    store-node sync PEER --config FILE              one replication session with PEER

Exit codes: 0 ok, 1 runtime failure (archive, integrity), 2 bad configuration
or arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict

from store_node.config import NodeConfig, load_config
from store_node.errors import ConfigError, StoreNodeError
from transports.base import TransportError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="store-node", description="Chorus store node: archive SDS channels, serve them."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the store node")
    serve.add_argument("--config", required=True, help="TOML configuration file")
    export = sub.add_parser("export", help="export the archive to Parquet")
    export.add_argument("--config", required=True)
    export.add_argument("--out", required=True, help="output folder (Hive layout)")
    export.add_argument(
        "--max-file-mb", type=int, default=128, help="roll to a new part file after this"
    )
    export.add_argument("--overwrite", action="store_true", help="replace an existing export")
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


def _serve(config: NodeConfig) -> int:
    from store_node.log import configure_logging
    from store_node.node import StoreNode

    configure_logging(config.log.level)
    if not config.ingest.channels:
        raise ConfigError("[ingest] channels is empty: nothing to archive")
    asyncio.run(StoreNode(config).run())
    return 0


def _export(config: NodeConfig, ns: argparse.Namespace) -> int:
    from store_node.archive import open_archive
    from store_node.export import export_archive

    with open_archive(config.archive) as archive:
        summary = export_archive(
            archive,
            ns.out,
            max_file_bytes=ns.max_file_mb * 1024 * 1024,
            overwrite=ns.overwrite,
            progress=not ns.no_progress,
        )
    print(json.dumps({"rows": summary.rows, "files": len(summary.files), "out": ns.out}))
    return 0


def _stats(config: NodeConfig, check: bool) -> int:
    from store_node.archive import open_archive

    if config.archive.backend == "sqlite" and not config.archive.path.exists():
        raise StoreNodeError(f"no archive at {config.archive.path}")
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


def _replicate(config: NodeConfig) -> int:
    from store_node.log import configure_logging
    from store_node.replication import ReplicationService

    configure_logging(config.log.level)
    if not config.replication.enabled:
        raise ConfigError("[replication] has neither listen nor peers: nothing to do")
    asyncio.run(ReplicationService(config.replication).run())
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
        if ns.command == "replicate":
            return _replicate(config)
        if ns.command == "sync":
            return _sync(config, ns)
        if ns.command == "export":
            return _export(config, ns)
        return _stats(config, ns.check)
    except ConfigError as exc:
        print(f"store-node: {exc}", file=sys.stderr)
        return 2
    except (StoreNodeError, TransportError) as exc:
        # TransportError: e.g. the broker refused the first connection.
        print(f"store-node: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
