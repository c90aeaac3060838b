"""The range index: an augmented B+-tree answering every prefix :class:`Summary` in
O(log n), its nodes in a :class:`~sdk.sync.rbsr.node_store.NodeStore`, and the union of
several indexes as one range source."""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from sdk.sds.varint import read_uvarint, write_uvarint
from sdk.sync.rbsr.monoid import MASK, Summary, lift
from sdk.sync.rbsr.node_store import MemoryNodeStore, NodeStore


@dataclass(slots=True, eq=False)
class _Node:
    """A B+-tree node (see :class:`RangeIndex`): a leaf's sorted ``keys`` (their ``lifts``
    cached, never stored), or an inner node's children with the smallest key below each."""

    leaf: bool
    keys: list[bytes]
    children: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    totals: list[int] = field(default_factory=list)
    lifts: list[int] | None = None

    def leaf_lifts(self) -> list[int]:
        if self.lifts is None:
            self.lifts = [lift(k) for k in self.keys]
        return self.lifts

    def summary(self) -> Summary:
        if self.leaf:
            return Summary(len(self.keys), sum(self.leaf_lifts()) & MASK)
        return Summary(sum(self.counts), sum(self.totals) & MASK)

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
        node = cls(data[:1] == b"L", [])
        n, pos = read_uvarint(data, 1)
        for _ in range(n):
            size, pos = read_uvarint(data, pos)
            node.keys.append(data[pos : pos + size])
            pos += size
            if not node.leaf:
                child, pos = read_uvarint(data, pos)
                count, pos = read_uvarint(data, pos)
                node.children.append(child)
                node.counts.append(count)
                node.totals.append(int.from_bytes(data[pos : pos + 16], "big"))
                pos += 16
        return node


#: ``shorten(prev, key)``: a bound ``b`` with ``prev < b <= key`` that is cheaper to send
#: than ``key`` (e.g. a prefix of it), or ``key`` itself. Any such ``b`` cuts a sorted set
#: between ``prev`` and ``key`` exactly as ``key`` does.
Shorten = Callable[[bytes, bytes], bytes]

#: How many keys either side of an equal-count cut :meth:`RankedSet.split` looks at.
SPLIT_WINDOW = 200


class RankedSet:
    """The range queries of a sorted set of keys, over four it answers itself:
    ``len``, :meth:`prefix`, :meth:`key_at` and :meth:`iter_from` (ranks count from
    its smallest key). What the reconciler reads (:data:`RangeSource`)."""

    def __len__(self) -> int:
        raise NotImplementedError

    def prefix(self, bound: bytes | None) -> Summary:
        """The value of all keys ``< bound`` (``None``: all keys)."""
        raise NotImplementedError

    def key_at(self, rank: int) -> bytes:
        """The key with ``rank`` smaller keys (0-based)."""
        raise NotImplementedError

    def iter_from(self, lo: bytes | None) -> Iterator[bytes]:
        """Keys ``>= lo`` in order (all keys for ``None``)."""
        raise NotImplementedError

    def summary(self, lo: bytes | None, hi: bytes | None) -> Summary:
        """The value of the circular range ``[lo, hi)``; ``None`` bounds are open ends."""
        value = self.prefix(hi) - (Summary() if lo is None else self.prefix(lo))
        if lo is not None and hi is not None and lo >= hi:  # wraps past the largest key
            value = value + self.prefix(None)
        return value

    def first(self) -> bytes | None:
        """The smallest key, or ``None`` when empty."""
        return next(self.iter_from(None), None)

    def keys_in(self, lo: bytes | None, hi: bytes | None) -> Iterator[bytes]:
        """Keys of the circular range ``[lo, hi)`` in range order."""
        if lo is not None and hi is not None and lo >= hi:
            yield from self.iter_from(lo)
            yield from self.keys_in(None, hi)
            return
        yield from itertools.takewhile(lambda key: hi is None or key < hi, self.iter_from(lo))

    def split(
        self, lo: bytes, hi: bytes, parts: int, shorten: Shorten | None = None
    ) -> list[bytes]:
        """Up to ``parts - 1`` bounds cutting the circular ``[lo, hi)`` into about equal counts.

        Without ``shorten`` each cut is the key at an equal-count rank. With it, each
        cut may move up to :data:`SPLIT_WINDOW` keys (and at most half a part, so cuts
        never cross) to where ``shorten(previous key, key)`` is shortest, nearest the
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
        if shorten is None or first - 1 < start or last >= start + count or last >= len(self):
            # No room to move, or the window wraps past the largest key.
            key = self.key_at(target % len(self))
            if shorten is not None and target % len(self):
                return shorten(self.key_at(target % len(self) - 1), key)
            return key
        keys = itertools.islice(self.iter_from(self.key_at(first - 1)), last - first + 2)
        bounds = enumerate((shorten(a, b) for a, b in itertools.pairwise(keys)), first)
        return min(bounds, key=lambda b: (len(b[1]), abs(b[0] - target)))[1]


class RangeIndex(RankedSet):
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
        self._root, self._next_id, self.watermark = meta or (0, 1, 0)
        if meta is None:
            self._put(0, _Node(True, []))
            self._store.put_meta(0, 1, 0)
        self._size = self._node(self._root).summary().count

    def _node(self, node_id: int) -> _Node:
        node = self._cache.get(node_id) or _Node.decode(self._store.get(node_id))
        return self._cached(node_id, node)

    def _put(self, node_id: int, node: _Node) -> None:
        # Encoded at flush (or eviction), so a node changed by many inserts is written once.
        self._dirty[node_id] = node
        self._cached(node_id, node)

    def _cached(self, node_id: int, node: _Node) -> _Node:
        """Keep ``node`` as the most recently used; write out what falls off the cache."""
        self._cache[node_id] = node
        self._cache.move_to_end(node_id)
        while len(self._cache) > self._cache_nodes:
            old_id, old = self._cache.popitem(last=False)
            if self._dirty.pop(old_id, None) is not None:
                self._store.put(old_id, old.encode())
        return node

    def _drop(self, node_id: int) -> None:
        self._store.delete(node_id)
        self._cache.pop(node_id, None)
        self._dirty.pop(node_id, None)

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

    def __len__(self) -> int:
        return self._size

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and key in self._descend(key)[2].keys

    def prefix(self, bound: bytes | None) -> Summary:
        node = self._node(self._root)
        if bound is None:
            return node.summary()
        count = total = 0
        while not node.leaf:
            i = bisect.bisect_left(node.keys, bound) - 1
            if i < 0:
                return Summary(count, total & MASK)
            count += sum(node.counts[:i])
            total += sum(node.totals[:i])
            node = self._node(node.children[i])
        j = bisect.bisect_left(node.keys, bound)
        count += j
        total += sum(node.leaf_lifts()[:j])
        return Summary(count, total & MASK)

    def key_at(self, rank: int) -> bytes:
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

    def iter_from(self, lo: bytes | None) -> Iterator[bytes]:
        yield from self._iter(self._root, lo)

    def _iter(self, node_id: int, lo: bytes | None) -> Iterator[bytes]:
        node = self._node(node_id)
        if node.leaf:
            start = 0 if lo is None else bisect.bisect_left(node.keys, lo)
            yield from node.keys[start:]
            return
        start = 0 if lo is None else max(bisect.bisect_right(node.keys, lo) - 1, 0)
        for n, child in enumerate(node.children[start:]):
            yield from self._iter(child, lo if n == 0 else None)

    def _descend(self, key: bytes) -> tuple[list[tuple[int, _Node, int]], int, _Node]:
        """The path from the root to the leaf where ``key`` belongs (each inner node with
        the child taken), the leaf's id and the leaf."""
        path: list[tuple[int, _Node, int]] = []
        node_id, node = self._root, self._node(self._root)
        while not node.leaf:
            i = max(bisect.bisect_right(node.keys, key) - 1, 0)
            path.append((node_id, node, i))
            node_id, node = node.children[i], self._node(node.children[i])
        return path, node_id, node

    def insert(self, key: bytes) -> bool:
        """Add ``key``; return False if it was there already."""
        size = self._size
        self.update(inserts=(key,))
        return self._size > size

    def remove(self, key: bytes) -> bool:
        """Remove ``key``; return False if it was not there."""
        key = bytes(key)
        path, node_id, node = self._descend(key)
        j = bisect.bisect_left(node.keys, key)
        if j >= len(node.keys) or node.keys[j] != key:
            return False
        del node.keys[j]
        lifted = lift(key) if node.lifts is None else node.lifts.pop(j)
        self._size -= 1
        # Update the sums and smallest keys and drop emptied children, leaf upwards.
        child_id, child = node_id, node
        self._put(child_id, child)
        for parent_id, parent, i in reversed(path):
            if not child.keys:
                del parent.keys[i], parent.children[i], parent.counts[i], parent.totals[i]
                self._drop(child_id)
            else:
                parent.keys[i] = child.keys[0]
                parent.counts[i] -= 1
                parent.totals[i] = (parent.totals[i] - lifted) & MASK
            self._put(parent_id, parent)
            child_id, child = parent_id, parent
        root = self._node(self._root)
        while not root.leaf and len(root.children) == 1:
            self._drop(self._root)
            self._root = root.children[0]
            root = self._node(self._root)
        if not root.leaf and not root.children:
            self._put(self._root, _Node(True, []))
        return True

    def _store_path(self, path: list[tuple[int, _Node, int]], leaf_id: int, leaf: _Node) -> None:
        """Write the changed path, splitting nodes over the fanout bottom-up (a split
        root gets a new root above it)."""
        split = self._split_if_full(leaf_id, leaf)
        for parent_id, parent, i in reversed(path):
            if split is not None:
                self._add_right(parent, i, *split)
            split = self._split_if_full(parent_id, parent)
        if split is not None:
            root = _Node(False, [self._node(self._root).keys[0]], [self._root], [0], [0])
            self._add_right(root, 0, *split)
            self._root = self._new_id()
            self._put(self._root, root)

    def _add_right(self, parent: _Node, i: int, new_id: int, new_node: _Node) -> None:
        """Add ``new_node``, split off child ``i`` of ``parent``, right after it."""
        left, right = self._node(parent.children[i]).summary(), new_node.summary()
        parent.counts[i], parent.totals[i] = left.count, left.total
        parent.keys.insert(i + 1, new_node.keys[0])
        parent.children.insert(i + 1, new_id)
        parent.counts.insert(i + 1, right.count)
        parent.totals.insert(i + 1, right.total)

    def _split_if_full(self, node_id: int, node: _Node) -> tuple[int, _Node] | None:
        if len(node.keys) <= self._fanout:
            self._put(node_id, node)
            return None
        half = len(node.keys) // 2
        per_child = (node.children, node.counts, node.totals)  # a leaf's are empty
        right = _Node(node.leaf, node.keys[half:], *(p[half:] for p in per_child))
        node.keys = node.keys[:half]
        node.children, node.counts, node.totals = (p[:half] for p in per_child)
        if node.lifts is not None:
            right.lifts, node.lifts = node.lifts[half:], node.lifts[:half]
        new_id = self._new_id()
        self._put(node_id, node)
        self._put(new_id, right)
        return new_id, right

    def update(self, inserts: Iterable[bytes] = (), removes: Iterable[bytes] = ()) -> None:
        """Apply several removes, then inserts: as one :meth:`remove` or :meth:`insert` per
        key, but the inserts go in key order and those landing in one leaf share one walk
        from the root and one write of the path."""
        for key in removes:
            self.remove(key)
        keys = sorted({bytes(key) for key in inserts})
        fanout, n, k = self._fanout, len(keys), 0
        while k < n:
            key = keys[k]
            path, node_id, node = self._descend(key)
            # The smallest separator right of the path: keys from it on go elsewhere.
            upper = next((p.keys[i + 1] for _, p, i in reversed(path) if i + 1 < len(p.keys)), None)
            # The leaf's new keys are counted on the path once, after the last of them.
            leaf_keys, lifts = node.keys, node.lifts
            added = total = j = 0
            while True:
                j = bisect.bisect_left(leaf_keys, key, j)
                if j == len(leaf_keys) or leaf_keys[j] != key:
                    leaf_keys.insert(j, key)
                    lifted = lift(key)
                    if lifts is not None:
                        lifts.insert(j, lifted)
                    added += 1
                    total += lifted
                k += 1
                # A full leaf is split before the next key.
                if k == n or len(leaf_keys) > fanout:
                    break
                key = keys[k]
                if upper is not None and key >= upper:
                    break
            if added:
                self._size += added
                # A key below a subtree's smallest descends to its leftmost leaf, so the
                # leaf's first key is then the subtree's new smallest.
                first = leaf_keys[0]
                for _, parent, i in path:
                    parent.counts[i] += added
                    parent.totals[i] = (parent.totals[i] + total) & MASK
                    if first < parent.keys[i]:
                        parent.keys[i] = first
                self._store_path(path, node_id, node)


#: What the reconciler reads: a :class:`RangeIndex`, a view of one or a :class:`UnionIndex`.
RangeSource: TypeAlias = RankedSet


class UnionIndex(RankedSet):
    """Several disjoint :class:`RangeIndex` seen as one set (e.g. one per schema): values
    add up (the monoid) and keys merge."""

    def __init__(self, members: Sequence[RankedSet]) -> None:
        self._members = list(members)

    def __len__(self) -> int:
        return sum(len(m) for m in self._members)

    def prefix(self, bound: bytes | None) -> Summary:
        return sum((m.prefix(bound) for m in self._members), Summary())

    def iter_from(self, lo: bytes | None) -> Iterator[bytes]:
        return heapq.merge(*(m.iter_from(lo) for m in self._members))

    def split(
        self, lo: bytes, hi: bytes, parts: int, shorten: Shorten | None = None
    ) -> list[bytes]:
        """Cuts from the member with the most keys in ``[lo, hi)`` (any bound cuts any set),
        which keeps parts roughly balanced without a merged index."""
        if not self._members:
            return []
        biggest = max(self._members, key=lambda m: m.summary(lo, hi).count)
        return biggest.split(lo, hi, parts, shorten)


__all__ = ["SPLIT_WINDOW", "RangeIndex", "RangeSource", "RankedSet", "Shorten", "UnionIndex"]
