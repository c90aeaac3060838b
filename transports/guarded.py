"""Listeners that do not hold whoever connects: limits, deadlines, TLS and peer authentication.

:class:`GuardedListener` is the one serving path of the store node's stream
listeners (``[replication]``, ``[collection]``, ``[bamboo_p2p]``,
``[store_sync]``). It accepts TCP connections like
:func:`transports.stream.serve_tcp` and hands each handler a
:class:`GuardedStream`, under :class:`ListenerLimits`:

* **a connection cap** (``max_connections``): one more is closed on accept,
  before a TLS handshake or a protocol byte;
* **TLS** (:class:`TlsServer`): the handshake must finish within
  ``handshake_timeout_s``; with ``client_ca_file`` a client must present a
  certificate that CA signed (mutual TLS), and with ``client_fingerprints``
  its certificate's SHA-256 must be on that list. A peer that fails either is
  closed before the handler runs, so no protocol byte of it is ever read;
* **an idle timeout** (``idle_timeout_s``): the handler waits for the peer and
  no byte moved either way for this long;
* **a write timeout** (``write_timeout_s``): one write waited this long for the
  peer to take our bytes (a peer that stops reading);
* **a frame deadline** (``frame_deadline_s``): a frame whose first byte has been
  read must be complete this many seconds later. A trickle (one byte a second)
  resets the idle timer but not this one. The listener follows frame boundaries
  with the protocol's frame meter, a :class:`FrameBoundaries` (``sdk.sync.framing.FrameMeter``,
  ``sdk.sync.bamboo_p2p.framing.ChannelFrameMeter``), which counts bytes and
  keeps none;
* **a memory budget** (``max_buffered_bytes``): the bytes of partly received
  frames, summed over the listener's connections; the connection whose read
  takes the sum over the budget is cut. What one connection holds is bounded
  by its protocol's largest frame plus the stream reader's buffer
  (:data:`transports.stream.READ_LIMIT`, twice over before asyncio stops
  reading the socket).

One watchdog task per listener checks the deadlines every quarter of the
shortest one; a connection past one is aborted (its handler's next read or
write raises :class:`~transports.stream.StreamClosed`, so its buffers go with
it), and a second after a burst of closes that held large frames the process
collects and trims its heap (:func:`release_freed_memory`). Every refusal and
cut is counted by reason (:attr:`GuardedListener.refused`,
:attr:`GuardedListener.cut`); the store node exports them
(``chorus_store_listener_*``, :mod:`store_node.metrics`).

Clients pass :func:`tls_client_context` to :func:`transports.stream.connect_tcp`;
command lines take ``--tls-ca``, ``--tls-cert``, ``--tls-key``
(:func:`add_tls_arguments`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import hashlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from transports.stream import READ_LIMIT, StreamClosed, TcpStream, stop_tcp_server

log = logging.getLogger("transports.guarded")

#: Why a connection was refused before its handler ran.
REFUSALS = ("capacity", "tls", "peer_not_allowed")
#: Why an open connection was cut off.
CUTS = ("idle", "write_timeout", "frame_deadline", "memory")


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """What one listener allows its peers; ``None`` turns a timeout off."""

    #: Connections at once; one more is closed on accept.
    max_connections: int = 256
    #: Seconds without a byte either way while the handler waits for the peer.
    idle_timeout_s: float | None = 300.0
    #: Seconds one write may wait for the peer to take our bytes.
    write_timeout_s: float | None = 60.0
    #: Seconds from a frame's first byte read to its last.
    frame_deadline_s: float | None = 30.0
    #: Bytes of partly received frames over all the listener's connections.
    max_buffered_bytes: int = 64 * 1024 * 1024
    #: Seconds a TLS handshake may take (TLS listeners only).
    handshake_timeout_s: float = 10.0

    def tick(self) -> float:
        """How often the watchdog looks: a quarter of the shortest deadline (20 ms..1 s)."""
        deadlines = [
            d
            for d in (self.idle_timeout_s, self.write_timeout_s, self.frame_deadline_s)
            if d is not None
        ]
        return min(1.0, max(0.02, min(deadlines, default=4.0) / 4))


def fingerprint(certificate_der: bytes) -> str:
    """A certificate's SHA-256 fingerprint: 64 lowercase hex digits (``openssl x509
    -fingerprint -sha256`` prints the same digits, upper case with colons)."""
    return hashlib.sha256(certificate_der).hexdigest()


def normalize_fingerprint(text: str) -> str:
    """``text`` as :func:`fingerprint` spells it (colons and case ignored); ValueError if
    it is not 32 bytes of hex."""
    digits = text.replace(":", "").strip().lower()
    if len(digits) != 64 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"not a SHA-256 fingerprint: {text[:80]!r}")
    return digits


@dataclass(frozen=True, slots=True)
class TlsServer:
    """A listener's TLS: its certificate, and who may connect."""

    #: PEM certificate chain and its private key.
    cert_file: Path
    key_file: Path
    #: PEM CA bundle: clients must present a certificate it signed (mutual TLS).
    client_ca_file: Path | None = None
    #: SHA-256 fingerprints (:func:`fingerprint`) of the client certificates allowed;
    #: empty: any the CA signed. Needs ``client_ca_file``.
    client_fingerprints: frozenset[str] = field(default_factory=frozenset)

    def context(self) -> ssl.SSLContext:
        """The server context (TLS 1.2 or later); raises ``OSError`` / ``ssl.SSLError``
        for files that cannot be read."""
        if self.client_fingerprints and self.client_ca_file is None:
            raise ValueError("client fingerprints need a client CA file")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file is not None:
            context.load_verify_locations(cafile=self.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def tls_client_context(
    ca_file: str | Path | None = None,
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
    *,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client context trusting ``ca_file`` (the system's CAs without one), presenting
    ``cert_file``/``key_file`` when given (for listeners that ask for a client
    certificate). ``check_hostname``: the server's certificate must name the host
    dialled (an IP address must be in its subjectAltName)."""
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=None if ca_file is None else str(ca_file)
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = check_hostname
    if cert_file is not None:
        context.load_cert_chain(str(cert_file), None if key_file is None else str(key_file))
    return context


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """``--tls-ca``, ``--tls-cert``, ``--tls-key``: how a command line client dials a
    listener with TLS (read back with :func:`tls_from_arguments`)."""
    group = parser.add_argument_group("TLS (listeners with tls_cert)")
    group.add_argument("--tls-ca", metavar="FILE", help="PEM CA bundle to trust (turns TLS on)")
    group.add_argument(
        "--tls-cert", metavar="FILE", help="PEM client certificate (listeners with tls_client_ca)"
    )
    group.add_argument("--tls-key", metavar="FILE", help="PEM key of --tls-cert")


def tls_from_arguments(ns: argparse.Namespace) -> ssl.SSLContext | None:
    """The client context :func:`add_tls_arguments`'s options ask for (None: plain TCP)."""
    if ns.tls_ca is None and ns.tls_cert is None:
        return None
    return tls_client_context(ns.tls_ca, ns.tls_cert, ns.tls_key)


class FrameBoundaries(Protocol):
    """Follows a protocol's frame boundaries through its byte stream, keeping no bytes."""

    @property
    def partial(self) -> int:
        """Bytes read of the frame in progress (0 between frames)."""
        ...

    @property
    def completed(self) -> int:
        """Frames completed so far."""
        ...

    def feed(self, data: bytes) -> None:
        """Account for the next bytes read."""
        ...


class GuardedStream(TcpStream):
    """A :class:`~transports.stream.TcpStream` watched by its :class:`GuardedListener`.

    Reads and writes pass through; the listener's watchdog aborts the connection
    when a deadline passes, and the handler's read or write then raises
    :class:`~transports.stream.StreamClosed` naming the reason.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        listener: GuardedListener,
        meter: FrameBoundaries,
    ) -> None:
        super().__init__(reader, writer)
        self._listener = listener
        self._meter = meter
        now = time.monotonic()
        #: When a byte last moved either way.
        self.last_activity = now
        self.reading_since: float | None = None
        self.writing_since: float | None = None
        #: When the first byte of the frame in progress was read (None between frames).
        self.frame_since: float | None = None
        #: Bytes of the frame in progress, as counted in the listener's budget.
        self.partial = 0
        #: The most :attr:`partial` has been.
        self.largest_partial = 0
        #: Why the listener cut this connection off (None while it is not).
        self.cut_reason: str | None = None

    @property
    def peer_certificate(self) -> bytes | None:
        """The client's certificate (DER) on a TLS connection that asked for one."""
        ssl_object = self.extra_info("ssl_object")
        return None if ssl_object is None else ssl_object.getpeercert(binary_form=True)

    def _closed(self) -> StreamClosed:
        return StreamClosed(f"cut off by the listener: {self.cut_reason}")

    async def read(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` bytes; ``b""`` once the peer closed its side."""
        if self.cut_reason is not None:
            raise self._closed()
        self.reading_since = time.monotonic()
        try:
            data = await super().read(max_bytes)
        finally:
            self.reading_since = None
        if self.cut_reason is not None:
            raise self._closed()
        if data:
            now = self.last_activity = time.monotonic()
            meter = self._meter
            completed = meter.completed
            meter.feed(data)
            partial = meter.partial
            if not partial:
                self.frame_since = None
            elif self.frame_since is None or meter.completed != completed:
                self.frame_since = now
            self._listener._account(self, partial)
            if self.cut_reason is not None:
                raise self._closed()
        return data

    async def write(self, data: bytes) -> None:
        """Send ``data``; waits while the peer does not keep up (within the write timeout)."""
        if self.cut_reason is not None:
            raise self._closed()
        self.writing_since = time.monotonic()
        try:
            await super().write(data)
        except StreamClosed:
            if self.cut_reason is not None:
                raise self._closed() from None
            raise
        finally:
            self.writing_since = None
        if self.cut_reason is not None:
            # An aborted transport can release a waiting drain without an error.
            raise self._closed()
        self.last_activity = time.monotonic()

    def cut(self, reason: str) -> None:
        """Abort the connection now (``reason``: one of :data:`CUTS`)."""
        if self.cut_reason is not None:
            return
        self.cut_reason = reason
        self.abort()

    def overdue(self, now: float, limits: ListenerLimits) -> str | None:
        """The deadline this connection has passed at ``now``, if any."""
        if (
            limits.write_timeout_s is not None
            and self.writing_since is not None
            and now - self.writing_since > limits.write_timeout_s
        ):
            return "write_timeout"
        if (
            limits.frame_deadline_s is not None
            and self.frame_since is not None
            and now - self.frame_since > limits.frame_deadline_s
        ):
            return "frame_deadline"
        if (
            limits.idle_timeout_s is not None
            and self.reading_since is not None
            and self.writing_since is None
            and now - max(self.reading_since, self.last_activity) > limits.idle_timeout_s
        ):
            return "idle"
        return None


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None  # not glibc: nothing to do
    return trim


_malloc_trim = _find_malloc_trim()

#: Seconds after the last close of a connection that held a large partial frame
#: before the heap is trimmed (one trim for a burst of closes).
TRIM_DELAY_S = 1.0
#: A closed connection whose partial frame reached this many bytes asks for a trim.
TRIM_AFTER_BYTES = 256 * 1024


def release_freed_memory() -> None:
    """Free what closed connections left and hand the pages back to the system.

    A connection's buffers can outlive it in reference cycles (an exception's
    traceback holds the frames that hold them) until the cyclic collector's next
    full pass, and glibc keeps freed pages: after 300 peers each left a 1 MiB
    frame half-sent, the node stayed 100 MB above its level without this
    (``bench/listeners.py``). Hence a full collection, then glibc's
    ``malloc_trim`` (skipped where there is none).
    """
    gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)


class _NoFrames:
    """A meter for a protocol without known framing: frame deadline and budget stay idle."""

    partial = 0
    completed = 0

    def feed(self, data: bytes) -> None:
        pass


class GuardedListener:
    """A TCP listener under :class:`ListenerLimits` and optional :class:`TlsServer`.

    ``handler`` runs once per admitted connection with its :class:`GuardedStream`,
    which is closed when the handler returns. ``meter`` makes a fresh
    :class:`FrameBoundaries` per connection (none: the frame deadline and memory budget
    stay idle). ``name`` labels logs and metrics.
    """

    def __init__(
        self,
        name: str,
        handler: Callable[[GuardedStream], Awaitable[None]],
        limits: ListenerLimits | None = None,
        *,
        tls: TlsServer | None = None,
        meter: Callable[[], FrameBoundaries] | None = None,
    ) -> None:
        self.name = name
        self.limits = limits or ListenerLimits()
        self.tls = tls
        self._handler = handler
        self._meter = meter or _NoFrames
        self._context = tls.context() if tls is not None else None
        self.port = 0
        #: Connections refused before their handler ran, by reason (:data:`REFUSALS`).
        self.refused: dict[str, int] = dict.fromkeys(REFUSALS, 0)
        #: Connections cut off, by reason (:data:`CUTS`).
        self.cut: dict[str, int] = dict.fromkeys(CUTS, 0)
        #: Connections accepted (handed to the handler) since start.
        self.accepted = 0
        #: Bytes of partly received frames now held, over every connection.
        self.buffered_bytes = 0
        self._streams: set[GuardedStream] = set()
        self._tasks: set[asyncio.Future[Any]] = set()
        self._server: asyncio.Server | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._trim: asyncio.TimerHandle | None = None

    @property
    def open_connections(self) -> int:
        """Connections accepted and not yet closed (handshakes in progress included)."""
        return len(self._tasks)

    @property
    def server(self) -> asyncio.Server | None:
        """The asyncio server while started (``None`` before :meth:`start` and after
        :meth:`close`)."""
        return self._server

    @property
    def serving(self) -> bool:
        """Whether the listener accepts connections."""
        return self._server is not None and self._server.is_serving()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on ``host:port``; return the bound port."""
        self._server = await asyncio.start_server(self._accept, host, port, limit=READ_LIMIT)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._watchdog = asyncio.create_task(self._watch(), name=f"{self.name}-watchdog")
        return self.port

    async def close(self, connection_timeout: float | None = 10.0) -> bool:
        """Stop accepting, cancel open connections (waiting up to ``connection_timeout``
        seconds for them); return whether the listener closed in time."""
        if self._trim is not None:
            self._trim.cancel()
            self._trim = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        closed = await stop_tcp_server(
            self._server, self._tasks, connection_timeout=connection_timeout
        )
        self._server = None
        return closed

    def _refuse(self, writer: asyncio.StreamWriter, reason: str) -> None:
        self.refused[reason] += 1
        log.warning(
            "connection refused",
            extra={"listener": self.name, "reason": reason, "peer": _peer(writer)},
        )
        writer.transport.abort()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._tasks) >= self.limits.max_connections:
            self._refuse(writer, "capacity")
            return
        self._tasks.add(task)
        try:
            if self._context is not None and not await self._handshake(writer):
                return
            stream = GuardedStream(reader, writer, self, self._meter())
            self._streams.add(stream)
            self.accepted += 1
            try:
                await self._handler(stream)
            except asyncio.CancelledError:
                pass  # the listener is closing; the connection ends here
            except StreamClosed as exc:
                log.info("connection closed", extra={"listener": self.name, "error": str(exc)})
            except Exception as exc:
                # Not the peer's doing (protocols end their sessions on bad input):
                # a bug or a broken store; say so rather than drop the connection mutely.
                log.error(
                    "connection handler failed",
                    extra={"listener": self.name, "peer": stream.peer, "error": repr(exc)},
                )
            finally:
                self._streams.discard(stream)
                self._account(stream, 0)
                with contextlib.suppress(asyncio.CancelledError):
                    await stream.close()
                if stream.largest_partial >= TRIM_AFTER_BYTES:
                    self._trim_soon()
        except asyncio.CancelledError:
            writer.transport.abort()
        finally:
            self._tasks.discard(task)

    def _trim_soon(self) -> None:
        # Each large close pushes the trim back: one trim after a burst has ended.
        if self._trim is not None:
            self._trim.cancel()
        self._trim = asyncio.get_running_loop().call_later(TRIM_DELAY_S, self._trimmed)

    async def _handshake(self, writer: asyncio.StreamWriter) -> bool:
        assert self._context is not None and self.tls is not None
        try:
            async with asyncio.timeout(self.limits.handshake_timeout_s):
                await writer.start_tls(self._context)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            log.info("tls handshake failed", extra={"listener": self.name, "error": str(exc)})
            self._refuse(writer, "tls")
            return False
        if self.tls.client_fingerprints:
            ssl_object = writer.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            if der is None or fingerprint(der) not in self.tls.client_fingerprints:
                self._refuse(writer, "peer_not_allowed")
                return False
        return True

    def _trimmed(self) -> None:
        self._trim = None
        release_freed_memory()

    def _account(self, stream: GuardedStream, partial: int) -> None:
        self.buffered_bytes += partial - stream.partial
        stream.partial = partial
        stream.largest_partial = max(stream.largest_partial, partial)
        if partial and self.buffered_bytes > self.limits.max_buffered_bytes:
            self._cut(stream, "memory")

    def _cut(self, stream: GuardedStream, reason: str) -> None:
        if stream.cut_reason is not None:
            return
        self.cut[reason] += 1
        log.warning(
            "connection cut off",
            extra={"listener": self.name, "reason": reason, "peer": stream.peer},
        )
        stream.cut(reason)
        # Its partial frame dies with the handler; the budget is free from now.
        self._account(stream, 0)

    async def _watch(self) -> None:
        tick = self.limits.tick()
        # Ends once nothing is left to watch: closed with :meth:`close`, or (a
        # :func:`~transports.stream.serve_tcp` listener) its server closed and its
        # last connection gone.
        while self.serving or self._streams:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for stream in list(self._streams):
                reason = stream.overdue(now, self.limits)
                if reason is not None:
                    self._cut(stream, reason)


def _peer(writer: asyncio.StreamWriter) -> str:
    name = writer.get_extra_info("peername")
    return f"{name[0]}:{name[1]}" if name else "?"


__all__ = [
    "CUTS",
    "REFUSALS",
    "FrameBoundaries",
    "GuardedListener",
    "GuardedStream",
    "ListenerLimits",
    "TlsServer",
    "add_tls_arguments",
    "fingerprint",
    "normalize_fingerprint",
    "tls_client_context",
    "tls_from_arguments",
]
