"""Range-based set reconciliation: the index against a sorted list, and two peers converging."""

from __future__ import annotations

import itertools
import random
import sqlite3
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.sync.rbsr import (
    EmptySet,
    Fingerprint,
    MemoryNodeStore,
    Payload,
    RangeIndex,
    RangeMessage,
    ReconcileError,
    Reconciler,
    ReconcilerLimits,
    Shorten,
    SqliteNodeStore,
    Summary,
    Terminal,
    UnionIndex,
    fingerprint,
    lift,
)

_MASK = (1 << 128) - 1


def brute(keys: Sequence[bytes], lo: bytes | None, hi: bytes | None) -> Summary:
    if lo is not None and hi is not None and lo >= hi:
        chosen = [k for k in keys if k >= lo or k < hi]
    else:
        chosen = [k for k in keys if (lo is None or k >= lo) and (hi is None or k < hi)]
    return Summary(len(chosen), sum(lift(k) for k in chosen) & _MASK)


keys_st = st.lists(st.binary(min_size=0, max_size=6), max_size=300)


@settings(max_examples=60, deadline=None)
@given(keys_st, keys_st, st.binary(max_size=6), st.binary(max_size=6))
def test_index_matches_a_sorted_list(inserted, removed, lo, hi) -> None:
    index = RangeIndex(fanout=4)
    for key in inserted:
        index.insert(key)
    for key in removed:
        index.remove(key)
    expected = sorted(set(inserted) - set(removed))
    assert len(index) == len(expected)
    assert list(index.iter_from(None)) == expected
    assert index.summary(lo, hi) == brute(expected, lo, hi)
    assert index.summary(None, hi) == brute(expected, None, hi)
    assert index.summary(lo, None) == brute(expected, lo, None)
    in_range = list(index.keys_in(lo, hi))
    if lo >= hi:
        assert in_range == [k for k in expected if k >= lo] + [k for k in expected if k < hi]
    else:
        assert in_range == [k for k in expected if lo <= k < hi]
    for rank, key in enumerate(expected):
        assert index.key_at(rank) == key
        assert key in index


def _check_tree(index: RangeIndex, node_id: int | None = None) -> tuple[bytes | None, Summary]:
    """Every inner node's smallest keys and sums match its children; (min key, summary)."""
    node = index._node(index._root if node_id is None else node_id)
    if node.leaf:
        assert node.keys == sorted(set(node.keys))
        assert len(node.keys) <= index._fanout
        return (node.keys[0] if node.keys else None), node.summary()
    assert len(node.children) <= index._fanout
    for i, child in enumerate(node.children):
        smallest, summary = _check_tree(index, child)
        assert smallest == node.keys[i]
        assert (node.counts[i], node.totals[i]) == (summary.count, summary.total)
    return node.keys[0], node.summary()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(keys_st, keys_st), max_size=6))
def test_update_in_batches_equals_one_key_at_a_time(batches) -> None:
    """update() sorts its inserts and shares a leaf's walk; the set and sums are insert()'s."""
    batched, one_by_one = RangeIndex(fanout=4), RangeIndex(fanout=4)
    for inserts, removes in batches:
        batched.update(inserts=inserts, removes=removes)
        for key in removes:
            one_by_one.remove(key)
        for key in inserts:
            one_by_one.insert(key)
        assert list(batched.iter_from(None)) == list(one_by_one.iter_from(None))
        assert len(batched) == len(one_by_one)
        assert batched.summary(None, None) == one_by_one.summary(None, None)
        _check_tree(batched)


def test_insert_reports_duplicates_and_remove_reports_absence() -> None:
    index = RangeIndex()
    assert index.insert(b"a")
    assert not index.insert(b"a")
    assert index.remove(b"a")
    assert not index.remove(b"a")
    assert len(index) == 0
    assert index.summary(None, None) == Summary()


def test_split_gives_parts_of_equal_count() -> None:
    index = RangeIndex(fanout=8)
    keys = [i.to_bytes(4, "big") for i in range(1000)]
    for key in keys:
        index.insert(key)
    cuts = index.split(keys[100], keys[900], 4)
    assert cuts == [keys[300], keys[500], keys[700]]
    # Circular: from 900 around to 100 is 200 keys.
    assert index.split(keys[900], keys[100], 2) == [keys[0]]


def test_sqlite_index_persists_and_reads_only_its_path(tmp_path) -> None:
    path = str(tmp_path / "index.db")
    rng = random.Random(7)
    keys = sorted({rng.randbytes(12) for _ in range(5000)})
    index = RangeIndex(SqliteNodeStore(path, "t"), fanout=16)
    for key in keys:
        index.insert(key)
    index.watermark = 42
    index.flush()
    expected = brute(keys, keys[1000], keys[4000])

    class CountingStore(SqliteNodeStore):
        reads = 0

        def get(self, node_id: int) -> bytes:
            CountingStore.reads += 1
            return super().get(node_id)

    reopened = RangeIndex(CountingStore(path, "t"), fanout=16, cache_nodes=10_000)
    assert reopened.watermark == 42
    assert len(reopened) == len(keys)
    CountingStore.reads = 0
    assert reopened.summary(keys[1000], keys[4000]) == expected
    # Two root-to-leaf paths of a 5000-key tree of fanout 16: a handful of nodes, not all.
    nodes = sqlite3.connect(path).execute("SELECT count(*) FROM rbsr_nodes").fetchone()[0]
    assert CountingStore.reads <= 8 < nodes


def test_unflushed_changes_are_not_persisted(tmp_path) -> None:
    path = str(tmp_path / "index.db")
    index = RangeIndex(SqliteNodeStore(path, "t"))
    index.insert(b"kept")
    index.flush()
    index.insert(b"lost")
    reopened = RangeIndex(SqliteNodeStore(path, "t"))
    assert list(reopened.iter_from(None)) == [b"kept"]


def test_union_adds_members() -> None:
    a, b = RangeIndex(), RangeIndex()
    for key in (b"a", b"c", b"e"):
        a.insert(key)
    for key in (b"b", b"d"):
        b.insert(key)
    union = UnionIndex([a, b])
    assert len(union) == 5
    assert list(union.keys_in(b"b", b"e")) == [b"b", b"c", b"d"]
    assert list(union.keys_in(b"d", b"b")) == [b"d", b"e", b"a"]
    assert union.summary(None, None) == brute([b"a", b"b", b"c", b"d", b"e"], None, None)


# -- two peers ------------------------------------------------------------------------


def run(
    a_keys: set[bytes],
    b_keys: set[bytes],
    *,
    branching: int = 4,
    threshold: int = 8,
    shorten: Shorten | None = None,
    part_threshold: int | None = None,
    group_prefix: int | None = None,
) -> tuple[Reconciler, Reconciler, int, int]:
    """Reconcile two sets message by message; return both sides, round trips and messages."""
    index_a, index_b = RangeIndex(fanout=8), RangeIndex(fanout=8)
    for key in a_keys:
        index_a.insert(key)
    for key in b_keys:
        index_b.insert(key)
    options = {"shorten": shorten, "part_threshold": part_threshold, "group_prefix": group_prefix}
    a = Reconciler(index_a, branching=branching, threshold=threshold, **options)  # type: ignore[arg-type]
    b = Reconciler(index_b, branching=branching, threshold=threshold, **options)  # type: ignore[arg-type]
    outgoing: list[RangeMessage] = a.initiate()
    sender, receiver = a, b
    rounds = 1
    messages = len(outgoing)
    while outgoing:
        reply: list[RangeMessage] = []
        for message in outgoing:
            reply.extend(receiver.receive(message))
        outgoing = reply
        messages += len(reply)
        if reply:
            rounds += 1
        sender, receiver = receiver, sender
    return a, b, (rounds + 1) // 2, messages


def check_differences(a: Reconciler, b: Reconciler, a_keys: set[bytes], b_keys: set[bytes]) -> None:
    assert a.finished and b.finished
    a_local, a_remote = a.take_differences()
    b_local, b_remote = b.take_differences()
    assert set(a_local) == a_keys - b_keys
    assert set(a_remote) == b_keys - a_keys
    assert set(b_local) == b_keys - a_keys
    assert set(b_remote) == a_keys - b_keys


@settings(max_examples=80, deadline=None)
@given(
    st.sets(st.binary(min_size=1, max_size=4), max_size=200),
    st.sets(st.binary(min_size=1, max_size=4), max_size=40),
    st.sets(st.binary(min_size=1, max_size=4), max_size=40),
    st.integers(2, 6),
)
def test_both_sides_learn_the_symmetric_difference(common, only_a, only_b, branching) -> None:
    a_keys = common | only_a
    b_keys = (common - only_a) | only_b
    a, b, _, _ = run(a_keys, b_keys, branching=branching, threshold=branching + 2)
    check_differences(a, b, a_keys, b_keys)


def test_equal_sets_take_one_round_trip() -> None:
    keys = {i.to_bytes(8, "big") for i in range(10_000)}
    a, b, round_trips, messages = run(keys, set(keys))
    assert round_trips == 1
    assert messages == 3  # Fingerprint + Terminal, then a bare Terminal
    check_differences(a, b, keys, keys)


def test_the_opening_fingerprint_has_the_cheapest_bound_the_shortening_allows() -> None:
    index = RangeIndex()
    for i in range(20):
        index.insert(bytes([7, i, 1, 2, 3]))
    plain = Reconciler(index).initiate()
    assert plain[0] == Fingerprint(fingerprint(index.summary(None, None)), bytes([7, 0, 1, 2, 3]))
    # [x, x) is the whole set for any x; with a shortening, x is shorten(b"", first key).
    short = Reconciler(index, shorten=shortest_prefix).initiate()
    assert short == [Fingerprint(fingerprint(index.summary(None, None)), b"\x07"), Terminal()]


def test_one_difference_stays_logarithmic() -> None:
    rng = random.Random(3)
    keys = {rng.randbytes(16) for _ in range(20_000)}
    extra = rng.randbytes(16)
    a, b, round_trips, _ = run(keys | {extra}, keys, branching=4, threshold=8)
    check_differences(a, b, keys | {extra}, keys)
    # 2 * ceil(log_4(20001)) + 2
    assert round_trips <= 2 * 8 + 2


def test_empty_sides() -> None:
    keys = {bytes([i]) for i in range(50)}
    a, b, round_trips, _ = run(set(), keys)
    check_differences(a, b, set(), keys)
    assert round_trips == 1
    a, b, _, _ = run(keys, set())
    check_differences(a, b, keys, set())
    a, b, _, _ = run(set(), set())
    assert a.finished and b.finished


def test_an_empty_set_can_be_answered_without_keys() -> None:
    index = RangeIndex()
    for i in range(50):
        index.insert(bytes([i]))
    listing = Reconciler(index)
    assert len(listing.receive_round([EmptySet(True)])) == 51  # 50 Payloads and Terminal
    assert listing.peer_empty and len(listing.local_only) == 50
    # Off: the owner sends everything itself (p2panda), the peer needs no list.
    quiet = Reconciler(index, keys_for_empty_set=False)
    assert quiet.receive_round([EmptySet(True)]) == [Terminal()]
    assert quiet.peer_empty and quiet.finished
    assert quiet.take_differences() == ([], [])
    # The empty side learns nothing from the bare Terminal, and is finished too.
    empty = Reconciler(RangeIndex())
    assert empty.initiate() == [EmptySet(True), Terminal()]
    assert empty.receive(Terminal()) == [] and empty.finished
    assert not empty.peer_empty


def grouped(draw_groups: dict[int, int]) -> set[bytes]:
    """One key per group, like p2panda's one key per log: 2 bytes of group, 1 of height."""
    return {group.to_bytes(2, "big") + bytes([height]) for group, height in draw_groups.items()}


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.integers(0, 3000), st.integers(1, 3), max_size=150),
    st.dictionaries(st.integers(0, 3000), st.integers(1, 3), max_size=150),
    st.integers(2, 5),
    st.booleans(),
)
def test_peer_lacks_only_groups_the_peer_holds_nothing_of(groups_a, groups_b, b, short) -> None:
    a_keys, b_keys = grouped(groups_a), grouped(groups_b)
    shorten = shortest_prefix if short else None
    a, b_side, _, _ = run(
        a_keys, b_keys, branching=b, threshold=b + 1, shorten=shorten, group_prefix=2
    )
    check_differences(a, b_side, a_keys, b_keys)
    for side, mine, theirs in ((a, a_keys, b_keys), (b_side, b_keys, a_keys)):
        lacks = side.take_peer_lacks()
        assert len(lacks) == len(set(lacks))
        assert set(lacks) <= {k for k in mine if k[:2] not in {t[:2] for t in theirs}}


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.integers(0, 3000), st.integers(1, 3), max_size=150),
    st.dictionaries(st.integers(0, 3000), st.integers(1, 3), max_size=150),
    st.integers(2, 5),
    st.booleans(),
)
def test_keys_of_groups_the_peer_lacks_need_not_be_sent_back(groups_a, groups_b, b, short):
    a_keys, b_keys = grouped(groups_a), grouped(groups_b)
    shorten = shortest_prefix if short else None
    index_a, index_b = RangeIndex(fanout=8), RangeIndex(fanout=8)
    for key in a_keys:
        index_a.insert(key)
    for key in b_keys:
        index_b.insert(key)
    options = {"branching": b, "threshold": b + 1, "shorten": shorten, "group_prefix": 2}
    a = Reconciler(index_a, send_lacking=False, **options)  # type: ignore[arg-type]
    b_side = Reconciler(index_b, send_lacking=False, **options)  # type: ignore[arg-type]
    outgoing, sender, receiver = a.initiate(), a, b_side
    while outgoing:
        reply: list[RangeMessage] = []
        for message in outgoing:
            reply.extend(receiver.receive(message))
        outgoing, sender, receiver = reply, receiver, sender
    assert a.finished and b_side.finished
    for side, other, mine, theirs in ((a, b_side, a_keys, b_keys), (b_side, a, b_keys, a_keys)):
        lacks = set(side.take_peer_lacks())
        assert lacks <= {k for k in mine if k[:2] not in {t[:2] for t in theirs}}
        # What the peer was not told is what this side knows it must send.
        assert set(other.remote_only) | lacks == mine - theirs
        assert set(side.local_only) == mine - theirs


def test_peer_lacks_reports_groups_before_reconciliation_ends() -> None:
    # b holds every other group; a holds all. The ranges b answers as empty or as a list
    # settle whole groups, so a knows them before the last round.
    a_keys = grouped({g: 2 for g in range(400)})
    b_keys = grouped({g: 2 for g in range(0, 400, 2)})
    a, b, _, _ = run(a_keys, b_keys, shorten=shortest_prefix, group_prefix=2)
    lacks = set(a.take_peer_lacks())
    assert lacks <= a_keys - b_keys and len(lacks) >= 150
    assert b.take_peer_lacks() == []


def test_bad_rounds_raise_reconcile_error() -> None:
    index = RangeIndex()
    with pytest.raises(ReconcileError):
        Reconciler(index).receive_round([Payload(b"x")])  # list without an end
    with pytest.raises(ReconcileError):
        Reconciler(index).receive_round([Fingerprint(b"short", b"x")])
    with pytest.raises(ReconcileError):
        Reconciler(index).receive_round([Payload(b"x", True, b"y"), EmptySet(True)])
    small = Reconciler(index, limits=ReconcilerLimits(max_round_messages=2))
    small.receive(Payload(b"a"))
    small.receive(Payload(b"b"))
    with pytest.raises(ReconcileError):
        small.receive(Payload(b"c"))
    done = Reconciler(index)
    done.receive(Terminal())
    assert done.finished
    with pytest.raises(ReconcileError):
        done.receive(Terminal())


def test_fingerprint_depends_on_count_and_sum() -> None:
    assert fingerprint(Summary(1, 5)) != fingerprint(Summary(2, 5))
    assert fingerprint(Summary(1, 5)) != fingerprint(Summary(1, 6))
    assert len(fingerprint(Summary())) == 16
    assert MemoryNodeStore().get_meta() is None


def shortest_prefix(prev: bytes, key: bytes) -> bytes:
    """The generic shortening: the shortest prefix of ``key`` greater than ``prev``."""
    for i in range(len(key)):
        if key[: i + 1] > prev:
            return key[: i + 1]
    return key


@settings(max_examples=80, deadline=None)
@given(
    st.sets(st.binary(min_size=1, max_size=6), max_size=400),
    st.sets(st.binary(min_size=1, max_size=6), max_size=40),
    st.sets(st.binary(min_size=1, max_size=6), max_size=40),
    st.integers(2, 6),
    st.integers(0, 6),
)
def test_shortened_cuts_still_find_the_symmetric_difference(
    common, only_a, only_b, branching, part_threshold
) -> None:
    """Bounds that are not keys (prefixes between two neighbours) cut the sets the same way,
    and small parts sent as fingerprints rather than keys change nothing either."""
    a_keys = common | only_a
    b_keys = (common - only_a) | only_b
    a, b, _, _ = run(
        a_keys,
        b_keys,
        branching=branching,
        threshold=branching,
        shorten=shortest_prefix,
        part_threshold=min(part_threshold, branching),
    )
    check_differences(a, b, a_keys, b_keys)


@settings(max_examples=60, deadline=None)
@given(
    st.sets(st.binary(min_size=1, max_size=5), min_size=2, max_size=500),
    st.binary(max_size=5),
    st.binary(max_size=5),
    st.integers(2, 8),
)
def test_split_with_shorten_gives_ordered_cuts_inside_the_range(keys, lo, hi, parts) -> None:
    index = RangeIndex(fanout=8)
    for key in keys:
        index.insert(key)
    cuts = index.split(lo, hi, parts, shortest_prefix)
    assert len(cuts) <= parts - 1
    # The parts [lo, c1), [c1, c2), ..., [ck, hi) hold every key of [lo, hi) once (so the
    # cuts follow the circular order from lo) and none of them is empty.
    bounds = [lo, *cuts, hi]
    counts = [index.summary(x, y).count for x, y in itertools.pairwise(bounds)]
    assert sum(counts) == index.summary(lo, hi).count
    assert all(counts) or not cuts
