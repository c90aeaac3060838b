"""``python -m sdk.sync``: serve or sync a document store over TCP (for scripts and tests).

::

    python -m sdk.sync serve --db FILE --schema ID [--schema ID ...] [--port 0]
        [--max-connections N] [--idle-timeout S] [--frame-deadline S]
    python -m sdk.sync sync  --db FILE --schema ID [--mode rbsr|log-height]
        [--tls-ca FILE [--tls-cert FILE --tls-key FILE]] HOST:PORT

``serve`` prints ``listening HOST:PORT`` on stdout once it accepts connections
and serves until killed, under :class:`transports.guarded.ListenerLimits` (the
options change the cap on connections at once, the seconds a connection may be
idle and the seconds a frame may take from its first byte to its last; ``0``
turns a timeout off); ``sync`` runs one session and prints its result as JSON.
Application schemas must be known to the store: ``--schema-json FILE`` adds
schemas described as ``{"name", "view_id", "description", "fields"}``.
``--tls-ca`` dials a listener with TLS (a store node's ``[replication]`` with
``tls_cert``), ``--tls-cert``/``--tls-key`` present a client certificate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from sdk.documents import application_schemas
from sdk.sync.driver import serve_stream, sync
from sdk.sync.errors import SyncError
from sdk.sync.framing import FrameMeter
from sdk.sync.messages import Mode
from sdk.sync.run import serve_listening
from sdk.sync.store import SyncStore
from transports.guarded import ListenerLimits, add_tls_arguments, tls_from_arguments
from transports.stream import TcpStream, connect_tcp, serve_tcp


def open_store(ns: argparse.Namespace) -> SyncStore:
    """The store of ``--db``, with the application schemas of ``--schema-json`` (a JSON
    list of objects) registered."""
    store = SyncStore(ns.db)
    for schema in application_schemas(ns.schema_json) if ns.schema_json else ():
        store.add_schema(schema)
    return store


async def _serve(ns: argparse.Namespace) -> int:
    store = open_store(ns)

    async def handle(stream: TcpStream) -> None:
        await serve_stream(store, stream, ns.schema)

    limits = ListenerLimits(
        max_connections=ns.max_connections,
        idle_timeout_s=ns.idle_timeout or None,
        frame_deadline_s=ns.frame_deadline or None,
    )
    server = await serve_tcp(handle, ns.host, ns.port, limits=limits, meter=FrameMeter)
    await serve_listening(server)
    return 0


async def _sync(ns: argparse.Namespace) -> int:
    store = open_store(ns)
    host, _, port = ns.peer.rpartition(":")
    stream = await connect_tcp(host, int(port), ssl=tls_from_arguments(ns))
    mode = Mode.LOG_HEIGHT if ns.mode == "log-height" else Mode.SET_RECONCILIATION
    try:
        done = await sync(store, stream, ns.schema, mode=mode)
    except SyncError as exc:
        print(json.dumps({"error": type(exc).__name__, "detail": str(exc)}))
        return 1
    finally:
        store.close()
    print(json.dumps({"received": done.entries_received, "sent": done.entries_sent}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m sdk.sync")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("serve", "sync"):
        p = sub.add_parser(name)
        p.add_argument("--db", required=True, help="SQLite file of the document store")
        p.add_argument("--schema", action="append", required=True, help="schema id to replicate")
        p.add_argument("--schema-json", help="application schemas to register (JSON list)")
    serve = sub.choices["serve"]
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0)
    defaults = ListenerLimits()
    serve.add_argument("--max-connections", type=int, default=defaults.max_connections)
    serve.add_argument("--idle-timeout", type=float, default=defaults.idle_timeout_s)
    serve.add_argument("--frame-deadline", type=float, default=defaults.frame_deadline_s)
    sync_p = sub.choices["sync"]
    sync_p.add_argument("--mode", choices=["rbsr", "log-height"], default="rbsr")
    sync_p.add_argument("peer", help="HOST:PORT")
    add_tls_arguments(sync_p)
    ns = parser.parse_args(argv)
    return asyncio.run(_serve(ns) if ns.command == "serve" else _sync(ns))


if __name__ == "__main__":
    sys.exit(main())
