"""The node's document services (``[replication]``, ``[collection]``, ``[bamboo_p2p]``)
on one event loop, and ``process = "separate"``: those services in a child process.

:class:`DocumentServices` starts whichever of the three sections is on, with one
document store per file (a second connection's caches would not see what the first
stores, and its listeners would never hear of it): ``[collection]`` on the
``[replication]`` file, and ``[bamboo_p2p] documents`` on either, use that
service's store. The node runs it on its own event loop with ``[replication]
process = "node"``; the documents process runs it with ``process = "separate"``,
the default of ``store-node serve``.

A catch-up is store work (decoding, verifying, SQLite writes) that holds Python's
interpreter lock for most of its time; on a thread of the node's own process it
makes the gRPC lookups and the probes wait for that lock (docs/store-node.md,
"Threads and the GIL"). With ``process = "separate"`` ``store-node serve`` runs the
document services in a child (``python -m store_node.documents_process``) and
supervises it:

- the child gets the sections' tables as written on its standard input (one JSON
  line), binds every configured address and answers with one JSON line on its
  standard output, ``{"ports": {SECTION: PORT}}`` (or ``{"error": TEXT, "code":
  N}``: the node then fails to start with that one line, exit 1, or 2 for a
  configuration error); its log lines go to the node's standard error;
- then, every :data:`REPORT_INTERVAL_S` when they changed, it writes its
  listeners' counters (``{"listeners": [...]}``,
  :class:`store_node.metrics.ListenerCounts`); the node's ``/metrics`` shows them,
  the counters of earlier children added (so they never go back), the gauges
  (open connections, buffered bytes) of the running child only;
- :class:`DocumentsProcess` starts it before the node reports itself started (a
  child that exits before answering fails the start, with its exit code), restarts
  it when it exits (after :data:`RESTART_DELAY_S`, doubling up to
  :data:`RESTART_DELAY_MAX_S` while restarts fail or the restarted child exits within
  :data:`RESTART_STABLE_S`) on the ports it first bound, and reports ``serving``
  false while it is down: ``/readyz`` and ``grpc.health.v1`` then say not ready
  (``documents_serving``, and ``replication_serving`` when replication is served
  there), and ``details`` carry ``documents_process`` (its pid, ports, restarts);
- stopping the node closes the child's standard input and sends it SIGTERM (SIGKILL
  after :data:`STOP_TIMEOUT_S`); a child whose node is gone sees its standard input
  end and stops too.
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
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from store_node.bamboo_p2p import BambooP2PConfig, BambooP2PService, parse_bamboo_p2p
from store_node.collection import CollectionNodeConfig, CollectionNodeService, parse_collection
from store_node.errors import ConfigError, StoreNodeError
from store_node.metrics import ListenerCounts
from store_node.replication import ReplicationConfig, ReplicationService, parse_replication

if TYPE_CHECKING:
    from sdk.sync.store import SyncStore
    from transports.guarded import GuardedListener

log = logging.getLogger("store_node.documents_process")

#: Seconds before the first restart of a child that exited; doubled after each
#: restart that fails, and after each restarted child that exits within
#: :data:`RESTART_STABLE_S`, up to :data:`RESTART_DELAY_MAX_S`.
RESTART_DELAY_S = 0.5
#: The longest wait between two restarts.
RESTART_DELAY_MAX_S = 30.0
#: Seconds a child must serve before its exit is restarted after :data:`RESTART_DELAY_S`
#: again: a child that crashes soon after every start is restarted ever more slowly,
#: not twice a second forever.
RESTART_STABLE_S = 10.0
#: Seconds a child may take to answer with its ports.
START_TIMEOUT_S = 60.0
#: Seconds a stopping child gets after SIGTERM before SIGKILL.
STOP_TIMEOUT_S = 10.0
#: Seconds between two looks at the child's listener counters (reported when changed).
REPORT_INTERVAL_S = 0.5

#: A document service's section, as :func:`store_node.config.parse_config` gives it.
SectionConfig = ReplicationConfig | CollectionNodeConfig | BambooP2PConfig
#: The document services' sections, in the order they start.
SECTIONS = ("replication", "collection", "bamboo_p2p")


class DocumentServices:
    """``[replication]``, ``[collection]`` and ``[bamboo_p2p]`` (those that are on) on
    one event loop, one document store per file (see the module docstring)."""

    def __init__(
        self,
        replication: ReplicationConfig | None = None,
        collection: CollectionNodeConfig | None = None,
        bamboo_p2p: BambooP2PConfig | None = None,
    ) -> None:
        self._replication_config = replication or ReplicationConfig()
        self._collection_config = collection or CollectionNodeConfig()
        self._bamboo_p2p_config = bamboo_p2p or BambooP2PConfig()
        self.replication: ReplicationService | None = None
        self.collection: CollectionNodeService | None = None
        self.bamboo_p2p: BambooP2PService | None = None
        #: The bound port of each section that listens.
        self.ports: dict[str, int] = {}
        self._peers: asyncio.Task[None] | None = None

    async def start(self) -> dict[str, int]:
        """Open the stores, listen, start syncing with ``[replication]`` peers; the ports.

        A listener that cannot bind raises :class:`StoreNodeError` naming its section;
        :meth:`close` then closes what had started.
        """
        from store_node.node import bind_listener

        replication = self._replication_config
        if replication.enabled:
            # On the loop's thread: the store's SQLite connection is used from it only.
            self.replication = ReplicationService(replication)
            port = await bind_listener("replication", replication.listen, self.replication.start())
            if replication.listen:
                self.ports["replication"] = port
            self._peers = asyncio.create_task(
                self.replication.sync_peers_forever(), name="replication"
            )
            log.info(
                "replication started",
                extra={"port": port or None, "peers": list(replication.peers)},
            )
        collection = self._collection_config
        if collection.enabled:
            self.collection = CollectionNodeService(collection, self._open_store(collection.path))
            self.ports["collection"] = await bind_listener(
                "collection", collection.listen, self.collection.start()
            )
        bamboo_p2p = self._bamboo_p2p_config
        if bamboo_p2p.enabled:
            self.bamboo_p2p = BambooP2PService(bamboo_p2p, self._open_store(bamboo_p2p.documents))
            self.ports["bamboo_p2p"] = await bind_listener(
                "bamboo_p2p", bamboo_p2p.listen, self.bamboo_p2p.start()
            )
        return self.ports

    def _open_store(self, path: Path | None) -> SyncStore | None:
        """The document store at ``path`` if a service here has it open already."""
        if path is None:
            return None
        for service in (self.replication, self.collection):
            if service is not None and service.config.path.resolve() == path.resolve():
                return service.store
        return None

    @property
    def replication_serving(self) -> bool:
        """Whether ``[replication]``'s listener is open."""
        return self.replication is not None and self.replication.serving

    def listeners(self) -> list[GuardedListener]:
        """The stream listeners serving now (for the metrics)."""
        services = (self.replication, self.collection, self.bamboo_p2p)
        return [s.listener for s in services if s is not None and s.listener is not None]

    async def close(self) -> None:
        """Stop every service, Bamboo first (it may use the others' document store),
        replication last (its sessions end, its store closes)."""
        if self.bamboo_p2p is not None:
            await self.bamboo_p2p.close()
        if self.collection is not None:
            await self.collection.close()
        if self.replication is not None:
            if self._peers is not None:
                self._peers.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._peers
            await self.replication.close()
            log.info("replication stopped")


class DocumentsProcess:
    """Runs and supervises the child that serves the document services.

    ``sections``: the sections to serve by name (``replication``, ``collection``,
    ``bamboo_p2p``), each as parsed from the node's configuration. ``sleep`` waits
    between restarts and ``clock`` tells how long a child served (tests give their
    own).
    """

    def __init__(
        self,
        sections: Mapping[str, SectionConfig],
        log_level: str = "info",
        *,
        restart_delay: float = RESTART_DELAY_S,
        restart_delay_max: float = RESTART_DELAY_MAX_S,
        restart_stable: float = RESTART_STABLE_S,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sections = dict(sections)
        self.log_level = log_level
        self.restart_delay = restart_delay
        self.restart_delay_max = restart_delay_max
        self.restart_stable = restart_stable
        self.sleep = sleep
        self.clock = clock
        self._served_at = 0.0
        #: The port of each section that listens (empty before the first answer).
        self.ports: dict[str, int] = {}
        #: Children started after the first.
        self.restarts = 0
        #: Restarts that failed (the child exited or stayed silent before answering).
        self.failed_restarts = 0
        self._child: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._serving = False
        self._supervisor: asyncio.Task[None] | None = None
        self._closed = False
        # The totals of the listeners of children that ended, and the running child's
        # counters; one tuple, replaced whole, since /metrics reads it from its thread.
        self._counts: tuple[dict[str, ListenerCounts], dict[str, ListenerCounts]] = ({}, {})

    @property
    def port(self) -> int:
        """The port ``[replication]`` is served on (0 when it does not listen)."""
        return self.ports.get("replication", 0)

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
        return {
            "pid": self.pid,
            "port": self.port or None,
            "ports": dict(self.ports),
            "restarts": self.restarts,
            "failed_restarts": self.failed_restarts,
        }

    def listeners(self) -> list[ListenerCounts]:
        """The child's listeners as last reported, with the counts of earlier children."""
        ended, live = self._counts
        added = {name: c.plus(live[name]) if name in live else c for name, c in ended.items()}
        return list({**live, **added}.values())

    async def start(self) -> dict[str, int]:
        """Start the child and wait for its ports; then supervise it. Returns the ports.

        Raises :class:`StoreNodeError` (:class:`ConfigError` for a configuration the
        child refused) when the child exits, or stays silent for
        :data:`START_TIMEOUT_S`, before answering: a port in use, a bad schema file.
        """
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(), name="documents-process")
        return self.ports

    def _order(self) -> dict[str, Any]:
        """What the child reads on its standard input."""
        sections = {}
        for name, config in self.sections.items():
            table = dict(config.source)
            if self.ports.get(name) and config.listen:
                # A restart binds the port the first child bound (``listen`` may say 0).
                table["listen"] = f"{config.listen.rpartition(':')[0]}:{self.ports[name]}"
            sections[name] = {"table": table, "base": str(config.base)}
        return {"sections": sections, "log": self.log_level}

    async def _spawn(self) -> None:
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
        child.stdin.write(json.dumps(self._order()).encode() + b"\n")
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await child.stdin.drain()
                answer = json.loads(await child.stdout.readline())
            refused = answer.get("error")
            ports = {str(name): int(port) for name, port in answer.get("ports", {}).items()}
        except (TimeoutError, ValueError, KeyError, TypeError, AttributeError, OSError):
            code = await self._end(child)
            raise StoreNodeError(
                f"the documents process exited (code {code}) before serving"
            ) from None
        if refused is not None:
            code = await self._end(child)
            raise (ConfigError if code == 2 else StoreNodeError)(str(refused))
        self.ports = ports
        self._serving = True
        self._served_at = self.clock()
        self._reader = asyncio.create_task(self._read(child), name="documents-process-reports")
        log.info("documents process serving", extra={"pid": child.pid, "ports": ports})

    async def _read(self, child: asyncio.subprocess.Process) -> None:
        """Take in the child's reports until its standard output ends."""
        assert child.stdout is not None
        async for line in child.stdout:
            try:
                listeners = json.loads(line)["listeners"]
                live = {c.name: c for c in map(ListenerCounts.from_json, listeners)}
                self._counts = (self._counts[0], live)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("documents process: unreadable report", extra={"error": repr(exc)})

    def _child_ended(self) -> None:
        """Keep the ended child's counters (the gauges drop to 0)."""
        ended, live = self._counts
        totals = dict(ended)
        for name, counts in live.items():
            totals[name] = (counts if name not in ended else ended[name].plus(counts)).ended()
        self._counts = (totals, {})

    async def _supervise(self) -> None:
        delay = self.restart_delay
        while True:
            child = self._child
            assert child is not None and self._reader is not None
            code = await child.wait()
            # Its last report first (its stdout ends with it), then not serving: a
            # scrape that sees the child down never sees its open connections.
            await self._reader
            self._child_ended()
            self._serving = False
            log.error("documents process exited", extra={"pid": child.pid, "code": code})
            if self.clock() - self._served_at >= self.restart_stable:
                delay = self.restart_delay
            while True:
                await self.sleep(delay)
                try:
                    await self._spawn()
                except StoreNodeError as exc:
                    self.failed_restarts += 1
                    delay = min(delay * 2, self.restart_delay_max)
                    log.error("documents process restart failed", extra={"error": str(exc)})
                    continue
                self.restarts += 1
                # The next exit waits longer, unless this child serves RESTART_STABLE_S.
                delay = min(delay * 2, self.restart_delay_max)
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
        if self._reader is not None:
            await self._reader


def _say(message: dict[str, Any]) -> None:
    """One JSON line to the node (the child's standard output)."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def _child_main(order: dict[str, Any]) -> None:
    """The child: serve the sections, say the ports, report the listeners until told to stop."""
    parsers = {
        "replication": parse_replication,
        "collection": parse_collection,
        "bamboo_p2p": parse_bamboo_p2p,
    }
    configs: dict[str, Any] = {
        name: parsers[name](section["table"], Path(section["base"]))
        for name, section in order["sections"].items()
    }
    services = DocumentServices(**configs)
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    # Ctrl-C reaches the whole process group: the node, stopping, stops the child.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch_stdin() -> None:
        # The node holds the other end: its end (the node stopped or died) stops us.
        sys.stdin.buffer.read()
        loop.call_soon_threadsafe(task.cancel)

    threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True).start()
    try:
        _say({"ports": await services.start()})
        reported: list[dict[str, Any]] = []
        while True:
            counts = [ListenerCounts.of(listener).to_json() for listener in services.listeners()]
            if counts != reported:
                _say({"listeners": counts})
                reported = counts
            await asyncio.sleep(REPORT_INTERVAL_S)
    finally:
        await services.close()


def main() -> int:
    """Entry point of the child (``python -m store_node.documents_process``)."""
    from store_node.cli import _share_the_gil
    from store_node.log import configure_logging

    order = json.loads(sys.stdin.buffer.readline())
    configure_logging(order["log"])
    _share_the_gil()
    try:
        asyncio.run(_child_main(order))
    except asyncio.CancelledError:
        return 0
    except StoreNodeError as exc:
        # The node fails its start with this line (or logs it when restarting).
        code = 2 if isinstance(exc, ConfigError) else 1
        _say({"error": str(exc), "code": code})
        return code
    return 0


__all__ = ["SECTIONS", "DocumentServices", "DocumentsProcess", "main"]

if __name__ == "__main__":
    sys.exit(main())
