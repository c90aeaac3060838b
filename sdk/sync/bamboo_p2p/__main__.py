"""``python -m sdk.sync.bamboo_p2p``: serve or replicate Bamboo logs over TCP (scripts, tests).

::

    python -m sdk.sync.bamboo_p2p serve --db FILE [--host 127.0.0.1] [--port 0]
        [--compression-window N]
    python -m sdk.sync.bamboo_p2p replicate --db FILE --author HEX [--log-id 0]
        --start N [--end N] [--lower N] [--sparse] [--payload-only]
        [--offset N | --resume] [--compression-window N] [--stall-timeout S]
        [--tls-ca FILE [--tls-cert FILE --tls-key FILE]] HOST:PORT

``serve`` answers every connection from the SQLite log store ``FILE``
(:class:`~sdk.sync.bamboo_p2p.SqliteLogStore`), prints ``listening HOST:PORT``
once it accepts connections, and serves until killed. ``replicate`` runs one
request into ``FILE`` and prints its outcome as one JSON line (its keys, an example,
and why a range neither side holds stalls: docs/bamboo-p2p.md, "The command line").
``--payload-only`` asks for the payloads of entries ``FILE`` holds; ``--offset N``
starts inside the payload of ``--start``; ``--resume`` uses the length of the prefix
``FILE`` kept of that payload when an earlier connection was cut (nothing to resume:
a plain request). ``--compression-window N`` announces an LZFoo window of N bytes
(payloads are compressed only when both sides announce one). ``--tls-ca`` dials a
listener with TLS (a store node's ``[bamboo_p2p]`` with ``tls_cert``),
``--tls-cert``/``--tls-key`` present a client certificate. Exit codes: 0 complete,
1 not complete or the connection failed (one line on stderr saying why), 2 bad
arguments (one line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from sdk.sync.bamboo_p2p.driver import BambooConnection, ConnectionLost, serve_bamboo
from sdk.sync.bamboo_p2p.endpoint import Endpoint, EndpointConfig
from sdk.sync.bamboo_p2p.errors import LocalProtocolError, RemoteProtocolError
from sdk.sync.bamboo_p2p.messages import MAX_U64
from sdk.sync.bamboo_p2p.setup import Role
from sdk.sync.bamboo_p2p.sqlite_store import SqliteLogStore
from sdk.sync.bamboo_p2p.store import resume_offset
from sdk.sync.run import serve_listening
from transports.guarded import add_tls_arguments, tls_from_arguments
from transports.stream import TcpStream, connect_tcp, serve_tcp

PROG = "python -m sdk.sync.bamboo_p2p"
#: Seconds ``replicate`` waits without progress before it gives up: long enough for a
#: peer's answer to arrive, short enough that a log the peer lacks is said at once.
STALL_TIMEOUT = 3.0


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (``PROG: ...``) and exit 2."""

    def error(self, message: str) -> NoReturn:
        _fail(message)


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"{PROG}: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(code)


def _bound(option: str, value: float | None, lowest: float, highest: float, must: str) -> None:
    """Exit 2 saying ``OPTION must MUST, got VALUE`` unless ``value`` is in
    ``lowest..highest`` (an option not given, ``None``, is)."""
    if value is not None and not lowest <= value <= highest:
        _fail(f"{option} must {must}, got {value}")


def _check(ns: argparse.Namespace) -> None:
    """Every argument the parser could not judge: one line, exit 2."""
    folder = Path(ns.db).parent
    if not folder.is_dir():
        _fail(f"--db {ns.db}: folder {folder} does not exist")
    _bound("--compression-window", ns.compression_window, 0, 1 << 24, "be in 0..16777216")
    if ns.command == "serve":
        _bound("--port", ns.port, 0, 65535, "be in 0..65535")
        return
    try:
        author = bytes.fromhex(ns.author)
    except ValueError:
        author = b""
    if len(author) != 32:
        _fail(f"--author must be an ed25519 public key: 64 hex digits, got {ns.author!r}")
    _bound("--log-id", ns.log_id, 0, MAX_U64, "be in 0..2^64-1")
    _bound("--start", ns.start, 1, MAX_U64, "be a sequence number (1 or more)")
    _bound("--end", ns.end, ns.start, MAX_U64, f"be at least --start ({ns.start})")
    _bound("--lower", ns.lower, 1, ns.start, f"be in 1..--start ({ns.start})")
    _bound("--offset", ns.offset, 0, math.inf, "not be negative")
    if not ns.stall_timeout > 0:
        _fail(f"--stall-timeout must be a positive number of seconds, got {ns.stall_timeout}")
    host, _, port = ns.peer.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        _fail(f"PEER must be HOST:PORT, got {ns.peer!r}")


async def _serve(ns: argparse.Namespace) -> int:
    store = SqliteLogStore(ns.db)
    config = EndpointConfig(compression_window=ns.compression_window)

    async def handle(stream: TcpStream) -> None:
        await serve_bamboo(store, stream, config)

    try:
        server = await serve_tcp(handle, ns.host, ns.port)
    except OSError as exc:
        store.close()
        _fail(f"cannot listen on {ns.host}:{ns.port}: {exc.strerror or exc}", 1)
    await serve_listening(server)
    return 0


def _stalled_detail(ns: argparse.Namespace, seq_num: int, payload: bool) -> str:
    piece = f"the payload of entry {seq_num}" if payload else f"entry {seq_num}"
    where = f"log {ns.author[:16]}.../{ns.log_id}"
    lacks = (
        f"the peer has no payload for entry {seq_num} of {where}"
        if payload
        else f"the peer does not have {where} from entry {seq_num} on (or at all)"
    )
    return (
        f"no progress for {ns.stall_timeout:g} s: neither side holds {piece}, so {lacks}; "
        "nothing more can come on this connection (--stall-timeout to wait longer)"
    )


async def _replicate(ns: argparse.Namespace) -> int:
    store = SqliteLogStore(ns.db)
    host, _, port = ns.peer.rpartition(":")
    log = (bytes.fromhex(ns.author), ns.log_id)
    offset = resume_offset(store, log, ns.start) if ns.resume else ns.offset
    config = EndpointConfig(compression_window=ns.compression_window)
    endpoint = Endpoint(Role.PROACTIVE, store, config)
    began = time.monotonic()
    try:
        stream = await connect_tcp(host, int(port), ssl=tls_from_arguments(ns))
        async with BambooConnection(endpoint, stream, stall_timeout=ns.stall_timeout) as connection:
            outcome = await connection.replicate(
                log,
                ns.start,
                end=ns.end,
                lower=ns.lower,
                sparse=ns.sparse,
                payload_only=ns.payload_only,
                offset=offset,
            )
    except LocalProtocolError as exc:
        _fail(f"replicate: {exc}")  # what the endpoint refuses to propose (an offset, no entry)
    except (OSError, ConnectionLost, RemoteProtocolError) as exc:
        print(json.dumps({"complete": False, "error": type(exc).__name__, "detail": str(exc)}))
        _fail(f"replicate with {ns.peer} failed: {exc}", 1)
    finally:
        store.close()
    reason = outcome.peer_reason
    result: dict[str, object] = {
        "complete": outcome.complete,
        "peer_reason": None if reason is None else int(reason),
        "peer_reason_name": None if reason is None else reason.name.lower(),
        "peer_reason_meaning": None if reason is None else reason.meaning,
        "stalled": outcome.stalled is not None,
    }
    stats = endpoint.stats
    result.update(
        entries_received=stats.entries_received,
        entries_sent=stats.entries_sent,
        payloads_received=stats.payloads_received,
        payloads_sent=stats.payloads_sent,
        payload_bytes_received=stats.payload_bytes_received,
        payload_bytes_sent=stats.payload_bytes_sent,
        wire_bytes_received=stats.bytes_received,
        wire_bytes_sent=stats.bytes_sent,
        seconds=round(time.monotonic() - began, 3),
    )
    if outcome.stalled is not None:
        result["detail"] = _stalled_detail(ns, outcome.stalled.seq_num, outcome.stalled.payload)
    elif outcome.dropped:
        result["detail"] = "the peer's concurrent proposal overlapped this one: propose again"
    elif not outcome.complete and reason is not None:
        result["detail"] = f"the peer cancelled with {int(reason)}: {reason.meaning}"
    print(json.dumps(result))
    if "detail" in result:
        print(f"{PROG}: replicate: {result['detail']}", file=sys.stderr)
    return 0 if outcome.complete else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    parser = _Parser(prog=PROG)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = sub.add_parser("serve", help="serve a SQLite log store")
    rep = sub.add_parser("replicate", help="replicate one range of a log")
    for p in (serve, rep):
        p.add_argument("--db", required=True, help="SQLite file of the log store")
        p.add_argument("--compression-window", type=int, default=0, help="LZFoo window")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0)
    rep.add_argument("--author", required=True, help="author public key, 64 hex digits")
    rep.add_argument("--log-id", type=int, default=0)
    rep.add_argument("--start", type=int, required=True)
    rep.add_argument("--end", type=int, default=None)
    rep.add_argument("--lower", type=int, default=1, help="lower certpool info")
    rep.add_argument("--sparse", action="store_true")
    rep.add_argument("--payload-only", action="store_true", help="payloads only, no metadata")
    start_at = rep.add_mutually_exclusive_group()
    start_at.add_argument("--offset", type=int, default=None, help="start inside the payload")
    start_at.add_argument("--resume", action="store_true", help="resume a cut payload")
    stall = "give up after this many seconds without progress (default %(default)g)"
    rep.add_argument("--stall-timeout", type=float, default=STALL_TIMEOUT, help=stall)
    rep.add_argument("peer", help="HOST:PORT")
    add_tls_arguments(rep)
    ns = parser.parse_args(argv)
    _check(ns)
    return asyncio.run(_serve(ns) if ns.command == "serve" else _replicate(ns))


if __name__ == "__main__":
    sys.exit(main())
