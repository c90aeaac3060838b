"""``python -m sdk.sync.bamboo_p2p``: serve or replicate Bamboo logs over TCP (scripts, tests).

::

    python -m sdk.sync.bamboo_p2p serve --db FILE [--host 127.0.0.1] [--port 0]
        [--compression-window N]
    python -m sdk.sync.bamboo_p2p replicate --db FILE --author HEX [--log-id 0]
        --start N [--end N] [--lower N] [--sparse] [--payload-only]
        [--offset N | --resume] [--compression-window N]
        [--tls-ca FILE [--tls-cert FILE --tls-key FILE]] HOST:PORT

``serve`` answers every connection from the SQLite log store ``FILE``
(:class:`~sdk.sync.bamboo_p2p.SqliteLogStore`), prints ``listening HOST:PORT``
once it accepts connections, and serves until killed. ``replicate`` runs one
request into ``FILE`` and prints its outcome as one JSON line. ``--payload-only``
asks for the payloads of entries ``FILE`` holds; ``--offset N`` starts inside the
payload of ``--start``; ``--resume`` uses the length of the prefix ``FILE`` kept of that
payload when an earlier connection was cut (nothing to resume: a plain request).
``--compression-window N`` announces an LZFoo window of N bytes (payloads are
compressed only when both sides announce one). ``--tls-ca`` dials a listener with
TLS (a store node's ``[bamboo_p2p]`` with ``tls_cert``), ``--tls-cert``/``--tls-key``
present a client certificate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from sdk.sync.bamboo_p2p.sqlite_store import SqliteLogStore
from transports.guarded import add_tls_arguments, tls_from_arguments
from transports.stream import TcpStream, connect_tcp, serve_tcp


async def _serve(ns: argparse.Namespace) -> None:
    from sdk.sync.bamboo_driver import serve_bamboo

    store = SqliteLogStore(ns.db)

    from sdk.sync.bamboo_p2p.endpoint import EndpointConfig

    config = EndpointConfig(compression_window=ns.compression_window)

    async def handle(stream: TcpStream) -> None:
        await serve_bamboo(store, stream, config)

    server = await serve_tcp(handle, ns.host, ns.port)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"listening {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


async def _replicate(ns: argparse.Namespace) -> int:
    from sdk.sync.bamboo_driver import ConnectionLost, replicate_range
    from sdk.sync.bamboo_p2p.endpoint import EndpointConfig
    from sdk.sync.bamboo_p2p.errors import LocalProtocolError, RemoteProtocolError

    store = SqliteLogStore(ns.db)
    host, _, port = ns.peer.rpartition(":")
    log = (bytes.fromhex(ns.author), ns.log_id)
    offset = ns.offset
    if ns.resume:
        from sdk.sync.bamboo_p2p.store import resume_offset

        offset = resume_offset(store, log, ns.start)
    try:
        stream = await connect_tcp(host, int(port), ssl=tls_from_arguments(ns))
        outcome = await replicate_range(
            store,
            stream,
            log,
            ns.start,
            end=ns.end,
            lower=ns.lower,
            sparse=ns.sparse,
            payload_only=ns.payload_only,
            offset=offset,
            config=EndpointConfig(compression_window=ns.compression_window),
        )
    except (OSError, ConnectionLost, RemoteProtocolError, LocalProtocolError) as exc:
        print(json.dumps({"error": type(exc).__name__, "detail": str(exc)}))
        return 1
    finally:
        store.close()
    print(
        json.dumps(
            {
                "complete": outcome.complete,
                "peer_reason": None if outcome.peer_reason is None else int(outcome.peer_reason),
                "stalled": outcome.stalled is not None,
            }
        )
    )
    return 0 if outcome.complete else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m sdk.sync.bamboo_p2p")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a SQLite log store")
    serve.add_argument("--db", required=True, help="SQLite file of the log store")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--compression-window", type=int, default=0, help="LZFoo window")
    rep = sub.add_parser("replicate", help="replicate one range of a log")
    rep.add_argument("--db", required=True, help="SQLite file of the log store")
    rep.add_argument("--author", required=True, help="author public key, hex")
    rep.add_argument("--log-id", type=int, default=0)
    rep.add_argument("--start", type=int, required=True)
    rep.add_argument("--end", type=int, default=None)
    rep.add_argument("--lower", type=int, default=1, help="lower certpool info")
    rep.add_argument("--sparse", action="store_true")
    rep.add_argument("--payload-only", action="store_true", help="payloads only, no metadata")
    start_at = rep.add_mutually_exclusive_group()
    start_at.add_argument("--offset", type=int, default=None, help="start inside the payload")
    start_at.add_argument("--resume", action="store_true", help="resume a cut payload")
    rep.add_argument("--compression-window", type=int, default=0, help="LZFoo window")
    rep.add_argument("peer", help="HOST:PORT")
    add_tls_arguments(rep)
    ns = parser.parse_args(argv)
    if ns.command == "serve":
        asyncio.run(_serve(ns))
        return 0
    return asyncio.run(_replicate(ns))


if __name__ == "__main__":
    sys.exit(main())
