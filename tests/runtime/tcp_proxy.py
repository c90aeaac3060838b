"""A TCP forwarder on 127.0.0.1 whose connections a test can cut or stall: one
participant's link to a real broker goes down (or silent) and comes back while
everybody else stays connected."""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_port``; :meth:`cut` drops every
    connection and refuses new ones until :meth:`restore`; :meth:`pause` holds every
    byte in both directions (a silent partition: connections stay open, keep-alive
    must notice) until :meth:`resume`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._refusing = False
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def start(self) -> None:
        """Listen on an ephemeral port (kept across :meth:`cut` / :meth:`restore`)."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers |= {writer, up_writer}
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                await self._flowing.wait()
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()
            self._writers.discard(dst)

    def cut(self) -> None:
        """Drop every forwarded connection and refuse new ones."""
        self._refusing = True
        for writer in list(self._writers):
            transport = writer.transport
            transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        """Accept connections again."""
        self._refusing = False

    def pause(self) -> None:
        """Stop forwarding; what arrives meanwhile is held, not dropped (TCP would
        retransmit it after the partition heals)."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward again, held bytes first."""
        self._flowing.set()

    async def close(self) -> None:
        """Stop listening and drop everything."""
        self._flowing.set()
        self.cut()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
