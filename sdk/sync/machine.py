"""The one shape of a sync protocol machine, and how a driver runs it.

Theory of operation
-------------------
A machine is the whole of one protocol's rules for one connection, and does no
I/O: no sockets, no asyncio, no threads, no database. Time comes in as ``now``
(milliseconds, the driver's monotonic clock) on every call that may act on it.

* Bytes go in and out as they are: the machine does its own framing. What the
  application should learn comes out as events.
* One timer (:meth:`Machine.get_timer`): idle and stall limits are this timer; the
  machine decides what silence means in each of its states.
* Work that must not run on the event loop (reading or writing the store,
  checking signatures) leaves as a *request*; the driver carries requests out one
  at a time, in order, off the loop, and hands each result back. A request that
  raises ends the connection with that error. A request never waits for the
  network, so a machine waiting on one cannot deadlock two peers.
* Backpressure is the machine's to say: the driver reads only while
  :attr:`Machine.wants_data` is true (a machine stops wanting data while what it
  read is still being stored), and asks for more output only after the last
  was written, so a machine that makes output only when its buffer is small
  holds a bounded amount.
* :attr:`Machine.error` set: the driver stops, sends nothing more and raises it.
  :attr:`Machine.finished` set: the driver writes what is left of the output and stops.

:func:`sdk.sync.run.run_machine` is the asyncio driver for any machine over any
:class:`transports.stream.Stream`. Machines of this shape, each leaving what needs
the store as requests: :class:`store_node.store_sync.machine.StoreSyncMachine`
(store-to-store sync), :class:`sdk.sync.collection.machine.CollectionMachine`
(collection sync), :class:`sdk.sync.bamboo_p2p.machine.BambooMachine` (Bamboo
point-to-point) and :class:`sdk.sync.session.Replication` (p2panda replication).
"""

from __future__ import annotations

from typing import Any, Protocol


class Machine(Protocol):
    """A sans-I/O sync protocol machine (see the module docstring)."""

    @property
    def wants_data(self) -> bool:
        """True while the driver should read from the peer."""
        ...

    @property
    def finished(self) -> bool:
        """True once the machine has nothing more to read or ask (its output may remain)."""
        ...

    @property
    def error(self) -> Exception | None:
        """Why the connection failed, once it has."""
        ...

    def receive_data(self, data: bytes, now: int) -> None:
        """Take bytes read from the peer (``b""``: the peer closed its side)."""
        ...

    def data_to_send(self) -> bytes:
        """Take the bytes to write to the peer (``b""``: nothing now)."""
        ...

    def next_event(self) -> Any | None:
        """The next event for the application, or ``None``."""
        ...

    def get_timer(self) -> int | None:
        """When (ms, the driver's clock) :meth:`handle_timer` is due, or ``None``."""
        ...

    def handle_timer(self, now: int) -> None:
        """The timer is due (it may be late, or early after a change: check ``now``).

        Afterwards :meth:`get_timer` must be later than ``now``, ``None``, or the
        machine failed: the driver calls again as long as the timer is due.
        """
        ...

    def next_request(self) -> Any | None:
        """The next piece of work to carry out off the event loop, or ``None``."""
        ...

    def request_done(self, request: Any, result: Any, now: int) -> None:
        """``request`` (from :meth:`next_request`) was carried out with ``result``."""
        ...


__all__ = ["Machine"]
