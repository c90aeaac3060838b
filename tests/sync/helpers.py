"""Stores with todo documents and a wire between two Replication machines."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sdk.documents import KeyPair
from sdk.documents.bamboo import decode_entry
from sdk.documents.operation import decode_operation
from sdk.sync.events import SyncEvent
from sdk.sync.framing import MAX_FRAME
from sdk.sync.session import Replication as Machine
from sdk.sync.session import SyncConfig
from sdk.sync.store import StoredEntry, SyncStore
from sdk.sync.store_work import perform
from tests.documents.helpers import TODO_SCHEMA, todo_fields

TODO = TODO_SCHEMA.id
KEYS = [KeyPair.from_private_key(bytes([i + 1]) * 32) for i in range(4)]


def history(seed: int, operations: int, authors: int = 3) -> list[tuple[bytes, bytes]]:
    """A causally ordered list of (entry, operation): todos created and edited by several authors."""
    rng = random.Random(seed)
    store = SyncStore()
    store.add_schema(TODO_SCHEMA)
    published: list[tuple[bytes, bytes]] = []
    documents: list[str] = []
    for n in range(operations):
        key = KEYS[rng.randrange(authors)]
        if not documents or rng.random() < 0.3:
            p = store.create(key, TODO, todo_fields(f"item {n}"))
            documents.append(p.document_id)
        else:
            doc = rng.choice(documents)
            view = store.document(doc)
            assert view is not None
            if view.deleted:
                continue
            if rng.random() < 0.05:
                p = store.delete(key, doc)
            else:
                p = store.update(key, doc, {"title": f"edit {n}", "done": rng.random() < 0.5})
        published.append((p.entry, p.operation))
    return published


def dependencies(entry: bytes, operation: bytes) -> set[str]:
    decoded = decode_entry(entry)
    deps = set(decode_operation(operation).previous or ())
    if decoded.backlink is not None:
        deps.add(decoded.backlink.hex())
    return deps


def closed_subset(
    published: list[tuple[bytes, bytes]], rng: random.Random, keep: float
) -> list[tuple[bytes, bytes]]:
    """A random subset that holds every dependency of what it holds."""
    chosen: list[tuple[bytes, bytes]] = []
    ids: set[str] = set()
    for entry, operation in published:
        if rng.random() < keep and dependencies(entry, operation) <= ids:
            chosen.append((entry, operation))
            ids.add(decode_entry(entry).id)
    return chosen


def make_store(entries: Iterable[tuple[bytes, bytes]], path: str = ":memory:") -> SyncStore:
    store = SyncStore(path)
    store.add_schema(TODO_SCHEMA)
    for entry, operation in entries:
        store.ingest(entry, operation)
    return store


def entry_ids(store: SyncStore) -> set[str]:
    return {row[0] for row in store._db.execute("SELECT hash FROM entries")}


def views(store: SyncStore) -> list[object]:
    return [
        (v.document_id, v.view_id, dict(v.fields), v.deleted)
        for v in store.documents(TODO, deleted=True)
    ]


#: The attributes of a :class:`LocalReplication` itself (the others are its machine's).
_OWN = frozenset({"store", "machine", "_now", "_own", "_unlisten"})


class LocalReplication:
    """A :class:`~sdk.sync.session.Replication` over ``store`` in the caller's thread:
    every request is carried out as soon as it is made, and entries the store stores
    meanwhile (not through this replication) are told to it (live mode). Frames go in
    and messages come out as with a driver, without one (tests, benchmarks).

    Everything else is the machine's (attributes are looked up on :attr:`machine`).
    """

    def __init__(
        self,
        store: SyncStore,
        schema_ids: Iterable[str],
        *,
        now: int,
        config: SyncConfig | None = None,
        max_frame: int = MAX_FRAME,
    ) -> None:
        self.store = store
        self.machine = Machine(schema_ids, now=now, config=config, max_frame=max_frame)
        self._now = now
        self._own = False
        self._unlisten = store.add_listener(self._on_stored)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.machine, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.machine, name, value)

    def settle(self) -> None:
        """Carry out the machine's requests until it has none."""
        machine = self.machine
        while (request := machine.next_request()) is not None:
            self._own = True
            try:
                result = perform(self.store, request)
            finally:
                self._own = False
            machine.request_done(request, result, self._now)

    def _on_stored(self, stored: StoredEntry) -> None:
        if not self._own:
            self.machine.stored([(stored.schema_id, stored.author, stored.log_id, stored.seq_num)])
            self.settle()

    def receive(self, data: bytes, now: int) -> None:
        """Take one frame from the peer."""
        self.receive_many([data], now)

    def receive_many(self, frames: Sequence[bytes], now: int) -> None:
        """Take the frames of one read (see :meth:`Replication.receive_many`)."""
        self._now = now
        self.machine.receive_many(frames, now)
        self.settle()

    def receive_data(self, data: bytes, now: int) -> None:
        """Take the peer's bytes (see :meth:`Replication.receive_data`)."""
        self._now = now
        self.machine.receive_data(data, now)
        self.settle()

    def data_to_send(self) -> bytes:
        """The next write (see :meth:`Replication.data_to_send`)."""
        self.settle()
        data: bytes = self.machine.data_to_send()
        return data

    def messages_to_send(self) -> list[bytes]:
        """Encoded messages to send, one per frame; about a chunk of entries per call,
        ``[]`` once nothing is left."""
        out: list[bytes] = []
        while len(out) < self.machine.config.send_chunk:
            self.settle()
            if not (more := self.machine.messages_to_send()):
                break
            out += more
        return out

    def request(self, schema_ids: Iterable[str], now: int, **options: Any) -> int:
        """Open a session (see :meth:`Replication.request`)."""
        self._now = now
        session_id: int = self.machine.request(schema_ids, now, **options)
        self.settle()
        return session_id

    def end_live(self, session_id: int, now: int) -> None:
        """Leave live mode (see :meth:`Replication.end_live`)."""
        self._now = now
        self.machine.end_live(session_id, now)
        self.settle()

    def handle_timer(self, now: int) -> None:
        """The stall timer (see :meth:`Replication.handle_timer`)."""
        self._now = now
        self.machine.handle_timer(now)
        self.settle()

    def close(self) -> None:
        """Close the machine, stop listening to the store and flush its indexes."""
        self._unlisten()
        self.machine.close()
        self.store.flush()


#: What the wire joins: two replications with their stores.
Replication = LocalReplication


@dataclass
class Wire:
    """Two machines joined by an in-order stream each way; deliver in any interleaving."""

    a: Replication
    b: Replication
    now: int = 0
    a_to_b: list[bytes] = field(default_factory=list)
    b_to_a: list[bytes] = field(default_factory=list)
    events_a: list[SyncEvent] = field(default_factory=list)
    events_b: list[SyncEvent] = field(default_factory=list)
    bytes_a_to_b: int = 0
    bytes_b_to_a: int = 0

    def collect(self) -> None:
        for data in self.a.messages_to_send():
            self.a_to_b.append(data)
            self.bytes_a_to_b += len(data)
        for data in self.b.messages_to_send():
            self.b_to_a.append(data)
            self.bytes_b_to_a += len(data)
        while (e := self.a.next_event()) is not None:
            self.events_a.append(e)
        while (e := self.b.next_event()) is not None:
            self.events_b.append(e)

    def run(self, rng: random.Random | None = None, max_steps: int = 1_000_000) -> None:
        """Deliver until both queues are empty, picking a direction at random if ``rng``."""
        self.collect()
        for _ in range(max_steps):
            if not self.a_to_b and not self.b_to_a:
                return
            if self.a_to_b and (not self.b_to_a or (rng is not None and rng.random() < 0.5)):
                take = 1 if rng is None else rng.randint(1, len(self.a_to_b))
                batch, self.a_to_b = self.a_to_b[:take], self.a_to_b[take:]
                for data in batch:
                    self.b.receive(data, self.now)
            else:
                take = 1 if rng is None else rng.randint(1, len(self.b_to_a))
                batch, self.b_to_a = self.b_to_a[:take], self.b_to_a[take:]
                for data in batch:
                    self.a.receive(data, self.now)
            self.collect()
        raise AssertionError("no quiescence")


def pair(
    store_a: SyncStore,
    store_b: SyncStore,
    config_a: SyncConfig | None = None,
    config_b: SyncConfig | None = None,
    schemas: tuple[str, ...] = (TODO,),
) -> Wire:
    a = Replication(store_a, schemas, now=0, config=config_a or SyncConfig(initiator=True))
    b = Replication(store_b, schemas, now=0, config=config_b or SyncConfig(initiator=False))
    return Wire(a, b)
