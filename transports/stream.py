"""Reliable ordered byte streams between two peers, for the sync protocols.

Unlike the broadcast :class:`~transports.base.Transport`, replication needs a
two-way, reliable, ordered byte stream. :class:`Stream` is the one small
interface the sync drivers use; adapters:

* :class:`TcpStream` over asyncio TCP (:func:`connect_tcp`, :func:`serve_tcp`,
  bound to 127.0.0.1 unless told otherwise); every listener is a
  :class:`transports.guarded.GuardedListener` (connection cap, deadlines, TLS,
  peer authentication), :func:`serve_tcp` one with default limits;
* :func:`memory_pipe`: two connected in-process ends with fault injection
  (:class:`PipeFaults`: delay, cut after N bytes, cut now, stall and resume),
  for tests and simulations;
* a libp2p stream of the existing py-libp2p host
  (:meth:`transports.libp2p.Libp2pTransport.open_stream` / ``handle_streams``).

The adapters are thin: framing and protocol logic live in ``sdk.sync``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from ssl import SSLContext
from typing import TYPE_CHECKING, Any, Protocol

from transports.tasks import cancel_and_wait

if TYPE_CHECKING:
    from transports.guarded import FrameBoundaries, ListenerLimits

#: Seconds :meth:`TcpStream.close` waits for buffered bytes to leave before it aborts.
CLOSE_TIMEOUT_S = 5.0
#: The asyncio stream reader's buffer limit of :class:`TcpStream` (asyncio stops
#: reading the socket once twice this much is buffered). At asyncio's default
#: (64 KiB) a read returned at most ~180 KB however much the caller asked for, so a
#: catch-up's batches (one read's Entry frames, one transaction) held ~770 entries;
#: at 1 MiB a read can take what arrived while the previous batch was stored.
#: Still a bound: what a peer can make us buffer is 2 MiB plus one socket read.
READ_LIMIT = 1024 * 1024


class StreamClosed(ConnectionError):
    """The stream was closed or cut; nothing more can be sent or received."""


class Stream(Protocol):
    """A reliable ordered byte stream to one peer."""

    async def read(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` bytes; ``b""`` once the peer closed its side."""
        ...

    async def write(self, data: bytes) -> None:
        """Send ``data`` (waits while the peer does not keep up)."""
        ...

    async def close(self) -> None:
        """Close both directions."""
        ...


class TcpStream:
    """A :class:`Stream` over an asyncio TCP connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        name = writer.get_extra_info("peername")
        #: ``host:port`` of the other end (``?`` if the socket could not say).
        self.peer = f"{name[0]}:{name[1]}" if name else "?"

    def extra_info(self, name: str) -> Any:
        """The transport's ``name`` information (``"ssl_object"``, ``"peername"``, ...)."""
        return self._writer.get_extra_info(name)

    def abort(self) -> None:
        """Drop the connection now, without waiting for buffered bytes (a pending read
        ends, a pending write fails)."""
        self._writer.transport.abort()

    async def read(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` bytes; ``b""`` at end of stream."""
        try:
            return await self._reader.read(max_bytes)
        except ConnectionError as exc:
            raise StreamClosed(str(exc)) from exc

    async def write(self, data: bytes) -> None:
        """Send ``data`` and wait for the socket buffer to drain."""
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise StreamClosed(str(exc)) from exc

    async def close(self) -> None:
        """Close the connection."""
        self._writer.close()
        # A peer that stopped reading can hold the close forever: give it a
        # moment to take what is buffered, then drop the connection.
        # Shielded: every waiter shares one close future, and a waiter cancelled
        # (a read loop being stopped while it closes) would cancel that future
        # under the other waiters, who then raise CancelledError.
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await asyncio.shield(self._writer.wait_closed())
        except TimeoutError:
            self._writer.transport.abort()
        except (ConnectionError, OSError):
            pass


async def connect_tcp(host: str, port: int, *, ssl: SSLContext | None = None) -> TcpStream:
    """Open a TCP stream to ``host:port``; over TLS with ``ssl`` (a listener with
    TLS, :mod:`transports.guarded`: make one with
    :func:`transports.guarded.tls_client_context`)."""
    reader, writer = await asyncio.open_connection(host, port, limit=READ_LIMIT, ssl=ssl)
    return TcpStream(reader, writer)


async def stop_tcp_server(
    server: asyncio.Server | None,
    connections: Iterable[asyncio.Future[Any]] = (),
    *,
    connection_timeout: float | None = 10.0,
    close_timeout: float = 5.0,
) -> bool:
    """Stop a :func:`serve_tcp` listener: stop accepting, cancel the ``connections``
    (waiting up to ``connection_timeout`` seconds for them to end), then wait up to
    ``close_timeout`` for the listener to close. Returns whether it closed in time.
    """
    if server is not None:
        server.close()
    await cancel_and_wait(list(connections), timeout=connection_timeout)
    if server is None:
        return True
    try:
        async with asyncio.timeout(close_timeout):
            await server.wait_closed()
    except TimeoutError:
        return False
    return True


async def serve_tcp(
    handler: Callable[[TcpStream], Awaitable[None]],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    limits: ListenerLimits | None = None,
    meter: Callable[[], FrameBoundaries] | None = None,
) -> asyncio.Server:
    """Accept TCP streams on ``host:port`` (127.0.0.1, any free port by default).

    ``handler`` runs once per connection; the stream is closed when it returns.
    Served by a :class:`transports.guarded.GuardedListener` (the one home of the
    rules), so no peer is held forever: ``limits`` (by default
    :class:`~transports.guarded.ListenerLimits`: 256 connections, 300 s idle, 60 s
    per write) and, with the protocol's frame ``meter``, a whole-frame deadline and a
    memory budget. Closing the returned server stops the listener once its last
    connection ended. For TLS, client certificates and counters use
    :class:`~transports.guarded.GuardedListener` directly, as the store node does.
    """
    from transports.guarded import GuardedListener

    listener = GuardedListener("tcp", handler, limits, meter=meter)
    await listener.start(host, port)
    assert listener.server is not None
    return listener.server


@dataclass
class PipeFaults:
    """Faults of a :func:`memory_pipe`, changeable while it runs.

    ``delay`` seconds are added before each chunk is delivered; after
    ``cut_after`` bytes have been written (both directions together) the pipe
    is cut; :meth:`cut` cuts it now; :meth:`stall` stops delivery (writes
    still succeed up to ``capacity``, then wait) until :meth:`resume`. A single
    write larger than ``capacity`` waits until the reader has drained the pipe.
    """

    delay: float = 0.0
    cut_after: int | None = None
    capacity: int = 1 << 20
    written: int = 0
    cut_now: bool = False
    _flowing: asyncio.Event | None = None

    def flowing(self) -> asyncio.Event:
        if self._flowing is None:
            self._flowing = asyncio.Event()
            self._flowing.set()
        return self._flowing

    def cut(self) -> None:
        """Cut the pipe: both ends see :class:`StreamClosed` from now on."""
        self.cut_now = True
        self.flowing().set()

    def stall(self) -> None:
        """Hold every byte in flight until :meth:`resume`."""
        self.flowing().clear()

    def resume(self) -> None:
        """Deliver again."""
        self.flowing().set()


class _PipeEnd:
    def __init__(self, faults: PipeFaults) -> None:
        self.faults = faults
        self.inbox: asyncio.Queue[bytes] = asyncio.Queue()
        self.peer: _PipeEnd | None = None
        self.closed = False
        self.buffered = 0
        self._space = asyncio.Condition()
        self._pending = b""

    async def read(self, max_bytes: int = 65536) -> bytes:
        if self.faults.cut_now:
            raise StreamClosed("pipe cut")
        if not self._pending:
            get = asyncio.ensure_future(self.inbox.get())
            try:
                while True:
                    done, _ = await asyncio.wait({get}, timeout=0.05)
                    if done:
                        break
                    if self.faults.cut_now:
                        raise StreamClosed("pipe cut")
            except asyncio.CancelledError:
                if get.done() and not get.cancelled():
                    self._pending = get.result()  # keep it for the next read
                else:
                    get.cancel()
                raise
            except StreamClosed:
                get.cancel()
                raise
            self._pending = get.result()
            if not self._pending:
                return b""
            async with self._space:
                self.buffered -= len(self._pending)
                self._space.notify_all()
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def write(self, data: bytes) -> None:
        faults = self.faults
        peer = self.peer
        if faults.cut_now or self.closed or peer is None or peer.closed:
            raise StreamClosed("pipe cut" if faults.cut_now else "pipe closed")
        if faults.cut_after is not None and faults.written + len(data) > faults.cut_after:
            keep = max(faults.cut_after - faults.written, 0)
            if keep:
                await self._deliver(peer, data[:keep])
            faults.written += keep
            faults.cut()
            raise StreamClosed("pipe cut")
        faults.written += len(data)
        await self._deliver(peer, data)

    async def _deliver(self, peer: _PipeEnd, data: bytes) -> None:
        capacity = self.faults.capacity
        async with peer._space:
            # A write larger than the capacity goes through once the peer has read
            # everything before it (as a socket takes it piece by piece); waiting for
            # room it can never have would block the writer forever.
            await peer._space.wait_for(
                lambda: (
                    peer.buffered + len(data) <= capacity
                    or peer.buffered == 0
                    or self.faults.cut_now
                )
            )
            peer.buffered += len(data)
        if self.faults.cut_now:
            raise StreamClosed("pipe cut")
        await self.faults.flowing().wait()
        if self.faults.delay:
            await asyncio.sleep(self.faults.delay)
        peer.inbox.put_nowait(bytes(data))

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.peer is not None:
            self.peer.inbox.put_nowait(b"")
        self.inbox.put_nowait(b"")


def memory_pipe(faults: PipeFaults | None = None) -> tuple[Stream, Stream, PipeFaults]:
    """Two connected in-process stream ends sharing ``faults``."""
    faults = faults or PipeFaults()
    a, b = _PipeEnd(faults), _PipeEnd(faults)
    a.peer, b.peer = b, a
    return a, b, faults


__all__ = [
    "PipeFaults",
    "Stream",
    "StreamClosed",
    "TcpStream",
    "connect_tcp",
    "memory_pipe",
    "serve_tcp",
    "stop_tcp_server",
]
