"""Range-based set reconciliation over totally ordered byte keys.

Theory of operation
-------------------
Two peers each hold a set of keys (``bytes``, compared lexically). They find
the symmetric difference by comparing *fingerprints* of key ranges and
splitting the ranges that differ (Meyer, "Range-Based Set Reconciliation",
2022; the same scheme as earthstar's range-reconcile, iroh's ranger and
negentropy). Nothing here knows about p2panda: the replication session
(:mod:`sdk.sync.session`) maps its ``(public_key, log_id, seq_num)`` items to
keys, and store-to-store archive sync can use ``(timestamp, message hash)``.

**Fingerprints** come from a lifting monoid: every key is *lifted* to
``XXH3-128(key)`` and a range's value is ``(count, sum of lifts mod 2**128)``.
Addition is commutative and invertible, so the value of ``[lo, hi)`` is
``prefix(hi) - prefix(lo)``, and :class:`RangeIndex` answers every prefix in
O(log n) from an augmented B+-tree kept up to date on insert and remove. The
fingerprint on the wire is ``XXH3-128(count || sum)`` (16 bytes), so the count
is part of what is compared. Why XXH3-128: it is the fastest xxHash on 64-bit
CPUs (bulk loading hashes every key), its 128-bit output makes an accidental
match of two different ranges a 2**-128 event, and it is stable since xxHash
0.8.0. It is not a cryptographic hash: a peer can craft keys whose sums
collide, which only hides that peer's own data from the sync (every entry is
still validated); use a cryptographic lift if peers must not be able to do that.

**Ranges are circular.** ``[lo, hi)`` with ``lo < hi`` is the usual interval;
``lo >= hi`` wraps past the largest key, so ``[x, x)`` is the whole set. A
*round* is a list of :data:`RangeMessage` ending in :class:`Terminal`. Range
messages carry only their upper bound: a range starts where the previous one
ended, at a :class:`LowerBound`, or, for the first range of a round without
one, at the round's last upper bound. Ranges a round does not mention are
reconciled already (there is no need to send :class:`Done`).

Answering a range (:meth:`Reconciler.receive_round`):

* :class:`Fingerprint` equal to ours: nothing to do. Different: if we hold
  ``threshold`` keys or fewer there, we send them all (:class:`Payload`,
  ``can_respond``); if none, :class:`EmptyPayload`; otherwise we split it into
  ``branching`` parts of equal key count and answer each with a fingerprint,
  or its keys if they are few.
* :class:`Payload` list (the peer's complete keys of the range): both
  differences are now known here. With ``can_respond`` we answer with the
  symmetric difference (``can_respond`` off), so the peer learns it too: a key
  it sent back is one we lack, any other one we have and it lacks.
* :class:`EmptyPayload`: the peer has nothing there; we send our keys.
* With ``group_prefix`` and ``send_lacking`` off, the last two answers leave out
  our keys of groups the peer was just shown to hold nothing of
  (:attr:`Reconciler.peer_lacks`); the owner sends their data instead.
* :class:`EmptySet` opens a session from an empty set: we send all our keys, or,
  with ``keys_for_empty_set`` off, a bare Terminal and :attr:`Reconciler.peer_empty`
  tells the owner to send everything it holds (the peer learns nothing from a
  list of keys it will receive anyway).

A round *needs an answer* when it has a fingerprint, an empty payload or a
payload with ``can_respond``. Whoever receives a round that needs none, or
answers with one that needs none, is finished; a finished peer sends nothing
more. Identical sets take one round trip: a fingerprint, then a bare Terminal.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import xxhash

from sdk.sds.varint import read_uvarint, write_uvarint
from sdk.sync.errors import LimitExceeded, RemoteProtocolError

__all__ = [
    "FINGERPRINT_SIZE",
    "SQLITE",
    "Done",
    "EmptyPayload",
    "EmptySet",
    "Fingerprint",
    "LowerBound",
    "MemoryNodeStore",
    "NodeStore",
    "Payload",
    "RangeIndex",
    "RangeMessage",
    "RangeSource",
    "ReconcileError",
    "Reconciler",
    "ReconcilerLimits",
    "RoundTooLong",
    "SqlDialect",
    "SqlNodeStore",
    "SqliteNodeStore",
    "Summary",
    "Terminal",
    "UnionIndex",
    "fingerprint",
    "lift",
]

_MASK = (1 << 128) - 1
#: Bytes of a fingerprint on the wire.
FINGERPRINT_SIZE = 16


def lift(key: bytes) -> int:
    """The monoid value of one key: XXH3-128 of its bytes as an integer."""
    return xxhash.xxh3_128_intdigest(key)


@dataclass(frozen=True, slots=True)
class Summary:
    """A range's monoid value: how many keys and the sum of their lifts mod 2**128."""

    count: int = 0
    total: int = 0

    def __add__(self, other: Summary) -> Summary:
        return Summary(self.count + other.count, (self.total + other.total) & _MASK)

    def __sub__(self, other: Summary) -> Summary:
        return Summary(self.count - other.count, (self.total - other.total) & _MASK)


def fingerprint(summary: Summary) -> bytes:
    """The 16 bytes peers compare: XXH3-128 over the count (8 bytes) and the sum (16)."""
    return xxhash.xxh3_128_digest(
        summary.count.to_bytes(8, "big") + summary.total.to_bytes(16, "big")
    )


# -- the index ------------------------------------------------------------------------


class _Node:
    """A B+-tree node. Leaves hold keys; inner nodes hold children with their sums.

    ``keys`` is the sorted keys of a leaf, or the smallest key below each child
    of an inner node. ``lifts`` (leaves) is cached, never stored.
    """

    __slots__ = ("children", "counts", "keys", "leaf", "lifts", "totals")

    def __init__(
        self,
        leaf: bool,
        keys: list[bytes],
        children: list[int] | None = None,
        counts: list[int] | None = None,
        totals: list[int] | None = None,
    ) -> None:
        self.leaf = leaf
        self.keys = keys
        self.children = children or []
        self.counts = counts or []
        self.totals = totals or []
        self.lifts: list[int] | None = None

    def leaf_lifts(self) -> list[int]:
        if self.lifts is None:
            self.lifts = [lift(k) for k in self.keys]
        return self.lifts

    def summary(self) -> Summary:
        if self.leaf:
            return Summary(len(self.keys), sum(self.leaf_lifts()) & _MASK)
        return Summary(sum(self.counts), sum(self.totals) & _MASK)

    def encode(self) -> bytes:
        out = bytearray(b"L" if self.leaf else b"I")
        write_uvarint(out, len(self.keys))
        for i, key in enumerate(self.keys):
            write_uvarint(out, len(key))
            out += key
            if not self.leaf:
                write_uvarint(out, self.children[i])
                write_uvarint(out, self.counts[i])
                out += self.totals[i].to_bytes(16, "big")
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes) -> _Node:
        leaf = data[:1] == b"L"
        n, pos = read_uvarint(data, 1)
        keys: list[bytes] = []
        children: list[int] = []
        counts: list[int] = []
        totals: list[int] = []
        for _ in range(n):
            size, pos = read_uvarint(data, pos)
            keys.append(data[pos : pos + size])
            pos += size
            if not leaf:
                child, pos = read_uvarint(data, pos)
                count, pos = read_uvarint(data, pos)
                children.append(child)
                counts.append(count)
                totals.append(int.from_bytes(data[pos : pos + 16], "big"))
                pos += 16
        return cls(leaf, keys, children, counts, totals)


class NodeStore(Protocol):
    """Where a :class:`RangeIndex` keeps its nodes (memory, SQLite, ...).

    Nodes are opaque bytes under integer ids. ``meta`` holds the root id, the
    next free id and a caller's watermark; writes may be buffered until
    :meth:`flush`.
    """

    def get(self, node_id: int) -> bytes:
        """The stored bytes of a node."""
        ...

    def put(self, node_id: int, data: bytes) -> None:
        """Store (or replace) a node."""
        ...

    def delete(self, node_id: int) -> None:
        """Forget a node."""
        ...

    def get_meta(self) -> tuple[int, int, int] | None:
        """``(root id, next free id, watermark)``, or ``None`` for a new index."""
        ...

    def put_meta(self, root: int, next_id: int, watermark: int) -> None:
        """Record the root, the next free id and the watermark."""
        ...

    def flush(self) -> None:
        """Make the writes so far durable."""
        ...


class MemoryNodeStore:
    """Nodes in a dict: for tests and for indexes rebuilt on start."""

    def __init__(self) -> None:
        self._nodes: dict[int, bytes] = {}
        self._meta: tuple[int, int, int] | None = None

    def get(self, node_id: int) -> bytes:
        """The stored bytes of a node."""
        return self._nodes[node_id]

    def put(self, node_id: int, data: bytes) -> None:
        """Store (or replace) a node."""
        self._nodes[node_id] = data

    def delete(self, node_id: int) -> None:
        """Forget a node."""
        self._nodes.pop(node_id, None)

    def get_meta(self) -> tuple[int, int, int] | None:
        """``(root id, next free id, watermark)``, or ``None`` for a new index."""
        return self._meta

    def put_meta(self, root: int, next_id: int, watermark: int) -> None:
        """Record the root, the next free id and the watermark."""
        self._meta = (root, next_id, watermark)

    def flush(self) -> None:
        """Nothing to do: memory is as durable as it gets."""

    def __len__(self) -> int:
        return len(self._nodes)


@contextmanager
def sqlite_transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One SQLite transaction, or the caller's when one is open (it commits it)."""
    if db.in_transaction:
        yield
        return
    db.execute("BEGIN")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@dataclass(frozen=True, slots=True)
class SqlDialect:
    """What a database changes in :class:`SqlNodeStore`: the rest is one SQL."""

    #: The driver's parameter placeholder (``?``, ``%s``).
    param: str
    #: Column types of a 64-bit integer and of a byte string.
    integer: str
    blob: str
    #: ``transaction(db)``: a context that commits what runs in it, at once.
    transaction: Callable[[Any], AbstractContextManager[object]]


#: SQLite (:mod:`sqlite3`); PostgreSQL's is in :mod:`store_node.store_sync.index`.
SQLITE = SqlDialect("?", "INTEGER", "BLOB", sqlite_transaction)


class SqlNodeStore:
    """Nodes as rows of ``rbsr_nodes`` in an SQL database, one index per ``name``.

    Writes wait in memory until :meth:`flush`, which commits them in one
    transaction (the caller flushes after a batch of inserts). A query reads only
    the O(log n) nodes on its path; reads go through the pending writes. The
    tables are the same in every database; ``dialect`` says what differs.
    """

    def __init__(self, db: Any, name: str, dialect: SqlDialect) -> None:
        self._db = db
        self._name = name
        self._dialect = dialect
        p, integer, blob = dialect.param, dialect.integer, dialect.blob
        with dialect.transaction(db):
            db.execute(
                f"CREATE TABLE IF NOT EXISTS rbsr_nodes (tree TEXT NOT NULL, id {integer} NOT NULL,"
                f" data {blob} NOT NULL, PRIMARY KEY (tree, id))"
            )
            db.execute(
                f"CREATE TABLE IF NOT EXISTS rbsr_meta (tree TEXT PRIMARY KEY, root {integer} "
                f"NOT NULL, next_id {integer} NOT NULL, watermark {integer} NOT NULL)"
            )
        self._select_node_sql = f"SELECT data FROM rbsr_nodes WHERE tree = {p} AND id = {p}"
        self._select_meta_sql = f"SELECT root, next_id, watermark FROM rbsr_meta WHERE tree = {p}"
        self._delete_sql = f"DELETE FROM rbsr_nodes WHERE tree = {p} AND id = {p}"
        self._put_sql = (
            f"INSERT INTO rbsr_nodes (tree, id, data) VALUES ({p}, {p}, {p}) "
            "ON CONFLICT (tree, id) DO UPDATE SET data = excluded.data"
        )
        self._meta_sql = (
            f"INSERT INTO rbsr_meta (tree, root, next_id, watermark) VALUES ({p}, {p}, {p}, {p}) "
            "ON CONFLICT (tree) DO UPDATE SET root = excluded.root, "
            "next_id = excluded.next_id, watermark = excluded.watermark"
        )
        self._pending: dict[int, bytes | None] = {}
        self._meta: tuple[int, int, int] | None = None

    def get(self, node_id: int) -> bytes:
        """The stored bytes of a node (a pending write if there is one)."""
        if node_id in self._pending:
            data = self._pending[node_id]
        else:
            row = self._db.execute(self._select_node_sql, (self._name, node_id)).fetchone()
            data = None if row is None else bytes(row[0])
        if data is None:
            raise KeyError(node_id)
        return data

    def put(self, node_id: int, data: bytes) -> None:
        """Store (or replace) a node at the next flush."""
        self._pending[node_id] = data

    def delete(self, node_id: int) -> None:
        """Forget a node at the next flush."""
        self._pending[node_id] = None

    def get_meta(self) -> tuple[int, int, int] | None:
        """``(root id, next free id, watermark)``, or ``None`` for a new index."""
        if self._meta is not None:
            return self._meta
        row = self._db.execute(self._select_meta_sql, (self._name,)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]), int(row[2]))

    def put_meta(self, root: int, next_id: int, watermark: int) -> None:
        """Record the root, the next free id and the watermark at the next flush."""
        self._meta = (root, next_id, watermark)

    def flush(self) -> None:
        """Write the pending nodes and meta in one transaction (or the caller's open one)."""
        if not self._pending and self._meta is None:
            return
        name = self._name
        puts = [(name, i, d) for i, d in self._pending.items() if d is not None]
        deletes = [(name, i) for i, d in self._pending.items() if d is None]
        with self._dialect.transaction(self._db), closing(self._db.cursor()) as cur:
            if deletes:
                cur.executemany(self._delete_sql, deletes)
            if puts:
                cur.executemany(self._put_sql, puts)
            if self._meta is not None:
                cur.execute(self._meta_sql, (name, *self._meta))
        self._pending.clear()
        self._meta = None


class SqliteNodeStore(SqlNodeStore):
    """:class:`SqlNodeStore` in SQLite: a connection, or a path to open."""

    def __init__(self, db: sqlite3.Connection | str, name: str = "default") -> None:
        if isinstance(db, str):
            db = sqlite3.connect(db, isolation_level=None)
        super().__init__(db, name, SQLITE)


#: ``shorten(prev, key)``: a bound ``b`` with ``prev < b <= key`` that is cheaper to send
#: than ``key`` (e.g. a prefix of it), or ``key`` itself. Any such ``b`` cuts a sorted set
#: between ``prev`` and ``key`` exactly as ``key`` does.
Shorten = Callable[[bytes, bytes], bytes]

#: How many keys either side of an equal-count cut :meth:`RangeIndex.split` looks at
#: for a cut with a shorter bound (and at most half a part, so cuts never cross).
SPLIT_WINDOW = 200


class RangeSource(Protocol):
    """What the reconciler asks of a set of keys (a :class:`RangeIndex` or a union)."""

    def __len__(self) -> int: ...

    def summary(self, lo: bytes | None, hi: bytes | None) -> Summary:
        """The monoid value of the circular range ``[lo, hi)`` (``None``: the whole set)."""
        ...

    def keys_in(self, lo: bytes | None, hi: bytes | None) -> Iterator[bytes]:
        """The keys of the circular range ``[lo, hi)`` in range order."""
        ...

    def split(
        self, lo: bytes, hi: bytes, parts: int, shorten: Shorten | None = None
    ) -> list[bytes]:
        """Up to ``parts - 1`` bounds cutting ``[lo, hi)`` into parts of about equal count."""
        ...

    def first(self) -> bytes | None:
        """The smallest key, or ``None`` when empty."""
        ...


class RangeIndex:
    """A sorted set of byte keys answering range fingerprints in O(log n).

    An augmented B+-tree: each inner node keeps, per child, its smallest key,
    key count and lift sum, so the value of every prefix is a walk from the
    root. Inserts and removes update the sums on their path (O(log n)); nodes
    live in a :class:`NodeStore` (call :meth:`flush` to persist) and a bounded
    cache. ``watermark`` is an integer the owner may record with the index
    (e.g. the last store row it reflects) to catch up after a crash.
    """

    def __init__(
        self,
        store: NodeStore | None = None,
        *,
        fanout: int = 64,
        cache_nodes: int = 4096,
    ) -> None:
        if fanout < 4:
            raise ValueError("fanout must be at least 4")
        self._store: NodeStore = store if store is not None else MemoryNodeStore()
        self._fanout = fanout
        self._cache: OrderedDict[int, _Node] = OrderedDict()
        self._dirty: dict[int, _Node] = {}
        self._cache_nodes = cache_nodes
        meta = self._store.get_meta()
        if meta is None:
            self._root, self._next_id, self.watermark = 0, 1, 0
            self._put(0, _Node(True, []))
            self._store.put_meta(self._root, self._next_id, self.watermark)
        else:
            self._root, self._next_id, self.watermark = meta
        self._size = self._node(self._root).summary().count

    # -- node access ---------------------------------------------------------------

    def _node(self, node_id: int) -> _Node:
        node = self._cache.get(node_id)
        if node is not None:
            self._cache.move_to_end(node_id)
            return node
        node = _Node.decode(self._store.get(node_id))
        self._cache[node_id] = node
        self._evict()
        return node

    def _put(self, node_id: int, node: _Node) -> None:
        # Encoded at flush (or when evicted): a node changed by many inserts is
        # written once.
        self._dirty[node_id] = node
        self._cache[node_id] = node
        self._cache.move_to_end(node_id)
        self._evict()

    def _evict(self) -> None:
        while len(self._cache) > self._cache_nodes:
            node_id, node = self._cache.popitem(last=False)
            if self._dirty.pop(node_id, None) is not None:
                self._store.put(node_id, node.encode())

    def _new_id(self) -> int:
        node_id = self._next_id
        self._next_id += 1
        return node_id

    def flush(self) -> None:
        """Persist every change so far (with the watermark) in the node store."""
        for node_id, node in self._dirty.items():
            self._store.put(node_id, node.encode())
        self._dirty.clear()
        self._store.put_meta(self._root, self._next_id, self.watermark)
        self._store.flush()

    # -- reading -------------------------------------------------------------------

    def __len__(self) -> int:
        return self._size

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes):
            return False
        node = self._node(self._root)
        while not node.leaf:
            i = max(bisect.bisect_right(node.keys, key) - 1, 0)
            node = self._node(node.children[i])
        i = bisect.bisect_left(node.keys, key)
        return i < len(node.keys) and node.keys[i] == key

    def prefix(self, bound: bytes | None) -> Summary:
        """The value of all keys ``< bound`` (``None``: all keys)."""
        node = self._node(self._root)
        if bound is None:
            return node.summary()
        count = total = 0
        while not node.leaf:
            i = bisect.bisect_left(node.keys, bound) - 1
            if i < 0:
                return Summary(count, total & _MASK)
            count += sum(node.counts[:i])
            total += sum(node.totals[:i])
            node = self._node(node.children[i])
        j = bisect.bisect_left(node.keys, bound)
        count += j
        total += sum(node.leaf_lifts()[:j])
        return Summary(count, total & _MASK)

    def summary(self, lo: bytes | None, hi: bytes | None) -> Summary:
        """The value of the circular range ``[lo, hi)``; ``None`` bounds are open ends."""
        if lo is None or hi is None:
            return self.prefix(hi) - (Summary() if lo is None else self.prefix(lo))
        if lo < hi:
            return self.prefix(hi) - self.prefix(lo)
        return self.prefix(None) - self.prefix(lo) + self.prefix(hi)

    def key_at(self, rank: int) -> bytes:
        """The key with ``rank`` smaller keys (0-based)."""
        if not 0 <= rank < self._size:
            raise IndexError(rank)
        node = self._node(self._root)
        while not node.leaf:
            for i, count in enumerate(node.counts):
                if rank < count:
                    node = self._node(node.children[i])
                    break
                rank -= count
        return node.keys[rank]

    def first(self) -> bytes | None:
        """The smallest key, or ``None`` when empty."""
        return self.key_at(0) if self._size else None

    def iter_from(self, lo: bytes | None) -> Iterator[bytes]:
        """Keys ``>= lo`` in order (all keys for ``None``)."""
        yield from self._iter(self._root, lo)

    def _iter(self, node_id: int, lo: bytes | None) -> Iterator[bytes]:
        node = self._node(node_id)
        if node.leaf:
            start = 0 if lo is None else bisect.bisect_left(node.keys, lo)
            yield from node.keys[start:]
            return
        start = 0 if lo is None else max(bisect.bisect_right(node.keys, lo) - 1, 0)
        children = list(node.children[start:])
        for n, child in enumerate(children):
            yield from self._iter(child, lo if n == 0 else None)

    def keys_in(self, lo: bytes | None, hi: bytes | None) -> Iterator[bytes]:
        """Keys of the circular range ``[lo, hi)`` in range order."""
        if lo is not None and hi is not None and lo >= hi:
            yield from self.iter_from(lo)
            for key in self.iter_from(None):
                if key >= hi or key >= lo:
                    return
                yield key
            return
        for key in self.iter_from(lo):
            if hi is not None and key >= hi:
                return
            yield key

    def split(
        self, lo: bytes, hi: bytes, parts: int, shorten: Shorten | None = None
    ) -> list[bytes]:
        """Up to ``parts - 1`` bounds cutting the circular ``[lo, hi)`` into about equal counts.

        Without ``shorten`` each cut is the key at an equal-count rank. With it,
        each cut may move up to :data:`SPLIT_WINDOW` keys (and at most half a
        part) to where ``shorten(previous key, key)`` is shortest, nearest the
        equal-count rank among equals: the bound on the wire is most of what a
        differing range costs, and some imbalance costs little (negentropy picks
        minimal bounds the same way, ``cpp/negentropy.h`` line 245).
        """
        count = self.summary(lo, hi).count
        if count < 2 or parts < 2:
            return []
        start = self.prefix(lo).count
        slack = min(SPLIT_WINDOW, count // (2 * parts)) if shorten is not None else 0
        cuts: list[bytes] = []
        for k in range(1, parts):
            offset = k * count // parts
            if offset == 0:
                continue
            cut = self._cut(start, offset, count, slack, shorten)
            if not cuts or cuts[-1] != cut:
                cuts.append(cut)
        return cuts

    def _cut(
        self, start: int, offset: int, count: int, slack: int, shorten: Shorten | None
    ) -> bytes:
        """The bound before the key ``offset`` keys into the range starting at rank ``start``."""
        target = start + offset
        first, last = target - slack, target + slack
        if (
            shorten is None
            or first - 1 < start
            or last >= start + count
            or last >= self._size
            or first - 1 < 0
        ):
            # No room to move, or the window wraps past the largest key.
            key = self.key_at(target % self._size)
            if shorten is not None and target % self._size:
                return shorten(self.key_at(target % self._size - 1), key)
            return key
        keys = list(itertools.islice(self.iter_from(self.key_at(first - 1)), last - first + 2))
        best: tuple[int, int, bytes] | None = None
        for i in range(1, len(keys)):
            bound = shorten(keys[i - 1], keys[i])
            score = (len(bound), abs(first + i - 1 - target))
            if best is None or score < best[:2]:
                best = (*score, bound)
        assert best is not None
        return best[2]

    # -- writing -------------------------------------------------------------------

    def insert(self, key: bytes) -> bool:
        """Add ``key``; return False if it was there already."""
        key = bytes(key)
        path: list[tuple[int, _Node, int]] = []
        node_id, node = self._root, self._node(self._root)
        while not node.leaf:
            i = max(bisect.bisect_right(node.keys, key) - 1, 0)
            path.append((node_id, node, i))
            node_id, node = node.children[i], self._node(node.children[i])
        j = bisect.bisect_left(node.keys, key)
        if j < len(node.keys) and node.keys[j] == key:
            return False
        self._add_to_leaf(path, node, j, key)
        self._store_path(path, node_id, node)
        return True

    def _add_to_leaf(
        self, path: list[tuple[int, _Node, int]], node: _Node, j: int, key: bytes
    ) -> None:
        """Put ``key`` at position ``j`` of leaf ``node`` and count it on ``path`` (the
        caller stores the path)."""
        node.keys.insert(j, key)
        lifted = lift(key)
        if node.lifts is not None:
            node.lifts.insert(j, lifted)
        self._size += 1
        for _, parent, i in path:
            parent.counts[i] += 1
            parent.totals[i] = (parent.totals[i] + lifted) & _MASK
            if key < parent.keys[i]:
                parent.keys[i] = key

    def remove(self, key: bytes) -> bool:
        """Remove ``key``; return False if it was not there."""
        key = bytes(key)
        path: list[tuple[int, _Node, int]] = []
        node_id, node = self._root, self._node(self._root)
        while not node.leaf:
            i = max(bisect.bisect_right(node.keys, key) - 1, 0)
            path.append((node_id, node, i))
            node_id, node = node.children[i], self._node(node.children[i])
        j = bisect.bisect_left(node.keys, key)
        if j >= len(node.keys) or node.keys[j] != key:
            return False
        del node.keys[j]
        if node.lifts is not None:
            del node.lifts[j]
        lifted = lift(key)
        self._size -= 1
        for _, parent, i in path:
            parent.counts[i] -= 1
            parent.totals[i] = (parent.totals[i] - lifted) & _MASK
        # Refresh the smallest keys and drop emptied children, leaf upwards.
        child_id, child = node_id, node
        self._put(child_id, child)
        for parent_id, parent, i in reversed(path):
            if not child.keys:
                del parent.keys[i], parent.children[i], parent.counts[i], parent.totals[i]
                self._store.delete(child_id)
                self._cache.pop(child_id, None)
                self._dirty.pop(child_id, None)
            else:
                parent.keys[i] = child.keys[0]
            self._put(parent_id, parent)
            child_id, child = parent_id, parent
        root = self._node(self._root)
        while not root.leaf and len(root.children) == 1:
            old = self._root
            self._root = root.children[0]
            self._store.delete(old)
            self._cache.pop(old, None)
            self._dirty.pop(old, None)
            root = self._node(self._root)
        if not root.leaf and not root.children:
            self._put(self._root, _Node(True, []))
        return True

    def _store_path(self, path: list[tuple[int, _Node, int]], leaf_id: int, leaf: _Node) -> None:
        """Write the changed path, splitting nodes over the fanout bottom-up."""
        split = self._split_if_full(leaf_id, leaf)
        for parent_id, parent, i in reversed(path):
            if split is not None:
                new_id, new_node = split
                summary = new_node.summary()
                left = self._node(parent.children[i]).summary()
                parent.counts[i], parent.totals[i] = left.count, left.total
                parent.keys.insert(i + 1, new_node.keys[0])
                parent.children.insert(i + 1, new_id)
                parent.counts.insert(i + 1, summary.count)
                parent.totals.insert(i + 1, summary.total)
            split = self._split_if_full(parent_id, parent)
        if split is not None:
            old_id, old = self._root, self._node(self._root)
            new_id, new_node = split
            a, b = old.summary(), new_node.summary()
            root = _Node(
                False,
                [old.keys[0], new_node.keys[0]],
                [old_id, new_id],
                [a.count, b.count],
                [a.total, b.total],
            )
            self._root = self._new_id()
            self._put(self._root, root)

    def _split_if_full(self, node_id: int, node: _Node) -> tuple[int, _Node] | None:
        if len(node.keys) <= self._fanout:
            self._put(node_id, node)
            return None
        half = len(node.keys) // 2
        if node.leaf:
            right = _Node(True, node.keys[half:])
            if node.lifts is not None:
                right.lifts = node.lifts[half:]
                node.lifts = node.lifts[:half]
            node.keys = node.keys[:half]
        else:
            right = _Node(
                False,
                node.keys[half:],
                node.children[half:],
                node.counts[half:],
                node.totals[half:],
            )
            node.keys, node.children = node.keys[:half], node.children[:half]
            node.counts, node.totals = node.counts[:half], node.totals[:half]
        new_id = self._new_id()
        self._put(node_id, node)
        self._put(new_id, right)
        return new_id, right

    def update(self, inserts: Iterable[bytes] = (), removes: Iterable[bytes] = ()) -> None:
        """Apply several removes and inserts (removes first).

        The same keys as one :meth:`remove` and :meth:`insert` per key; the inserts
        go in key order, and the keys that land in one leaf share one walk from
        the root and one write of the path.
        """
        for key in removes:
            self.remove(key)
        keys = sorted({bytes(key) for key in inserts})
        fanout, n, k = self._fanout, len(keys), 0
        while k < n:
            key = keys[k]
            path: list[tuple[int, _Node, int]] = []
            # The smallest separator right of the path: keys from it on go elsewhere.
            upper: bytes | None = None
            node_id, node = self._root, self._node(self._root)
            while not node.leaf:
                i = max(bisect.bisect_right(node.keys, key) - 1, 0)
                if i + 1 < len(node.keys):
                    upper = node.keys[i + 1]
                path.append((node_id, node, i))
                node_id, node = node.children[i], self._node(node.children[i])
            # The leaf's new keys are counted on the path once, after the last of them
            # (what one _add_to_leaf per key adds up to); the first is the smallest.
            leaf_keys, lifts = node.keys, node.lifts
            added = total = j = 0
            smallest = key
            while True:
                j = bisect.bisect_left(leaf_keys, key, j)
                if j == len(leaf_keys) or leaf_keys[j] != key:
                    leaf_keys.insert(j, key)
                    lifted = lift(key)
                    if lifts is not None:
                        lifts.insert(j, lifted)
                    if not added:
                        smallest = key
                    added += 1
                    total += lifted
                k += 1
                # A full leaf is split (as insert() does) before the next key.
                if k == n or len(leaf_keys) > fanout:
                    break
                key = keys[k]
                if upper is not None and key >= upper:
                    break
            if added:
                self._size += added
                for _, parent, i in path:
                    parent.counts[i] += added
                    parent.totals[i] = (parent.totals[i] + total) & _MASK
                    if smallest < parent.keys[i]:
                        parent.keys[i] = smallest
                self._store_path(path, node_id, node)


class UnionIndex:
    """Several disjoint :class:`RangeIndex` seen as one set (e.g. one per schema).

    Values add up (the monoid); splits come from the member holding most keys
    of the range, which keeps parts roughly balanced without a merged index.
    """

    def __init__(self, members: Sequence[RangeSource]) -> None:
        self._members = list(members)

    def __len__(self) -> int:
        return sum(len(m) for m in self._members)

    def summary(self, lo: bytes | None, hi: bytes | None) -> Summary:
        """The value of the circular range ``[lo, hi)`` over all members."""
        result = Summary()
        for member in self._members:
            result = result + member.summary(lo, hi)
        return result

    def keys_in(self, lo: bytes | None, hi: bytes | None) -> Iterator[bytes]:
        """Keys of the circular range ``[lo, hi)`` over all members, in range order."""
        if lo is not None and hi is not None and lo >= hi:
            yield from self.keys_in(lo, None)
            yield from self.keys_in(None, hi)
            return
        yield from heapq.merge(*(m.keys_in(lo, hi) for m in self._members))

    def split(
        self, lo: bytes, hi: bytes, parts: int, shorten: Shorten | None = None
    ) -> list[bytes]:
        """Cuts from the member with the most keys in ``[lo, hi)`` (any bound cuts any set)."""
        if not self._members:
            return []
        biggest = max(self._members, key=lambda m: m.summary(lo, hi).count)
        return biggest.split(lo, hi, parts, shorten)

    def first(self) -> bytes | None:
        """The smallest key of any member."""
        firsts = [k for k in (m.first() for m in self._members) if k is not None]
        return min(firsts) if firsts else None


# -- messages ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EmptySet:
    """My set is empty (opens a session); with ``can_respond`` send me all of yours."""

    can_respond: bool


@dataclass(frozen=True, slots=True)
class LowerBound:
    """The next range starts at ``bound``."""

    bound: bytes


@dataclass(frozen=True, slots=True)
class Payload:
    """One of my keys of the current range; the last one carries ``upper_bound``.

    ``upper_bound is None`` marks a key that is not the last. On the last,
    ``can_respond`` asks the receiver to answer with the symmetric difference.
    """

    key: bytes
    can_respond: bool = False
    upper_bound: bytes | None = None


@dataclass(frozen=True, slots=True)
class EmptyPayload:
    """I hold no key in ``[lower, upper_bound)``: send me yours."""

    upper_bound: bytes


@dataclass(frozen=True, slots=True)
class Done:
    """``[lower, upper_bound)`` is reconciled."""

    upper_bound: bytes


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """The fingerprint of my keys in ``[lower, upper_bound)``."""

    fingerprint: bytes
    upper_bound: bytes


@dataclass(frozen=True, slots=True)
class Terminal:
    """The end of a round."""


RangeMessage: TypeAlias = (
    "EmptySet | LowerBound | Payload | EmptyPayload | Done | Fingerprint | Terminal"
)


class ReconcileError(RemoteProtocolError):
    """A peer's round breaks the protocol or a bound (``ReconcilerLimits``)."""


class RoundTooLong(ReconcileError, LimitExceeded):
    """A peer's round has more messages than ``ReconcilerLimits.max_round_messages``."""


@dataclass(frozen=True, slots=True)
class ReconcilerLimits:
    """Bounds on what a peer can make us hold or do in one round."""

    #: Range messages in one round (fingerprints, payload keys, ...).
    max_round_messages: int = 100_000
    #: Bytes of one key.
    max_key_size: int = 1024


@dataclass(slots=True)
class _Range:
    lo: bytes
    hi: bytes
    kind: str  # "fp", "payload", "empty", "done"
    fingerprint: bytes = b""
    keys: tuple[bytes, ...] = ()
    can_respond: bool = False


class Reconciler:
    """One side of a reconciliation of ``source`` with a peer's set (sans I/O).

    Call :meth:`initiate` on the side that starts (it returns the first round)
    and :meth:`receive` with every message from the peer; it returns the
    messages to send (a whole round once a Terminal arrives). Learned
    differences accumulate in :attr:`local_only` (keys we hold and the peer
    lacks) and :attr:`remote_only` (keys the peer holds and we lack); the owner
    drains them with :meth:`take_differences`. :attr:`finished` becomes true
    when neither side has anything left to ask. ``source`` may change between
    rounds (keys arriving mid-session); the result still converges, perhaps
    with a few extra keys reported.

    ``threshold``: a range that differs and holds at most this many keys is
    answered with its keys. ``part_threshold`` (default: ``threshold``): when a
    differing range is split, a part with at most this many keys goes out as
    its keys, a larger part as a fingerprint. A lower ``part_threshold`` sends
    fingerprints (about 25 bytes with short bounds in the replication
    messages) for small parts that are mostly equal instead of their keys (45
    bytes each, 8 when one author's), for one more round trip.

    ``keys_for_empty_set``: answer a peer's opening :class:`EmptySet` with all
    our keys, so its :attr:`remote_only` learns each of them. Off, the answer is
    a bare Terminal, nothing is added to :attr:`local_only` (no work per key)
    and :attr:`peer_empty` becomes true: the owner sends everything instead (as
    p2panda does, ``specs/p2panda-replication.txt`` 2.1: the peer "is asked to
    send all entries of the requested schemas").

    ``group_prefix``: keys sharing their first ``group_prefix`` bytes form a
    group (p2panda: one log's keys share public key and log id). When given,
    :attr:`peer_lacks` collects, as soon as they are learned, the local-only
    keys of groups the peer holds no key of: the range they were learned in
    contains the whole group (no bound of it falls inside the group) and the
    peer's complete keys there have none of it. The owner can act on those
    at once rather than when reconciliation ends. With ``send_lacking`` off,
    those keys are left out of our answers too (the peer's :attr:`remote_only`
    misses them): the owner sends what they stand for, which tells the peer more
    than a list of keys would.
    """

    def __init__(
        self,
        source: RangeSource,
        *,
        branching: int = 4,
        threshold: int = 8,
        limits: ReconcilerLimits | None = None,
        shorten: Shorten | None = None,
        part_threshold: int | None = None,
        keys_for_empty_set: bool = True,
        group_prefix: int | None = None,
        send_lacking: bool = True,
    ) -> None:
        if branching < 2:
            raise ValueError("branching must be at least 2")
        if threshold < branching:
            raise ValueError("threshold must be at least the branching factor")
        self._source = source
        #: Cheaper bounds for the cuts of a split range (see :data:`Shorten`).
        self.shorten = shorten
        #: A part of a split range with at most this many keys goes out as its keys,
        #: a larger one as a fingerprint (see ``part_threshold``).
        self.part_threshold = threshold if part_threshold is None else part_threshold
        self.branching = branching
        self.threshold = threshold
        self.limits = limits or ReconcilerLimits()
        self.keys_for_empty_set = keys_for_empty_set
        #: The peer opened with EmptySet asking for everything (it holds no key).
        self.peer_empty = False
        self._round: list[RangeMessage] = []
        self.finished = False
        self.rounds_sent = 0
        self.rounds_received = 0
        self.local_only: list[bytes] = []
        self.remote_only: list[bytes] = []
        self.group_prefix = group_prefix
        self.send_lacking = send_lacking
        #: Local-only keys of groups the peer holds nothing of (see ``group_prefix``).
        self.peer_lacks: list[bytes] = []

    def take_differences(self) -> tuple[list[bytes], list[bytes]]:
        """``(local_only, remote_only)`` learned since the last call."""
        local, remote = self.local_only, self.remote_only
        self.local_only, self.remote_only = [], []
        return local, remote

    def take_peer_lacks(self) -> list[bytes]:
        """:attr:`peer_lacks` learned since the last call."""
        lacks, self.peer_lacks = self.peer_lacks, []
        return lacks

    def _note_lacking(
        self, lo: bytes, hi: bytes, local: list[bytes], theirs: Iterable[bytes]
    ) -> list[bytes]:
        """Add to :attr:`peer_lacks` the ``local`` keys of ``[lo, hi)`` whose group is whole
        in the range and absent from ``theirs`` (the peer's complete keys of the range);
        return the ``local`` keys to send back (all of them unless ``send_lacking`` is off)."""
        n = self.group_prefix
        if n is None:
            return local
        # A bound longer than the prefix may fall inside its group: part of the group
        # lies outside the range, where the peer may hold a key of it.
        skip = {k[:n] for k in theirs}
        if lo != hi:
            skip.update(b[:n] for b in (lo, hi) if len(b) > n)
        lacking = [k for k in local if k[:n] not in skip]
        self.peer_lacks.extend(lacking)
        if self.send_lacking or not lacking:
            return local
        return [k for k in local if k[:n] in skip]

    def initiate(self) -> list[RangeMessage]:
        """The opening round: the whole set's fingerprint, its keys, or EmptySet.

        One fingerprint rather than a split: equal sets then cost one message
        each way, and a difference costs one more round trip.
        """
        count = len(self._source)
        self.rounds_sent += 1
        if count == 0:
            return [EmptySet(True), Terminal()]
        first = self._source.first()
        assert first is not None
        out = _RoundWriter()
        if count <= self.threshold:
            self._send_keys(out, first, first, can_respond=True, report=False)
        else:
            # [x, x) is the whole set for any x: the cheapest bound not above the first key.
            start = first if self.shorten is None else self.shorten(b"", first)
            out.fingerprint(start, start, fingerprint(self._source.summary(start, start)))
        return out.finish()

    def receive(self, message: RangeMessage) -> list[RangeMessage]:
        """Take one message of the peer's round; at its Terminal return our answer."""
        if self.finished:
            raise ReconcileError("reconciliation is finished; no more rounds expected")
        if not isinstance(message, Terminal):
            if len(self._round) >= self.limits.max_round_messages:
                raise RoundTooLong(f"round longer than {self.limits.max_round_messages} messages")
            for key in _keys_of(message):
                if len(key) > self.limits.max_key_size:
                    raise ReconcileError(f"key of {len(key)} bytes")
            self._round.append(message)
            return []
        messages, self._round = self._round, []
        self.rounds_received += 1
        return self.receive_round(messages)

    def receive_round(self, messages: Sequence[RangeMessage]) -> list[RangeMessage]:
        """Answer a whole round (without its Terminal); ``[]`` when we are finished."""
        needs_answer = False
        out = _RoundWriter()
        if len(messages) == 1 and isinstance(messages[0], EmptySet):
            if messages[0].can_respond:
                needs_answer = True
                self.peer_empty = True
                if self.keys_for_empty_set and len(self._source):
                    first = self._source.first()
                    assert first is not None
                    self._send_keys(out, first, first, can_respond=False, report=True)
        else:
            for item in _ranges(messages):
                needs_answer |= self._answer(out, item)
        if not needs_answer:
            self.finished = True
            return []
        reply = out.finish()
        self.rounds_sent += 1
        if not out.needs_answer:
            self.finished = True
        return reply

    def _answer(self, out: _RoundWriter, item: _Range) -> bool:
        """Answer one range of the peer's round; return whether it asked for an answer."""
        if item.kind == "done":
            return False
        if item.kind == "fp":
            value = self._source.summary(item.lo, item.hi)
            if fingerprint(value) != item.fingerprint:
                self._answer_mismatch(out, item.lo, item.hi, value.count)
            return True
        if item.kind == "empty":
            keys = list(self._source.keys_in(item.lo, item.hi))
            self.local_only.extend(keys)
            keys = self._note_lacking(item.lo, item.hi, keys, ())
            if keys:
                out.keys(item.lo, item.hi, keys, can_respond=False)
            return True
        # A complete key list of the peer's range.
        theirs = set(item.keys)
        mine = list(self._source.keys_in(item.lo, item.hi))
        mine_set = set(mine)
        if item.can_respond:
            local = [k for k in mine if k not in theirs]
            remote = [k for k in item.keys if k not in mine_set]
            self.local_only.extend(local)
            self.remote_only.extend(remote)
            back = self._note_lacking(item.lo, item.hi, local, item.keys)
            diff = sorted(set(back) | set(remote), key=_circular(item.lo))
            if diff:
                out.keys(item.lo, item.hi, diff, can_respond=False)
            return True
        # An answer to our list: the symmetric difference. A key we hold came
        # back because the peer lacks it; any other is the peer's alone.
        local = [key for key in item.keys if key in mine_set]
        remote = [key for key in item.keys if key not in mine_set]
        self.local_only.extend(local)
        self.remote_only.extend(remote)
        if self.group_prefix is not None and local:
            # The peer's complete keys of the range: ours it did not send back, and its own.
            peer = [k for k in mine if k not in theirs] + remote
            self._note_lacking(item.lo, item.hi, local, peer)
        return False

    def _answer_mismatch(self, out: _RoundWriter, lo: bytes, hi: bytes, count: int) -> None:
        if count == 0:
            out.empty(lo, hi)
            return
        if count <= self.threshold:
            self._send_keys(out, lo, hi, can_respond=True, report=False)
            return
        cuts = self._source.split(lo, hi, self.branching, self.shorten)
        bounds = [lo, *cuts, hi]
        for a, b in itertools.pairwise(bounds):
            part = self._source.summary(a, b)
            if part.count == 0:
                out.empty(a, b)
            elif part.count <= self.part_threshold:
                self._send_keys(out, a, b, can_respond=True, report=False)
            else:
                out.fingerprint(a, b, fingerprint(part))

    def _send_keys(
        self, out: _RoundWriter, lo: bytes, hi: bytes, *, can_respond: bool, report: bool
    ) -> None:
        keys = list(self._source.keys_in(lo, hi))
        if report:
            self.local_only.extend(keys)
        if keys:
            out.keys(lo, hi, keys, can_respond=can_respond)


def _keys_of(message: RangeMessage) -> tuple[bytes, ...]:
    if isinstance(message, LowerBound):
        return (message.bound,)
    if isinstance(message, Payload):
        return (message.key,) if message.upper_bound is None else (message.key, message.upper_bound)
    if isinstance(message, EmptyPayload | Done | Fingerprint):
        return (message.upper_bound,)
    return ()


def _circular(lo: bytes) -> Callable[[bytes], tuple[bool, bytes]]:
    """Sort key putting keys ``>= lo`` first: the order of a circular range from ``lo``."""
    return lambda key: (key < lo, key)


def _ranges(messages: Sequence[RangeMessage]) -> Iterator[_Range]:
    """The ranges of a round, each with its lower bound resolved."""
    last_upper: bytes | None = None
    for message in reversed(messages):
        upper = _upper(message)
        if upper is not None:
            last_upper = upper
            break
    if last_upper is None:
        if messages:
            raise ReconcileError("a round without any range")
        return
    lower: bytes = last_upper
    keys: list[bytes] = []
    for message in messages:
        if isinstance(message, LowerBound):
            if keys:
                raise ReconcileError("LowerBound inside a payload list")
            lower = message.bound
        elif isinstance(message, EmptySet):
            raise ReconcileError("EmptySet inside a round of ranges")
        elif isinstance(message, Payload):
            keys.append(message.key)
            if message.upper_bound is not None:
                yield _Range(
                    lower,
                    message.upper_bound,
                    "payload",
                    keys=tuple(keys),
                    can_respond=message.can_respond,
                )
                keys, lower = [], message.upper_bound
        elif keys:
            raise ReconcileError("a payload list not ended by an upper bound")
        elif isinstance(message, Fingerprint):
            if len(message.fingerprint) != FINGERPRINT_SIZE:
                raise ReconcileError(f"fingerprint of {len(message.fingerprint)} bytes")
            yield _Range(lower, message.upper_bound, "fp", fingerprint=message.fingerprint)
            lower = message.upper_bound
        elif isinstance(message, EmptyPayload):
            yield _Range(lower, message.upper_bound, "empty")
            lower = message.upper_bound
        elif isinstance(message, Done):
            yield _Range(lower, message.upper_bound, "done")
            lower = message.upper_bound
    if keys:
        raise ReconcileError("a payload list not ended by an upper bound")


def _upper(message: RangeMessage) -> bytes | None:
    if isinstance(message, Payload):
        return message.upper_bound
    if isinstance(message, EmptyPayload | Done | Fingerprint):
        return message.upper_bound
    return None


class _RoundWriter:
    """Builds a round: skips LowerBound when ranges are consecutive; notes if it asks."""

    def __init__(self) -> None:
        self.messages: list[RangeMessage] = []
        self._cursor: bytes | None = None
        self._first_lower: bytes | None = None
        self.needs_answer = False

    def _start(self, lo: bytes) -> None:
        if self._cursor is None:
            # The first range's lower bound may be left implicit when it equals
            # the round's last upper bound; we cannot know that yet, so we
            # remember it and decide in finish().
            self._first_lower = lo
        elif self._cursor != lo:
            self.messages.append(LowerBound(lo))

    def fingerprint(self, lo: bytes, hi: bytes, fp: bytes) -> None:
        self._start(lo)
        self.messages.append(Fingerprint(fp, hi))
        self._cursor = hi
        self.needs_answer = True

    def empty(self, lo: bytes, hi: bytes) -> None:
        self._start(lo)
        self.messages.append(EmptyPayload(hi))
        self._cursor = hi
        self.needs_answer = True

    def keys(self, lo: bytes, hi: bytes, keys: Sequence[bytes], *, can_respond: bool) -> None:
        self._start(lo)
        for key in keys[:-1]:
            self.messages.append(Payload(key))
        self.messages.append(Payload(keys[-1], can_respond, hi))
        self._cursor = hi
        self.needs_answer |= can_respond

    def finish(self) -> list[RangeMessage]:
        if self._first_lower is not None and self._first_lower != self._cursor:
            self.messages.insert(0, LowerBound(self._first_lower))
        return [*self.messages, Terminal()]
