"""The reconciler: answers rounds of range messages until both sides know the
symmetric difference (see the package docstring for the rules)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from sdk.sync.errors import LimitExceeded, RemoteProtocolError
from sdk.sync.rbsr.index import RangeSource, Shorten
from sdk.sync.rbsr.messages import (
    Done,
    EmptyPayload,
    EmptySet,
    Fingerprint,
    LowerBound,
    Payload,
    RangeMessage,
    Terminal,
)
from sdk.sync.rbsr.monoid import FINGERPRINT_SIZE, fingerprint


class ReconcileError(RemoteProtocolError):
    """A peer's round breaks the protocol or a bound (``ReconcilerLimits``)."""


class RoundTooLong(ReconcileError, LimitExceeded):
    """A peer's round has more messages than ``ReconcilerLimits.max_round_messages``."""


@dataclass(frozen=True, slots=True)
class ReconcilerLimits:
    """Bounds on what a peer can make us hold or do in one round, checked as
    :meth:`Reconciler.collect` takes its messages (a caller that hands
    :meth:`Reconciler.receive_round` a round it gathered itself bounds it itself)."""

    #: Range messages in one round (fingerprints, payload keys, ...).
    max_round_messages: int = 100_000
    #: Bytes of one key.
    max_key_size: int = 1024


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

    ``threshold``: a differing range with at most this many keys is answered with
    its keys. ``part_threshold`` (default ``threshold``): the same for each part of
    a split range, a larger part going out as a fingerprint. A lower one sends
    fingerprints (about 25 bytes with short bounds in the replication messages)
    for small parts that are mostly equal instead of their keys (45 bytes each, 8
    when one author's), for one more round trip. ``shorten``: cheaper bounds for
    the cuts of a split range (see :data:`Shorten`).

    ``keys_for_empty_set`` off: a peer's opening :class:`EmptySet` is answered with
    a bare Terminal, not all our keys (nothing is added to :attr:`local_only`, no
    work per key), and :attr:`peer_empty` tells the owner to send everything
    instead (as p2panda does, ``specs/p2panda-replication.txt`` 2.1: the peer "is
    asked to send all entries of the requested schemas").

    ``group_prefix``: keys sharing their first ``group_prefix`` bytes form a group
    (p2panda: one log's keys share public key and log id). :attr:`peer_lacks` then
    collects, as soon as they are learned, the local-only keys of groups the peer
    holds no key of (the range they were learned in contains the whole group and
    the peer's complete keys there have none of it), for the owner to act on at
    once. With ``send_lacking`` off, those keys are left out of our answers too
    (the peer's :attr:`remote_only` misses them): the owner sends what they stand
    for, which tells the peer more than a list of keys would.
    """

    def __init__(
        self,
        source: RangeSource | None = None,
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
        #: The local set; ``None`` between uses: an owner that keeps no store sets it
        #: around each :meth:`initiate` and :meth:`receive_round` (the reconciler's state
        #: is its own, the set is read only during those calls).
        self.source = source
        self.shorten = shorten
        self.part_threshold = threshold if part_threshold is None else part_threshold
        self.branching = branching
        self.threshold = threshold
        self.limits = limits or ReconcilerLimits()
        self.keys_for_empty_set = keys_for_empty_set
        #: The peer opened with EmptySet asking for everything (it holds no key).
        self.peer_empty = False
        self._round: list[RangeMessage] = []
        self.finished = False
        self.local_only: list[bytes] = []
        self.remote_only: list[bytes] = []
        self.group_prefix = group_prefix
        self.send_lacking = send_lacking
        #: Local-only keys of groups the peer holds nothing of (see ``group_prefix``).
        self.peer_lacks: list[bytes] = []

    @property
    def _set(self) -> RangeSource:
        assert self.source is not None, "the reconciler has no set to read"
        return self.source

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
        first = self._set.first()
        if first is None:
            return [EmptySet(True), Terminal()]
        out = _RoundWriter()
        if len(self._set) <= self.threshold:
            self._send_keys(out, first, first, can_respond=True)
        else:
            # [x, x) is the whole set for any x: the cheapest bound not above the first key.
            start = first if self.shorten is None else self.shorten(b"", first)
            out.fingerprint(start, start, fingerprint(self._set.summary(start, start)))
        return out.finish()

    def receive(self, message: RangeMessage) -> list[RangeMessage]:
        """Take one message of the peer's round; at its Terminal return our answer."""
        messages = self.collect(message)
        return [] if messages is None else self.receive_round(messages)

    def collect(self, message: RangeMessage) -> list[RangeMessage] | None:
        """Take one message of the peer's round (its bounds checked, the set not read);
        at its Terminal return the whole round, for :meth:`receive_round`."""
        if self.finished:
            raise ReconcileError("reconciliation is finished; no more rounds expected")
        if not isinstance(message, Terminal):
            if len(self._round) >= self.limits.max_round_messages:
                raise RoundTooLong(f"round longer than {self.limits.max_round_messages} messages")
            for name in ("bound", "key", "upper_bound"):  # the fields holding a key or bound
                key = getattr(message, name, None)
                if key is not None and len(key) > self.limits.max_key_size:
                    raise ReconcileError(f"key of {len(key)} bytes")
            self._round.append(message)
            return None
        messages, self._round = self._round, []
        return messages

    def receive_round(self, messages: Sequence[RangeMessage]) -> list[RangeMessage]:
        """Answer a whole round (without its Terminal); ``[]`` when we are finished."""
        needs_answer = False
        out = _RoundWriter()
        if len(messages) == 1 and isinstance(messages[0], EmptySet):
            if messages[0].can_respond:
                needs_answer = True
                self.peer_empty = True
                first = self._set.first()
                if self.keys_for_empty_set and first is not None:
                    self._send_keys(out, first, first, can_respond=False)
        else:
            for lo, hi, last, keys in _ranges(messages):
                needs_answer |= self._answer(out, lo, hi, last, keys)
        # A round that needs no answer, or our answer that needs none, ends the exchange.
        if not (needs_answer and out.needs_answer):
            self.finished = True
        return out.finish() if needs_answer else []

    def _answer(
        self, out: _RoundWriter, lo: bytes, hi: bytes, last: RangeMessage, theirs: list[bytes]
    ) -> bool:
        """Answer one range of the peer's round (``last``: its message with the upper bound;
        ``theirs``: its payload keys); return whether it asked for an answer."""
        if isinstance(last, Done):
            return False
        if isinstance(last, Fingerprint):
            value = self._set.summary(lo, hi)
            if fingerprint(value) != last.fingerprint:
                self._answer_mismatch(out, lo, hi, value.count)
            return True
        # A complete key list of the peer's range (none for EmptyPayload): its keys we lack
        # are known either way.
        theirs_set = set(theirs)
        mine = list(self._set.keys_in(lo, hi))
        mine_set = set(mine)
        remote = [k for k in theirs if k not in mine_set]
        self.remote_only.extend(remote)
        if isinstance(last, EmptyPayload) or (isinstance(last, Payload) and last.can_respond):
            local = [k for k in mine if k not in theirs_set]
            self.local_only.extend(local)
            back = self._note_lacking(lo, hi, local, theirs)
            # In range order: keys ``>= lo`` first (the range may wrap).
            diff = sorted(set(back) | set(remote), key=lambda key: (key < lo, key))
            if diff:
                out.keys(lo, hi, diff, can_respond=False)
            return True
        # An answer to our list: the symmetric difference. A key we hold came
        # back because the peer lacks it; any other is the peer's alone.
        local = [key for key in theirs if key in mine_set]
        self.local_only.extend(local)
        if self.group_prefix is not None and local:
            # The peer's complete keys of the range: ours it did not send back, and its own.
            peer = [k for k in mine if k not in theirs_set] + remote
            self._note_lacking(lo, hi, local, peer)
        return False

    def _answer_mismatch(self, out: _RoundWriter, lo: bytes, hi: bytes, count: int) -> None:
        if count == 0:
            out.empty(lo, hi)
        elif count <= self.threshold:
            self._send_keys(out, lo, hi, can_respond=True)
        else:
            cuts = self._set.split(lo, hi, self.branching, self.shorten)
            for a, b in itertools.pairwise([lo, *cuts, hi]):
                part = self._set.summary(a, b)
                if part.count == 0:
                    out.empty(a, b)
                elif part.count <= self.part_threshold:
                    self._send_keys(out, a, b, can_respond=True)
                else:
                    out.fingerprint(a, b, fingerprint(part))

    def _send_keys(self, out: _RoundWriter, lo: bytes, hi: bytes, *, can_respond: bool) -> None:
        keys = list(self._set.keys_in(lo, hi))
        if not can_respond:  # a final list goes to a peer that holds none of the range
            self.local_only.extend(keys)
        if keys:
            out.keys(lo, hi, keys, can_respond=can_respond)


def _ranges(
    messages: Sequence[RangeMessage],
) -> Iterator[tuple[bytes, bytes, RangeMessage, list[bytes]]]:
    """The ranges of a round: lower and upper bound, the message ending the range (with
    the upper bound) and the range's payload keys."""
    # The first range starts at the round's last upper bound unless a LowerBound says.
    lower = next(
        (u for m in reversed(messages) if (u := getattr(m, "upper_bound", None)) is not None),
        None,
    )
    if lower is None:
        if messages:
            raise ReconcileError("a round without any range")
        return
    keys: list[bytes] = []
    for message in messages:
        if isinstance(message, LowerBound):
            if keys:
                raise ReconcileError("LowerBound inside a payload list")
            lower = message.bound
            continue
        if isinstance(message, EmptySet):
            raise ReconcileError("EmptySet inside a round of ranges")
        if isinstance(message, Payload):
            keys.append(message.key)
            if message.upper_bound is None:
                continue
        elif keys:
            raise ReconcileError("a payload list not ended by an upper bound")
        elif isinstance(message, Fingerprint) and len(message.fingerprint) != FINGERPRINT_SIZE:
            raise ReconcileError(f"fingerprint of {len(message.fingerprint)} bytes")
        elif not isinstance(message, Fingerprint | EmptyPayload | Done):
            continue  # a Terminal
        upper = message.upper_bound
        assert upper is not None  # a Payload without one went on above
        yield lower, upper, message, keys
        keys, lower = [], upper
    if keys:
        raise ReconcileError("a payload list not ended by an upper bound")


class _RoundWriter:
    """Builds a round: skips LowerBound when ranges are consecutive; notes if it asks."""

    def __init__(self) -> None:
        self.messages: list[RangeMessage] = []
        self._cursor: bytes | None = None
        self._first_lower: bytes | None = None
        self.needs_answer = False

    def _add(self, lo: bytes, messages: list[RangeMessage], hi: bytes, asks: bool) -> None:
        if self._cursor is None:
            # The first range's lower bound may be left implicit when it equals the
            # round's last upper bound, known only in finish().
            self._first_lower = lo
        elif self._cursor != lo:
            self.messages.append(LowerBound(lo))
        self.messages.extend(messages)
        self._cursor = hi
        self.needs_answer |= asks

    def fingerprint(self, lo: bytes, hi: bytes, fp: bytes) -> None:
        self._add(lo, [Fingerprint(fp, hi)], hi, True)

    def empty(self, lo: bytes, hi: bytes) -> None:
        self._add(lo, [EmptyPayload(hi)], hi, True)

    def keys(self, lo: bytes, hi: bytes, keys: Sequence[bytes], *, can_respond: bool) -> None:
        payloads: list[RangeMessage] = [Payload(key) for key in keys[:-1]]
        self._add(lo, [*payloads, Payload(keys[-1], can_respond, hi)], hi, can_respond)

    def finish(self) -> list[RangeMessage]:
        if self._first_lower is not None and self._first_lower != self._cursor:
            self.messages.insert(0, LowerBound(self._first_lower))
        return [*self.messages, Terminal()]


__all__ = ["ReconcileError", "Reconciler", "ReconcilerLimits", "RoundTooLong"]
