"""``[replication] process = "separate"``: the node's document services in a child process.

A catch-up is store work (decoding, verifying, SQLite writes) that holds Python's
interpreter lock for most of its time; on a thread of the node's own process it
makes the gRPC lookups and the probes wait for that lock (docs/store-node.md,
"Threads and the GIL"). With ``process = "separate"`` in ``[replication]``,
``store-node serve`` runs :class:`store_node.replication.ReplicationService` in a
child (``python -m store_node.documents_process``) and supervises it:

- the child gets the ``[replication]`` table as written on its standard input (one
  JSON line), binds the configured address and answers with one JSON line,
  ``{"replication_port": PORT}``, on its standard output; its log lines go to the
  node's standard error;
- :class:`DocumentsProcess` starts it before the node reports itself started (a
  child that exits before answering fails the start, with its exit code), restarts
  it when it exits (after :data:`RESTART_DELAY_S`, doubling up to
  :data:`RESTART_DELAY_MAX_S` while it keeps failing) on the port it first bound,
  and reports ``serving`` false while it is down: ``/readyz`` and
  ``grpc.health.v1`` then say not ready (``replication_serving``), and ``details``
  carry ``replication_process`` (its pid, port, restarts);
- stopping the node closes the child's standard input and sends it SIGTERM (SIGKILL
  after :data:`STOP_TIMEOUT_S`); a child whose node is gone sees its standard input
  end and stops too.

The child has the document store to itself: ``[collection]`` or ``[bamboo_p2p]``
on the same file would be a second connection whose caches never see what the
child stores, so :mod:`store_node.config` refuses them together with this option.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from store_node.errors import StoreNodeError
from store_node.replication import ReplicationConfig

log = logging.getLogger("store_node.documents_process")

#: Seconds before the first restart of a child that exited; doubled after each
#: child that exits without having answered, up to :data:`RESTART_DELAY_MAX_S`.
RESTART_DELAY_S = 0.5
#: The longest wait between two restarts.
RESTART_DELAY_MAX_S = 30.0
#: Seconds a child may take to answer with its port.
START_TIMEOUT_S = 60.0
#: Seconds a stopping child gets after SIGTERM before SIGKILL.
STOP_TIMEOUT_S = 10.0


class DocumentsProcess:
    """Runs and supervises the child that serves ``[replication]``."""

    def __init__(
        self,
        config: ReplicationConfig,
        log_level: str = "info",
        *,
        restart_delay: float = RESTART_DELAY_S,
    ) -> None:
        self.config = config
        self.log_level = log_level
        self.restart_delay = restart_delay
        #: The port the child serves on (0 before the first answer or without ``listen``).
        self.port = 0
        #: Children started after the first.
        self.restarts = 0
        self._child: asyncio.subprocess.Process | None = None
        self._serving = False
        self._supervisor: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def serving(self) -> bool:
        """Whether a child is running and has answered."""
        return self._serving and self._child is not None and self._child.returncode is None

    @property
    def pid(self) -> int | None:
        """The running child's process id."""
        child = self._child
        return child.pid if child is not None and child.returncode is None else None

    def details(self) -> dict[str, Any]:
        """What ``/readyz`` shows of the child."""
        return {"pid": self.pid, "port": self.port or None, "restarts": self.restarts}

    async def start(self) -> int:
        """Start the child and wait for its port; then supervise it. Returns the port.

        Raises :class:`StoreNodeError` when the child exits (or stays silent for
        :data:`START_TIMEOUT_S`) before answering: a port in use, a bad schema file.
        """
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(), name="documents-process")
        return self.port

    async def _spawn(self) -> None:
        table = dict(self.config.source)
        if self.port and self.config.listen:
            # A restart binds the port the first child bound (``listen`` may say 0).
            table["listen"] = f"{self.config.listen.rpartition(':')[0]}:{self.port}"
        order = {"replication": table, "base": str(self.config.base), "log": self.log_level}
        # The child imports this package from where the node did, whatever its cwd.
        here = str(Path(__file__).resolve().parents[1])
        path = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=here if not path else here + os.pathsep + path)
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "store_node.documents_process",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        self._child = child
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(order).encode() + b"\n")
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await child.stdin.drain()
                line = await child.stdout.readline()
            self.port = int(json.loads(line)["replication_port"])
        except (TimeoutError, ValueError, KeyError, TypeError, OSError):
            code = await self._end(child)
            raise StoreNodeError(
                f"replication: the documents process exited (code {code}) before serving"
            ) from None
        self._serving = True
        log.info("documents process serving", extra={"pid": child.pid, "port": self.port})

    async def _supervise(self) -> None:
        delay = self.restart_delay
        while True:
            child = self._child
            assert child is not None
            code = await child.wait()
            self._serving = False
            log.error("documents process exited", extra={"pid": child.pid, "code": code})
            while True:
                await asyncio.sleep(delay)
                try:
                    await self._spawn()
                except StoreNodeError as exc:
                    delay = min(delay * 2, RESTART_DELAY_MAX_S)
                    log.error("documents process restart failed", extra={"error": str(exc)})
                    continue
                self.restarts += 1
                delay = self.restart_delay
                break

    async def _end(self, child: asyncio.subprocess.Process) -> int:
        """Stop ``child`` (its stdin closed, SIGTERM, then SIGKILL); its exit code."""
        if child.stdin is not None:
            child.stdin.close()
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.terminate()
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await child.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
        return await child.wait()

    async def close(self) -> None:
        """Stop supervising and stop the child; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        self._serving = False
        if self._child is not None:
            await self._end(self._child)


async def _child_main(order: dict[str, Any]) -> None:
    """The child: serve ``[replication]``, say the port, run until told to stop."""
    from store_node.replication import ReplicationService, parse_replication

    config = parse_replication(order["replication"], Path(order["base"]))
    service = ReplicationService(config)
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)

    def watch_stdin() -> None:
        # The node holds the other end: its end (the node stopped or died) stops us.
        sys.stdin.buffer.read()
        loop.call_soon_threadsafe(task.cancel)

    threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True).start()
    try:
        port = await service.start()
        sys.stdout.write(json.dumps({"replication_port": port}) + "\n")
        sys.stdout.flush()
        await service.sync_peers_forever()
        await loop.create_future()
    finally:
        await service.close()


def main() -> int:
    """Entry point of the child (``python -m store_node.documents_process``)."""
    from store_node.cli import _share_the_gil
    from store_node.errors import ConfigError
    from store_node.log import configure_logging
    from store_node.node import listen_error

    order = json.loads(sys.stdin.buffer.readline())
    configure_logging(order["log"])
    _share_the_gil()
    try:
        asyncio.run(_child_main(order))
    except asyncio.CancelledError:
        return 0
    except OSError as exc:
        text = str(listen_error("replication", order["replication"].get("listen", ""), exc))
        print(f"store-node: {text}", file=sys.stderr)
        return 1
    except (ConfigError, StoreNodeError) as exc:
        print(f"store-node: {exc}", file=sys.stderr)
        return 2
    return 0


__all__ = ["DocumentsProcess", "main"]

if __name__ == "__main__":
    sys.exit(main())
